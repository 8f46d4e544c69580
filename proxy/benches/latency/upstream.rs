//! The bench's upstream: a fast in-process OpenAI-compatible engine on 127.0.0.1:0
//! (`ctxscope_testkit::FakeUpstream`, not recording, `TCP_NODELAY`, with the script below). A non-streaming
//! chat request gets a small fixed JSON body; `"stream": true` gets [`STREAM_EVENTS`] SSE events, each
//! its own body frame, paced by a real-time thread on absolute deadlines [`STREAM_PACING`] apart.
//! The instant each event was handed to hyper is recorded under the request's `x-bench-id`, so the
//! client can compute every chunk's one-way delay on the same clock.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_testkit::{FakeUpstream, Options, Received};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

use crate::error::BenchError;

/// Events per streamed response, `data: [DONE]` included.
pub const STREAM_EVENTS: usize = 200;
/// Time between two events of one stream.
pub const STREAM_PACING: Duration = Duration::from_micros(200);

const SMALL_REPLY: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}"#;

/// Emission instants of streamed responses, by `x-bench-id`.
#[derive(Default)]
pub struct Emissions(Mutex<HashMap<u64, Vec<Instant>>>);

impl Emissions {
    /// The instants at which each event of stream `id` was emitted; present once its last event is.
    pub fn take(&self, id: u64) -> Option<Vec<Instant>> {
        self.0.lock().ok()?.remove(&id)
    }

    fn put(&self, id: u64, stamps: Vec<Instant>) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(id, stamps);
        }
    }
}

pub struct Upstream {
    pub addr: std::net::SocketAddr,
    pub emissions: Arc<Emissions>,
    _fake: FakeUpstream,
}

struct State {
    emissions: Arc<Emissions>,
    events: Vec<Bytes>,
}

impl Upstream {
    pub async fn start() -> Result<Upstream, BenchError> {
        let emissions = Arc::new(Emissions::default());
        let state = Arc::new(State { emissions: emissions.clone(), events: stream_events() });
        let options = Options { record: false, nodelay: true };
        let fake = FakeUpstream::start_with(options, move |received| {
            let state = state.clone();
            async move { handle(&state, received) }
        })
        .await;
        Ok(Upstream { addr: fake.addr, emissions, _fake: fake })
    }
}

/// Deterministic text of about `len` characters, different for each seed (conversation messages).
pub fn text(seed: u64, len: usize) -> String {
    const WORDS: [&str; 16] = [
        "context", "window", "token", "prompt", "cache", "engine", "reply", "history", "model", "stream", "turn", "system", "user",
        "answer", "question", "detail",
    ];
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = format!("#{seed}");
    while out.len() < len {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        out.push(' ');
        out.push_str(WORDS[(state >> 60) as usize]);
    }
    out
}

type Reply = http::Response<ctxscope_testkit::Body>;

fn handle(state: &State, req: Received) -> Reply {
    if req.method != http::Method::POST || !req.path.ends_with("/chat/completions") {
        return ctxscope_testkit::raw(404, "text/plain", "not found");
    }
    let number = |name: &str| req.header(name).and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = number("x-bench-reply-seed") {
        return ctxscope_testkit::raw(200, "application/json", long_reply(seed));
    }
    if contains(&req.body, b"\"stream\":true") {
        return stream(state, number("x-bench-id").unwrap_or(0));
    }
    ctxscope_testkit::raw(200, "application/json", Bytes::from_static(SMALL_REPLY.as_bytes()))
}

fn long_reply(seed: u64) -> Bytes {
    let body = serde_json::json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text(seed, 300)}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 60, "total_tokens": 160}
    });
    Bytes::from(body.to_string())
}

/// Starts the pacing thread for one stream and answers with the channel it feeds.
fn stream(state: &State, id: u64) -> Reply {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let events = state.events.clone();
    let emissions = state.emissions.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut stamps = Vec::with_capacity(events.len());
        for (i, event) in events.into_iter().enumerate() {
            let deadline = start + STREAM_PACING * i as u32;
            let now = Instant::now();
            if deadline > now {
                std::thread::sleep(deadline - now);
            }
            stamps.push(Instant::now());
            if stamps.len() == STREAM_EVENTS {
                // Recorded before the last event leaves, so a client that saw it finds the stamps.
                emissions.put(id, std::mem::take(&mut stamps));
            }
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    let mut response = http::Response::new(ChannelBody(rx).map_err(|never| match never {}).boxed());
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    response
}

fn stream_events() -> Vec<Bytes> {
    let mut events: Vec<Bytes> = (0..STREAM_EVENTS - 2)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}},\"finish_reason\":null}}]}}\n\n"
            ))
        })
        .collect();
    events.push(Bytes::from_static(
        b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":198,\"total_tokens\":206}}\n\n",
    ));
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A response body fed frame by frame from the pacing thread.
struct ChannelBody(mpsc::UnboundedReceiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|event| event.map(|bytes| Ok(Frame::data(bytes))))
    }
}
