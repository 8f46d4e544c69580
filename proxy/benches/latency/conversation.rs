//! Capture cost along long conversations: each turn resends the whole history (system prompt plus
//! alternating ~300-character user and assistant messages, so turn 100 carries 200 messages) straight
//! to the upstream, through a `--no-capture` proxy and through the capturing proxy, then waits for
//! that turn's capture and reads its time from the `ctxscope_capture_seconds` sum/count on the admin port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::client::{self, metric_sum, Admin, Sender};
use crate::error::BenchError;
use crate::proxy_proc::ProxyProcess;
use crate::upstream::text;

const MESSAGE_CHARS: usize = 300;

/// One turn of one conversation.
pub struct TurnTiming {
    /// 1-based.
    pub turn: usize,
    pub messages: usize,
    pub request_bytes: usize,
    pub direct_ns: u64,
    /// Through the `--no-capture` proxy.
    pub bare_ns: u64,
    /// Through the capturing proxy.
    pub proxy_ns: u64,
    /// This exchange's time in the capture pipeline (parse, thread, store), from the metric's sum.
    pub capture_s: f64,
}

pub struct Report {
    pub turns: Vec<TurnTiming>,
    /// Store size after the first conversation: (apparent, allocated) bytes.
    pub store_after_first: (u64, u64),
    pub store_after_all: (u64, u64),
    /// Request bytes sent through the proxy during the first conversation.
    pub request_bytes_first: u64,
    /// `turns` of each conversation the proxy's API lists.
    pub captured_turns: Vec<u64>,
    pub dropped: f64,
}

/// Runs `conversations` conversations of `turns` turns against a proxy with a fresh store.
pub async fn run(
    proxy: &ProxyProcess,
    bare: SocketAddr,
    upstream: SocketAddr,
    conversations: usize,
    turns: usize,
) -> Result<Report, BenchError> {
    let mut direct = client::connect(upstream).await?;
    let mut uncaptured = client::connect(bare).await?;
    let mut through = client::connect(proxy.listen).await?;
    let mut admin = Admin::new(proxy.admin);
    let mut timings = Vec::with_capacity(conversations * turns);
    let (mut store_after_first, mut request_bytes_first) = ((0, 0), 0);
    for c in 0..conversations {
        let base = (c as u64 + 1) * 1_000_000;
        let mut messages = vec![json!({"role": "system", "content": text(base, MESSAGE_CHARS)})];
        for turn in 1..=turns {
            let user_seed = base + 2 * turn as u64;
            messages.push(json!({"role": "user", "content": text(user_seed, MESSAGE_CHARS)}));
            let body = Bytes::from(json!({"model": "bench", "messages": messages, "max_tokens": 128}).to_string());
            let reply_seed = user_seed + 1;
            let (before_count, before_sum) = capture_totals(&mut admin).await?;
            // Direct and uncaptured alternate in order; the capturing proxy goes last so its capture
            // work (started after its response) does not overlap the other two.
            let (direct_ns, bare_ns) = if turn % 2 == 1 {
                let d = timed(&mut direct, upstream, &body, reply_seed).await?;
                (d, timed(&mut uncaptured, bare, &body, reply_seed).await?)
            } else {
                let b = timed(&mut uncaptured, bare, &body, reply_seed).await?;
                (timed(&mut direct, upstream, &body, reply_seed).await?, b)
            };
            let proxy_ns = timed(&mut through, proxy.listen, &body, reply_seed).await?;
            let capture_s = wait_capture(&mut admin, before_count + 1.0).await? - before_sum;
            if c == 0 {
                request_bytes_first += body.len() as u64;
            }
            timings.push(TurnTiming { turn, messages: messages.len(), request_bytes: body.len(), direct_ns, bare_ns, proxy_ns, capture_s });
            messages.push(json!({"role": "assistant", "content": text(reply_seed, MESSAGE_CHARS)}));
        }
        if c == 0 {
            store_after_first = settled_size(proxy).await;
        }
    }
    let store_after_all = settled_size(proxy).await;
    let (_, listing) = admin.get("/api/conversations").await?;
    let listed: Vec<Value> = serde_json::from_str(&listing).unwrap_or_default();
    let captured_turns = listed.iter().filter_map(|c| c["turns"].as_u64()).collect();
    let dropped = admin.metric("ctxscope_capture_dropped_total").await? + 0.0;
    Ok(Report { turns: timings, store_after_first, store_after_all, request_bytes_first, captured_turns, dropped })
}

/// One request on a kept-alive connection, start to last body byte.
async fn timed(sender: &mut Sender, addr: SocketAddr, body: &Bytes, reply_seed: u64) -> Result<u64, BenchError> {
    let request = client::post(addr, body.clone(), &[("x-bench-reply-seed", reply_seed.to_string())]);
    let started = Instant::now();
    let (status, _) = client::exchange(sender, request).await?;
    let elapsed = started.elapsed().as_nanos() as u64;
    if status != 200 {
        return Err(BenchError::Setup(format!("conversation request to {addr} answered {status}")));
    }
    Ok(elapsed)
}

async fn capture_totals(admin: &mut Admin) -> Result<(f64, f64), BenchError> {
    let (_, text) = admin.get("/metrics").await?;
    Ok((metric_sum(&text, "ctxscope_capture_seconds_count"), metric_sum(&text, "ctxscope_capture_seconds_sum")))
}

/// Polls until the capture count reaches `count`; returns the capture time sum then.
async fn wait_capture(admin: &mut Admin, count: f64) -> Result<f64, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Poll sparingly: rendering /metrics takes CPU from the capture it waits for.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (now_count, sum) = capture_totals(admin).await?;
        if now_count >= count {
            return Ok(sum);
        }
        if Instant::now() > deadline {
            return Err(BenchError::Setup(format!("capture count stuck at {now_count}, expected {count}")));
        }
    }
}

/// The store size once the periodic flush (500 ms by default) has run.
async fn settled_size(proxy: &ProxyProcess) -> (u64, u64) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.store_size()
}
