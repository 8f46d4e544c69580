//! `phantom_cache_reuse` (the engine reports more cached tokens than any earlier prompt could have
//! supplied) and `cache_miss` (it reused far less than a recent prompt left, with the cause named: a
//! prefix-breaking edit, changed tools, or eviction).

use ctxscope_store::{FindingKind, Relation, Severity};
use serde_json::{json, Value};

use super::cache::{longest, RecentPrompts, Shared};
use super::history::{self, Break, History};
use super::{Context, Draft};

pub(crate) fn reuse(cx: &Context<'_>, recent: &RecentPrompts, cache_reported: bool) -> Vec<Draft> {
    let turn = cx.obs.turn;
    let Some(cached) = turn.usage.as_ref().and_then(|u| u.cached_tokens) else { return Vec::new() };
    if cached == 0 && !cache_reported {
        return Vec::new();
    }
    // The prefix this prompt shares with each recent one, computed once for both detectors.
    let shared = cx.obs.prompt_ids.map(|ids| recent.shared(ids));
    let mut drafts = Vec::new();
    drafts.extend(phantom(cx, shared.as_deref(), cached));
    drafts.extend(miss(cx, shared.as_deref(), cached));
    drafts
}

/// The most an honest engine could have reused: the longest token prefix shared with an earlier
/// prompt, or, with no tokenizer, a byte bound on the messages shared with an earlier turn.
fn reusable_bound(cx: &Context<'_>, shared: Option<&[Shared]>) -> (u64, &'static str, Option<Shared>) {
    let obs = cx.obs;
    // Messages shared with an earlier captured turn (persisted: survives a proxy restart).
    let shared_messages = obs.turn.base.map_or(0, |b| b.len as usize);
    match (obs.prompt_ids, obs.segment_ends, shared) {
        (Some(ids), Some(ends), Some(shared)) => {
            let best = longest(shared, None);
            // Whole messages shared with a stored turn: covers prompts sent before this proxy started
            // (a partial message shared with such a prompt is not counted; see docs/findings.md).
            let by_messages = if shared_messages == 0 { 0 } else { ends.get(shared_messages - 1).copied().unwrap_or(ids.len()) };
            let tokens = best.map_or(0, |b| b.tokens).max(by_messages);
            (tokens as u64, "token_ids", best)
        }
        _ => {
            let upto = (shared_messages + 1).min(obs.messages.len());
            let bytes: usize = obs.messages[..upto].iter().map(|m| m.bound_bytes() as usize + 16).sum();
            ((bytes + 64) as u64, "bytes", None)
        }
    }
}

fn phantom(cx: &Context<'_>, shared: Option<&[Shared]>, cached: u64) -> Option<Draft> {
    let turn = cx.obs.turn;
    if cached <= cx.config.cache_block_tokens {
        return None;
    }
    let (local_bound, method, source) = reusable_bound(cx, shared);
    // The bound is in local tokens, `cached` in the engine's: tokens the engine counts beyond the local
    // count (a default system prompt its template adds) may all sit in the shared prefix.
    let engine = turn.usage.as_ref().and_then(|u| u.prompt_tokens);
    let local = turn.local_tokens.as_ref().map(|l| l.prompt);
    let extra = match (engine, local) {
        (Some(e), Some(l)) => e.saturating_sub(l),
        _ => 0,
    };
    // A request that extends the previous turn may reuse all of it, as the engine counted it.
    let previous = cx.previous().filter(|_| matches!(turn.relation, Relation::Extend { .. }));
    let previous_whole =
        previous.and_then(|p| p.usage.as_ref()).map_or(0, |u| u.prompt_tokens.unwrap_or(0) + u.completion_tokens.unwrap_or(0));
    let bound = (local_bound + extra).max(previous_whole);
    let allowance = cx.config.cache_block_tokens;
    if cached <= bound + allowance {
        return None;
    }
    Some(Draft {
        kind: FindingKind::PhantomCacheReuse,
        severity: Severity::Critical,
        summary: format!(
            "engine reports {cached} cached tokens but this prompt shares at most {bound} with any earlier prompt: reused KV does not match the prompt"
        ),
        evidence: json!({
            "cached_tokens": cached,
            "longest_common_prefix": local_bound,
            "engine_extra_tokens": extra,
            "previous_turn_tokens": previous_whole,
            "bound": bound,
            "bound_method": method,
            "allowance": allowance,
            "engine_prompt_tokens": turn.usage.as_ref().and_then(|u| u.prompt_tokens),
            "local_prompt_tokens": turn.local_tokens.as_ref().map(|l| l.prompt),
            "closest_conversation": source.map(|s| s.conversation),
            "closest_turn": source.map(|s| s.turn),
        }),
        cause: format!("phantom_cache_reuse/{}", turn.conversation),
    })
}

fn miss(cx: &Context<'_>, shared: Option<&[Shared]>, cached: u64) -> Option<Draft> {
    let turn = cx.obs.turn;
    let config = cx.config;
    // The engine cannot have kept more than it processed (a truncating engine is engine_truncation's).
    let processed = turn.usage.as_ref().and_then(|u| u.prompt_tokens).unwrap_or(u64::MAX);
    let far_below = |reusable: u64| {
        let reusable = reusable.min(processed);
        reusable >= config.miss_min_tokens && (cached as f64) < reusable as f64 * config.miss_fraction
    };
    // 1. The client broke its own prefix: what the previous turn left was reusable had it been kept.
    if let (Some(broke), Some(previous)) = (prefix_break(cx), cx.previous()) {
        let reusable = super::prompt_tokens(previous)?;
        if !far_below(reusable) {
            return None;
        }
        let change = serde_json::to_value(broke.change).unwrap_or(Value::Null);
        let change_name = change.as_str().unwrap_or("edit").to_string();
        return Some(draft(
            format!(
                "engine reused {cached} of the {reusable} tokens the previous turn left: the prefix broke at message {} character {} ({change_name})",
                broke.message, broke.char
            ),
            json!({
                "cause": change, "message": broke.message, "char": broke.char, "role": broke.role,
                "before": broke.before, "after": broke.after, "cached_tokens": cached, "reusable_tokens": reusable,
                "previous_turn": previous.id,
            }),
            format!("cache_miss/{}/{change_name}", turn.conversation),
        ));
    }
    // 2. The prefix was intact: the engine evicted it (or never kept it).
    let window_start = turn.time_unix_ms.saturating_sub(config.miss_window.as_millis() as u64);
    let (reusable, source_turn, since_ms) = match shared {
        Some(shared) => {
            let best = longest(shared, Some(window_start))?;
            (best.tokens as u64, best.turn, turn.time_unix_ms.saturating_sub(best.time_unix_ms))
        }
        None => {
            let previous = cx.previous().filter(|p| matches!(turn.relation, Relation::Extend { .. }) && p.time_unix_ms >= window_start)?;
            (super::prompt_tokens(previous)?, previous.id, turn.time_unix_ms.saturating_sub(previous.time_unix_ms))
        }
    };
    if !far_below(reusable) {
        return None;
    }
    Some(draft(
        format!("engine reused {cached} of {reusable} tokens a request {:.1} s earlier left unchanged: evicted", since_ms as f64 / 1000.0),
        json!({
            "cause": "eviction", "cached_tokens": cached, "reusable_tokens": reusable,
            "source_turn": source_turn, "gap_ms": since_ms,
        }),
        format!("cache_miss/{}/eviction", turn.conversation),
    ))
}

/// Where this request broke the prefix the previous turn left: an edit in the history, or its tools.
fn prefix_break(cx: &Context<'_>) -> Option<Break> {
    if let Some(History::PrefixBreak(b)) = &cx.history {
        return Some(b.clone());
    }
    let previous = cx.previous()?;
    history::compare_tools(previous.tools.as_ref(), cx.obs.turn.tools.as_ref())
}

fn draft(summary: String, evidence: Value, cause: String) -> Draft {
    Draft { kind: FindingKind::CacheMiss, severity: Severity::Warning, summary, evidence, cause }
}
