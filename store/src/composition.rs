//! A turn's budget: its prompt's tokens by part (system, tool definitions, tool results, user,
//! assistant, reasoning, images, summaries, other) and the context limit known when it was captured.
//! Computed by the capture pipeline (`ctxscope_proxy::capture::composition`); how each method counts
//! is in docs/capture.md, "Composition and budget".

use serde::{Deserialize, Serialize};

/// A turn within this share of its context limit is near it (`show` marks it, the UI shades it).
pub const NEAR_LIMIT: f64 = 0.9;

/// The prompt's tokens by part, how they were counted, and the context limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Composition {
    /// The prompt's tokens: the sum of `parts`.
    pub total: u64,
    /// Who counted: `tokenizer` (the local tokenizer, part by part), `upstream` (the engine's count
    /// of the whole prompt, split by bytes), `engine_usage` (the engine's reported prompt tokens,
    /// split by bytes) or `bytes` (no count: about 4 bytes a token).
    pub method: String,
    /// True when any part is an estimate (a split by bytes, or images at a fixed cost).
    pub estimated: bool,
    pub parts: Parts,
    /// The context limit known for the turn; absent when neither the engine nor `--context-limit`
    /// gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<ContextLimit>,
}

/// Tokens of each part of a prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Parts {
    /// System and developer messages, and harness reminders (`<system-reminder>`).
    pub system: u64,
    /// The request's tool definitions.
    pub tools: u64,
    /// Tool outputs (`tool` messages, Anthropic `tool_result` blocks, Responses `function_call_output`).
    pub tool_results: u64,
    pub user: u64,
    /// Assistant messages (their text and tool calls), without their reasoning.
    pub assistant: u64,
    /// Reasoning the request carries (`reasoning_content`, `thinking` blocks, Responses reasoning items).
    pub reasoning: u64,
    /// Images and other media parts, at a fixed estimate each.
    pub images: u64,
    /// Compaction summaries standing in for earlier turns.
    pub summary: u64,
    /// Template overhead (BOS, the generation prompt) and messages of no other kind.
    pub other: u64,
}

impl Parts {
    /// The parts' names, in display order.
    pub const NAMES: [&'static str; 9] =
        ["system", "tools", "tool_results", "user", "assistant", "reasoning", "images", "summary", "other"];

    /// Each part with its name, in display order.
    pub fn list(&self) -> [(&'static str, u64); 9] {
        let values =
            [self.system, self.tools, self.tool_results, self.user, self.assistant, self.reasoning, self.images, self.summary, self.other];
        std::array::from_fn(|i| (Self::NAMES[i], values[i]))
    }

    /// The part named `name` (0 for an unknown name).
    pub fn get(&self, name: &str) -> u64 {
        self.list().into_iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| v)
    }

    pub fn sum(&self) -> u64 {
        self.list().iter().map(|(_, v)| v).sum()
    }
}

/// A context limit and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextLimit {
    pub tokens: u64,
    /// The engine fingerprint's field (`props.default_generation_settings.n_ctx`,
    /// `models.data.0.max_model_len`, ...) or `--context-limit`.
    pub source: String,
}

impl Composition {
    /// The prompt's share of the context limit (None without a limit).
    pub fn pressure(&self) -> Option<f64> {
        self.limit.as_ref().filter(|l| l.tokens > 0).map(|l| self.total as f64 / l.tokens as f64)
    }

    /// Whether the prompt is within 10% of the limit (or past it).
    pub fn near_limit(&self) -> bool {
        self.pressure().is_some_and(|p| p >= NEAR_LIMIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_list_sum_and_pressure() {
        let parts = Parts { system: 10, tools: 20, reasoning: 5, other: 1, ..Parts::default() };
        assert_eq!(parts.sum(), 36);
        assert_eq!(parts.get("tools"), 20);
        assert_eq!(parts.get("nonsense"), 0);
        assert_eq!(parts.list().map(|(n, _)| n), Parts::NAMES);
        let limit = |tokens| Some(ContextLimit { tokens, source: "--context-limit".into() });
        let mut c = Composition { total: 36, method: "bytes".into(), estimated: true, parts, limit: limit(40) };
        assert_eq!(c.pressure(), Some(0.9));
        assert!(c.near_limit());
        c.limit = limit(41);
        assert!(!c.near_limit());
        c.limit = None;
        assert_eq!((c.pressure(), c.near_limit()), (None, false));
        // Records written before the field existed, and a composition without a limit, load.
        let old: Composition = serde_json::from_str(r#"{"total":3,"method":"bytes","estimated":true,"parts":{"user":3}}"#).unwrap();
        assert_eq!((old.parts.user, old.limit), (3, None));
    }
}
