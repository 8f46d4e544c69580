//! Replay end to end on the real model, with real processes and sockets: a conversation captured
//! through `ctxscope serve`, then `ctxscope replay` against golden, numerical patch sets, a context
//! fault, cold-cache golden and llama.cpp's llama-server; the same replay again (determinism) as a
//! partial run resumed; `ctxscope bisect` naming the fault by probes and the one numerical patch past a
//! KL threshold; the HTML report; the stored runs. One test: every step replays the same capture, and
//! sled lets one process at a time open the store.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ctxscope_replay::{score, Metric, Outcome, ProbeSpec, ReplayReport, Reply, TurnResult};
use ctxscope_store::ReplayEntry;
use serde_json::json;
use support::*;

/// Turns captured and replayed (the fixture holds 8; `scripts/bench_replay.sh` uses all of them).
const TURNS: usize = 6;
/// Generated tokens per turn, at capture and on replay.
const MAX_TOKENS: u64 = 24;
/// The context fault's N: the prompt first exceeds it at turn 3 (126 tokens; turn 2 has 86), and the
/// probes after turn 3 on lose the first turn, which holds the secret word, to the cut.
const CTX_SHIFT: u64 = 96;
const MODEL_NAME: &str = "SmolLM2-135M-Instruct.Q4_1";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/replay");

const RMSNORM: &str = "engine:rmsnorm_bf16";
const KV_ACT: &str = "engine:kv_fp8+act_q8";
const RESIDUAL: &str = "engine:residual_gemm_bf16";
const SPLITK: &str = "engine:attn_splitk_bf16";
const COLD: &str = "engine:prefix_cache_off";
const LLAMA: &str = "llama.cpp";

fn shift_name() -> String {
    format!("engine:ctx_shift={CTX_SHIFT}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_end_to_end() {
    let clock = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let llama = LlamaServer::start(&model).await;
    let data = dir.path().join("data");
    let (conversation, captured) = capture(&model, &data).await;
    let lab = Lab { dir: dir.path().to_path_buf(), data, model, conversation, probes: probes() };
    lap(&clock, "capture");

    let first = replay_every_target(&lab, llama.as_ref(), &captured);
    drop(llama);
    lap(&clock, "replay against every target");
    let resumed = deterministic_and_resumable(&lab, &first);
    lap(&clock, "golden again, as a partial run resumed");
    let by_probes = bisect_names_the_context_fault(&lab, &first);
    lap(&clock, "bisect by probes");
    let by_kl = bisect_names_the_numerical_patch(&lab, &first);
    lap(&clock, "bisect by KL");
    runs_are_stored(&lab, &[&first, &resumed, &by_probes, &by_kl]);
    lap(&clock, "stored runs");
}

/// What every step shares: the store, the model, the captured conversation and the probes.
struct Lab {
    dir: PathBuf,
    data: PathBuf,
    model: PathBuf,
    conversation: u64,
    probes: Vec<ProbeSpec>,
}

impl Lab {
    /// `ctxscope COMMAND CONV --data DIR --model M --max-tokens 24 --concurrency 2 --json EXTRA...`.
    fn run(&self, command: &str, extra: &[&str]) -> ReplayReport {
        let (conversation, data, model) = (self.conversation.to_string(), path_str(&self.data), path_str(&self.model));
        let max_tokens = MAX_TOKENS.to_string();
        let mut args = vec![command, &conversation, "--data", data, "--model", model, "--max-tokens", &max_tokens];
        args.extend(["--concurrency", "2", "--json"]);
        args.extend_from_slice(extra);
        serde_json::from_value(cli_json(&args)).unwrap_or_else(|e| panic!("ctxscope {command}: not a replay report: {e}"))
    }

    /// The probes after turns up to `last`, written where `--probes` can read them.
    fn probes_file(&self, last: u32) -> PathBuf {
        let path = self.dir.join(format!("probes-upto-{last}.json"));
        let kept: Vec<&ProbeSpec> = self.probes.iter().filter(|p| p.after_turn <= last).collect();
        std::fs::write(&path, serde_json::to_vec(&kept).unwrap()).unwrap();
        path
    }
}

/// Captures the fixture's first turns through `serve`, one by one with the real replies; returns the
/// conversation id and the replies the client got.
async fn capture(model: &Path, data: &Path) -> (u64, Vec<String>) {
    let serve = Serve::start(model, data, &[]).await;
    let turns: Vec<String> = serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/secret_word_turns.json")).unwrap()).unwrap();
    let (mut messages, mut replies) = (Vec::new(), Vec::new());
    for (i, user) in turns.iter().take(TURNS).enumerate() {
        messages.push(json!({"role": "user", "content": user}));
        let request = json!({"model": MODEL_NAME, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS});
        let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), &[], &request).await;
        assert_eq!(raw.status, 200, "turn {i}: {}", String::from_utf8_lossy(&raw.body));
        let body = raw.json();
        let text =
            body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("turn {i}: no reply text: {body}")).to_string();
        eprintln!("captured turn {i} ({} prompt tokens): {text:?}", body["usage"]["prompt_tokens"]);
        messages.push(json!({"role": "assistant", "content": text}));
        replies.push(text);
    }
    let list = serve.wait_turns(TURNS as u64).await;
    let conversations = list.as_array().expect("a list of conversations");
    assert_eq!(conversations.len(), 1, "the turns thread into one conversation: {list}");
    assert_eq!(conversations[0]["turns"].as_u64(), Some(TURNS as u64), "{list}");
    let id = conversations[0]["id"].as_u64().expect("a conversation id");
    serve.stop();
    (id, replies)
}

fn probes() -> Vec<ProbeSpec> {
    serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/secret_word_probes.json")).unwrap()).unwrap()
}

/// Step 1: one replay against golden, two numerical patch sets, the context fault, three single
/// patches (measured here for the KL bisection, cold-cache golden among them) and llama.cpp.
fn replay_every_target(lab: &Lab, llama: Option<&LlamaServer>, captured: &[String]) -> ReplayReport {
    let html = lab.dir.join("report.html");
    let probes = lab.probes_file(u32::MAX);
    let shift = format!("engine:patches=ctx_shift={CTX_SHIFT}");
    let llama_target = llama.map(|l| format!("url={},model={MODEL_NAME},name={LLAMA}", l.url));
    let mut args = vec!["--probes", path_str(&probes), "--html", path_str(&html)];
    let targets = ["engine:patches=rmsnorm_bf16", "engine:patches=kv_fp8,act_q8", shift.as_str()];
    let singles = ["engine:patches=residual_gemm_bf16", "engine:patches=attn_splitk_bf16", "engine:patches=prefix_cache_off"];
    for target in targets.iter().chain(&singles).copied().chain(llama_target.as_deref()) {
        args.extend(["--target", target]);
    }
    let report = lab.run("replay", &args);
    print_summary(&report);
    assert_eq!(report.conversation, lab.conversation);
    assert_eq!(report.turns, TURNS as u32);
    assert!(!report.interrupted);

    golden_reproduces_the_capture(&report, captured);
    numerical_patches_diverge_little(&report);
    context_fault_loses_the_fact(&report);
    if llama.is_some() {
        llama_cpp_answers(&report);
    }
    html_report_holds_the_chart(&html, &report);
    report
}

/// Golden is greedy on the engine that made the capture: each reply is the captured one, and
/// computing every prompt cold (prefix_cache_off) changes no logprob.
fn golden_reproduces_the_capture(report: &ReplayReport, captured: &[String]) {
    let golden = turn_results(report, "golden");
    for (result, text) in golden.iter().zip(captured) {
        let reply = ok(result);
        assert_eq!(&reply.text, text, "turn {}: golden replay differs from the capture", result.turn);
        let matched = result.vs_captured.as_ref().unwrap_or_else(|| panic!("turn {}: no comparison with the capture", result.turn));
        assert!(matched.exact, "turn {}: {matched:?}", result.turn);
        assert!(!reply.tokens.is_empty(), "turn {}: golden gave no logprobs", result.turn);
        for probe in &result.probes {
            assert!(probe.passed, "golden must recall the fact at every probe, else the probes test nothing: {probe:?}");
        }
    }
    assert!(
        golden.iter().any(|r| ok(r).cached_tokens.unwrap_or(0) > 0),
        "no golden turn hit the prefix cache: the cold comparison would be vacuous"
    );
    for (warm, cold) in golden.iter().zip(turn_results(report, COLD)) {
        assert!(
            same_generation(ok(warm), ok(cold)),
            "turn {}: golden depends on the prefix cache:\n{:?}\n{:?}",
            warm.turn,
            ok(warm),
            ok(cold)
        );
        assert_eq!(ok(cold).cached_tokens, Some(0));
    }
    assert_eq!(mean_kl(report, COLD), 0.0);
}

/// The numerical patch sets move the distribution a little (measured mean top-5 KL: rmsnorm_bf16
/// 8.7e-5, kv_fp8+act_q8 9.3e-3; token agreement 1.00 and 0.75) and keep the fact.
fn numerical_patches_diverge_little(report: &ReplayReport) {
    let (kl_rms, kl_kv) = (mean_kl(report, RMSNORM), mean_kl(report, KV_ACT));
    assert!(kl_rms > 0.0 && kl_rms < 1e-3, "rmsnorm_bf16 mean KL {kl_rms:e}");
    assert!(kl_kv > 1e-3 && kl_kv < 5e-2, "kv_fp8+act_q8 mean KL {kl_kv:e}");
    assert!(kl_rms < kl_kv, "bf16 RMSNorm statistics move less than FP8 KV plus 8-bit activations");
    assert!(mean_agreement(report, RMSNORM) >= 0.9, "rmsnorm_bf16 agreement {}", mean_agreement(report, RMSNORM));
    assert!(mean_agreement(report, KV_ACT) >= 0.5, "kv_fp8+act_q8 agreement {}", mean_agreement(report, KV_ACT));
    for target in [RMSNORM, KV_ACT, RESIDUAL, SPLITK] {
        assert!(mean_kl(report, target) > 0.0, "{target} changed nothing");
        for result in turn_results(report, target) {
            ok(result);
            assert!(result.probes.iter().all(|p| p.passed), "{target} lost the fact after turn {}: {:?}", result.turn, result.probes);
        }
    }
}

/// ctx_shift=N: identical to golden while the prompt fits; from the first turn whose prompt exceeds N
/// the engine evaluates N tokens, and every probe from there on fails while golden's pass.
fn context_fault_loses_the_fact(report: &ReplayReport) {
    let name = shift_name();
    let golden = turn_results(report, "golden");
    let shifted = turn_results(report, &name);
    let k =
        golden.iter().position(|r| ok(r).prompt_tokens.unwrap_or(0) > CTX_SHIFT).expect("the conversation never outgrows ctx_shift") as u32;
    let probed: Vec<u32> = shifted.iter().filter(|r| !r.probes.is_empty()).map(|r| r.turn).collect();
    assert!(probed.iter().any(|t| *t < k) && probed.iter().any(|t| *t >= k), "probes after turns {probed:?} do not straddle turn {k}");
    eprintln!("ctx_shift={CTX_SHIFT}: the prompt first exceeds it at turn {k}");
    for (g, s) in golden.iter().zip(&shifted) {
        let (reference, reply) = (ok(g), ok(s));
        if s.turn < k {
            assert!(same_generation(reference, reply), "turn {}: ctx_shift changed a prompt that fits", s.turn);
        } else {
            assert_eq!(reply.prompt_tokens, Some(CTX_SHIFT), "turn {}: golden prompt {:?}", s.turn, reference.prompt_tokens);
        }
        for probe in &s.probes {
            let recalls = probe.probe.after_turn < k;
            let answer = match &probe.outcome {
                Outcome::Ok(reply) => reply,
                Outcome::Failed { error, .. } => panic!("probe after turn {} failed to run: {error}", s.turn),
            };
            assert_eq!(probe.passed, recalls, "probe after turn {} (prompt {:?} tokens): {:?}", s.turn, answer.prompt_tokens, answer.text);
            if !recalls {
                assert_eq!(answer.prompt_tokens, Some(CTX_SHIFT));
            }
        }
    }
}

/// llama.cpp on the same GGUF answered every turn, and its distance from golden is in the report.
fn llama_cpp_answers(report: &ReplayReport) {
    for result in turn_results(report, LLAMA) {
        let reply = ok(result);
        assert!(!reply.text.trim().is_empty(), "turn {}: llama.cpp answered nothing", result.turn);
        let d = result.vs_golden.as_ref().unwrap_or_else(|| panic!("turn {}: llama.cpp not compared with golden", result.turn));
        eprintln!(
            "llama.cpp turn {}: agreement {:.3} over {} tokens, exact {}, first diff {:?}, KL {:?}, logprobs {}",
            result.turn,
            d.agreement,
            d.compared_tokens,
            d.exact,
            d.first_diff,
            d.kl_topk,
            !reply.tokens.is_empty()
        );
    }
}

/// `--html FILE` wrote the self-contained report with its chart and every target in it.
fn html_report_holds_the_chart(path: &Path, report: &ReplayReport) {
    let html = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(html.len() > 1000, "{} bytes of HTML", html.len());
    assert!(html.contains(r#"id="divergence-chart""#), "no chart element in the HTML report");
    for target in &report.targets {
        assert!(html.contains(&target.name), "target {} missing from the HTML report", target.name);
    }
}

/// Step 2: golden alone, first on turns 0-2, then resumed for all turns: the resumed run keeps the
/// first three results as they were (same wall times: not run again) and every golden reply and probe
/// answer is identical, tokens and logprobs included, to step 1's.
fn deterministic_and_resumable(lab: &Lab, first: &ReplayReport) -> ReplayReport {
    let early = lab.probes_file(2);
    let partial = lab.run("replay", &["--turns", "0,1,2", "--probes", path_str(&early)]);
    assert_eq!(partial.targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["golden"]);
    assert_eq!(partial.results.len(), 3);
    let all = lab.probes_file(u32::MAX);
    let id = partial.id.to_string();
    let resumed = lab.run("replay", &["--resume", &id, "--probes", path_str(&all)]);
    assert_eq!(resumed.id, partial.id, "a resumed run keeps its id");
    for kept in &partial.results {
        let now = resumed.results.iter().find(|r| r.turn == kept.turn).expect("a kept turn");
        assert_eq!(now, kept, "turn {} was run again instead of kept", kept.turn);
    }
    let answered: usize = resumed.results.iter().map(|r| r.probes.len()).sum();
    assert_eq!(answered, lab.probes.len(), "every probe answered once");
    assert_reproduced(first, &resumed, "golden", "golden alone, resumed");
    resumed
}

/// Step 3a: the probes metric names the context fault among numerical patches.
fn bisect_names_the_context_fault(lab: &Lab, first: &ReplayReport) -> ReplayReport {
    let fault = format!("ctx_shift={CTX_SHIFT}");
    let patches = format!("rmsnorm_bf16,rope_bf16,{fault},kv_fp8");
    let probes = lab.probes_file(u32::MAX);
    let started = Instant::now();
    let report = lab.run("bisect", &["--patches", &patches, "--metric", "probes", "--threshold", "0.0", "--probes", path_str(&probes)]);
    let bisect = report.bisect.as_ref().expect("a bisect section");
    eprintln!(
        "bisect by probes over {patches}: culprit {:?} in {} replays (naive {}), {:.1} s",
        bisect.culprit,
        bisect.replays_run,
        bisect.naive_replays,
        started.elapsed().as_secs_f64()
    );
    for step in &bisect.steps {
        eprintln!("  {:?} score {} diverges {} reused {}", step.patches, step.score, step.diverges, step.reused);
        assert_eq!(step.diverges, step.patches.contains(&fault), "only subsets with the fault lose the fact: {step:?}");
    }
    assert_eq!(bisect.culprit, [fault]);
    assert_reproduced(first, &report, "golden", "bisect's golden");
    assert!(bisect.replays_run <= bisect.naive_replays, "{} replays, naive {}", bisect.replays_run, bisect.naive_replays);
    report
}

/// Step 3b: the KL metric names residual_gemm_bf16 when the threshold lies between its mean KL and
/// attn_splitk_bf16's (prefix_cache_off changes no numerics), both measured in step 1: 2.2e-5 and
/// 5.4e-6 to 6.4e-6. attn_splitk_bf16's moves from run to run: it rounds decode attention only, so the
/// KV rows of generated tokens differ from the same positions prefilled, and which of the two a turn
/// reuses depends on the prefix cache (on which turn finished first). Hence a geometric-mean threshold,
/// and residual_gemm_bf16, bit-identical across cache states, as the one compared exactly.
fn bisect_names_the_numerical_patch(lab: &Lab, first: &ReplayReport) -> ReplayReport {
    let (residual, splitk) = (mean_kl(first, RESIDUAL), mean_kl(first, SPLITK));
    assert!(residual > 2.0 * splitk, "residual_gemm_bf16 (KL {residual:e}) is not separable from attn_splitk_bf16 ({splitk:e}) here");
    let threshold = (residual * splitk).sqrt();
    let text = format!("{threshold:e}");
    let started = Instant::now();
    let patches = "residual_gemm_bf16,attn_splitk_bf16,prefix_cache_off";
    let report = lab.run("bisect", &["--patches", patches, "--metric", "kl", "--threshold", &text]);
    let bisect = report.bisect.as_ref().expect("a bisect section");
    eprintln!(
        "bisect by KL over {patches} at {text} (residual {residual:e}, splitk {splitk:e}): culprit {:?} in {} replays (naive {}), {:.1} s",
        bisect.culprit,
        bisect.replays_run,
        bisect.naive_replays,
        started.elapsed().as_secs_f64()
    );
    for step in &bisect.steps {
        eprintln!("  {:?} score {:e} diverges {} reused {}", step.patches, step.score, step.diverges, step.reused);
    }
    assert_eq!(bisect.culprit, ["residual_gemm_bf16"]);
    let alone = bisect.steps.iter().find(|s| s.patches == ["residual_gemm_bf16"]).expect("residual_gemm_bf16 replayed alone");
    assert!((alone.score - residual).abs() <= 1e-9 * residual, "residual_gemm_bf16 KL {:e} in bisect, {residual:e} in step 1", alone.score);
    assert_reproduced(first, &report, "golden", "bisect's golden");
    assert_reproduced(first, &report, RESIDUAL, "bisect's residual_gemm_bf16");
    assert!(bisect.replays_run <= bisect.naive_replays);
    report
}

/// Step 5: `ctxscope replays` lists every run, newest first, and gives each report back whole.
fn runs_are_stored(lab: &Lab, runs: &[&ReplayReport]) {
    let data = path_str(&lab.data);
    let list: Vec<ReplayEntry> =
        serde_json::from_value(cli_json(&["replays", "--data", data, "--json"])).expect("a list of replay entries");
    let mut expected: Vec<u64> = runs.iter().map(|r| r.id).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(list.iter().map(|e| e.id).collect::<Vec<_>>(), expected, "stored runs, newest first");
    for entry in &list {
        assert_eq!(entry.conversation, lab.conversation);
        assert_eq!(entry.targets.first().map(String::as_str), Some("golden"));
        assert!(entry.report.is_null(), "listings carry no report");
    }
    for run in runs {
        let id = run.id.to_string();
        let stored: ReplayReport = serde_json::from_value(cli_json(&["replays", &id, "--data", data, "--json"])).expect("a replay report");
        assert_eq!(&stored, *run, "replay {id} as stored differs from what the command printed");
    }
}

/// llama.cpp's llama-server on the test model (None, with a note, when it is not installed; CI must
/// have it). One thread: on this 2-core machine its spinning workers otherwise halve the engine's
/// throughput (the step-1 replay took 100 s with the default threads, 47 s with one).
struct LlamaServer {
    url: String,
    _process: KillOnDrop,
}

impl LlamaServer {
    async fn start(model: &Path) -> Option<LlamaServer> {
        let Some(server) = llama_server_bin() else {
            optional_missing("llama.cpp's llama-server", "set LLAMA_SERVER or run scripts/llama_cpp/install.sh");
            return None;
        };
        let port = free_port();
        let child = Command::new(&server)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--ctx-size", "2048", "-np", "1", "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", server.display()));
        let process = KillOnDrop(child);
        let url = format!("http://127.0.0.1:{port}");
        wait_http_ok(&format!("{url}/health"), Duration::from_secs(60)).await;
        Some(LlamaServer { url, _process: process })
    }
}

/// A target's results in turn order, one per captured turn.
fn turn_results<'a>(report: &'a ReplayReport, target: &str) -> Vec<&'a TurnResult> {
    let mut results: Vec<&TurnResult> = report.results.iter().filter(|r| r.target == target).collect();
    results.sort_by_key(|r| r.turn);
    assert_eq!(results.len(), TURNS, "{target}: {} results", results.len());
    results
}

fn ok(result: &TurnResult) -> &Reply {
    match &result.outcome {
        Outcome::Ok(reply) => reply,
        Outcome::Failed { error, status } => panic!("{} turn {} failed ({status:?}): {error}", result.target, result.turn),
    }
}

/// Every reply of `target` in `b` is the same generation as in `a`, and so is every probe answer both ran.
fn assert_reproduced(a: &ReplayReport, b: &ReplayReport, target: &str, what: &str) {
    for (x, y) in turn_results(a, target).iter().zip(turn_results(b, target)) {
        assert!(same_generation(ok(x), ok(y)), "{what}, turn {}: not the reply of step 1:\n{:?}\n{:?}", x.turn, ok(x), ok(y));
        for (p, q) in x.probes.iter().zip(&y.probes) {
            let (Outcome::Ok(p), Outcome::Ok(q)) = (&p.outcome, &q.outcome) else { panic!("{what}, turn {}: a probe failed", x.turn) };
            assert!(same_generation(p, q), "{what}, turn {}: not the probe answer of step 1:\n{p:?}\n{q:?}", x.turn);
        }
    }
}

/// Same generation: text, tokens with their logprobs, usage and finish (not timing or cache hits).
fn same_generation(a: &Reply, b: &Reply) -> bool {
    a.text == b.text
        && a.tokens == b.tokens
        && a.prompt_tokens == b.prompt_tokens
        && a.completion_tokens == b.completion_tokens
        && a.finish_reason == b.finish_reason
}

fn mean_kl(report: &ReplayReport, target: &str) -> f64 {
    score(report, target, Metric::Kl).unwrap_or_else(|| panic!("{target}: no KL"))
}

fn mean_agreement(report: &ReplayReport, target: &str) -> f64 {
    1.0 - score(report, target, Metric::Agreement).unwrap_or_else(|| panic!("{target}: no agreement"))
}

/// One line per target: agreement, KL, exact turns, probes passed.
fn print_summary(report: &ReplayReport) {
    eprintln!("{:<28} {:>9} {:>10} {:>6} {:>7}", "target", "agreement", "mean KL", "exact", "probes");
    for target in report.targets.iter().filter(|t| t.name != report.golden) {
        let results: Vec<&TurnResult> = report.results.iter().filter(|r| r.target == target.name).collect();
        let exact = results.iter().filter(|r| r.vs_golden.as_ref().is_some_and(|d| d.exact)).count();
        let probes: Vec<bool> = results.iter().flat_map(|r| r.probes.iter().map(|p| p.passed)).collect();
        eprintln!(
            "{:<28} {:>9.3} {:>10.3e} {:>3}/{:<2} {:>4}/{}",
            target.name,
            1.0 - score(report, &target.name, Metric::Agreement).unwrap_or(f64::NAN),
            score(report, &target.name, Metric::Kl).unwrap_or(f64::NAN),
            exact,
            results.len(),
            probes.iter().filter(|p| **p).count(),
            probes.len()
        );
    }
}

fn lap(clock: &Instant, step: &str) {
    eprintln!("[{:6.1} s] {step} done", clock.elapsed().as_secs_f64());
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
