//! The suite's scripted OpenAI/Anthropic-compatible upstream: `ctxscope_testkit::FakeUpstream` (a
//! real loopback socket) with this script. Replies are deterministic; request headers pick
//! misbehaviours: `x-script: reset | status400 | hang`, `x-script-chunks: N`, `x-script-delay-ms: N`.
//! It records what it received and whether a stream it was writing lost its reader (client
//! cancellation reaching the upstream).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ctxscope_testkit::{Body, FakeUpstream, Options, Received};
use serde_json::{json, Value};

#[derive(Default)]
pub struct State {
    pub requests: AtomicU64,
    /// A streamed response's reader went away before the stream finished.
    pub cancelled: AtomicBool,
    pub headers: Mutex<Vec<http::HeaderMap>>,
    pub bodies: Mutex<Vec<Bytes>>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    _fake: FakeUpstream,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let state = Arc::new(State::default());
        let shared = state.clone();
        let fake =
            FakeUpstream::start_with(Options { record: false, ..Options::default() }, move |received| handle(shared.clone(), received))
                .await;
        Upstream { addr: fake.addr, state, _fake: fake }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn with_id(mut response: http::Response<Body>) -> http::Response<Body> {
    response.headers_mut().insert("x-upstream-id", "scripted".parse().unwrap());
    response
}

fn raw_response(status: u16, content_type: &str, body: &str) -> http::Response<Body> {
    with_id(ctxscope_testkit::raw(status, content_type, body.to_string()))
}

fn json_response(status: u16, value: Value) -> http::Response<Body> {
    with_id(ctxscope_testkit::json(status, &value))
}

async fn handle(state: Arc<State>, req: Received) -> http::Response<Body> {
    // The proxy's engine fingerprint probes are not traffic: like an upstream without
    // self-description endpoints, answer 404 and record nothing.
    if req.header("user-agent") == Some("ctxscope-fingerprint") {
        return raw_response(404, "application/json", r#"{"error":"not found"}"#);
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    state.headers.lock().unwrap().push(req.headers.clone());
    state.bodies.lock().unwrap().push(req.body.clone());
    let path = req.path.clone();
    if req.method == http::Method::GET && path == "/v1/models" {
        return json_response(200, json!({"object": "list", "data": [{"id": "scripted", "object": "model"}]}));
    }
    let script = req.header("x-script").unwrap_or("").to_string();
    if script == "status400" {
        let body = r#"{"error":{"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","code":400}}"#;
        return raw_response(400, "application/json", body);
    }
    let Some(request) = req.json() else {
        return raw_response(400, "application/json", r#"{"error":{"message":"invalid JSON body","code":400}}"#);
    };
    let chunks = req.header("x-script-chunks").and_then(|v| v.parse().ok()).unwrap_or(0usize);
    let delay = Duration::from_millis(req.header("x-script-delay-ms").and_then(|v| v.parse().ok()).unwrap_or(0));
    let anthropic = path.ends_with("/v1/messages");
    let reply = reply_text(&request, chunks);
    let prompt_tokens = (req.body.len() / 4) as u64;
    let stream = request["stream"].as_bool().unwrap_or(false);
    if !stream {
        let body = if anthropic {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": reply}],
                   "stop_reason": "end_turn", "usage": {"input_tokens": prompt_tokens, "output_tokens": 3}})
        } else {
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": request["model"],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3,
                             "prompt_tokens_details": {"cached_tokens": 0}}})
        };
        return json_response(200, body);
    }
    let events = if anthropic { anthropic_events(&reply, prompt_tokens) } else { openai_events(&request, &reply, prompt_tokens) };
    stream_response(state, events, delay, &script)
}

/// Deterministic reply: echoes the last user text; with `chunks` > 0 it has exactly that many words.
fn reply_text(request: &Value, chunks: usize) -> String {
    if chunks > 0 {
        return (0..chunks).map(|i| format!("w{i} ")).collect();
    }
    let last = request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
    let text = match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    format!("You said: {text}")
}

fn openai_events(request: &Value, reply: &str, prompt_tokens: u64) -> Vec<String> {
    let base = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": request["model"],
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![base(json!({"role": "assistant", "content": ""}), Value::Null)];
    for word in reply.split_inclusive(' ') {
        events.push(base(json!({"content": word}), Value::Null));
    }
    events.push(base(json!({}), json!("stop")));
    if request["stream_options"]["include_usage"].as_bool() == Some(true) {
        events.push(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": request["model"], "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3}}));
    }
    let mut out: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push("data: [DONE]\n\n".into());
    out
}

fn anthropic_events(reply: &str, prompt_tokens: u64) -> Vec<String> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": prompt_tokens, "output_tokens": 1}}}),
        ),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
    ];
    for word in reply.split_inclusive(' ') {
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
        ));
    }
    events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}})));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events.iter().map(|(name, data)| format!("event: {name}\ndata: {data}\n\n")).collect()
}

fn stream_response(state: Arc<State>, events: Vec<String>, delay: Duration, script: &str) -> http::Response<Body> {
    let (writer, mut response) = ctxscope_testkit::stream(200, "text/event-stream");
    let script = script.to_string();
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            if script == "reset" && i == 2 {
                writer.reset().await;
                return;
            }
            if script == "hang" && i == 1 {
                // Wait until the reader goes away, then note the cancellation.
                writer.closed().await;
                state.cancelled.store(true, Ordering::SeqCst);
                return;
            }
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if !writer.send(event).await {
                state.cancelled.store(true, Ordering::SeqCst);
                return;
            }
        }
    });
    response.headers_mut().insert("cache-control", "no-cache".parse().unwrap());
    with_id(response)
}
