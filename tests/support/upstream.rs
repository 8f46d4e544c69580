//! A scripted OpenAI/Anthropic-compatible upstream on a real loopback socket. Replies are
//! deterministic; request headers pick misbehaviours: `x-script: reset | status400 | hang`,
//! `x-script-chunks: N`, `x-script-delay-ms: N`. It records what it received and whether a stream
//! it was writing lost its reader (client cancellation reaching the upstream).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

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
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Upstream { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

fn header<'a>(req: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    req.get(name).and_then(|v| v.to_str().ok())
}

async fn handle(state: Arc<State>, req: http::Request<Incoming>) -> Result<http::Response<Body>, Infallible> {
    // The proxy's engine fingerprint probes are not traffic: like an upstream without
    // self-description endpoints, answer 404 and record nothing.
    if header(req.headers(), "user-agent") == Some("ctxscope-fingerprint") {
        return Ok(raw_response(404, "application/json", r#"{"error":"not found"}"#));
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    state.headers.lock().unwrap().push(parts.headers.clone());
    state.bodies.lock().unwrap().push(bytes.clone());
    let path = parts.uri.path().to_string();
    if parts.method == http::Method::GET && path == "/v1/models" {
        return Ok(json_response(200, json!({"object": "list", "data": [{"id": "scripted", "object": "model"}]})));
    }
    let script = header(&parts.headers, "x-script").unwrap_or("").to_string();
    if script == "status400" {
        let body = r#"{"error":{"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","code":400}}"#;
        return Ok(raw_response(400, "application/json", body));
    }
    let Ok(request) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(raw_response(400, "application/json", r#"{"error":{"message":"invalid JSON body","code":400}}"#));
    };
    let chunks = header(&parts.headers, "x-script-chunks").and_then(|v| v.parse().ok()).unwrap_or(0usize);
    let delay = Duration::from_millis(header(&parts.headers, "x-script-delay-ms").and_then(|v| v.parse().ok()).unwrap_or(0));
    let anthropic = path.ends_with("/v1/messages");
    let reply = reply_text(&request, chunks);
    let prompt_tokens = (bytes.len() / 4) as u64;
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
        return Ok(json_response(200, body));
    }
    let events = if anthropic { anthropic_events(&reply, prompt_tokens) } else { openai_events(&request, &reply, prompt_tokens) };
    Ok(stream_response(state, events, delay, &script))
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
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let script = script.to_string();
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            if script == "reset" && i == 2 {
                let _ = tx.send(Err(std::io::Error::other("scripted reset"))).await;
                return;
            }
            if script == "hang" && i == 1 {
                // Wait until the reader goes away, then note the cancellation.
                tx.closed().await;
                state.cancelled.store(true, Ordering::SeqCst);
                return;
            }
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if tx.send(Ok(Frame::data(Bytes::from(event)))).await.is_err() {
                state.cancelled.store(true, Ordering::SeqCst);
                return;
            }
        }
    });
    let stream = tokio_stream_from(rx);
    let mut response = http::Response::new(StreamBody::new(stream).boxed());
    response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    response.headers_mut().insert("cache-control", "no-cache".parse().unwrap());
    response.headers_mut().insert("x-upstream-id", "scripted".parse().unwrap());
    response
}

/// An mpsc receiver as a `Stream` without pulling in tokio-stream.
fn tokio_stream_from<T>(mut rx: tokio::sync::mpsc::Receiver<T>) -> impl futures_core::Stream<Item = T> {
    futures_util_stream::poll_fn(move |cx| rx.poll_recv(cx))
}

mod futures_util_stream {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct PollFn<F>(F);

    pub fn poll_fn<T, F: FnMut(&mut Context<'_>) -> Poll<Option<T>>>(f: F) -> PollFn<F> {
        PollFn(f)
    }

    impl<T, F: FnMut(&mut Context<'_>) -> Poll<Option<T>> + Unpin> futures_core::Stream for PollFn<F> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            (self.0)(cx)
        }
    }
}

fn json_response(status: u16, value: Value) -> http::Response<Body> {
    raw_response(status, "application/json", &value.to_string())
}

fn raw_response(status: u16, content_type: &str, body: &str) -> http::Response<Body> {
    let mut response = http::Response::new(full(body.to_string()));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    response.headers_mut().insert("content-type", content_type.parse().unwrap());
    response.headers_mut().insert("x-upstream-id", "scripted".parse().unwrap());
    response
}
