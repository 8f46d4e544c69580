//! Runs a sweep: every generated conversation on every target (golden first), one request per probe
//! (the whole conversation, then the question), answers checked against the planted facts. Targets
//! are asked one conversation at a time, so an engine's prefix cache serves the probes after the first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map};

use super::gen::{self, SweepConversation};
use crate::client::{ChatRequest, ClientError, TargetClient};
use crate::model::{Outcome, TargetSpec};

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

/// Runs the sweep; `progress` hears each finished cell.
pub async fn sweep(
    golden: &TargetSpec,
    targets: &[TargetSpec],
    engine_url: Option<&str>,
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
    let clients = all.iter().map(|t| TargetClient::new(t, engine_url, options.timeout)).collect::<Result<Vec<_>, _>>()?;
    let mut cells: Vec<Cell> = Vec::new();
    for conv in &convs {
        let mut golden_recall = 0.0;
        for (i, (target, client)) in all.iter().zip(&clients).enumerate() {
            let answers = ask(client, conv, options).await;
            let recall = answers.iter().filter(|a| a.passed).count() as f64 / answers.len().max(1) as f64;
            if i == 0 {
                golden_recall = recall;
            }
            let cell = Cell {
                target: target.name.clone(),
                length: conv.length,
                turns: conv.turns,
                depth: conv.depth,
                recall,
                golden: golden_recall,
                prompt_tokens: answers.iter().find_map(|a| a.prompt_tokens),
                answers,
            };
            progress(&cell);
            cells.push(cell);
        }
    }
    Ok(FidelityReport {
        seed: options.seed,
        targets: all.iter().map(|t| t.name.clone()).collect(),
        lengths: options.lengths.clone(),
        turns: options.turns.clone(),
        depths: options.depths.clone(),
        cells,
        conversations: convs,
        wall_s: started.elapsed().as_secs_f64(),
    })
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
