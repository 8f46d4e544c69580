//! `engine_truncation` on Responses API chains: a request with `previous_response_id` stands on the
//! whole chain, which holds the parent response's input and output and then the new input. An engine
//! whose reported input is smaller than the parent's input and output together did not see the chain:
//! it ignored `previous_response_id` (or, with `truncation: "auto"`, dropped the oldest items; then
//! which ones, by the local counts).

use ctxscope_store::{FindingKind, Severity, TurnRecord};
use serde_json::{json, Value};

use super::{Context, Draft};

/// The engine said it dropped input items (`truncation: "auto"`), or, failing that, its input count
/// shows it did not see the chain.
pub(crate) fn ignored_chain(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let info = turn.responses.as_ref()?;
    if let Some(dropped) = info.dropped_items.as_ref().and_then(Value::as_array).filter(|d| !d.is_empty()) {
        let summary = format!("engine dropped the {} oldest input message(s) to fit (truncation: \"auto\")", dropped.len());
        let evidence = json!({
            "method": "response_reported", "confidence": "high", "truncation": info.truncation,
            "dropped_items": dropped, "engine_prompt_tokens": turn.usage.as_ref().and_then(|u| u.prompt_tokens),
            "chain_messages": info.chain_messages, "input_messages": info.input_messages,
        });
        let cause = format!("engine_truncation/{}", turn.conversation);
        return Some(Draft { kind: FindingKind::EngineTruncation, severity: Severity::Warning, summary, evidence, cause });
    }
    let parent_id = info.parent_turn?;
    let engine = turn.usage.as_ref()?.prompt_tokens?;
    let parent = parent(cx, parent_id)?;
    let parent_usage = parent.usage.as_ref()?;
    let (parent_in, parent_out) = (parent_usage.prompt_tokens?, parent_usage.completion_tokens.unwrap_or(0));
    // The chain holds all of the parent's input and output (only its instructions are not carried
    // over), then at least one new item.
    let expected = parent_in + parent_out;
    if engine >= expected {
        return None;
    }
    let same_instructions = match (info.instructions, parent.responses.as_ref().is_some_and(|r| r.instructions)) {
        (false, false) => true,
        (true, true) => cx.obs.hashes.first().map(ctxscope_store::to_hex).as_ref() == parent_first_message(cx, &parent).as_ref(),
        _ => false,
    };
    let auto = info.truncation.as_deref() == Some("auto");
    let missing = expected - engine;
    let dropped = if auto { dropped_items(cx, missing) } else { Value::Null };
    let what = if auto { "dropped the oldest items of the chain (truncation: \"auto\")" } else { "ignored previous_response_id" };
    let summary = format!(
        "engine reported {engine} input tokens on a chain whose previous response alone had {parent_in} input and {parent_out} output tokens: it {what}"
    );
    let evidence = json!({
        "method": "responses_chain_usage",
        "confidence": if same_instructions { "high" } else { "medium" },
        "previous_response_id": info.previous_response_id, "parent_turn": parent_id,
        "parent_input_tokens": parent_in, "parent_output_tokens": parent_out, "expected_at_least": expected,
        "engine_prompt_tokens": engine, "missing_tokens": missing,
        "chain_messages": info.chain_messages, "input_messages": info.input_messages,
        "truncation": info.truncation, "dropped_items": dropped,
        "same_instructions": same_instructions,
    });
    let severity = if same_instructions && !auto { Severity::Critical } else { Severity::Warning };
    Some(Draft {
        kind: FindingKind::EngineTruncation,
        severity,
        summary,
        evidence,
        cause: format!("engine_truncation/{}", turn.conversation),
    })
}

fn parent(cx: &Context<'_>, id: u64) -> Option<TurnRecord> {
    match cx.previous() {
        Some(previous) if previous.id == id => Some(previous.clone()),
        _ => cx.store.turn(id).ok().flatten(),
    }
}

fn parent_first_message(cx: &Context<'_>, parent: &TurnRecord) -> Option<String> {
    cx.store.turn_messages(parent).ok()?.first().map(ctxscope_store::to_hex)
}

/// With per-message token counts: the oldest messages after the instructions whose tokens add up to
/// what is missing, by position and role. Without them, nothing is guessed.
fn dropped_items(cx: &Context<'_>, missing: u64) -> Value {
    let Some(ends) = cx.obs.segment_ends.filter(|e| e.len() == cx.obs.messages.len()) else {
        return Value::Null;
    };
    let first = usize::from(cx.obs.turn.responses.as_ref().is_some_and(|r| r.instructions));
    let start = if first == 0 { 0 } else { ends[0] };
    let mut items = Vec::new();
    for (i, end) in ends.iter().enumerate().skip(first) {
        let role = cx.obs.messages[i].role().unwrap_or("");
        items.push(json!({"index": i, "role": role}));
        if (end - start) as u64 >= missing {
            break;
        }
    }
    Value::Array(items)
}
