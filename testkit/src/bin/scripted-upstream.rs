//! A scripted, deterministic OpenAI-compatible upstream in its own process, for the `openai`-client
//! tests in tests/python (the Rust tests script [`ctxscope_testkit::FakeUpstream`] in-process).
//!
//! `scripted-upstream [PORT] [--host HOST] [--require-key KEY]` binds HOST:PORT (127.0.0.1:0 by
//! default: a free port) and prints the bound port as the first line of stdout. It serves:
//! - `POST /v1/chat/completions`: replies "You said: <text of the last user message>". A
//!   non-streaming reply is one JSON body with `usage`; a streaming one (`"stream": true`) is
//!   server-sent events, one per body chunk: a role chunk, one chunk per word, a finish chunk, a usage
//!   chunk (`choices: []`) only when `stream_options.include_usage` is true, then `data: [DONE]`. When
//!   the request has `tools` and the last user message mentions "weather", the reply is a
//!   `get_weather` tool call instead (streamed as fragments: index, id and name first, then the
//!   arguments over several chunks).
//! - `GET /v1/models`: a one-model list.
//!
//! Everything in a reply is a function of the request body (ids included), so the same request sent
//! directly and through a proxy gets the same bytes back. `prompt_tokens` is the body's length / 4;
//! `cached_tokens` half of it once the conversation has more than one message. With
//! `--require-key KEY` a request without `Authorization: Bearer KEY` gets a 401.

use std::io::Write;
use std::net::SocketAddr;

use ctxscope_testkit::{json, stream, Body, FakeUpstream, Options, Received};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const MODEL: &str = "scripted-model";
const CREATED: u64 = 1_700_000_000;

struct Args {
    addr: SocketAddr,
    require_key: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let (mut host, mut port, mut require_key) = ("127.0.0.1".to_string(), 0u16, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--host" => host = args.next().ok_or("--host needs a value")?,
            "--require-key" => require_key = Some(args.next().ok_or("--require-key needs a value")?),
            "-h" | "--help" => return Err("usage: scripted-upstream [PORT] [--host HOST] [--require-key KEY]".into()),
            other => port = other.parse().map_err(|_| format!("`{other}` is not a port"))?,
        }
    }
    let addr = format!("{host}:{port}").parse().map_err(|e| format!("{host}:{port}: {e}"))?;
    Ok(Args { addr, require_key })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("scripted-upstream: {message}");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("scripted-upstream: cannot listen on {}: {e}", args.addr);
            std::process::exit(1);
        }
    };
    let key = args.require_key.map(|k| format!("Bearer {k}"));
    let options = Options { record: false, nodelay: true };
    let fake = FakeUpstream::serve(listener, options, move |received| answer(received, key.clone()));
    println!("{}", fake.addr.port());
    let _ = std::io::stdout().flush();
    let _ = tokio::signal::ctrl_c().await;
}

async fn answer(received: Received, key: Option<String>) -> http::Response<Body> {
    if key.is_some() && received.header("authorization") != key.as_deref() {
        let error = json!({"error": {"message": "missing or wrong API key", "type": "invalid_request_error", "code": 401}});
        return tagged(json(401, &error));
    }
    match (received.method.as_str(), received.path.as_str()) {
        ("GET", "/v1/models") => {
            let list =
                json!({"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "ctxscope-tests"}]});
            tagged(json(200, &list))
        }
        ("POST", "/v1/chat/completions") => match received.json().filter(Value::is_object) {
            Some(request) => chat(&request, &received.body).await,
            None => tagged(json(400, &json!({"error": {"message": "invalid JSON body", "code": 400}}))),
        },
        (method, path) => tagged(json(404, &json!({"error": {"message": format!("no route {method} {path}"), "code": 404}}))),
    }
}

/// Every response names its upstream, so a test can tell it passed through.
fn tagged(mut response: http::Response<Body>) -> http::Response<Body> {
    response.headers_mut().insert("x-upstream-id", http::HeaderValue::from_static("scripted"));
    response
}

async fn chat(request: &Value, body: &[u8]) -> http::Response<Body> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let text = last_user_text(&messages);
    let digest: String = Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect();
    let id = format!("chatcmpl-{}", &digest[..24]);
    let model = request["model"].as_str().unwrap_or(MODEL).to_string();
    let prompt_tokens = body.len() / 4;
    let cached_tokens = if messages.len() > 1 { prompt_tokens / 2 } else { 0 };
    let tool_call = request["tools"].as_array().is_some_and(|t| !t.is_empty()) && text.to_lowercase().contains("weather");
    let (pieces, completion_tokens, finish, call) = if tool_call {
        let arguments = weather_arguments(&text);
        let pieces = fragments(&arguments, 4);
        let n = pieces.len() + 1;
        (pieces, n, "tool_calls", Some((format!("call_{}", &digest[24..40]), arguments)))
    } else {
        let pieces = words(&format!("You said: {text}"));
        let n = pieces.len();
        (pieces, n, "stop", None)
    };
    let usage = json!({
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens},
    });
    if request["stream"].as_bool() != Some(true) {
        let message = match &call {
            Some((call_id, arguments)) => json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}),
            None => json!({"role": "assistant", "content": pieces.concat()}),
        };
        let whole = json!({"id": id, "object": "chat.completion", "created": CREATED, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}], "usage": usage});
        return tagged(json(200, &whole));
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": id, "object": "chat.completion.chunk", "created": CREATED, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    };
    let mut events: Vec<String> = Vec::new();
    match &call {
        Some((call_id, _)) => {
            events.push(
                chunk(
                    json!({"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
                    None,
                )
                .to_string(),
            );
            events.extend(
                pieces.iter().map(|p| chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}), None).to_string()),
            );
        }
        None => {
            events.push(chunk(json!({"role": "assistant", "content": ""}), None).to_string());
            events.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None).to_string()));
        }
    }
    events.push(chunk(json!({}), Some(finish)).to_string());
    if request["stream_options"]["include_usage"].as_bool() == Some(true) {
        events.push(
            json!({"id": id, "object": "chat.completion.chunk", "created": CREATED, "model": model, "choices": [], "usage": usage})
                .to_string(),
        );
    }
    events.push("[DONE]".to_string());
    let (writer, mut response) = stream(200, "text/event-stream");
    response.headers_mut().insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    tokio::spawn(async move {
        for event in events {
            if !writer.send(format!("data: {event}\n\n")).await {
                return;
            }
        }
    });
    tagged(response)
}

/// The text of the last user message (string content, or its text parts joined).
fn last_user_text(messages: &[Value]) -> String {
    let Some(message) = messages.iter().rev().find(|m| m["role"] == "user") else { return String::new() };
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// Pieces that concatenate back to `text`, one per word with its trailing whitespace.
fn words(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut in_space = false;
    for c in text.chars() {
        if !c.is_whitespace() && in_space {
            pieces.push(std::mem::take(&mut current));
            in_space = false;
        }
        in_space |= c.is_whitespace();
        current.push(c);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// `{"location": "<capitalised words after 'weather in '>", "unit": "celsius"}` (Paris when none),
/// spaced as Python's `json.dumps` writes it.
fn weather_arguments(text: &str) -> String {
    let location = text
        .find("weather in ")
        .map(|at| {
            let rest = &text[at + "weather in ".len()..];
            let mut taken: Vec<&str> = Vec::new();
            for word in rest.split(' ') {
                let name: &str = word.trim_end_matches(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-' || c == '_'));
                if !name.starts_with(|c: char| c.is_uppercase()) {
                    break;
                }
                taken.push(name);
                if name.len() != word.len() {
                    break;
                }
            }
            taken.join(" ")
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "Paris".to_string());
    format!("{{\"location\": {}, \"unit\": \"celsius\"}}", Value::String(location))
}

/// `text` cut into `n` pieces of (nearly) equal length.
fn fragments(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_concatenate_back() {
        assert_eq!(words("You said: hi  there "), vec!["You ", "said: ", "hi  ", "there "]);
        assert_eq!(words("x").concat(), "x");
    }

    #[test]
    fn weather_arguments_take_capitalised_words() {
        assert_eq!(weather_arguments("What's the weather in New York today?"), r#"{"location": "New York", "unit": "celsius"}"#);
        assert_eq!(weather_arguments("weather in Paris."), r#"{"location": "Paris", "unit": "celsius"}"#);
        assert_eq!(weather_arguments("what weather?"), r#"{"location": "Paris", "unit": "celsius"}"#);
        assert_eq!(fragments("abcdefghij", 4), vec!["abc", "def", "ghi", "j"]);
    }
}
