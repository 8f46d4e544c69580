//! `history_dropped`: the request continues a conversation but earlier turns were removed, rewritten or
//! summarized (harness compaction, a sliding window); the comparison itself is in [`super::history`].

use ctxscope_store::{FindingKind, Severity, Store, StoreError, TurnRecord};
use serde_json::Value;

use super::history::{self, History};
use super::{Context, Draft, Observation};

/// The previous turn's history (messages and reply) against this request.
pub(crate) fn compare_history(store: &Store, previous: &TurnRecord, obs: &Observation<'_>) -> Result<History, StoreError> {
    let history = store.turn_history(previous)?;
    let hashes: Vec<String> = history.iter().map(|(hash, _)| ctxscope_store::to_hex(hash)).collect();
    let values: Vec<Value> = history.into_iter().map(|(_, value)| value.unwrap_or(Value::Null)).collect();
    let request_hex: Vec<String> = obs.hashes.iter().map(ctxscope_store::to_hex).collect();
    let request_canonical: Vec<Value> = obs.messages.iter().map(|m| ctxscope_store::canonical_message(m)).collect();
    let before: Vec<_> = hashes.iter().zip(&values).map(|(hash, value)| history::Message { hash, value }).collect();
    let after: Vec<_> = request_hex.iter().zip(&request_canonical).map(|(hash, value)| history::Message { hash, value }).collect();
    Ok(history::compare(&before, &after))
}

/// `history_dropped`: the request continues the conversation with earlier turns removed or rewritten.
pub(crate) fn finding(cx: &Context<'_>) -> Option<Draft> {
    let Some(History::Dropped(dropped)) = &cx.history else { return None };
    let turn = cx.obs.turn;
    let previous = cx.previous()?;
    let lost = dropped.removed_messages.len() + dropped.rewritten_messages.len();
    Some(Draft {
        kind: FindingKind::HistoryDropped,
        severity: Severity::Warning,
        summary: format!(
            "the client dropped or rewrote {lost} earlier message(s) ({} user turn(s)) from message {} on: {} messages before, {} now",
            dropped.user_turns_lost, dropped.first_differing_message, dropped.messages_before, dropped.messages_after
        ),
        evidence: serde_json::json!({
            "previous_turn": previous.id,
            "first_differing_message": dropped.first_differing_message,
            "removed_messages": dropped.removed_messages,
            "rewritten_messages": dropped.rewritten_messages,
            "user_turns_lost": dropped.user_turns_lost,
            "messages_before": dropped.messages_before,
            "messages_after": dropped.messages_after,
            "kept_latest_reply": dropped.kept_latest_reply,
            "tokens_before": super::prompt_tokens(previous),
            "tokens_after": super::prompt_tokens(turn),
            "first_before": dropped.first_before,
            "first_after": dropped.first_after,
        }),
        cause: format!("history_dropped/{}", turn.conversation),
    })
}
