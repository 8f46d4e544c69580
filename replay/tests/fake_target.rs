//! Replay end to end against a fake OpenAI-compatible server on a loopback socket
//! (`ctxscope_testkit::FakeUpstream` with the script below): teacher forcing,
//! per-turn failures, timeouts, logprob fallback, cancel, resume, probes and bisection. The fake
//! answers deterministically from the last user message, with logprobs; it diverges when the
//! `x-ctxscope-patches` header lists its fault patch, and can reject or hang on chosen turns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctxscope_replay::{
    bisect, replay, replay_test_conversation, BisectError, Endpoints, Metric, Observer, Outcome, Plan, ProbeSpec, Quiet, ReplayReport,
    TargetSpec, TurnResult,
};
use ctxscope_testkit::{Body, FakeUpstream, Received};
use serde_json::{json, Value};
use tokio::sync::watch;

/// How the fake misbehaves.
#[derive(Default, Clone)]
struct Script {
    /// 400 when the last user message contains this.
    reject: Option<String>,
    /// Never answer when the last user message contains this.
    hang: Option<String>,
    /// 400 on any request asking for logprobs.
    no_logprobs: bool,
    /// Diverge when the patch header lists this patch.
    fault: Option<String>,
    /// 400 ("unknown patch") when the patch header lists this patch.
    unknown_patch: Option<String>,
    /// Delay before every answer.
    delay_ms: u64,
}

#[derive(Default)]
struct Shared {
    script: Mutex<Script>,
}

struct Fake {
    upstream: FakeUpstream,
}

impl Fake {
    async fn start(script: Script) -> Fake {
        let shared = Arc::new(Shared { script: Mutex::new(script) });
        let upstream = FakeUpstream::start(move |received| handle(shared.clone(), received)).await;
        Fake { upstream }
    }

    fn url(&self) -> String {
        self.upstream.url()
    }

    fn endpoints(&self) -> Endpoints {
        Endpoints::engine(Some(self.url()))
    }

    fn count(&self) -> usize {
        self.upstream.received().len()
    }

    /// (patch header, body) of every request received.
    fn requests(&self) -> Vec<(String, Value)> {
        self.upstream
            .received()
            .iter()
            .map(|r| (r.header("x-ctxscope-patches").unwrap_or("<none>").to_string(), r.json().unwrap_or(Value::Null)))
            .collect()
    }
}

fn response(status: u16, body: Value) -> http::Response<Body> {
    ctxscope_testkit::json(status, &body)
}

async fn handle(shared: Arc<Shared>, req: Received) -> http::Response<Body> {
    let body: Value = req.json().unwrap_or(Value::Null);
    let script = shared.script.lock().unwrap().clone();
    tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
    let last_user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    let patches: Vec<String> = req.header("x-ctxscope-patches").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default();
    let listed = |name: &Option<String>| name.as_ref().is_some_and(|n| patches.contains(n));
    if listed(&script.unknown_patch) {
        return response(400, json!({"error": {"message": "unknown patch `typo`", "type": "invalid_request_error"}}));
    }
    if script.reject.as_ref().is_some_and(|r| last_user.contains(r.as_str())) {
        return response(400, json!({"error": {"message": "turn rejected by the fake", "type": "invalid_request_error"}}));
    }
    if script.hang.as_ref().is_some_and(|h| last_user.contains(h.as_str())) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let logprobs = body["logprobs"].as_bool().unwrap_or(false);
    if logprobs && script.no_logprobs {
        return response(400, json!({"error": {"message": "logprobs is not supported by this model"}}));
    }
    let tokens = reply_tokens(&last_user, listed(&script.fault));
    response(200, completion(&body, tokens, logprobs))
}

/// "Reply to question k" (the secret word for a probe); the fault changes everything after two tokens.
fn reply_tokens(last_user: &str, fault: bool) -> Vec<String> {
    let words: Vec<&str> = if last_user.contains("secret") {
        if fault {
            vec!["I", " do", " not", " know"]
        } else {
            vec!["The", " word", " is", " papaya"]
        }
    } else {
        let mut words = vec!["Reply", " to"];
        let tail: Vec<&str> = last_user.split_whitespace().collect();
        words.extend(tail.iter().map(|w| if fault { " drift" } else { w }));
        words
    };
    words.iter().enumerate().map(|(i, w)| if i > 1 && !w.starts_with(' ') { format!(" {w}") } else { w.to_string() }).collect()
}

fn completion(request: &Value, mut tokens: Vec<String>, logprobs: bool) -> Value {
    let max = request["max_tokens"].as_u64().unwrap_or(64) as usize;
    let finish = if tokens.len() > max { "length" } else { "stop" };
    tokens.truncate(max);
    let top_n = request["top_logprobs"].as_u64().unwrap_or(0) as usize;
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = [(t.as_str(), -0.1), (" alt", -2.5), (" other", -3.0)]
                .iter()
                .take(top_n)
                .map(|(tok, lp)| json!({"token": tok, "logprob": lp}))
                .collect();
            json!({"token": t, "logprob": -0.1, "top_logprobs": top})
        })
        .collect();
    let prompt_tokens = request["messages"].as_array().map_or(0, Vec::len) * 10;
    json!({
        "id": "fake",
        "object": "chat.completion",
        "model": request["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": tokens.concat()},
            "logprobs": if logprobs { json!({"content": content}) } else { Value::Null }, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens.len(), "prompt_tokens_details": {"cached_tokens": 0}}
    })
}

fn plan(turns: u32, targets: &[&str]) -> Plan {
    let mut plan = Plan::new(replay_test_conversation(7, turns), TargetSpec::parse("engine").unwrap());
    plan.targets = targets.iter().map(|t| TargetSpec::parse(t).unwrap()).collect();
    plan.options.timeout = Duration::from_secs(10);
    plan
}

fn secret_probe(after_turn: u32) -> ProbeSpec {
    ProbeSpec { after_turn, question: "What was the secret word?".into(), expected: "PAPAYA".into() }
}

fn no_cancel() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    std::mem::forget(tx);
    rx
}

fn reply_text(result: &TurnResult) -> &str {
    match &result.outcome {
        Outcome::Ok(reply) => &reply.text,
        Outcome::Failed { error, .. } => panic!("turn {} on {} failed: {error}", result.turn, result.target),
    }
}

fn contents(body: &Value) -> Vec<String> {
    body["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap().to_string()).collect()
}

/// Counts the observer's calls.
#[derive(Default)]
struct Counting {
    calls: Mutex<Vec<(usize, usize)>>,
}

impl Observer for Counting {
    fn on_result(&self, _: &TurnResult, done: usize, total: usize) {
        self.calls.lock().unwrap().push((done, total));
    }
}

#[tokio::test]
async fn turn_k_is_sent_with_the_captured_history_not_replayed_replies() {
    let fake = Fake::start(Script::default()).await;
    let observer = Counting::default();
    let report = replay(&plan(3, &["engine:patches=kv_fp8"]), &fake.endpoints(), &observer, no_cancel(), None).await.unwrap();

    let requests = fake.requests();
    assert_eq!(requests.len(), 6);
    let (patches, turn2) = requests.iter().find(|(p, b)| p.is_empty() && contents(b).last().unwrap() == "question 2").unwrap();
    assert_eq!(patches, "", "golden sends an empty patch set, not the engine's default");
    assert_eq!(contents(turn2), ["be brief", "question 0", "captured 0", "question 1", "captured 1", "question 2"]);
    assert!(requests.iter().all(|(_, b)| !contents(b).iter().any(|c| c.starts_with("Reply to"))), "no replayed reply is fed back");
    assert_eq!(turn2["temperature"], 0);
    assert_eq!((turn2["seed"].clone(), turn2["max_tokens"].clone()), (json!(0), json!(32)));
    assert_eq!((turn2["logprobs"].clone(), turn2["top_logprobs"].clone()), (json!(true), json!(5)));
    assert_eq!((turn2["model"].clone(), turn2["stop"].clone()), (json!("captured-model"), json!(["\n\n"])));
    assert!(requests.iter().any(|(p, _)| p == "kv_fp8"));

    assert_eq!(report.schema, ctxscope_replay::REPORT_SCHEMA);
    assert_eq!((report.conversation, report.turns, report.golden.as_str()), (7, 3, "golden"));
    assert!(!report.interrupted);
    let order: Vec<(u32, &str)> = report.results.iter().map(|r| (r.turn, r.target.as_str())).collect();
    assert_eq!(order, [(0, "golden"), (0, "engine:kv_fp8"), (1, "golden"), (1, "engine:kv_fp8"), (2, "golden"), (2, "engine:kv_fp8")]);
    for r in &report.results {
        assert_eq!(reply_text(r), format!("Reply to question {}", r.turn));
        let m = r.vs_captured.as_ref().unwrap();
        assert!(!m.exact && m.common_prefix_chars == 0);
        match r.target.as_str() {
            "golden" => assert!(r.vs_golden.is_none()),
            _ => assert!(r.vs_golden.as_ref().unwrap().exact),
        }
    }
    let calls = observer.calls.lock().unwrap().clone();
    assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
    assert!(calls.iter().all(|c| c.1 == 6));
    println!("teacher forcing: {} requests, turn 2 carried {:?}", requests.len(), contents(turn2));
}

#[tokio::test]
async fn failures_are_recorded_per_turn_and_the_run_goes_on() {
    let fake = Fake::start(Script { reject: Some("question 1".into()), ..Script::default() }).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let target = format!("url=http://{dead},name=dead");
    let report = replay(&plan(3, &["engine:patches=kv_fp8", &target]), &fake.endpoints(), &Quiet, no_cancel(), None).await.unwrap();
    assert_eq!(report.results.len(), 9);
    for r in &report.results {
        match (r.target.as_str(), r.turn, &r.outcome) {
            ("dead", _, Outcome::Failed { error, status: None }) => assert!(error.to_lowercase().contains("connect"), "{error}"),
            (_, 1, Outcome::Failed { error, status: Some(400) }) => assert_eq!(error, "turn rejected by the fake"),
            (_, turn, Outcome::Ok(_)) if turn != 1 => {}
            other => panic!("unexpected {other:?}"),
        }
        if r.target == "engine:kv_fp8" {
            assert_eq!(r.vs_golden.is_some(), r.turn != 1, "no comparison where golden failed");
        }
    }
    let failed: Vec<String> = report
        .results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Failed { error, status } => Some(format!("{} turn {}: {status:?} {error}", r.target, r.turn)),
            Outcome::Ok(_) => None,
        })
        .collect();
    println!("failures: {failed:#?}");
}

#[tokio::test]
async fn a_hanging_target_times_out_on_that_turn_only() {
    let fake = Fake::start(Script { hang: Some("question 2".into()), ..Script::default() }).await;
    let mut p = plan(3, &[]);
    p.options.timeout = Duration::from_millis(300);
    let report = replay(&p, &fake.endpoints(), &Quiet, no_cancel(), None).await.unwrap();
    assert_eq!(reply_text(&report.results[0]), "Reply to question 0");
    match &report.results[2].outcome {
        Outcome::Failed { error, status: None } => assert!(error.contains("timed out after 0.3 s"), "{error}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn a_target_rejecting_logprobs_is_retried_without_and_remembered() {
    let fake = Fake::start(Script { no_logprobs: true, ..Script::default() }).await;
    let mut p = plan(3, &[]);
    p.options.concurrency = 1;
    let report = replay(&p, &fake.endpoints(), &Quiet, no_cancel(), None).await.unwrap();
    assert!(report.results.iter().all(|r| matches!(&r.outcome, Outcome::Ok(reply) if reply.tokens.is_empty())));
    let asked: Vec<bool> = fake.requests().iter().map(|(_, b)| b["logprobs"] == true).collect();
    assert_eq!(asked, [true, false, false, false], "one rejected request, then no more logprobs");
}

#[tokio::test]
async fn cancel_returns_a_partial_report() {
    let fake = Fake::start(Script { delay_ms: 150, ..Script::default() }).await;
    let mut p = plan(5, &[]);
    p.options.concurrency = 1;
    let (tx, rx) = watch::channel(false);
    struct CancelAfterFirst(watch::Sender<bool>);
    impl Observer for CancelAfterFirst {
        fn on_result(&self, _: &TurnResult, _: usize, _: usize) {
            let _ = self.0.send(true);
        }
    }
    let report = replay(&p, &fake.endpoints(), &CancelAfterFirst(tx), rx, None).await.unwrap();
    assert!(report.interrupted);
    assert!((1..5).contains(&report.results.len()), "{} results", report.results.len());
    assert_eq!(fake.count(), report.results.len(), "in-flight requests finish, no new ones start");
    assert!(report.results.iter().all(|r| matches!(r.outcome, Outcome::Ok(_))));
    println!("cancel: {} of 5 turns finished, {} requests sent", report.results.len(), fake.count());
}

#[tokio::test]
async fn resume_reruns_only_what_is_missing_or_failed() {
    let fake = Fake::start(Script::default()).await;
    let mut p = plan(3, &["engine:patches=kv_fp8"]);
    p.probes = vec![secret_probe(1)];
    let first = replay(&p, &fake.endpoints(), &Quiet, no_cancel(), None).await.unwrap();
    assert_eq!(fake.count(), 6 + 2, "six turns and one probe per target");

    let mut partial: ReplayReport = first.clone();
    partial.results.retain(|r| !(r.target == "engine:kv_fp8" && r.turn == 2));
    for r in partial.results.iter_mut().filter(|r| r.target == "golden" && r.turn == 1) {
        r.outcome = Outcome::Failed { error: "was down".into(), status: None };
    }
    partial.interrupted = true;
    let observer = Counting::default();
    let resumed = replay(&p, &fake.endpoints(), &observer, no_cancel(), Some(&partial)).await.unwrap();
    let rerun = fake.count() - 8;
    assert_eq!(rerun, 3, "golden turn 1 and its probe, and the missing turn 2");
    assert!(!resumed.interrupted);
    assert_eq!(resumed.started_unix_ms, first.started_unix_ms);
    assert_eq!(resumed.results.len(), 6);
    let strip =
        |r: &ReplayReport| r.results.iter().map(|t| (t.turn, t.target.clone(), t.vs_golden.clone(), t.probes.len())).collect::<Vec<_>>();
    assert_eq!(strip(&resumed), strip(&first));
    assert_eq!(observer.calls.lock().unwrap().len(), 6, "reused results are reported too");
    println!("resume: first run {} requests, resumed run {rerun}", 8);
}

#[tokio::test]
async fn probes_ask_after_the_captured_reply() {
    let fake = Fake::start(Script { fault: Some("fault".into()), ..Script::default() }).await;
    let mut p = plan(2, &["engine:patches=fault"]);
    p.probes = vec![secret_probe(1)];
    let report = replay(&p, &fake.endpoints(), &Quiet, no_cancel(), None).await.unwrap();
    let probe_request = fake.requests().into_iter().find(|(_, b)| contents(b).last().unwrap().contains("secret")).unwrap().1;
    assert_eq!(contents(&probe_request), ["be brief", "question 0", "captured 0", "question 1", "captured 1", "What was the secret word?"]);
    let passed: Vec<(&str, bool)> =
        report.results.iter().filter(|r| r.turn == 1).map(|r| (r.target.as_str(), r.probes[0].passed)).collect();
    assert_eq!(passed, [("golden", true), ("engine:fault", false)]);
    assert_eq!(ctxscope_replay::score(&report, "engine:fault", Metric::Probes), Some(1.0));
    let d = report.results.iter().find(|r| r.target == "engine:fault" && r.turn == 1).unwrap().vs_golden.clone().unwrap();
    assert_eq!((d.first_diff, d.near_tie, d.agreement), (Some(2), false, 0.5));
    assert!((d.margin_at_diff.unwrap() - 2.4).abs() < 1e-9, "golden's top-1 minus top-2 where they split");
}

#[tokio::test]
async fn bisect_names_the_faulty_patch_among_four() {
    let fake = Fake::start(Script { fault: Some("fault".into()), ..Script::default() }).await;
    let p = plan(3, &[]);
    let patches: Vec<String> = ["rmsnorm_bf16", "kv_fp8", "fault", "rope_bf16"].map(String::from).to_vec();
    let report = bisect(&p, &fake.endpoints(), patches, Metric::Agreement, 0.1, &Quiet, no_cancel()).await.unwrap();
    let summary = report.bisect.clone().unwrap();
    assert_eq!(summary.culprit, ["fault"]);
    assert_eq!((summary.replays_run, summary.naive_replays), (4, 4));
    let steps: Vec<(Vec<String>, bool)> = summary.steps.iter().map(|s| (s.patches.clone(), s.diverges)).collect();
    let s = |list: &[&str]| list.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        steps,
        [
            (s(&["rmsnorm_bf16", "kv_fp8", "fault", "rope_bf16"]), true),
            (s(&["rmsnorm_bf16", "kv_fp8"]), false),
            (s(&["fault", "rope_bf16"]), true),
            (s(&["fault"]), true),
        ]
    );
    assert_eq!(fake.count(), 3 + 4 * 3, "golden once, then three turns per subset");
    let golden_requests = fake.requests().iter().filter(|(p, _)| p.is_empty()).count();
    assert_eq!(golden_requests, 3, "golden is replayed once");
    assert_eq!(report.targets.len(), 5);
    assert_eq!(report.results.len(), 15);
    assert!(!report.interrupted);
    println!(
        "bisect: culprit {:?} in {} replays (naive {}), steps {:?}",
        summary.culprit,
        summary.replays_run,
        summary.naive_replays,
        summary.steps.iter().map(|s| (s.patches.join("+"), s.score, s.diverges)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn bisect_on_probes_and_on_a_set_that_does_not_diverge() {
    let fake = Fake::start(Script { fault: Some("fault".into()), ..Script::default() }).await;
    let mut p = plan(2, &[]);
    p.probes = vec![secret_probe(1)];
    let patches: Vec<String> = ["a", "b", "fault"].map(String::from).to_vec();
    let report = bisect(&p, &fake.endpoints(), patches, Metric::Probes, 0.0, &Quiet, no_cancel()).await.unwrap();
    assert_eq!(report.bisect.unwrap().culprit, ["fault"]);

    let clean: Vec<String> = ["a", "b"].map(String::from).to_vec();
    let report = bisect(&plan(2, &[]), &fake.endpoints(), clean, Metric::Exact, 0.0, &Quiet, no_cancel()).await.unwrap();
    let summary = report.bisect.unwrap();
    assert!(summary.culprit.is_empty());
    assert_eq!(summary.replays_run, 1);
}

#[tokio::test]
async fn bisect_refuses_a_patch_set_the_engine_rejects() {
    let fake = Fake::start(Script { unknown_patch: Some("typo".into()), ..Script::default() }).await;
    let patches: Vec<String> = ["typo", "kv_fp8"].map(String::from).to_vec();
    let error = bisect(&plan(2, &[]), &fake.endpoints(), patches, Metric::Agreement, 0.1, &Quiet, no_cancel()).await.unwrap_err();
    assert!(matches!(&error, BisectError::CandidateFailed { error, .. } if error.contains("unknown patch")), "{error}");
}
