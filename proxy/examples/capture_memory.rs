//! Memory and store size of the capture pipeline on large requests, with the system allocator so that
//! a heap profiler sees every allocation: N turns of M short messages in one named conversation.
//! `cargo run --release -p ctxscope-proxy --example capture_memory -- N M` (under `heaptrack` to see
//! what holds the memory).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ctxscope_proxy::capture::exchange::{Captured, Exchange};
use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_store::{Endpoint, RetentionPolicy, Store, StoreOptions};
use serde_json::json;

fn captured(bytes: Vec<u8>) -> Captured {
    let mut c = Captured::default();
    c.push(&Bytes::from(bytes), usize::MAX);
    c.complete = true;
    c
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    kb / 1024.0
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().map(|e| if e.path().is_dir() { dir_bytes(&e.path()) } else { e.metadata().map_or(0, |m| m.len()) }).sum()
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (requests, per) = (args.first().copied().unwrap_or(4), args.get(1).copied().unwrap_or(20_000));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut pipeline = Pipeline::new(store.clone(), "http://bench".into(), None, RetentionPolicy::default());
    println!("idle: RSS {:.1} MiB", rss_mib());
    let mut sent = 0;
    for r in 0..requests {
        let messages: Vec<_> = (0..per)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("request {r} message {i}")}))
            .collect();
        let body = serde_json::to_vec(&json!({"model": "m", "messages": messages, "max_tokens": 4})).unwrap();
        sent += body.len();
        let response = json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]});
        let mut ex = Exchange::new(Endpoint::ChatCompletions, "POST", "/v1/chat/completions", Arc::new(Mutex::new(captured(body))));
        ex.conversation_name = Some("big".into());
        ex.status = Some(200);
        ex.response_content_type = Some("application/json".into());
        ex.response = captured(serde_json::to_vec(&response).unwrap());
        pipeline.capture(&ex).unwrap();
        store.flush().unwrap();
        println!("turn {r}: RSS {:.1} MiB, store {:.1} MiB", rss_mib(), dir_bytes(dir.path()) as f64 / 1048576.0);
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    println!(
        "sent {:.1} MiB; settled RSS {:.1} MiB; store {:.1} MiB",
        sent as f64 / 1048576.0,
        rss_mib(),
        dir_bytes(dir.path()) as f64 / 1048576.0
    );
    // Exit without dropping: a heap profiler then reports what was still held as leaked.
    std::process::exit(0);
}
