//! Times the capture pipeline per turn, with and without the detectors, on a synthetic 100-turn
//! conversation through a real sled store (the engine's usage as a truncating-free upstream reports
//! it; `--tokenizer GGUF` adds local counts and token-id prefix evidence). Prints p50/mean per group of
//! ten turns; then the cost per capture of many one-message conversations, as the latency bench's
//! load sends them (`SMALL=N`, default 20,000; p50 and mean of each fifth).
//! `cargo run --release -p ctxscope-proxy --example capture_cost [-- --tokenizer PATH]`.

// The ctxscope binary's allocator (src/main.rs), so the figures are what ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use ctxscope_proxy::capture::exchange::{Captured, Exchange};
use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_proxy::capture::tokens::TokenCache;
use ctxscope_proxy::capture::upstream_count::{CountSettings, UpstreamCounter};
use ctxscope_proxy::detect::DetectConfig;
use ctxscope_proxy::upstream::Upstream;
use ctxscope_store::{Endpoint, RetentionPolicy, Store, StoreOptions};
use serde_json::{json, Value};

fn captured(bytes: Vec<u8>) -> Captured {
    let mut c = Captured::default();
    c.push(&Bytes::from(bytes), usize::MAX);
    c.complete = true;
    c
}

fn exchange(messages: &[Value], reply: &str, prompt: u64, cached: u64) -> Exchange {
    let request = json!({"model": "m", "messages": messages});
    let response = json!({"choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 60, "prompt_tokens_details": {"cached_tokens": cached}}});
    let body = Arc::new(Mutex::new(captured(serde_json::to_vec(&request).unwrap())));
    let mut ex = Exchange::new(Endpoint::ChatCompletions, "POST", "/v1/chat/completions", body);
    ex.status = Some(200);
    ex.response_content_type = Some("application/json".into());
    ex.response = captured(serde_json::to_vec(&response).unwrap());
    ex
}

/// Capture time per turn, in microseconds. `counter`: count with the upstream's endpoints (`auto`
/// without a tokenizer, the proxy's default) against an upstream that has none, as the latency
/// bench's does (with a tokenizer the pipeline counts with it and leaves the counter unused).
fn run(detect: bool, tokenizer: Option<&str>, counter: bool) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let tokens = tokenizer.map(|p| TokenCache::open(std::path::Path::new(p)).unwrap());
    let config = DetectConfig { enabled: detect, ..DetectConfig::default() };
    let mut pipeline = Pipeline::new(store, "http://bench".into(), tokens, RetentionPolicy::default()).with_detect_config(config);
    if counter {
        // Port 9 (discard) refuses: the counter backs off, as it does before an upstream without endpoints.
        let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
        pipeline = pipeline.with_upstream_counter(UpstreamCounter::new(upstream, CountSettings::default()));
    }
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut times = Vec::new();
    let mut prompt = 20;
    for turn in 0..100 {
        messages
            .push(json!({"role": "user", "content": format!("Question {turn}: {}", "tell me more about the topic at hand. ".repeat(8))}));
        let reply = format!("Answer {turn}: {}", "here is some more detail about it. ".repeat(8));
        let ex = exchange(&messages, &reply, prompt, prompt.saturating_sub(80));
        let started = Instant::now();
        pipeline.capture(&ex).unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e6);
        prompt += 160;
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    times
}

/// Capture time of each of `n` one-message conversations (the latency bench's small requests), µs.
fn run_small(n: usize) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut pipeline = Pipeline::new(store, "http://bench".into(), None, RetentionPolicy::default());
    (0..n)
        .map(|i| {
            let ex = exchange(&[json!({"role": "user", "content": format!("hello {i}")})], "Hello! How can I help?", 12, 0);
            let started = Instant::now();
            pipeline.capture(&ex).unwrap();
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tokenizer = args.iter().position(|a| a == "--tokenizer").and_then(|i| args.get(i + 1)).map(String::as_str);
    // For a profiler: PROFILE_RUNS=N repeats the detectors-on run N more times first.
    let repeat: usize = std::env::var("PROFILE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for _ in 0..repeat {
        run(true, tokenizer, false);
    }
    let runs = [
        ("detectors off", run(false, tokenizer, false)),
        ("detectors on", run(true, tokenizer, false)),
        ("on, upstream counter", run(true, tokenizer, true)),
    ];
    println!("| turns | {} p50 µs | {} p50 µs | difference | {} p50 µs |", runs[0].0, runs[1].0, runs[2].0);
    println!("|---|---|---|---|---|");
    for group in [0, 40, 90] {
        let p50 = |times: &[f64]| {
            let mut g = times[group..group + 10].to_vec();
            g.sort_by(f64::total_cmp);
            (g[4] + g[5]) / 2.0
        };
        let (off, on, counted) = (p50(&runs[0].1), p50(&runs[1].1), p50(&runs[2].1));
        println!("| {}–{} | {off:.0} | {on:.0} | {:+.0} | {counted:.0} |", group + 1, group + 10, on - off);
    }
    let n: usize = std::env::var("SMALL").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    if n >= 5 {
        let times = run_small(n);
        println!();
        println!("| one-message conversations | p50 µs | mean µs |");
        println!("|---|---|---|");
        for part in 0..5 {
            let (from, to) = (part * n / 5, (part + 1) * n / 5);
            let mut g = times[from..to].to_vec();
            g.sort_by(f64::total_cmp);
            println!("| {}–{} | {:.1} | {:.1} |", from + 1, to, g[g.len() / 2], g.iter().sum::<f64>() / g.len() as f64);
        }
    }
}
