//! Detectors: turn the evidence in each captured turn into findings. They run on the capture worker
//! after the turn is stored (never on the request path), read the previous turn from the store, and
//! keep a little per-upstream state: recent prompts' token ids, the engine/local token ratio, and
//! whether the upstream reports cache hits at all. Each finding names its cause so that it is raised
//! once, not on every later turn that inherits it.

pub mod cache;
pub mod config;
pub mod drift;
pub mod history;
mod amnesia;
mod reuse;
mod truncation;

use std::sync::Arc;

use ctxscope_store::{FindingKind, Hash, Relation, Severity, Store, StoreError, TurnRecord};
use serde_json::Value;

pub use config::DetectConfig;
use cache::{Recent, RecentPrompts};
use drift::Drift;
use history::History;

/// What the detectors see of one captured turn.
pub struct Observation<'a> {
    pub turn: &'a TurnRecord,
    /// The request's messages as sent, their hashes.
    pub messages: &'a [Value],
    pub hashes: &'a [Hash],
    /// The prompt's token ids and where each message's segment ends in them (with a tokenizer).
    pub prompt_ids: Option<&'a [u32]>,
    pub segment_ends: Option<&'a [usize]>,
    /// The reply's token ids (with a tokenizer).
    pub reply_ids: Option<Vec<u32>>,
    /// The upstream's error object, when it answered with one.
    pub error_object: Option<&'a Value>,
}

/// A finding before it has an id and a place: what, how bad, why, and the cause it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub kind: FindingKind,
    pub severity: Severity,
    pub summary: String,
    pub evidence: Value,
    pub cause: String,
}

/// What the rules may look at besides the observation.
pub(crate) struct Context<'a> {
    pub obs: &'a Observation<'a>,
    pub config: &'a DetectConfig,
    /// The conversation's previous turn, when this one continues, repeats or rewrites it.
    pub previous: Option<TurnRecord>,
    /// How this request differs from the previous turn's history.
    pub history: Option<History>,
}

/// The detectors and their per-upstream state.
pub struct Detectors {
    config: DetectConfig,
    recent: RecentPrompts,
    drift: Drift,
    /// The upstream has reported a cache hit at least once.
    cache_reported: bool,
    /// Turns seen with a cached-token count of zero before any hit (for the one-time note).
    cold_reports: u64,
    max_prompt: u64,
}

impl Detectors {
    pub fn new(config: DetectConfig) -> Detectors {
        let recent = RecentPrompts::new(config.recent_prompts, config.recent_tokens);
        Detectors { config, recent, drift: Drift::default(), cache_reported: false, cold_reports: 0, max_prompt: 0 }
    }

    pub fn config(&self) -> &DetectConfig {
        &self.config
    }

    /// Runs every detector on one stored turn.
    pub fn observe(&mut self, store: &Store, obs: &Observation<'_>) -> Result<Vec<Draft>, StoreError> {
        let turn = obs.turn;
        let previous = match &turn.relation {
            Relation::Extend { parent_turn } => store.turn(*parent_turn)?,
            Relation::Regenerate { turn } | Relation::Diverged { previous_turn: turn, .. } => store.turn(*turn)?,
            Relation::New | Relation::Branch { .. } => None,
        };
        let history = match (&turn.relation, &previous) {
            (Relation::Diverged { .. }, Some(prev)) => Some(compare_history(store, prev, obs)?),
            _ => None,
        };
        let cx = Context { obs, config: &self.config, previous, history };
        let mut drafts = Vec::new();
        drafts.extend(truncation::overflow(&cx));
        let ok = (200..300).contains(&turn.status);
        if ok {
            drafts.extend(truncation::truncation(&cx, self.drift.steady(self.config.drift_turns, self.config.drift_tolerance)));
            drafts.extend(token_drift(&mut self.drift, &self.config, turn));
            drafts.extend(reuse::reuse(&cx, &self.recent, self.cache_reported));
            drafts.extend(amnesia::amnesia(&cx));
        }
        drafts.extend(history_dropped(&cx));
        self.remember(obs);
        Ok(drafts)
    }

    /// Folds this turn into the per-upstream state and gauges.
    fn remember(&mut self, obs: &Observation<'_>) {
        let turn = obs.turn;
        let usage = turn.usage.as_ref();
        let upstream = turn.upstream.clone();
        if let Some(cached) = usage.and_then(|u| u.cached_tokens) {
            if cached > 0 && !self.cache_reported {
                self.cache_reported = true;
            } else if cached == 0 && !self.cache_reported {
                self.cold_reports += 1;
                if self.cold_reports == 20 {
                    tracing::info!(%upstream, "upstream has reported no cache hit in 20 turns: caching off or not reported; cache findings wait for a first hit");
                }
            }
        }
        metrics::gauge!(crate::metrics::UPSTREAM_CACHE_REPORTED, "upstream" => upstream.clone()).set(f64::from(u8::from(self.cache_reported)));
        if let Some(prompt) = usage.and_then(|u| u.prompt_tokens) {
            self.max_prompt = self.max_prompt.max(prompt);
            metrics::gauge!(crate::metrics::UPSTREAM_LAST_PROMPT_TOKENS, "upstream" => upstream.clone()).set(prompt as f64);
            metrics::gauge!(crate::metrics::UPSTREAM_MAX_PROMPT_TOKENS, "upstream" => upstream.clone()).set(self.max_prompt as f64);
            metrics::counter!(crate::metrics::UPSTREAM_PROMPT_TOKENS_TOTAL, "upstream" => upstream.clone()).increment(prompt);
            if let Some(local) = &turn.local_tokens {
                metrics::counter!(crate::metrics::UPSTREAM_LOCAL_PROMPT_TOKENS_TOTAL, "upstream" => upstream.clone()).increment(local.prompt);
                metrics::gauge!(crate::metrics::UPSTREAM_TOKEN_RATIO, "upstream" => upstream.clone()).set(self.drift.median_ratio(self.config.drift_turns));
            }
        }
        if let Some(cached) = usage.and_then(|u| u.cached_tokens) {
            metrics::counter!(crate::metrics::UPSTREAM_CACHED_TOKENS_TOTAL, "upstream" => upstream).increment(cached);
        }
        if let Some(ids) = obs.prompt_ids {
            let mut held: Vec<u32> = ids.to_vec();
            held.extend(obs.reply_ids.iter().flatten());
            self.recent.push(Recent { ids: Arc::from(held), time_unix_ms: turn.time_unix_ms, conversation: turn.conversation, turn: turn.id });
        }
    }

}

/// `token_count_drift`: the engine's count has settled on a line away from the local count.
fn token_drift(drift: &mut Drift, config: &DetectConfig, turn: &TurnRecord) -> Option<Draft> {
    let local = turn.local_tokens.as_ref()?;
    let engine = turn.usage.as_ref()?.prompt_tokens?;
    // Every turn is a sample: a truncating engine's count goes flat, which `steady` refuses.
    drift.push(local.prompt, engine, config.drift_turns);
    let steady = drift.steady(config.drift_turns, config.drift_tolerance)?;
    let scale_off = (steady.scale - 1.0).abs() > config.drift_fraction;
    let offset_off = steady.offset.abs() > config.drift_offset_tokens;
    if !scale_off && !offset_off {
        return None;
    }
    let model = turn.model.as_deref().unwrap_or("");
    let what = match (scale_off, offset_off) {
        (true, _) => format!("{:.1}% {} tokens", (steady.scale - 1.0).abs() * 100.0, if steady.scale > 1.0 { "more" } else { "fewer" }),
        (false, _) => format!("a steady {:+.0} tokens", steady.offset),
    };
    Some(Draft {
        kind: FindingKind::TokenCountDrift,
        severity: Severity::Warning,
        summary: format!(
            "engine counts {what} than {} over {} turns (engine = {:.3} x local {:+.1}): the configured tokenizer or chat template is not the engine's",
            local.tokenizer, steady.turns, steady.scale, steady.offset
        ),
        evidence: serde_json::json!({
            "scale": steady.scale, "offset": steady.offset, "residual": steady.residual, "turns": steady.turns,
            "tokenizer": local.tokenizer, "last_local_tokens": local.prompt, "last_engine_tokens": engine,
        }),
        cause: format!("token_count_drift/{}/{model}/{}", turn.upstream, local.tokenizer),
    })
}

/// The previous turn's history (messages and reply) against this request.
fn compare_history(store: &Store, previous: &TurnRecord, obs: &Observation<'_>) -> Result<History, StoreError> {
    let mut hashes = store.turn_messages(previous)?;
    hashes.extend(previous.reply.iter().cloned());
    let mut values = Vec::with_capacity(hashes.len());
    for hash in &hashes {
        let value = ctxscope_store::from_hex(hash).map(|h| store.message(&h)).transpose()?.flatten();
        values.push(value.unwrap_or(Value::Null));
    }
    let request_hex: Vec<String> = obs.hashes.iter().map(ctxscope_store::to_hex).collect();
    let request_canonical: Vec<Value> = obs.messages.iter().map(ctxscope_store::canonical_message).collect();
    let before: Vec<_> = hashes.iter().zip(&values).map(|(hash, value)| history::Message { hash, value }).collect();
    let after: Vec<_> = request_hex.iter().zip(&request_canonical).map(|(hash, value)| history::Message { hash, value }).collect();
    Ok(history::compare(&before, &after))
}

/// `history_dropped`: the request continues the conversation with earlier turns removed or rewritten.
fn history_dropped(cx: &Context<'_>) -> Option<Draft> {
    let Some(History::Dropped(dropped)) = &cx.history else { return None };
    let turn = cx.obs.turn;
    let previous = cx.previous.as_ref()?;
    let tokens = |t: &TurnRecord| t.usage.as_ref().and_then(|u| u.prompt_tokens).or(t.local_tokens.as_ref().map(|l| l.prompt));
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
            "tokens_before": tokens(previous),
            "tokens_after": tokens(turn),
            "first_before": dropped.first_before,
            "first_after": dropped.first_after,
        }),
        cause: format!("history_dropped/{}", turn.conversation),
    })
}
