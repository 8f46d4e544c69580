//! `engine_changed`: the turn was served under a different engine fingerprint than the conversation's
//! previous turn (a restart with other settings, another model, a changed patch set). The evidence
//! lists each changed field, old -> new; a changed command line (`argv`, from the live process) also
//! names the flags that differ, and the summary shows them: `argv (--ctx-size)`, `env.GGML_...`,
//! `lib.libggml-cpu.so`.

mod argv;

use ctxscope_store::{FieldChange, FindingKind, Severity};
use serde_json::{json, Value};

use super::{Context, Draft};

/// Changed fields listed in the evidence; the rest are counted.
const LISTED: usize = 32;

pub(crate) fn finding(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let new_hash = turn.fingerprint.as_deref()?;
    let previous = cx.previous()?;
    let old_hash = previous.fingerprint.as_deref()?;
    if old_hash == new_hash {
        return None;
    }
    let read = |hash: &str| {
        cx.store.fingerprint(hash).unwrap_or_else(|error| {
            tracing::debug!(%error, "fingerprint unreadable; engine_changed not checked");
            None
        })
    };
    let (old, new) = (read(old_hash)?, read(new_hash)?);
    let changes = old.diff(&new);
    if changes.is_empty() {
        return None;
    }
    let names: Vec<String> = changes.iter().map(|c| named(c, &flags(c))).collect();
    let shown = names.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 4 { format!(" and {} more", names.len() - 4) } else { String::new() };
    let listed: Vec<Value> = changes.iter().take(LISTED).map(listed).collect();
    Some(Draft {
        kind: FindingKind::EngineChanged,
        severity: Severity::Warning,
        summary: format!("the {} engine changed since turn {}: {shown}{more}", new.engine, previous.index),
        evidence: json!({
            "previous_turn": previous.id,
            "old_fingerprint": old_hash,
            "new_fingerprint": new_hash,
            "engine": new.engine,
            "changed_fields": names.len(),
            "changes": listed,
        }),
        cause: format!("engine_changed:{}:{old_hash}:{new_hash}", turn.conversation),
    })
}

/// The flags that differ when `change` is the command line's (`argv`), else `None`.
fn flags(change: &FieldChange) -> Option<Vec<String>> {
    let text = |side: &Option<Value>| side.as_ref().and_then(Value::as_str).unwrap_or("").to_string();
    (change.field == "argv").then(|| argv::changed(&text(&change.old), &text(&change.new)))
}

/// The field as the summary names it: `argv (--ctx-size, -np)` for the command line.
fn named(change: &FieldChange, flags: &Option<Vec<String>>) -> String {
    match flags {
        Some(flags) if !flags.is_empty() => format!("{} ({})", change.field, flags.join(", ")),
        _ => change.field.clone(),
    }
}

/// One change as the evidence lists it; the command line's also carries its `flags`.
fn listed(change: &FieldChange) -> Value {
    let mut entry = json!({"field": change.field, "old": change.old, "new": change.new});
    if let Some(flags) = flags(change) {
        entry["flags"] = json!(flags);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(field: &str, old: Option<&str>, new: Option<&str>) -> FieldChange {
        FieldChange { field: field.into(), old: old.map(Value::from), new: new.map(Value::from) }
    }

    #[test]
    fn the_command_line_names_its_flags_other_fields_their_names() {
        let argv = change("argv", Some("llama-server -m m.gguf --ctx-size 1024"), Some("llama-server -m m.gguf --ctx-size 2048 -np 2"));
        assert_eq!(named(&argv, &flags(&argv)), "argv (--ctx-size, -np)");
        let entry = listed(&argv);
        assert_eq!(entry["flags"], json!(["--ctx-size", "-np"]));
        assert_eq!(entry["old"], json!("llama-server -m m.gguf --ctx-size 1024"));
        let env = change("env.GGML_SCHED_MAX_COPIES", None, Some("4"));
        assert_eq!(named(&env, &flags(&env)), "env.GGML_SCHED_MAX_COPIES");
        assert_eq!(listed(&env), json!({"field": "env.GGML_SCHED_MAX_COPIES", "old": null, "new": "4"}));
        let lib = change("lib.libggml-cpu.so", Some("aa"), Some("bb"));
        assert_eq!(named(&lib, &flags(&lib)), "lib.libggml-cpu.so");
        // A process that appeared (no argv before) lists every flag; one whose argv only changed form, none.
        let appeared = change("argv", None, Some("p --x 1"));
        assert_eq!(listed(&appeared)["flags"], json!(["argv[0]", "--x"]));
        let same = change("argv", Some("p --x=1"), Some("p --x 1"));
        assert_eq!((named(&same, &flags(&same)), listed(&same)["flags"].clone()), ("argv".to_string(), json!([])));
    }
}
