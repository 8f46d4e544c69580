//! Detectors: turn the evidence in each captured turn into findings. They run on the capture worker
//! after the turn is stored (never on the request path), read the previous turn from the store, and
//! keep a little per-upstream state: recent prompts' token ids, the engine/local token ratio, and
//! whether the upstream reports cache hits at all. Each finding names its cause so that it is raised
//! once, not on every later turn that inherits it.

mod align;
mod amnesia;
pub mod anatomy;
pub mod bound;
pub mod cache;
pub mod config;
pub mod context_report;
pub mod drift;
mod dropped;
mod engine_changed;
pub mod history;
pub mod markers;
mod rate;
mod responses;
mod reuse;
mod truncation;

use std::sync::Arc;

use ctxscope_store::{FindingKind, Hash, Relation, Severity, Store, StoreError, TurnRecord};
use serde_json::Value;

use cache::{Recent, RecentPrompts};
pub use config::DetectConfig;
use drift::Drift;
pub use dropped::{rule_for, with_sides};
use history::History;
use rate::{Rates, Sample};

/// What the detectors see of one captured turn.
pub struct Observation<'a> {
    pub turn: &'a TurnRecord,
    /// The request's messages as sent, their hashes.
    pub messages: &'a [crate::parse::message::Message],
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
    /// The conversation's previous turn, when this one continues, repeats or rewrites it: read from
    /// the store on first use (most turns never need it).
    previous: std::cell::OnceCell<Option<Arc<TurnRecord>>>,
    previous_id: Option<u64>,
    store: &'a Store,
    recent_turns: &'a RecentTurns,
    /// How this request differs from the previous turn's history.
    pub history: Option<History>,
    /// The request's text bytes ([`rate::text_bytes`]), measured on first use.
    text_bytes: std::cell::OnceCell<u64>,
}

impl Context<'_> {
    /// The previous turn (a store error reads as none: detection never fails a capture).
    pub fn previous(&self) -> Option<&TurnRecord> {
        self.previous
            .get_or_init(|| {
                let id = self.previous_id?;
                if let Some(turn) = self.recent_turns.get(id) {
                    return Some(turn);
                }
                let stored = self.store.turn(id).unwrap_or_else(|error| {
                    tracing::debug!(%error, "previous turn unreadable; detectors go without it");
                    None
                });
                stored.map(Arc::new)
            })
            .as_deref()
    }

    /// The request's text bytes (message contents and tool calls; no media).
    pub fn text_bytes(&self) -> u64 {
        *self.text_bytes.get_or_init(|| rate::text_bytes(self.obs.messages))
    }
}

/// The turns observed last, by id: the previous turn of a conversation is nearly always here, which
/// spares a store read and decode per turn. Bounded by count and by bytes: a turn of 100,000 messages
/// holds 3.2 MB of message hashes, and 1,024 of them would hold gigabytes. A turn over the budget is
/// read back from the store when needed: one read for a turn that large is small beside its capture.
#[derive(Default)]
struct RecentTurns {
    turns: std::collections::HashMap<u64, Arc<TurnRecord>>,
    order: std::collections::VecDeque<u64>,
    bytes: usize,
}

impl RecentTurns {
    const CAPACITY: usize = 1024;
    /// Bytes of turns held at most; a larger turn (more than about 30,000 new messages) is not kept
    /// (the store has it). It was 4 MiB: after 16 requests of 100,000 messages the last one stayed
    /// resident, 3.2 MB of the 22 MiB the proxy held above idle.
    const BUDGET: usize = 1 << 20;

    fn get(&self, id: u64) -> Option<Arc<TurnRecord>> {
        self.turns.get(&id).cloned()
    }

    /// What a turn holds on the heap, roughly: its message hashes and texts.
    fn cost(turn: &TurnRecord) -> usize {
        let notes: usize = turn.notes.iter().map(String::len).sum();
        std::mem::size_of::<TurnRecord>() + 32 * turn.new_messages.len() + turn.reply_text.len() + notes + 64 * turn.params.len()
    }

    fn push(&mut self, turn: &TurnRecord) {
        let cost = Self::cost(turn);
        if cost > Self::BUDGET {
            return;
        }
        if let Some(old) = self.turns.insert(turn.id, Arc::new(turn.clone())) {
            self.bytes -= Self::cost(&old);
        } else {
            self.order.push_back(turn.id);
        }
        self.bytes += cost;
        while self.order.len() > Self::CAPACITY || self.bytes > Self::BUDGET {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(turn) = self.turns.remove(&old) {
                self.bytes -= Self::cost(&turn);
            }
        }
    }
}

/// The per-upstream series, registered once (the upstream of a pipeline never changes).
struct UpstreamGauges {
    cache_reported: metrics::Gauge,
    last_prompt: metrics::Gauge,
    max_prompt: metrics::Gauge,
    token_ratio: metrics::Gauge,
    prompt_total: metrics::Counter,
    local_total: metrics::Counter,
    cached_total: metrics::Counter,
}

impl UpstreamGauges {
    fn new(upstream: &str) -> UpstreamGauges {
        use crate::metrics as m;
        let label = || [("upstream", upstream.to_string())];
        UpstreamGauges {
            cache_reported: metrics::gauge!(m::UPSTREAM_CACHE_REPORTED, &label()),
            last_prompt: metrics::gauge!(m::UPSTREAM_LAST_PROMPT_TOKENS, &label()),
            max_prompt: metrics::gauge!(m::UPSTREAM_MAX_PROMPT_TOKENS, &label()),
            token_ratio: metrics::gauge!(m::UPSTREAM_TOKEN_RATIO, &label()),
            prompt_total: metrics::counter!(m::UPSTREAM_PROMPT_TOKENS_TOTAL, &label()),
            local_total: metrics::counter!(m::UPSTREAM_LOCAL_PROMPT_TOKENS_TOTAL, &label()),
            cached_total: metrics::counter!(m::UPSTREAM_CACHED_TOKENS_TOTAL, &label()),
        }
    }
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
    recent_turns: RecentTurns,
    /// Engine tokens per text byte, per conversation and upstream (for diagnosis without a count).
    rates: Rates,
    gauges: Option<UpstreamGauges>,
}

impl Detectors {
    pub fn new(config: DetectConfig) -> Detectors {
        let recent = RecentPrompts::new(config.recent_prompts, config.recent_tokens);
        Detectors {
            config,
            recent,
            drift: Drift::default(),
            cache_reported: false,
            cold_reports: 0,
            max_prompt: 0,
            recent_turns: RecentTurns::default(),
            rates: Rates::default(),
            gauges: None,
        }
    }

    pub fn config(&self) -> &DetectConfig {
        &self.config
    }

    /// Runs every detector on one stored turn.
    pub fn observe(&mut self, store: &Store, obs: &Observation<'_>) -> Result<Vec<Draft>, StoreError> {
        let turn = obs.turn;
        let previous_id = match &turn.relation {
            Relation::Extend { parent_turn } => Some(*parent_turn),
            Relation::Regenerate { turn } | Relation::Diverged { previous_turn: turn, .. } => Some(*turn),
            Relation::New | Relation::Branch { .. } => None,
        };
        let recent_turns = &self.recent_turns;
        let mut cx = Context {
            obs,
            config: &self.config,
            previous: Default::default(),
            previous_id,
            store,
            recent_turns,
            history: None,
            text_bytes: Default::default(),
        };
        match (&turn.relation, cx.previous()) {
            (Relation::Diverged { .. }, Some(prev)) => cx.history = Some(dropped::compare_history(store, prev, obs)?),
            // An extension whose resent reply is not the reply on record (say, without its reasoning
            // inside a tool loop): compared too, and kept only when it lost something.
            (Relation::Extend { .. }, Some(prev)) if resent_otherwise(prev, obs) => {
                let history = dropped::compare_history(store, prev, obs)?;
                cx.history = matches!(history, History::Dropped(_)).then_some(history);
            }
            _ => {}
        }
        if let Some(History::Dropped(d)) = &cx.history {
            for cause in &d.causes {
                metrics::counter!(crate::metrics::HISTORY_EDITS_TOTAL, "cause" => cause.as_str()).increment(1);
            }
        }
        let mut drafts = Vec::new();
        drafts.extend(truncation::overflow(&cx));
        let ok = (200..300).contains(&turn.status);
        if ok {
            let steady = self.drift.steady(self.config.drift_turns, self.config.drift_tolerance);
            drafts.extend(responses::ignored_chain(&cx));
            drafts.extend(truncation::truncation(&cx, steady, &self.rates));
            drafts.extend(drift::finding(&mut self.drift, &self.config, turn));
            drafts.extend(reuse::reuse(&cx, &self.recent, self.cache_reported));
            drafts.extend(amnesia::amnesia(&cx));
        }
        drafts.extend(dropped::finding(&cx));
        drafts.extend(engine_changed::finding(&cx));
        for draft in &mut drafts {
            stamp(draft, obs);
        }
        let truncated = drafts.iter().any(|d| d.kind == FindingKind::EngineTruncation);
        let measured = cx.text_bytes.get().copied();
        self.remember(obs, truncated, measured);
        Ok(drafts)
    }

    /// Folds this turn into the per-upstream state and gauges; `text_bytes`: the request's, when the
    /// detectors already measured them.
    fn remember(&mut self, obs: &Observation<'_>, truncated: bool, text_bytes: Option<u64>) {
        let turn = obs.turn;
        self.recent_turns.push(turn);
        if let (Some(tokens), true) = (turn.usage.as_ref().and_then(|u| u.prompt_tokens), (200..300).contains(&turn.status)) {
            let extends = match turn.relation {
                Relation::Extend { parent_turn } => Some(parent_turn),
                _ => None,
            };
            let bytes = text_bytes.unwrap_or_else(|| rate::text_bytes(obs.messages));
            let sample = Sample { bytes, messages: turn.message_count, tokens };
            self.rates.record(turn.id, turn.conversation, sample, !truncated, extends);
        }
        let usage = turn.usage.as_ref();
        let gauges = self.gauges.get_or_insert_with(|| UpstreamGauges::new(&turn.upstream));
        if let Some(cached) = usage.and_then(|u| u.cached_tokens) {
            if cached > 0 {
                self.cache_reported = true;
            } else if !self.cache_reported {
                self.cold_reports += 1;
                if self.cold_reports == 20 {
                    tracing::info!(upstream = %turn.upstream, "upstream has reported no cache hit in 20 turns: caching off or not reported; cache findings wait for a first hit");
                }
            }
            gauges.cached_total.increment(cached);
        }
        gauges.cache_reported.set(f64::from(u8::from(self.cache_reported)));
        if let Some(prompt) = usage.and_then(|u| u.prompt_tokens) {
            self.max_prompt = self.max_prompt.max(prompt);
            gauges.last_prompt.set(prompt as f64);
            gauges.max_prompt.set(self.max_prompt as f64);
            gauges.prompt_total.increment(prompt);
            if let Some(local) = &turn.local_tokens {
                gauges.local_total.increment(local.prompt);
                gauges.token_ratio.set(self.drift.median_ratio(self.config.drift_turns));
            }
        }
        if let Some(ids) = obs.prompt_ids {
            let held = ids.iter().chain(obs.reply_ids.iter().flatten()).copied();
            self.recent.push(Recent {
                fingerprints: cache::fingerprints(held),
                time_unix_ms: turn.time_unix_ms,
                conversation: turn.conversation,
                turn: turn.id,
            });
        }
    }
}

/// Creates every history-edit series at zero (after the recorder is installed), so that rate() and
/// increase() see the first edit of each cause.
/// Once per process: a second proxy in the same process must not reset the first one's counts.
pub fn register_series() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for cause in history::Cause::ALL {
            metrics::counter!(crate::metrics::HISTORY_EDITS_TOTAL, "cause" => cause.as_str()).absolute(0);
        }
    });
}

/// Whether an extension carries the previous reply's place with another message than the reply on record.
fn resent_otherwise(previous: &TurnRecord, obs: &Observation<'_>) -> bool {
    let Some(reply) = previous.reply.as_deref() else { return false };
    obs.hashes.get(previous.message_count as usize).is_some_and(|h| ctxscope_store::to_hex(h) != reply)
}

/// Every finding's evidence names how it was found (`method`) and how sure that is (`confidence`:
/// high when the evidence proves it, medium or low for estimates); a detector that knows better sets
/// them itself, the rest get their kind's.
fn stamp(draft: &mut Draft, obs: &Observation<'_>) {
    let Some(evidence) = draft.evidence.as_object_mut() else { return };
    let method = match draft.kind {
        FindingKind::ContextOverflow => "error_message",
        FindingKind::PhantomCacheReuse => match evidence.get("bound_method").and_then(Value::as_str) {
            Some("bytes") => "bytes",
            _ => "token_ids",
        },
        FindingKind::CacheMiss if obs.prompt_ids.is_some() => "token_ids",
        FindingKind::CacheMiss => "turn_counts",
        FindingKind::HistoryDropped => "message_hashes",
        FindingKind::AmnesiaReply => "phrase",
        FindingKind::TokenCountDrift => "count_fit",
        FindingKind::EngineChanged => "fingerprint",
        _ => "local_count",
    };
    let confidence = match draft.kind {
        FindingKind::CacheMiss if obs.prompt_ids.is_none() => "medium",
        FindingKind::AmnesiaReply => "medium",
        _ => "high",
    };
    evidence.entry("method").or_insert_with(|| Value::from(method));
    evidence.entry("confidence").or_insert_with(|| Value::from(confidence));
}

/// A turn's prompt size: the engine's count, else the local one.
pub(crate) fn prompt_tokens(turn: &TurnRecord) -> Option<u64> {
    turn.usage.as_ref().and_then(|u| u.prompt_tokens).or(turn.local_tokens.as_ref().map(|l| l.prompt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_turns_are_bounded_by_bytes_as_well_as_count() {
        let mut recent = RecentTurns::default();
        let big = |id: u64, n: usize| ctxscope_store::store_test_turn(id, 1, vec![[7u8; 32]; n]);
        for id in 0..10 {
            recent.push(&big(id, 20_000));
        }
        assert!(recent.bytes <= RecentTurns::BUDGET, "{} bytes held", recent.bytes);
        assert_eq!(recent.turns.len(), recent.order.len());
        assert!(recent.get(9).is_some() && recent.get(0).is_none(), "the oldest went first");
        recent.push(&big(10, 200_000));
        assert!(recent.get(10).is_none(), "a turn over the whole budget is not kept");
        for id in 11..2000 {
            recent.push(&big(id, 1));
        }
        assert_eq!(recent.turns.len(), RecentTurns::CAPACITY);
    }
}
