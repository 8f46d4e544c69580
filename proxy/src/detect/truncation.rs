//! `engine_truncation` (the engine processed less than it was sent) and `context_overflow` (the engine
//! refused the prompt for its length).

use ctxscope_store::{FindingKind, Relation, Severity};
use serde_json::{json, Value};

use super::config::normalise;
use super::drift::Steady;
use super::rate::{self, RateSource, Rates};
use super::{Context, Draft};

/// Compares the engine's prompt count with the local count (scaled by the settled ratio), or, with no
/// count of the prompt, with the previous turn's and with the byte rate (see [`without_count`]).
pub(crate) fn truncation(cx: &Context<'_>, steady: Option<Steady>, rates: &Rates) -> Option<Draft> {
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
                "method": "local_count", "confidence": if steady.is_some() { "high" } else { "medium" }, "local_prompt_tokens": local.prompt, "engine_prompt_tokens": engine,
                "expected_engine_tokens": expected.round() as u64, "missing_tokens": missing,
                "fit": steady.map(|s| json!({"scale": s.scale, "offset": s.offset})),
                "growth_since_previous_turn": growth, "tokenizer": local.tokenizer, "messages": turn.message_count,
            }),
        ));
    }
    without_count(cx, engine, rates)
}

/// No count of the prompt: the engine's own numbers against the request's growth. A count that stays
/// flat or falls while the conversation was extended by at least `flat_growth_bytes` is certain (an
/// appended prompt cannot take fewer tokens), so critical; a count far below what the bytes predict
/// at the rate fitted on earlier turns is an estimate, so a warning, with the rate and its source.
fn without_count(cx: &Context<'_>, engine: u64, rates: &Rates) -> Option<Draft> {
    let turn = cx.obs.turn;
    let config = cx.config;
    let bytes = cx.text_bytes();
    let rate = rates.rate(turn.conversation);
    let previous = cx.previous().filter(|_| matches!(turn.relation, Relation::Extend { .. }));
    let Some(previous) = previous else {
        // A first turn: only the whole-prompt rate of this upstream's other conversations can speak for it.
        let rate = rates.whole_rate()?;
        let predicted = rate.tokens_per_byte * bytes as f64;
        if (engine as f64) >= predicted * config.rate_first_turn_fraction
            || predicted - (engine as f64) < config.rate_first_turn_min_tokens as f64
        {
            return None;
        }
        let summary = format!(
            "engine reported {engine} prompt tokens for {bytes} bytes of text, about {} at this upstream's rate",
            predicted.round()
        );
        return Some(rate_draft(
            cx,
            summary,
            "low",
            json!({
                "method": "byte_rate", "rate_source": rate.source.name(), "tokens_per_byte": rate.tokens_per_byte, "rate_samples": rate.samples,
                "engine_prompt_tokens": engine, "text_bytes": bytes, "predicted_prompt_tokens": predicted.round() as u64,
                "messages": turn.message_count,
            }),
        ));
    };
    let before = previous.usage.as_ref()?.prompt_tokens?;
    let grew = turn.request_bytes.saturating_sub(previous.request_bytes);
    if grew >= config.flat_growth_bytes && engine <= before + config.truncation_min_tokens {
        return Some(draft(
            cx,
            format!("engine reported {engine} prompt tokens after {before} while the request grew by {grew} bytes"),
            json!({
                "method": "flat_prompt_tokens", "confidence": "high", "engine_prompt_tokens": engine, "previous_engine_prompt_tokens": before,
                "previous_turn": previous.id, "request_bytes": turn.request_bytes, "previous_request_bytes": previous.request_bytes,
                "messages": turn.message_count, "previous_messages": previous.message_count,
            }),
        ));
    }
    // Against each earlier whole-looking turn of this chain of extensions: the one that shows the
    // largest shortfall (a count that crept up a little each turn shows none against the last turn).
    let rate = rate?;
    let anchors = rates.anchors(turn.conversation);
    if anchors.last().map(|(id, _)| *id) != Some(previous.id) {
        return None;
    }
    let shortfall = |anchor: &rate::Sample| {
        let expected = rate.tokens_per_byte * bytes.checked_sub(anchor.bytes)? as f64;
        let actual = engine as f64 - anchor.tokens as f64;
        Some((expected, actual))
    };
    let (anchor_id, anchor, expected, actual) = anchors
        .iter()
        .filter_map(|(id, a)| shortfall(a).map(|(e, g)| (*id, *a, e, g)))
        .max_by(|x, y| (x.2 - x.3).total_cmp(&(y.2 - y.3)))?;
    if expected < config.rate_min_tokens as f64
        || actual >= expected * config.rate_growth_fraction
        || expected - actual < config.rate_min_tokens as f64
    {
        return None;
    }
    let predicted = anchor.tokens as f64 + expected;
    let text_grew = bytes - anchor.bytes;
    let summary = format!(
        "engine reported {engine} prompt tokens; {text_grew} bytes of text added since turn {anchor_id} ({} tokens then) predict about {} at this {}'s rate",
        anchor.tokens,
        predicted.round(),
        rate.source.name()
    );
    let confidence = if rate.source == RateSource::Conversation { "medium" } else { "low" };
    Some(rate_draft(
        cx,
        summary,
        confidence,
        json!({
            "method": "byte_rate", "rate_source": rate.source.name(), "tokens_per_byte": rate.tokens_per_byte, "rate_samples": rate.samples,
            "engine_prompt_tokens": engine, "anchor_turn": anchor_id, "anchor_engine_prompt_tokens": anchor.tokens,
            "previous_turn": previous.id, "previous_engine_prompt_tokens": before,
            "text_bytes": bytes, "text_bytes_added": text_grew, "predicted_prompt_tokens": predicted.round() as u64,
            "missing_tokens": (predicted - engine as f64).round() as u64, "messages": turn.message_count,
        }),
    ))
}

/// An estimate from the byte rate: a warning, never critical (the proxy has no count of its own).
fn rate_draft(cx: &Context<'_>, summary: String, confidence: &str, mut evidence: Value) -> Draft {
    evidence["confidence"] = json!(confidence);
    Draft { severity: Severity::Warning, ..draft(cx, summary, evidence) }
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
        summary: format!(
            "engine refused the prompt for its length (HTTP {}): {}",
            turn.status,
            message.chars().take(200).collect::<String>()
        ),
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
