//! `engine_truncation` (the engine processed less than it was sent) and `context_overflow` (the engine
//! refused the prompt for its length).

use ctxscope_store::{FindingKind, Relation, Severity};
use serde_json::{json, Value};

use super::config::normalise;
use super::drift::Steady;
use super::{Context, Draft};

/// Compares the engine's prompt count with the local count (scaled by the settled ratio), or, with no
/// tokenizer, with the previous turn's: flat or falling while the request grew.
pub(crate) fn truncation(cx: &Context<'_>, steady: Option<Steady>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let engine = turn.usage.as_ref()?.prompt_tokens?;
    let config = cx.config;
    if let Some(local) = &turn.local_tokens {
        let (expected, fraction) = match steady {
            Some(s) => (s.expected(local.prompt), config.truncation_fraction),
            None => (local.prompt as f64, config.truncation_cold_fraction),
        };
        let slack = (expected * fraction).max(config.truncation_min_tokens as f64);
        if (engine as f64) + slack >= expected {
            return None;
        }
        // Before the ratio is known, tell a truncating engine from a mismatched tokenizer by growth.
        let growth = steady.is_none().then(|| growth(cx)).flatten();
        let confirmed = match (steady, growth) {
            (Some(_), _) => true,
            (None, Some(g)) => g < config.truncation_growth_fraction,
            (None, None) => (engine as f64) < local.prompt as f64 * config.truncation_first_turn_fraction,
        };
        if !confirmed {
            return None;
        }
        let missing = (expected - engine as f64).round() as u64;
        return Some(draft(
            cx,
            format!("engine processed {engine} prompt tokens of the {} sent ({missing} missing)", local.prompt),
            json!({
                "method": "local_count", "local_prompt_tokens": local.prompt, "engine_prompt_tokens": engine,
                "expected_engine_tokens": expected.round() as u64, "missing_tokens": missing,
                "fit": steady.map(|s| json!({"scale": s.scale, "offset": s.offset})),
                "growth_since_previous_turn": growth, "tokenizer": local.tokenizer, "messages": turn.message_count,
            }),
        ));
    }
    // No tokenizer: the request grew but the engine's count did not.
    let previous = cx.previous().filter(|_| matches!(turn.relation, Relation::Extend { .. }))?;
    let before = previous.usage.as_ref()?.prompt_tokens?;
    let grew = turn.request_bytes.saturating_sub(previous.request_bytes);
    if grew >= config.flat_growth_bytes && engine <= before + config.truncation_min_tokens {
        return Some(draft(
            cx,
            format!("engine reported {engine} prompt tokens after {before} while the request grew by {grew} bytes"),
            json!({
                "method": "flat_prompt_tokens", "engine_prompt_tokens": engine, "previous_engine_prompt_tokens": before,
                "previous_turn": previous.id, "request_bytes": turn.request_bytes, "previous_request_bytes": previous.request_bytes,
                "messages": turn.message_count, "previous_messages": previous.message_count,
            }),
        ));
    }
    None
}

/// Engine-count growth over local-count growth since the conversation's previous turn.
fn growth(cx: &Context<'_>) -> Option<f64> {
    let turn = cx.obs.turn;
    let previous = cx.previous().filter(|_| matches!(turn.relation, Relation::Extend { .. }))?;
    let (local, before_local) = (turn.local_tokens.as_ref()?.prompt, previous.local_tokens.as_ref()?.prompt);
    let (engine, before_engine) = (turn.usage.as_ref()?.prompt_tokens?, previous.usage.as_ref()?.prompt_tokens?);
    (local > before_local).then(|| (engine as f64 - before_engine as f64) / (local - before_local) as f64)
}

fn draft(cx: &Context<'_>, summary: String, evidence: Value) -> Draft {
    Draft {
        kind: FindingKind::EngineTruncation,
        severity: Severity::Critical,
        summary,
        evidence,
        cause: format!("engine_truncation/{}", cx.obs.turn.conversation),
    }
}

/// An error answer whose message says the prompt was too long.
pub(crate) fn overflow(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    if turn.status < 400 {
        return None;
    }
    let message = turn.error.as_deref().unwrap_or("");
    let object = cx.obs.error_object.map(Value::to_string).unwrap_or_default();
    let haystack = normalise(&format!("{message} {object}"));
    let phrase = cx.config.overflow_phrases.iter().find(|p| haystack.contains(p.as_str()))?;
    let object = cx.obs.error_object;
    let field = |name: &str| object.and_then(|o| o.get(name)).and_then(Value::as_u64);
    Some(Draft {
        kind: FindingKind::ContextOverflow,
        severity: Severity::Warning,
        summary: format!("engine refused the prompt for its length (HTTP {}): {}", turn.status, message.chars().take(200).collect::<String>()),
        evidence: json!({
            "status": turn.status,
            "message": message,
            "matched": phrase,
            "numbers_in_message": numbers(message),
            "engine_prompt_tokens": field("n_prompt_tokens"),
            "engine_context_size": field("n_ctx"),
            "local_prompt_tokens": turn.local_tokens.as_ref().map(|l| l.prompt),
            "messages": turn.message_count,
            "request_bytes": turn.request_bytes,
        }),
        cause: format!("context_overflow/{}", turn.conversation),
    })
}

/// The integers in an error message (vLLM: "maximum context length is 2048 tokens. However, you requested 2100").
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty() && w.len() < 12).filter_map(|w| w.parse().ok()).collect()
}
