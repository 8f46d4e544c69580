//! The replay orchestrator: every (target, turn) request of a [`Plan`], the golden target's too, run
//! teacher-forced with bounded concurrency per target (turns in parallel), then each turn's probes;
//! results reused from an earlier report, compared with golden and with the capture as they come in
//! (see [`crate::collect`]), reported to an [`Observer`], and stopped cleanly on cancel.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctxscope_store::ConversationDetail;
use serde_json::Value;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::client::{ChatRequest, ClientError, TargetClient};
use crate::collect::{Collector, Unit};
use crate::compare::DEFAULT_NEAR_TIE;
use crate::conversation::{Conversation, TurnRequest};
use crate::model::{CapturedFingerprint, Outcome, ProbeResult, ProbeSpec, ReplayReport, TargetKind, TargetSpec, TurnResult, REPORT_SCHEMA};

/// How requests are made.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// Generated tokens per request (the captured `max_tokens` when smaller).
    pub max_tokens: u64,
    pub seed: u64,
    /// Alternatives per generated token.
    pub top_logprobs: u32,
    /// Requests in flight per target.
    pub concurrency: usize,
    /// Per request, connection included.
    pub timeout: Duration,
    /// Near-tie threshold in nats (see [`DEFAULT_NEAR_TIE`]).
    pub near_tie: f64,
    /// Replay only these turn indexes (all replayable turns when None).
    pub turns: Option<Vec<u32>>,
}

impl Default for ReplayOptions {
    fn default() -> ReplayOptions {
        ReplayOptions {
            max_tokens: 64,
            seed: 0,
            top_logprobs: 5,
            concurrency: 2,
            timeout: Duration::from_secs(120),
            near_tie: DEFAULT_NEAR_TIE,
            turns: None,
        }
    }
}

/// What to replay, where, and what to ask afterwards.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Report id (the CLI's sequence number; kept as is).
    pub id: u64,
    pub conversation: ConversationDetail,
    /// The reference every other target is compared with (also replayed).
    pub golden: TargetSpec,
    /// The targets under test; one equal to `golden` is dropped.
    pub targets: Vec<TargetSpec>,
    pub probes: Vec<ProbeSpec>,
    pub options: ReplayOptions,
}

impl Plan {
    /// A plan with default options, no other target and no probes.
    pub fn new(conversation: ConversationDetail, golden: TargetSpec) -> Plan {
        Plan { id: 0, conversation, golden, targets: Vec::new(), probes: Vec::new(), options: ReplayOptions::default() }
    }

    /// Golden first, then the other targets in order (a copy of golden dropped).
    pub fn all_targets(&self) -> Vec<TargetSpec> {
        let mut all = vec![self.golden.clone()];
        all.extend(self.targets.iter().filter(|t| **t != self.golden).cloned());
        all
    }
}

/// Where engine targets without a `url` and launch targets are reached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Endpoints {
    /// Base URL of the in-process engine (`http://127.0.0.1:PORT`).
    pub engine_url: Option<String>,
    /// Base URL of each running launched engine, by target name (filled by [`crate::launch`]).
    pub launched: BTreeMap<String, String>,
    /// Where launched engines' logs go (`<dir>/<run id>/<target>.stdout.log`); a temporary
    /// directory when None.
    pub launch_dir: Option<PathBuf>,
}

impl Endpoints {
    /// The in-process engine only.
    pub fn engine(url: Option<String>) -> Endpoints {
        Endpoints { engine_url: url, ..Endpoints::default() }
    }

    /// The folder launched engines' logs go under (`launch_dir`, else a temporary one).
    pub fn launch_logs(&self) -> PathBuf {
        self.launch_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("ctxscope-launches"))
    }

    /// The local base URL `target` is reached at, if it has one (see [`TargetClient::new`]).
    pub fn local_url(&self, target: &TargetSpec) -> Option<&str> {
        match &target.kind {
            TargetKind::Launch { .. } => self.launched.get(&target.name).map(String::as_str),
            _ => self.engine_url.as_deref(),
        }
    }
}

/// Told about every turn result as it completes (reused ones first). Called from the replay's task,
/// so keep it quick.
pub trait Observer: Send + Sync {
    fn on_result(&self, result: &TurnResult, done: usize, total: usize);
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {
    fn on_result(&self, _: &TurnResult, _: usize, _: usize) {}
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("two targets are named `{name}`; give one a different name=")]
    DuplicateTarget { name: String },
    #[error("conversation {conversation} has nothing to replay: {}", if notes.is_empty() { "it has no turns".to_string() } else { notes.join("; ") })]
    NothingToReplay { conversation: u64, notes: Vec<String> },
    #[error("turn {turn} is not a replayable turn of this conversation (replayable: {available:?})")]
    UnknownTurn { turn: u32, available: Vec<u32> },
    #[error("a probe is set after turn {turn}, which this replay does not run")]
    ProbeTurn { turn: u32 },
    #[error("concurrency must be at least 1")]
    Concurrency,
    #[error("{0}")]
    Profile(String),
    #[error("the golden target `{target}` could not be started, so nothing can be compared: {error}")]
    Launch { target: String, error: String },
    #[error(
        "conversation {conversation} was captured with --capture hashes: no message text was stored for its turn(s) {turns:?}, so it cannot be replayed (capture with --capture full or redacted to replay)"
    )]
    TextWithheld { conversation: u64, turns: Vec<u32> },
}

/// Generation settings shared by every request of a run.
#[derive(Debug, Clone, Copy)]
struct Settings {
    max_tokens: u64,
    seed: u64,
    top_logprobs: u32,
}

/// One target's client and its concurrency bound.
struct Lane {
    client: TargetClient,
    permits: Semaphore,
}

/// Replays the plan with every target reachable as it is (launch targets already running, see
/// [`crate::launch::replay`], which callers use). Results present in `resume` for the same target
/// (same name and spec) and turn, with an Ok outcome and every probe answered, are reused; a target
/// needs to be reachable only when something of it is not. A cancel stops new requests, waits for
/// those in flight, and returns what finished with `interrupted: true`.
pub(crate) async fn replay_reachable(
    plan: &Plan,
    endpoints: &Endpoints,
    observer: &dyn Observer,
    cancel: watch::Receiver<bool>,
    resume: Option<&ReplayReport>,
) -> Result<ReplayReport, PlanError> {
    let started_unix_ms = resume.map_or_else(now_ms, |r| r.started_unix_ms);
    let targets = plan.all_targets();
    check_names(&targets)?;
    let conversation = Arc::new(select_turns(plan)?);
    if plan.options.concurrency == 0 {
        return Err(PlanError::Concurrency);
    }
    let mut lanes: Vec<Option<Arc<Lane>>> = vec![None; targets.len()];
    let settings = Settings { max_tokens: plan.options.max_tokens, seed: plan.options.seed, top_logprobs: plan.options.top_logprobs };
    let mut collector = Collector::new(&conversation, targets.iter().map(|t| t.name.clone()).collect(), plan.options.near_tie);
    let total = targets.len() * conversation.turns.len();
    let mut jobs = JoinSet::new();
    let mut keys = HashMap::new();
    for (target, spec) in targets.iter().enumerate() {
        for (position, turn) in conversation.turns.iter().enumerate() {
            let probes: Vec<ProbeSpec> = plan.probes.iter().filter(|p| p.after_turn == turn.turn).cloned().collect();
            if let Some(done) = reusable(resume, spec, turn.turn, probes.len()) {
                collector.add(Unit { target, turn: turn.turn, outcome: done.outcome.clone(), probes: done.probes.clone() });
                continue;
            }
            let lane = match &lanes[target] {
                Some(lane) => lane.clone(),
                None => lanes[target].insert(lane(spec, endpoints, &plan.options)?).clone(),
            };
            let job = run_unit(lane, conversation.clone(), position, probes, settings, cancel.clone());
            let id = jobs.spawn(job).id();
            keys.insert(id, (target, turn.turn));
        }
    }
    let mut interrupted = false;
    let mut results = report_ready(&mut collector, observer, total);
    while let Some(joined) = jobs.join_next_with_id().await {
        let (key, answer) = match joined {
            Ok((id, answer)) => (keys.get(&id).copied(), answer),
            Err(error) => (keys.get(&error.id()).copied(), Some(panicked(&error))),
        };
        let Some((target, turn)) = key else { continue };
        match answer {
            Some((outcome, probes, complete)) => {
                interrupted |= !complete;
                collector.add(Unit { target, turn, outcome, probes });
            }
            None => interrupted = true,
        }
        results.extend(report_ready(&mut collector, observer, total));
    }
    collector.flush();
    results.extend(report_ready(&mut collector, observer, total));
    results.sort_by_key(|r| (r.turn, targets.iter().position(|t| t.name == r.target)));
    Ok(ReplayReport {
        schema: REPORT_SCHEMA,
        id: plan.id,
        conversation: plan.conversation.conversation.id,
        started_unix_ms,
        finished_unix_ms: now_ms(),
        golden: plan.golden.name.clone(),
        // Stored, printed and rendered: header values and URL passwords never leave the process.
        targets: targets.iter().map(TargetSpec::redacted).collect(),
        turns: conversation.total_turns,
        results,
        bisect: None,
        interrupted,
        captured_fingerprints: plan
            .conversation
            .turns
            .iter()
            .filter_map(|v| v.turn.fingerprint.clone().map(|fingerprint| CapturedFingerprint { turn: v.turn.index, fingerprint }))
            .collect(),
        launches: Vec::new(),
    })
}

/// Completed results, each told to the observer.
fn report_ready(collector: &mut Collector, observer: &dyn Observer, total: usize) -> Vec<TurnResult> {
    let ready = collector.take_ready();
    for result in &ready {
        collector.done += 1;
        observer.on_result(result, collector.done, total);
    }
    ready
}

fn panicked(error: &tokio::task::JoinError) -> (Outcome, Vec<ProbeResult>, bool) {
    (Outcome::Failed { error: format!("the replay task failed: {error}"), status: None }, Vec::new(), true)
}

/// Refuses a conversation captured without text: nothing of it can be sent again (an empty or
/// partial replay would compare nothing).
pub fn check_text(detail: &ctxscope_store::ConversationDetail) -> Result<(), PlanError> {
    let turns = crate::conversation::textless_turns(detail);
    if turns.is_empty() && detail.conversation.capture != ctxscope_store::CaptureLevel::Hashes {
        return Ok(());
    }
    Err(PlanError::TextWithheld { conversation: detail.conversation.id, turns })
}

fn check_names(targets: &[TargetSpec]) -> Result<(), PlanError> {
    for (i, target) in targets.iter().enumerate() {
        if targets[..i].iter().any(|t| t.name == target.name) {
            return Err(PlanError::DuplicateTarget { name: target.name.clone() });
        }
    }
    Ok(())
}

/// The replayable turns the options select; every probe must follow one of them.
fn select_turns(plan: &Plan) -> Result<Conversation, PlanError> {
    check_text(&plan.conversation)?;
    let mut conversation = Conversation::from_detail(&plan.conversation);
    for note in &conversation.notes {
        tracing::info!(conversation = conversation.id, "{note}");
    }
    if let Some(wanted) = &plan.options.turns {
        let available: Vec<u32> = conversation.turns.iter().map(|t| t.turn).collect();
        if let Some(turn) = wanted.iter().find(|t| !available.contains(t)) {
            return Err(PlanError::UnknownTurn { turn: *turn, available });
        }
        conversation.turns.retain(|t| wanted.contains(&t.turn));
    }
    if conversation.turns.is_empty() {
        return Err(PlanError::NothingToReplay { conversation: conversation.id, notes: conversation.notes });
    }
    if let Some(probe) = plan.probes.iter().find(|p| conversation.turn(p.after_turn).is_none()) {
        return Err(PlanError::ProbeTurn { turn: probe.after_turn });
    }
    Ok(conversation)
}

fn lane(target: &TargetSpec, endpoints: &Endpoints, options: &ReplayOptions) -> Result<Arc<Lane>, PlanError> {
    let client = TargetClient::new(target, endpoints.local_url(target), options.timeout)?;
    Ok(Arc::new(Lane { client, permits: Semaphore::new(options.concurrency) }))
}

/// `report` with every target and result of `runs` added (targets it already has are kept as they
/// are), results ordered by turn, then target.
pub(crate) fn merge(mut report: ReplayReport, runs: Vec<ReplayReport>) -> ReplayReport {
    for run in runs {
        for target in run.targets {
            if report.targets.iter().any(|k| k.name == target.name) {
                continue;
            }
            let name = target.name.clone();
            report.results.extend(run.results.iter().filter(|r| r.target == name).cloned());
            report.targets.push(target);
        }
        report.launches.extend(run.launches);
        report.interrupted |= run.interrupted;
        report.finished_unix_ms = report.finished_unix_ms.max(run.finished_unix_ms);
    }
    let order: Vec<String> = report.targets.iter().map(|t| t.name.clone()).collect();
    report.results.sort_by_key(|r| (r.turn, order.iter().position(|n| *n == r.target)));
    report
}

/// An earlier result worth keeping: same target spec, Ok, and all of its probes answered.
pub(crate) fn reusable<'a>(resume: Option<&'a ReplayReport>, spec: &TargetSpec, turn: u32, probes: usize) -> Option<&'a TurnResult> {
    let report = resume?;
    report.targets.iter().find(|t| t.name == spec.name).filter(|t| **t == spec.redacted())?;
    report
        .results
        .iter()
        .find(|r| r.target == spec.name && r.turn == turn && matches!(r.outcome, Outcome::Ok(_)) && r.probes.len() == probes)
}

/// One turn on one target, then its probes. None when cancelled before it started; `false` in the
/// answer when cancelled between probes (the missing ones are not run).
async fn run_unit(
    lane: Arc<Lane>,
    conversation: Arc<Conversation>,
    position: usize,
    probes: Vec<ProbeSpec>,
    settings: Settings,
    cancel: watch::Receiver<bool>,
) -> Option<(Outcome, Vec<ProbeResult>, bool)> {
    let _permit = lane.permits.acquire().await.ok()?;
    if *cancel.borrow() {
        return None;
    }
    let turn = &conversation.turns[position];
    let outcome = lane.client.chat(&chat_request(turn, &turn.messages, settings)).await;
    let mut results = Vec::with_capacity(probes.len());
    for probe in probes {
        if *cancel.borrow() {
            return Some((outcome, results, false));
        }
        let outcome = match &outcome {
            Outcome::Ok(_) => lane.client.chat(&chat_request(turn, &turn.probe_messages(&probe.question), settings)).await,
            Outcome::Failed { .. } => Outcome::Failed { error: "not run: the turn's own request failed".into(), status: None },
        };
        let passed = matches!(&outcome, Outcome::Ok(reply) if contains_ignoring_case(&reply.text, &probe.expected));
        results.push(ProbeResult { probe, outcome, passed });
    }
    Some((outcome, results, true))
}

fn chat_request<'a>(turn: &'a TurnRequest, messages: &'a [Value], settings: Settings) -> ChatRequest<'a> {
    ChatRequest {
        messages,
        model: turn.model.as_deref(),
        params: &turn.params,
        max_tokens: turn.captured_max_tokens.map_or(settings.max_tokens, |m| m.clamp(1, settings.max_tokens.max(1))),
        seed: settings.seed,
        top_logprobs: settings.top_logprobs,
    }
}

fn contains_ignoring_case(text: &str, expected: &str) -> bool {
    text.to_lowercase().contains(&expected.to_lowercase())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::tests::detail;

    fn plan(turns: u32) -> Plan {
        Plan::new(detail(turns), TargetSpec::parse("engine").unwrap())
    }

    #[test]
    fn golden_is_first_and_not_repeated() {
        let mut p = plan(1);
        p.targets = vec![TargetSpec::parse("engine").unwrap(), TargetSpec::parse("engine:patches=kv_fp8").unwrap()];
        let names: Vec<String> = p.all_targets().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["golden", "engine:kv_fp8"]);
        p.targets.push(TargetSpec::parse("http://h:1,name=golden").unwrap());
        assert!(matches!(check_names(&p.all_targets()), Err(PlanError::DuplicateTarget { .. })));
    }

    #[test]
    fn turn_filter_and_probes_are_checked() {
        let mut p = plan(3);
        p.options.turns = Some(vec![0, 2]);
        assert_eq!(select_turns(&p).unwrap().turns.iter().map(|t| t.turn).collect::<Vec<_>>(), [0, 2]);
        p.probes = vec![ProbeSpec { after_turn: 1, question: "q".into(), expected: "a".into() }];
        assert!(matches!(select_turns(&p), Err(PlanError::ProbeTurn { turn: 1 })));
        p.options.turns = Some(vec![5]);
        assert!(matches!(select_turns(&p), Err(PlanError::UnknownTurn { turn: 5, .. })));
        let empty = plan(0);
        let e = select_turns(&empty).unwrap_err();
        assert!(e.to_string().contains("no turns"), "{e}");
    }

    #[test]
    fn max_tokens_is_the_smaller_of_capture_and_option() {
        let c = Conversation::from_detail(&detail(1));
        let settings = Settings { max_tokens: 64, seed: 0, top_logprobs: 5 };
        assert_eq!(chat_request(&c.turns[0], &[], settings).max_tokens, 32);
        let settings = Settings { max_tokens: 8, ..settings };
        assert_eq!(chat_request(&c.turns[0], &[], settings).max_tokens, 8);
    }

    #[tokio::test]
    async fn an_engine_target_without_an_engine_is_an_error() {
        let (_tx, rx) = watch::channel(false);
        let e = replay_reachable(&plan(1), &Endpoints::default(), &Quiet, rx, None).await.unwrap_err();
        assert!(matches!(e, PlanError::Client(ClientError::NoEngine { .. })), "{e}");
    }

    #[test]
    fn probes_match_ignoring_case() {
        assert!(contains_ignoring_case("The word was PAPAYA.", "papaya"));
        assert!(!contains_ignoring_case("no idea", "papaya"));
    }
}
