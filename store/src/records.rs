//! The record kinds kept in the store. Their JSON form is the stable output of `ctxscope show --json`
//! and of the export format (see docs/capture.md); add fields with `#[serde(default)]`, never rename.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Hex form of a [`crate::Hash`] as it appears in records.
pub type HashHex = String;

/// Which API shape a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    AnthropicMessages,
    /// Ollama's native `/api/chat` (NDJSON streaming).
    OllamaChat,
    /// OpenAI's Responses API, `/v1/responses` (input items mapped to chat-shaped messages).
    Responses,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::AnthropicMessages => "anthropic_messages",
            Endpoint::OllamaChat => "ollama_chat",
            Endpoint::Responses => "responses",
        }
    }
}

/// How much of a turn's text the capture kept (`--capture`; docs/capture.md, "Privacy levels").
/// Ordered by what is withheld: a conversation records the most withholding level of its turns.
/// Message hashes are always those of the messages as sent, whatever the level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureLevel {
    /// Every message and reply as sent and received (records from before the levels read as this).
    #[default]
    Full,
    /// Text kept with secrets and personal data masked (`[redacted:KIND]`).
    Redacted,
    /// No text at all: message hashes, sizes, counts, timings, usage, findings without excerpts.
    Hashes,
}

impl CaptureLevel {
    pub const ALL: [CaptureLevel; 3] = [CaptureLevel::Full, CaptureLevel::Redacted, CaptureLevel::Hashes];

    pub fn as_str(self) -> &'static str {
        match self {
            CaptureLevel::Full => "full",
            CaptureLevel::Redacted => "redacted",
            CaptureLevel::Hashes => "hashes",
        }
    }

    /// Whether the text was kept as it was.
    pub fn is_full(&self) -> bool {
        *self == CaptureLevel::Full
    }
}

impl std::fmt::Display for CaptureLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CaptureLevel {
    type Err = String;

    fn from_str(text: &str) -> Result<CaptureLevel, String> {
        CaptureLevel::ALL
            .into_iter()
            .find(|level| level.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not a capture level; use full, redacted or hashes"))
    }
}

/// Token usage as the engine reported it, normalised; `source` names the form it came in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Forms seen: `openai`, `llama.cpp_timings`, `ollama`, `anthropic`.
    #[serde(default)]
    pub sources: Vec<String>,
}

/// Token counts computed locally with the configured tokenizer and chat template.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalTokens {
    /// Whole prompt as the engine should see it (template, generation prompt, BOS).
    pub prompt: u64,
    /// Per message in `new_messages` (the delta against `base`), in order.
    pub new_messages: Vec<u32>,
    /// Who counted: the tokenizer's file name, or `upstream:llama.cpp` / `upstream:vllm` /
    /// `upstream:sglang` / `upstream:ctxscope` when the engine's own endpoints did (`--count-with`).
    pub tokenizer: String,
}

/// Timings measured by the proxy, in microseconds from the moment the request arrived.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Upstream response headers received.
    pub headers_us: Option<u64>,
    /// First response body byte received.
    pub ttfb_us: Option<u64>,
    /// Response body finished (or the exchange ended).
    pub total_us: u64,
}

/// How a turn relates to what was captured before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Relation {
    /// First turn of a new conversation.
    New,
    /// Extends the previous turn's messages (plus its reply, usually).
    Extend { parent_turn: u64 },
    /// Sends exactly the messages of an earlier turn again.
    Regenerate { turn: u64 },
    /// Shares a prefix with an earlier conversation, then diverges: recorded as a new conversation.
    Branch { conversation: u64, turn: u64, shared_messages: u32 },
    /// Continues a conversation (named by header, or carrying its latest reply) without extending its
    /// previous turn: the history before was removed or rewritten.
    Diverged { previous_turn: u64, shared_messages: u32 },
}

/// The first `len` messages of this turn are the first `len` of `turn`'s messages followed by its reply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BaseRef {
    pub turn: u64,
    pub len: u32,
}

/// One request/response exchange. Message lists are stored as a delta against `base`, so a
/// conversation's storage grows with its length, not its square.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub id: u64,
    pub conversation: u64,
    /// Position in the conversation, from 0.
    pub index: u32,
    pub relation: Relation,
    pub time_unix_ms: u64,
    pub upstream: String,
    pub endpoint: Endpoint,
    pub method: String,
    pub path: String,
    pub model: Option<String>,
    pub status: u16,
    pub stream: bool,
    /// Sampling parameters as sent (temperature, top_p, max_tokens, seed, ...).
    #[serde(default)]
    pub params: Map<String, Value>,
    pub base: Option<BaseRef>,
    /// Hashes of the request messages after the `base` prefix (hex in JSON; raw on disk, see `codec`).
    #[serde(with = "crate::hash::hex_list")]
    pub new_messages: Vec<crate::Hash>,
    pub message_count: u32,
    /// Chain hash over all request messages.
    pub head: HashHex,
    /// Hash of the reply message, when there was one.
    pub reply: Option<HashHex>,
    /// Chain hash over the request messages followed by the reply.
    pub tail: Option<HashHex>,
    pub local_tokens: Option<LocalTokens>,
    pub usage: Option<Usage>,
    /// The prompt's tokens by part and the context limit known for the turn (docs/capture.md,
    /// "Composition and budget"). None: captured before compositions were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composition: Option<crate::composition::Composition>,
    pub timing: Timing,
    /// SSE events (streaming) or body frames (otherwise) in the response.
    pub chunks: u32,
    pub request_bytes: u64,
    pub response_bytes: u64,
    pub reply_text: String,
    pub finish_reason: Option<String>,
    /// Upstream error text, client disconnect, stream cut short.
    pub error: Option<String>,
    /// Things the capture could not fully understand.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The tool definitions sent, by digest (templates render them ahead of the messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsDigest>,
    /// Responses API turns only: the response id and how the turn chains (`previous_response_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responses: Option<ResponsesInfo>,
    /// The engine fingerprint the upstream reported when this turn was captured (its hash; see
    /// `Store::fingerprint`). None: not probed yet, or fingerprinting off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<HashHex>,
    /// How much of this turn's text was kept (`--capture`); records from before the levels: full.
    /// Below full, `new_messages` and `reply` are still the hashes of the messages as sent.
    #[serde(default)]
    pub capture: CaptureLevel,
}

/// What a Responses API turn adds to a chat turn (see docs/capture.md, "The Responses API").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesInfo {
    /// The response's `id` as the upstream returned it (indexed: `Store::turn_by_response_id`).
    #[serde(default)]
    pub response_id: Option<String>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// The turn that produced `previous_response_id`, when the proxy captured it.
    #[serde(default)]
    pub parent_turn: Option<u64>,
    /// `previous_response_id` names a response the proxy never captured: the context before this
    /// request's own input is unknown (the turn starts a conversation; nothing is guessed).
    #[serde(default)]
    pub parent_unknown: bool,
    /// The first message is the request's `instructions` (not carried to later responses).
    #[serde(default)]
    pub instructions: bool,
    /// Messages taken from the stored chain ahead of this request's own input.
    #[serde(default)]
    pub chain_messages: u32,
    /// Messages from this request's own `input`.
    #[serde(default)]
    pub input_messages: u32,
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub store: Option<bool>,
    /// The request's `conversation` (an id or `{"id": ...}`), as sent.
    #[serde(default)]
    pub conversation: Option<Value>,
    /// Input items the engine said it dropped to fit (`truncation: "auto"`), as it listed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_items: Option<Value>,
}

/// Tool definitions in brief: a hash of their canonical JSON and their names in the order sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolsDigest {
    pub hash: HashHex,
    pub names: Vec<String>,
}

/// Where a branch left its parent conversation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BranchRef {
    pub conversation: u64,
    pub turn: u64,
    pub shared_messages: u32,
}

/// A thread of turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationRecord {
    pub id: u64,
    /// Name given by header (`x-ctxscope-conversation` or the configured session header).
    pub name: Option<String>,
    pub created_unix_ms: u64,
    pub updated_unix_ms: u64,
    pub upstream: String,
    pub model: Option<String>,
    pub turns: u32,
    pub last_turn: u64,
    pub last_head: HashHex,
    pub last_message_count: u32,
    pub last_tail: Option<HashHex>,
    pub branch_of: Option<BranchRef>,
    /// Hash of the latest turn's reply message, when it had one.
    #[serde(default)]
    pub last_reply: Option<HashHex>,
    /// The most withholding capture level of its turns (`--capture`); records from before: full.
    #[serde(default)]
    pub capture: CaptureLevel,
}

/// Index entry: the first turn whose message list had this chain hash as a prefix of `len` messages.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefixEntry {
    pub conversation: u64,
    pub turn: u64,
    pub len: u32,
}

/// A turn with its full message list resolved, as `show` and export present it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnView {
    #[serde(flatten)]
    pub turn: TurnRecord,
    /// Hashes of all request messages in order.
    pub messages: Vec<HashHex>,
}

/// A conversation with its turns and every message they reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationDetail {
    pub conversation: ConversationRecord,
    pub turns: Vec<TurnView>,
    /// Message hash -> canonical message.
    pub messages: std::collections::BTreeMap<HashHex, Value>,
    /// What the detectors found in this conversation, oldest first.
    #[serde(default)]
    pub findings: Vec<FindingRecord>,
}

/// The kinds of finding, stable identifiers (documented with examples in docs/findings.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The client's request does not extend the previous turn: earlier turns removed, rewritten or summarized.
    HistoryDropped,
    /// The engine processed fewer prompt tokens than it was sent.
    EngineTruncation,
    /// The engine refused the prompt for its length.
    ContextOverflow,
    /// The engine reports more cached tokens than any earlier prompt could have supplied.
    PhantomCacheReuse,
    /// The engine reused far less of the prompt than a recent request left in its cache.
    CacheMiss,
    /// The reply denies context that the request carries.
    AmnesiaReply,
    /// Local and engine token counts disagree steadily: wrong tokenizer or chat template configured.
    TokenCountDrift,
    /// The engine serving the conversation reports different settings than for its previous turn.
    EngineChanged,
}

impl FindingKind {
    pub const ALL: [FindingKind; 8] = [
        FindingKind::HistoryDropped,
        FindingKind::EngineTruncation,
        FindingKind::ContextOverflow,
        FindingKind::PhantomCacheReuse,
        FindingKind::CacheMiss,
        FindingKind::AmnesiaReply,
        FindingKind::TokenCountDrift,
        FindingKind::EngineChanged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::HistoryDropped => "history_dropped",
            FindingKind::EngineTruncation => "engine_truncation",
            FindingKind::ContextOverflow => "context_overflow",
            FindingKind::PhantomCacheReuse => "phantom_cache_reuse",
            FindingKind::CacheMiss => "cache_miss",
            FindingKind::AmnesiaReply => "amnesia_reply",
            FindingKind::TokenCountDrift => "token_count_drift",
            FindingKind::EngineChanged => "engine_changed",
        }
    }

    pub fn parse(text: &str) -> Option<FindingKind> {
        FindingKind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// How bad a finding is: `critical` means the model did not see (or saw the wrong) context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Critical];

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One diagnosis: a stable kind, a severity, the turn that raised it, and the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingRecord {
    pub id: u64,
    pub kind: FindingKind,
    pub severity: Severity,
    pub time_unix_ms: u64,
    pub upstream: String,
    pub model: Option<String>,
    pub conversation: u64,
    pub turn: u64,
    /// The turn's position in its conversation.
    pub turn_index: u32,
    /// One line for people.
    pub summary: String,
    /// Kind-specific facts (counts, positions, the message that changed); see docs/findings.md.
    pub evidence: Value,
    /// What makes two findings the same cause: a cause is raised once, not on every turn that inherits it.
    pub cause: String,
}

/// A stored replay run: a small header for listings and the full report (the replay crate's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayEntry {
    pub id: u64,
    pub conversation: u64,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    /// Target names, golden first.
    pub targets: Vec<String>,
    /// One line for listings ("3 targets, 12 turns, culprit kv_fp8").
    pub summary: String,
    /// The whole report; `Null` in listings.
    #[serde(default)]
    pub report: Value,
}
