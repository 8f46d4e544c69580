//! `history_dropped`: the request continues a conversation but the harness edited its history:
//! compacted it into a summary, windowed it, pruned messages, rewrote or truncated one in place,
//! stripped media, or dropped reasoning the model's format needs. The comparison is in
//! [`super::history`]; this names the cause, weighs the loss and estimates its tokens.

use ctxscope_formats::template::reasoning_rule;
use ctxscope_store::{CaptureLevel, FindingKind, Severity, Store, StoreError, TurnRecord};
use serde_json::Value;

use super::history::{self, Cause, Dropped, History};
use super::{Context, Draft, Observation};

/// The previous turn's history (messages and reply) against this request.
/// Its working data (both sides' hashes and canonical messages: hundreds of MB of small blocks for a
/// history of 100,000 messages) is scratch, like a request's parse tree, so that it does not pin the
/// capture thread's pages once the turn is done.
pub(crate) fn compare_history(store: &Store, previous: &TurnRecord, obs: &Observation<'_>) -> Result<History, StoreError> {
    ctxscope_common::scratch::scope(|| {
        with_sides(store, previous, obs.hashes, obs.messages, obs.turn.capture, |before, after| {
            history::compare(before, after, rule_for(obs.turn))
        })
    })
}

/// Runs `f` on the previous turn's history (messages and reply) and a request's messages, both as
/// the comparison sees them (hex hashes, canonical forms). Below `--capture full` (`level`, or the
/// level the previous turn was stored at) the store holds masked text or none: with masked text
/// both sides are compared masked; a message stored without text that the request still carries
/// (the same hash: the same message) is read from the request; one it does not carry stays `null`,
/// which the comparison takes as unknown content (`history`).
pub fn with_sides<R>(
    store: &Store,
    previous: &TurnRecord,
    hashes: &[ctxscope_store::Hash],
    messages: &[crate::parse::message::Message],
    level: CaptureLevel,
    f: impl FnOnce(&[history::Message<'_>], &[history::Message<'_>]) -> R,
) -> Result<R, StoreError> {
    let history = store.turn_history(previous)?;
    let old_hex: Vec<String> = history.iter().map(|(hash, _)| ctxscope_store::to_hex(hash)).collect();
    let mut old_values: Vec<Option<Value>> = history.into_iter().map(|(_, value)| value).collect();
    let new_hex: Vec<String> = hashes.iter().map(ctxscope_store::to_hex).collect();
    let mut new_values: Vec<Value> = messages.iter().map(|m| ctxscope_store::canonical_message(m)).collect();
    if level == CaptureLevel::Redacted || previous.capture == CaptureLevel::Redacted {
        new_values.iter_mut().for_each(|value| {
            crate::privacy::redact::redact_value(value);
        });
    }
    if old_values.iter().any(Option::is_none) {
        let at: std::collections::HashMap<&str, usize> = new_hex.iter().enumerate().map(|(j, hash)| (hash.as_str(), j)).collect();
        for (hash, value) in old_hex.iter().zip(old_values.iter_mut()).filter(|(_, value)| value.is_none()) {
            *value = at.get(hash.as_str()).map(|&j| new_values[j].clone());
        }
    }
    let old_values: Vec<Value> = old_values.into_iter().map(|value| value.unwrap_or(Value::Null)).collect();
    let before: Vec<_> = old_hex.iter().zip(&old_values).map(|(hash, value)| history::Message { hash, value }).collect();
    let after: Vec<_> = new_hex.iter().zip(&new_values).map(|(hash, value)| history::Message { hash, value }).collect();
    Ok(f(&before, &after))
}

/// The reasoning rule of a turn's model and API.
pub fn rule_for(turn: &TurnRecord) -> &'static ctxscope_formats::template::ReasoningRule {
    reasoning_rule(turn.model.as_deref(), turn.endpoint.as_str())
}

/// `history_dropped`: the request continues the conversation with its history edited.
pub(crate) fn finding(cx: &Context<'_>) -> Option<Draft> {
    let Some(History::Dropped(dropped)) = &cx.history else { return None };
    let edit = dropped.cause?;
    let turn = cx.obs.turn;
    let previous = cx.previous()?;
    let severity = match dropped.weight() {
        3 => Severity::Critical,
        2 => Severity::Warning,
        _ => Severity::Info,
    };
    let tokens_lost = estimate_tokens(previous, dropped);
    let mut evidence = serde_json::to_value(dropped).unwrap_or(Value::Null);
    if let Some(map) = evidence.as_object_mut() {
        map.insert("previous_turn".into(), previous.id.into());
        map.insert("tokens_before".into(), super::prompt_tokens(previous).into());
        map.insert("tokens_after".into(), super::prompt_tokens(turn).into());
        map.insert("tokens_lost".into(), tokens_lost.into());
        map.insert(
            "tokens_lost_method".into(),
            "characters lost at the previous request's prompt tokens per body byte (an estimate)".into(),
        );
        // What the edit costs the prefix cache: nothing past the first edited message can be reused.
        let usage = turn.usage.as_ref();
        let cache = serde_json::json!({
            "reusable_messages": dropped.first_differing_message,
            "cached_tokens": usage.and_then(|u| u.cached_tokens),
            "prompt_tokens": usage.and_then(|u| u.prompt_tokens),
        });
        map.insert("cache".into(), cache);
    }
    // A compaction is an event of its own each time; other causes are raised once per conversation.
    let cause = match edit {
        Cause::Compaction => format!("history_dropped/{}/compaction/{}", turn.conversation, turn.id),
        other => format!("history_dropped/{}/{}", turn.conversation, other.as_str()),
    };
    let mut summary = summary(dropped, edit, turn.index);
    if let Some((cached, prompt)) = turn.usage.as_ref().and_then(|u| Some((u.cached_tokens?, u.prompt_tokens?))) {
        let reusable = dropped.first_differing_message;
        summary += &format!(
            "; the prefix cache could reuse only the first {reusable} message(s): the engine reused {cached} of {prompt} prompt tokens"
        );
    }
    Some(Draft { kind: FindingKind::HistoryDropped, severity, summary, evidence, cause })
}

/// "your harness removed 5 tool results (2,310 characters) at turn 6", in the cause's words.
fn summary(d: &Dropped, cause: Cause, turn_index: u32) -> String {
    let what: Vec<String> = d.lost.iter().map(|(kind, lost)| format!("{} {kind}", lost.messages)).collect();
    let what = if what.is_empty() { "nothing the model sees".to_string() } else { what.join(", ") };
    let at = format!("at turn {turn_index}");
    match cause {
        Cause::Compaction => {
            let by = d.summary.as_ref().and_then(|s| s.harness.clone()).map_or(String::new(), |h| format!(" ({h} style)"));
            format!("the harness compacted the history {at}: {what} replaced by a summary message{by}")
        }
        Cause::Windowed => format!("the harness kept only the latest messages {at}: the oldest {what} were dropped"),
        Cause::Pruned => format!("the harness pruned the history {at}: removed or cleared {what} from the middle"),
        Cause::Rewritten => format!("the harness rewrote earlier messages in place {at}: {what}"),
        Cause::TruncatedInPlace => format!("the harness truncated earlier messages in place {at}: {what}"),
        Cause::MediaStripped => format!("the harness stripped images or files from earlier messages {at}: {what}"),
        Cause::ReasoningDropped => {
            format!("the harness dropped reasoning the model's format needs ({} rule) {at}: {what}", d.reasoning_rule)
        }
    }
}

/// Tokens the loss took from the prompt: characters lost at the previous prompt's tokens per character.
fn estimate_tokens(previous: &TurnRecord, d: &Dropped) -> Option<u64> {
    let tokens = super::prompt_tokens(previous)?;
    let chars = previous.request_bytes.max(1);
    let lost: usize = d.lost.values().map(|l| l.chars).sum();
    Some((tokens as f64 * lost as f64 / chars as f64).round() as u64)
}
