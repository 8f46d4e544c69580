//! The replay's records: targets, per-turn results, divergence, probes, bisect. Their JSON form is the
//! stable output of `ctxscope replay --json` (docs/replay.md); add fields with `#[serde(default)]`,
//! never rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the JSON report.
pub const REPORT_SCHEMA: u32 = 1;

/// Where a replay sends its requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetSpec {
    /// Short name used in tables and charts (`name=`, else derived from the spec).
    pub name: String,
    pub kind: TargetKind,
    /// Model name sent in the request (`model=`); the captured one when absent.
    #[serde(default)]
    pub model: Option<String>,
    /// Extra request headers (`header=K:V`, repeatable).
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The spec as the user wrote it.
    pub spec: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TargetKind {
    /// This engine under a patch set: in-process (`url` absent) or reached at `url`. The patch set
    /// travels in the `x-ctxscope-patches` header; `path` (golden | fast) in `x-ctxscope-path`.
    Engine { patches: Vec<String>, path: Option<String>, url: Option<String> },
    /// Any OpenAI-compatible endpoint (base URL, `/v1/chat/completions` is appended).
    Url { url: String },
    /// An engine this run starts from a launch profile (see `crate::launch`), with these toggles on,
    /// reached on the port picked for it.
    Launch { profile: String, toggles: Vec<String> },
}

/// One generated token with its logprob and the top alternatives, as the target reported them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenStep {
    pub token: String,
    pub logprob: f64,
    /// (token, logprob), most likely first.
    #[serde(default)]
    pub top: Vec<(String, f64)>,
}

/// A target's answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub text: String,
    /// Empty when the target gives no logprobs.
    #[serde(default)]
    pub tokens: Vec<TokenStep>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    /// Wall time of the request in milliseconds.
    pub wall_ms: f64,
}

/// What came back: a reply, or why not (a dead target, a timeout, a 400 are recorded, not fatal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Ok(Reply),
    Failed { error: String, status: Option<u16> },
}

/// How one reply differs from a reference reply (token level; both greedy, same prompt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// Same text.
    pub exact: bool,
    /// First token position where the two differ (None when one is a prefix of the other and they
    /// have the same length, i.e. exact).
    pub first_diff: Option<usize>,
    /// The reference's top-1 minus top-2 logprob at `first_diff` (needs the reference's logprobs).
    pub margin_at_diff: Option<f64>,
    /// The flip happened where the reference was nearly tied (margin under the near-tie threshold):
    /// not drift.
    pub near_tie: bool,
    /// Positions with the same token, over the longer length.
    pub agreement: f64,
    pub compared_tokens: usize,
    /// Over the positions before `first_diff` where both sides gave logprobs: |logprob difference| of
    /// the chosen token, max and mean.
    pub max_logprob_diff: Option<f64>,
    pub mean_logprob_diff: Option<f64>,
    /// Mean KL(reference || this) over those positions and the first differing one (all follow the
    /// same tokens on both sides), on the top-k alternatives both report (renormalised).
    pub kl_topk: Option<f64>,
}

/// How a replayed reply compares with the captured one (text only: captures keep no logprobs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextMatch {
    pub exact: bool,
    /// Characters the two share from the start.
    pub common_prefix_chars: usize,
    pub captured_chars: usize,
}

/// A recall probe: after turn `after_turn`, ask `question`; passed when the answer contains `expected`
/// (case-insensitive).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeSpec {
    pub after_turn: u32,
    pub question: String,
    pub expected: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    pub probe: ProbeSpec,
    pub outcome: Outcome,
    pub passed: bool,
}

/// One turn on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnResult {
    /// Turn index in the conversation, from 0.
    pub turn: u32,
    /// Target name.
    pub target: String,
    pub outcome: Outcome,
    /// Against the golden target's reply to the same turn (None for the golden target itself, or
    /// when either failed).
    pub vs_golden: Option<Divergence>,
    /// Against the captured reply (None when the capture has no reply for this turn).
    pub vs_captured: Option<TextMatch>,
    #[serde(default)]
    pub probes: Vec<ProbeResult>,
}

/// One step of a bisection: a patch subset, its score and whether it diverges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BisectStep {
    pub patches: Vec<String>,
    pub score: f64,
    pub diverges: bool,
    /// Answered from an earlier step (no replay run).
    pub reused: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BisectReport {
    /// The suspects searched: engine patches, or a launch profile's toggles (see `profile`).
    pub patches: Vec<String>,
    /// The launch profile whose toggles were searched (absent: engine patches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `agreement` (1 - mean token agreement with golden), `probes` (fraction of probes failed),
    /// `exact` (fraction of turns not exactly equal) or `first_diff`.
    pub metric: String,
    pub threshold: f64,
    /// The smallest subset found that still diverges beyond the threshold (empty: the full set did not).
    pub culprit: Vec<String>,
    pub steps: Vec<BisectStep>,
    /// Replays actually run, and what testing every patch alone would have cost for comparison.
    pub replays_run: usize,
    pub naive_replays: usize,
}

/// A whole replay run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub schema: u32,
    pub id: u64,
    pub conversation: u64,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    /// Name of the golden target (also listed in `targets`).
    pub golden: String,
    pub targets: Vec<TargetSpec>,
    /// Turns in the conversation.
    pub turns: u32,
    pub results: Vec<TurnResult>,
    #[serde(default)]
    pub bisect: Option<BisectReport>,
    /// Stopped early (Ctrl-C): what finished is kept.
    #[serde(default)]
    pub interrupted: bool,
    /// The engine fingerprint each captured turn was served under (turns without one left out): what
    /// the replay is compared with. See docs/findings.md, `engine_changed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_fingerprints: Vec<CapturedFingerprint>,
    /// Every engine this run started from a launch profile, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub launches: Vec<LaunchRecord>,
}

/// One engine started from a launch profile: what ran, how long it took to be ready, where its
/// output is, what /proc said about it, and why it failed when it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// The target it served.
    pub target: String,
    pub profile: String,
    pub toggles: Vec<String>,
    /// Secret-looking values redacted.
    pub argv: Vec<String>,
    /// The profile's and the toggles' variables (the rest is inherited), secret-looking values redacted.
    pub env: BTreeMap<String, String>,
    pub port: u16,
    #[serde(default)]
    pub pid: Option<u32>,
    /// Seconds from start to the first passing readiness check.
    #[serde(default)]
    pub startup_s: Option<f64>,
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    /// The live process's fingerprint (argv, env.NAME, lib.NAME, exe; see docs/findings.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fingerprint: BTreeMap<String, String>,
    /// Why it could not be used (it did not start, or was interrupted while starting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The fingerprint hash (`Store::fingerprint`) that served one captured turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedFingerprint {
    pub turn: u32,
    pub fingerprint: String,
}
