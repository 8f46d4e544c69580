//! Memory and disk bounded by the work (issue 25's probe, on the real binary): large requests of
//! short messages (each request all new content) go through the proxy; once captured, its resident
//! memory must come back to within 2x the idle figure, and the store
//! must grow by at most 2x the bytes the requests carried. 4 requests of 20,000 messages here (before
//! packed turns: RSS 4.7x idle, store 9x); the full scale, on a release build (BENCHMARKS.md,
//! "Memory and store size"):
//! `CTXSCOPE_TEST_BIN=target/release/ctxscope CTXSCOPE_MEM_REQUESTS=16 CTXSCOPE_MEM_MESSAGES=100000
//! cargo test --test memory_bounds -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;

/// Resident set size of a process in bytes (Linux `/proc/PID/status`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let kb: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).expect("VmRSS");
    kb * 1024
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    // A directory that is not there (a build without the journal) holds nothing.
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { dir_bytes(&entry.path()) } else { meta.len() };
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_leave_memory_and_store_bounded() {
    let env = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (requests, messages_per) = (env("CTXSCOPE_MEM_REQUESTS", 4), env("CTXSCOPE_MEM_MESSAGES", 20_000));
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Extra proxy flags for experiments (e.g. CTXSCOPE_MEM_PROXY_ARGS="--store-cache-mib 8").
    let extra = std::env::var("CTXSCOPE_MEM_PROXY_ARGS").unwrap_or_default();
    let proxy = extra.split_whitespace().fold(Proxy::builder(&upstream.url(), &data), |b, a| b.arg(a)).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    // Warm up: one small conversation, so the idle figure includes what every run loads.
    let small = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4});
    assert_eq!(post_json(&url, &[], &small).await.status, 200);
    wait_captured_turns(&proxy.admin_url(), 1, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss(proxy.pid());
    let store_before = dir_bytes(&data);
    let mut sent = 0u64;
    for r in 0..requests {
        let messages: Vec<_> = (0..messages_per)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("request {r} message {i}")}))
            .collect();
        let body = json!({"model": "m", "messages": messages, "max_tokens": 4});
        let bytes = serde_json::to_vec(&body).unwrap();
        sent += bytes.len() as u64;
        let headers = [("content-type", "application/json"), ("x-ctxscope-conversation", "big")];
        let raw = send("POST", &url, &headers, bytes).await;
        assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    }
    let started = Instant::now();
    wait_captured_turns(&proxy.admin_url(), 1 + requests as u64, Duration::from_secs(600)).await;
    let peak_after = rss(proxy.pid());
    // The last turn's detectors run after it is listed, then the store flushes and the allocator
    // hands freed pages back: memory must be back within bounds 20 s after the traffic (the issue's
    // probe read it then), sampled each second.
    let mut settled = rss(proxy.pid());
    let mut trace = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        settled = rss(proxy.pid());
        trace.push(format!("{:.0}", settled as f64 / 1048576.0));
        if settled <= 2 * idle {
            break;
        }
    }
    // For diagnosis: CTXSCOPE_MEM_SMAPS=FILE keeps the settled proxy's memory map (/proc/PID/smaps).
    if let Ok(path) = std::env::var("CTXSCOPE_MEM_SMAPS") {
        let _ = std::fs::copy(format!("/proc/{}/smaps", proxy.pid()), path);
    }
    // sled and its spilled files; the record journal (a second, compressed copy of every turn, from
    // which damage is made good) is bounded on its own.
    let journal = dir_bytes(&data.join("journal"));
    let store = dir_bytes(&data) - store_before - journal;
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "sent {:.1} MiB in {requests} requests of {messages_per} messages; captured in {:.1?}; RSS idle {:.1} MiB, at capture end {:.1} MiB, then each second {} MiB; store grew {:.1} MiB ({:.2}x the bytes sent), journal {:.1} MiB",
        mib(sent),
        started.elapsed(),
        mib(idle),
        mib(peak_after),
        trace.join(", "),
        mib(store),
        store as f64 / sent as f64,
        mib(journal)
    );
    // Within 2x the idle figure, as the issue asks. Before the fixes this run settled at 269 MiB; at
    // 16 x 100,000 on a release build 37 MiB (2.4x idle) until the parse trees got a heap of their
    // own (src/alloc.rs), then 28-30; 31-36 when capture lagged the traffic (the workers that had
    // received the bodies slept on their frees) until capture wakes them as it drains: 25-26.
    let bound = 2 * idle;
    assert!(settled <= bound, "RSS {:.1} MiB after the traffic, idle was {:.1} MiB", mib(settled), mib(idle));
    assert!(store as f64 <= 2.0 * sent as f64, "store grew {:.1} MiB for {:.1} MiB of requests", mib(store), mib(sent));
    assert!(journal as f64 <= 1.5 * sent as f64, "journal grew {:.1} MiB for {:.1} MiB of requests", mib(journal), mib(sent));
    proxy.stop();
}
