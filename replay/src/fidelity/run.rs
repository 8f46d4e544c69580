//! Runs a sweep: every generated conversation on every target (golden first), one request per probe
//! (the whole conversation, then the question), answers checked against the planted facts. Targets
//! are asked one conversation at a time, so an engine's prefix cache serves the probes after the first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map};

use super::gen::{self, SweepConversation};
use crate::client::{ChatRequest, ClientError, TargetClient};
use crate::launch;
use crate::model::{LaunchRecord, Outcome, TargetSpec};
use crate::run::Endpoints;

/// The sweep's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepOptions {
    pub seed: u64,
    /// Conversation sizes in tokens (approximate).
    pub lengths: Vec<usize>,
    /// User/assistant exchanges per conversation.
    pub turns: Vec<u32>,
    /// Where facts are planted, 0 (first turn) to 1 (last turn).
    pub depths: Vec<f64>,
    /// Generated tokens per answer.
    pub max_tokens: u64,
    pub timeout: Duration,
}

impl Default for SweepOptions {
    fn default() -> SweepOptions {
        SweepOptions {
            seed: 0,
            lengths: vec![512, 1024, 2048],
            turns: vec![4],
            depths: vec![0.0, 0.5, 1.0],
            max_tokens: 16,
            timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the sweep is empty: give at least one length, one turn count and one depth")]
    Empty,
    #[error("two targets are named `{0}`; give one a different name=")]
    DuplicateTarget(String),
    #[error("bisect: {0}")]
    Bisect(String),
    #[error("{0}")]
    Launch(String),
}

/// One probe on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeAnswer {
    pub fact: String,
    pub passed: bool,
    /// The answer text, or the error.
    pub answer: String,
    pub prompt_tokens: Option<u64>,
}

/// Recall of one target on one conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub target: String,
    pub length: usize,
    pub turns: u32,
    pub depth: f64,
    /// Probes passed / probes asked.
    pub recall: f64,
    /// The golden target's recall on the same conversation.
    pub golden: f64,
    /// Prompt tokens the target reported for the first probe (the real size of the conversation).
    pub prompt_tokens: Option<u64>,
    pub answers: Vec<ProbeAnswer>,
}

/// A whole sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelityReport {
    pub seed: u64,
    /// Target names, golden first.
    pub targets: Vec<String>,
    pub lengths: Vec<usize>,
    pub turns: Vec<u32>,
    pub depths: Vec<f64>,
    pub cells: Vec<Cell>,
    /// The generated conversations, with their probes (replayable).
    pub conversations: Vec<SweepConversation>,
    pub wall_s: f64,
    /// Every engine started from a launch profile for this sweep.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub launches: Vec<LaunchRecord>,
}

/// Builds the conversations of `options`.
pub fn conversations(options: &SweepOptions) -> Vec<SweepConversation> {
    let mut list = Vec::new();
    for &length in &options.lengths {
        for &turns in &options.turns {
            for &depth in &options.depths {
                list.push(gen::conversation(options.seed, length, turns, depth));
            }
        }
    }
    list
}

/// Runs the sweep; `progress` hears each finished cell. Golden is asked first on every conversation,
/// then each target in turn; a launch target's engine is started for its turn and stopped after it
/// (one that does not start is recorded in `launches` with its error and has no cells). A golden
/// that does not start is an error.
pub async fn sweep(
    golden: &TargetSpec,
    targets: &[TargetSpec],
    endpoints: &Endpoints,
    options: &SweepOptions,
    progress: &(dyn Fn(&Cell) + Sync),
) -> Result<FidelityReport, SweepError> {
    let started = std::time::Instant::now();
    let convs = conversations(options);
    if convs.is_empty() {
        return Err(SweepError::Empty);
    }
    let mut all = vec![golden.clone()];
    for t in targets.iter().filter(|t| *t != golden) {
        if all.iter().any(|a| a.name == t.name) {
            return Err(SweepError::DuplicateTarget(t.name.clone()));
        }
        all.push(t.clone());
    }
    for target in &all {
        launch::load_for(target).map_err(|e| SweepError::Launch(e.to_string()))?;
    }
    let mut cells: Vec<Cell> = Vec::new();
    let mut launches = Vec::new();
    let mut golden_recall: Option<Vec<f64>> = None;
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let logs = endpoints.launch_logs().join(format!("fidelity-{}", since_epoch.as_millis()));
    for (i, target) in all.iter().enumerate() {
        let asked = Asked { convs: &convs, endpoints, options, golden_recall: golden_recall.as_deref(), logs: &logs };
        let Some(answered) = on_target(target, &asked, progress, &mut launches).await? else {
            if i == 0 {
                let error = launches.last().and_then(|l| l.error.clone()).unwrap_or_default();
                return Err(SweepError::Launch(format!("the golden target `{}` did not start: {error}", target.name)));
            }
            continue;
        };
        if i == 0 {
            golden_recall = Some(answered.iter().map(|c| c.recall).collect());
        }
        cells.extend(answered);
    }
    // Conversation by conversation, targets in order, as the table reads them.
    let position = |c: &Cell| {
        let conv = convs.iter().position(|v| v.length == c.length && v.turns == c.turns && v.depth == c.depth);
        (conv, all.iter().position(|t| t.name == c.target))
    };
    cells.sort_by_key(position);
    Ok(FidelityReport {
        seed: options.seed,
        targets: all.iter().map(|t| t.name.clone()).collect(),
        lengths: options.lengths.clone(),
        turns: options.turns.clone(),
        depths: options.depths.clone(),
        cells,
        conversations: convs,
        wall_s: started.elapsed().as_secs_f64(),
        launches,
    })
}

/// What every target of a sweep is asked, and against what.
struct Asked<'a> {
    convs: &'a [SweepConversation],
    endpoints: &'a Endpoints,
    options: &'a SweepOptions,
    /// Golden's recall per conversation (None while golden itself is asked).
    golden_recall: Option<&'a [f64]>,
    /// Where launched engines' logs go.
    logs: &'a std::path::Path,
}

/// Every conversation on one target (its engine launched around it when it is a launch target):
/// its cells, or None when it did not start.
async fn on_target(
    target: &TargetSpec,
    asked: &Asked<'_>,
    progress: &(dyn Fn(&Cell) + Sync),
    launches: &mut Vec<LaunchRecord>,
) -> Result<Option<Vec<Cell>>, SweepError> {
    let Asked { convs, endpoints, options, golden_recall, logs } = *asked;
    let (never, cancel) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    if launch::is_launch(target) {
        let (started, records) = launch::start_all(std::slice::from_ref(target), logs, &cancel).await;
        launches.extend(records);
        if started.is_empty() {
            return Ok(None);
        }
        running = started;
    }
    let reach = launch::reaching(endpoints, &running);
    let client = TargetClient::new(target, reach.local_url(target), options.timeout);
    let mut cells = Vec::new();
    if let Ok(client) = &client {
        for (index, conv) in convs.iter().enumerate() {
            let answers = ask(client, conv, options).await;
            let recall = answers.iter().filter(|a| a.passed).count() as f64 / answers.len().max(1) as f64;
            let cell = Cell {
                target: target.name.clone(),
                length: conv.length,
                turns: conv.turns,
                depth: conv.depth,
                recall,
                golden: golden_recall.map_or(recall, |g| g[index]),
                prompt_tokens: answers.iter().find_map(|a| a.prompt_tokens),
                answers,
            };
            progress(&cell);
            cells.push(cell);
        }
    }
    launch::stop_all(&mut running).await;
    drop(never);
    client?;
    Ok(Some(cells))
}

async fn ask(client: &TargetClient, conv: &SweepConversation, options: &SweepOptions) -> Vec<ProbeAnswer> {
    let params = Map::new();
    let mut answers = Vec::new();
    for probe in &conv.probes {
        let mut messages = conv.messages.clone();
        messages.push(json!({"role": "user", "content": probe.question}));
        let request = ChatRequest {
            messages: &messages,
            model: None,
            params: &params,
            max_tokens: options.max_tokens,
            seed: options.seed,
            top_logprobs: 0,
        };
        let answer = match client.chat(&request).await {
            Outcome::Ok(reply) => ProbeAnswer {
                fact: probe.fact.clone(),
                passed: gen::passes(probe, &reply.text),
                answer: reply.text,
                prompt_tokens: reply.prompt_tokens,
            },
            Outcome::Failed { error, .. } => {
                ProbeAnswer { fact: probe.fact.clone(), passed: false, answer: format!("error: {error}"), prompt_tokens: None }
            }
        };
        answers.push(answer);
    }
    answers
}
