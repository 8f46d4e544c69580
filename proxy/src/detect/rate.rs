//! Without a token count of its own, the proxy still knows how many text bytes each request carried
//! and how many prompt tokens the engine said it processed. This keeps, per conversation and per
//! upstream, the engine's tokens-per-byte rate on turns that looked whole, so that a turn whose
//! reported count falls far below what its bytes predict can be named (engine_truncation by rate).

use std::collections::{HashMap, VecDeque};

use crate::parse::message::Message;

/// Text bytes of the request's messages as a template renders them ([`crate::parse::message::text_bytes`]).
pub(crate) fn text_bytes(messages: &[Message]) -> u64 {
    messages.iter().map(Message::text_bytes).sum()
}

/// One observed turn: its text bytes, its messages and the engine's prompt count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub bytes: u64,
    pub messages: u32,
    pub tokens: u64,
}

/// Tokens a chat template may add around one message (role header, separators): more than the
/// common templates add, so that a rate fitted with it taken off is never too high.
const MESSAGE_OVERHEAD_TOKENS: f64 = 8.0;

/// The text rate of going from `from` to `to`: tokens per byte with the message overhead taken off;
/// None when the step is too narrow to say.
fn slope(from: Sample, to: Sample) -> Option<f64> {
    let bytes = to.bytes.checked_sub(from.bytes).filter(|b| *b >= MIN_STEP_BYTES)? as f64;
    let messages = f64::from(to.messages.saturating_sub(from.messages));
    let tokens = to.tokens as f64 - from.tokens as f64 - MESSAGE_OVERHEAD_TOKENS * messages;
    (tokens > 0.0).then(|| tokens / bytes)
}

/// Where a rate came from, which sets how much a prediction from it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateSource {
    /// Fitted on this conversation's own earlier turns.
    Conversation,
    /// The median over this upstream's recent conversations.
    Upstream,
}

impl RateSource {
    pub fn name(self) -> &'static str {
        match self {
            RateSource::Conversation => "conversation",
            RateSource::Upstream => "upstream",
        }
    }
}

/// Tokens per text byte, and what it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    pub tokens_per_byte: f64,
    pub source: RateSource,
    /// Turns (conversation) or growth steps (upstream) it was fitted on.
    pub samples: usize,
}

/// Growth steps narrower than this say little about the rate.
const MIN_STEP_BYTES: u64 = 64;
/// Whole prompts at least this large give the upstream's rate for first turns.
const MIN_WHOLE_BYTES: u64 = 1024;
/// Whole-prompt rates needed before a first turn is judged.
const MIN_WHOLE_SAMPLES: usize = 8;
/// Bounds on the memory the rates hold.
const MAX_CONVERSATIONS: usize = 4096;
const UPSTREAM_SLOPES: usize = 64;
/// Earlier turns of a conversation kept as anchors, and its growth slopes kept for its own rate.
const ANCHORS: usize = 8;
/// Slopes a conversation needs before its own rate is preferred to the upstream's.
const MIN_CONVERSATION_SLOPES: usize = 3;
/// Upstream slopes needed before the upstream rate is used.
const MIN_UPSTREAM_SLOPES: usize = 4;

/// A conversation's latest turns on one chain of pure extensions, and its growth slopes.
#[derive(Debug, Default)]
struct Chain {
    anchors: VecDeque<(u64, Sample)>,
    slopes: VecDeque<f64>,
}

/// Per-conversation chains and the upstream's recent growth slopes.
#[derive(Default)]
pub(crate) struct Rates {
    chains: HashMap<u64, Chain>,
    chain_order: VecDeque<u64>,
    /// (conversation, slope): a conversation later found cut takes its slopes back out (the steps
    /// before it was found may already have been cut in part).
    slopes: VecDeque<(u64, f64)>,
    /// Tokens per byte of whole prompts (overhead taken off), for first turns.
    wholes: VecDeque<f64>,
}

/// The value at `quantile` (0: the least) of a non-empty series.
fn quantile(values: impl IntoIterator<Item = f64>, quantile: f64) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * quantile).round() as usize]
}

impl Rates {
    /// The conversation's earlier whole-looking turns on its current chain of extensions, oldest
    /// first, as (turn id, sample).
    pub fn anchors(&self, conversation: u64) -> Vec<(u64, Sample)> {
        self.chains.get(&conversation).map(|c| c.anchors.iter().copied().collect()).unwrap_or_default()
    }

    /// The rate to predict a turn of `conversation` with, chosen low so that text of another shape
    /// than the fitted turns (a long paste after short questions, prose after numbers) is not taken
    /// for a cut: the least of the conversation's own recent slopes once it has a few, else the
    /// upstream's lower quartile, else the conversation's one or two.
    pub fn rate(&self, conversation: u64) -> Option<Rate> {
        let own = self.chains.get(&conversation).map(|c| &c.slopes).filter(|s| !s.is_empty());
        if let Some(own) = own.filter(|s| s.len() >= MIN_CONVERSATION_SLOPES) {
            return Some(Rate {
                tokens_per_byte: quantile(own.iter().copied(), 0.0),
                source: RateSource::Conversation,
                samples: own.len(),
            });
        }
        if self.slopes.len() >= MIN_UPSTREAM_SLOPES {
            let slopes = self.slopes.iter().map(|(_, s)| *s);
            return Some(Rate { tokens_per_byte: quantile(slopes, 0.25), source: RateSource::Upstream, samples: self.slopes.len() });
        }
        own.map(|own| Rate { tokens_per_byte: quantile(own.iter().copied(), 0.0), source: RateSource::Conversation, samples: own.len() })
    }

    /// The rate to judge a whole prompt with (a conversation's first turn): the least whole-prompt
    /// rate this upstream has shown on large prompts.
    pub fn whole_rate(&self) -> Option<Rate> {
        (self.wholes.len() >= MIN_WHOLE_SAMPLES).then(|| Rate {
            tokens_per_byte: quantile(self.wholes.iter().copied(), 0.0),
            source: RateSource::Upstream,
            samples: self.wholes.len(),
        })
    }

    /// Records a turn. `whole`: no truncation was found on it, so it may feed the rates and serve as
    /// an anchor; `extends`: the id of the turn it extends (None starts the conversation's chain anew).
    pub fn record(&mut self, turn: u64, conversation: u64, sample: Sample, whole: bool, extends: Option<u64>) {
        if !whole {
            // A conversation that lost its prompt once is not anchored or fitted on again, and its
            // earlier steps no longer speak for the upstream's rate.
            self.chains.remove(&conversation);
            self.slopes.retain(|(c, _)| *c != conversation);
            return;
        }
        if !self.chains.contains_key(&conversation) {
            self.chain_order.push_back(conversation);
            while self.chain_order.len() > MAX_CONVERSATIONS {
                if let Some(old) = self.chain_order.pop_front() {
                    self.chains.remove(&old);
                }
            }
        }
        if sample.bytes >= MIN_WHOLE_BYTES {
            let tokens = sample.tokens as f64 - MESSAGE_OVERHEAD_TOKENS * f64::from(sample.messages);
            if tokens > 0.0 {
                self.wholes.push_back(tokens / sample.bytes as f64);
                while self.wholes.len() > UPSTREAM_SLOPES {
                    self.wholes.pop_front();
                }
            }
        }
        let chain = self.chains.entry(conversation).or_default();
        let parent = extends.and_then(|id| chain.anchors.back().filter(|(last, _)| *last == id).map(|(_, s)| *s));
        let Some(parent) = parent else {
            // A new conversation, or one whose chain is not a pure extension of the last anchor.
            chain.anchors.clear();
            chain.anchors.push_back((turn, sample));
            return;
        };
        if let Some(slope) = slope(parent, sample) {
            chain.slopes.push_back(slope);
            self.slopes.push_back((conversation, slope));
            while chain.slopes.len() > ANCHORS {
                chain.slopes.pop_front();
            }
            while self.slopes.len() > UPSTREAM_SLOPES {
                self.slopes.pop_front();
            }
        }
        chain.anchors.push_back((turn, sample));
        while chain.anchors.len() > ANCHORS {
            chain.anchors.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_bytes_counts_text_and_skips_media() {
        let messages: Vec<Message> = [
            json!({"role": "system", "content": "abcd"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAAAAAAAAAAAAAAAAAA"}}]}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\":1}"}}]}),
        ]
        .into_iter()
        .map(Message::new)
        .collect();
        assert_eq!(text_bytes(&messages), 4 + 5 + 1 + 7);
    }

    fn sample(bytes: u64, messages: u32, tokens: u64) -> Sample {
        Sample { bytes, messages, tokens }
    }

    #[test]
    fn conversation_rate_is_its_least_slope_without_the_message_overhead() {
        let mut rates = Rates::default();
        assert_eq!(rates.rate(1), None);
        rates.record(10, 1, sample(400, 2, 120), true, None);
        assert_eq!(rates.rate(1), None, "one turn is no rate");
        // Each step adds two messages (16 tokens of overhead) and 400 bytes.
        for (id, bytes, tokens) in [(11, 800, 236), (12, 1200, 336), (13, 1600, 456)] {
            rates.record(id, 1, sample(bytes, 2 + 2 * (id - 10) as u32, tokens), true, Some(id - 1));
        }
        let rate = rates.rate(1).unwrap();
        assert_eq!(rate.source, RateSource::Conversation);
        assert!((rate.tokens_per_byte - 0.21).abs() < 1e-9, "{rate:?}");
        assert_eq!(rates.anchors(1).len(), 4);
    }

    #[test]
    fn upstream_rate_is_the_lower_quartile_and_a_cut_conversation_is_not_anchored() {
        let mut rates = Rates::default();
        for (c, slope) in [(1u64, 0.2), (2, 0.25), (3, 0.3), (4, 0.9), (5, 0.26)] {
            rates.record(c * 10, c, sample(1000, 2, 300), true, None);
            rates.record(c * 10 + 1, c, sample(2000, 2, 300 + (1000.0 * slope) as u64), true, Some(c * 10));
        }
        rates.record(61, 6, sample(500, 2, 100), true, None);
        let rate = rates.rate(6).unwrap();
        assert_eq!(rate.source, RateSource::Upstream);
        assert!((rate.tokens_per_byte - 0.25).abs() < 1e-9, "{rate:?}");
        assert_eq!(rates.whole_rate(), None, "five large prompts are too few to judge a first turn");
        rates.record(12, 1, sample(3000, 4, 300), false, Some(11));
        assert!(rates.anchors(1).is_empty());
        // Conversation 1's slope (0.2) left the upstream's with it: the quartile of 0.25, 0.26, 0.3, 0.9.
        let rate = rates.rate(6).unwrap();
        assert_eq!(rate.samples, 4);
        assert!((rate.tokens_per_byte - 0.26).abs() < 1e-9, "{rate:?}");
        // A turn that does not extend the last anchor starts the chain anew.
        rates.record(21, 2, sample(900, 2, 250), true, None);
        assert_eq!(rates.anchors(2).len(), 1);
    }
}
