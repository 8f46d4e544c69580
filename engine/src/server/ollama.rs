//! `POST /api/chat`, Ollama's native chat API, served by translation: the request becomes an OpenAI
//! chat request for the same generation path, and the answer goes back in Ollama's shape (one JSON
//! object, or NDJSON lines ending with `"done": true` when streamed, Ollama's default), with
//! `prompt_eval_count` and `eval_count`. Ollama clients (and the capture proxy's Ollama parser) can
//! then talk to this engine as to an Ollama server.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};

use super::body::{self, Body};
use super::completions;
use super::error::ApiError;
use super::reframe::{Reframed, Translate};
use super::request::{self, Endpoint};
use super::state::State;
use crate::forward::Path;
use crate::patch::PatchSet;

/// Translates Ollama's request into OpenAI's: messages as they are (Ollama's `images` are refused by
/// the chat validation as unknown content), `options` mapped to sampling parameters.
fn to_openai(object: &Map<String, Value>) -> Result<(Map<String, Value>, bool), ApiError> {
    let messages = object.get("messages").cloned().ok_or_else(|| ApiError::param("messages", "messages is required".to_string()))?;
    let stream = match object.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::param("stream", "stream must be a boolean".to_string())),
    };
    let mut out = Map::new();
    out.insert("messages".into(), messages);
    if let Some(model) = object.get("model") {
        out.insert("model".into(), model.clone());
    }
    let options = match object.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::param("options", "options must be an object".to_string())),
    };
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"), ("stop", "stop")] {
        if let Some(v) = options.get(from) {
            out.insert(to.into(), v.clone());
        }
    }
    // Ollama: num_predict -1 (or absent) is "until the context is full".
    if let Some(n) = options.get("num_predict").and_then(Value::as_i64).filter(|n| *n > 0) {
        out.insert("max_tokens".into(), json!(n));
    }
    out.insert("stream".into(), json!(stream));
    if stream {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok((out, stream))
}

fn created_at() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    ctxscope_common::civil::rfc3339(now.as_secs(), now.subsec_nanos(), 9)
}

/// The closing object: Ollama's done line with its counts and durations (nanoseconds).
fn done(model: &str, content: Option<&str>, finish: &str, usage: &Value, started: Instant) -> Value {
    let total = started.elapsed().as_nanos() as u64;
    json!({
        "model": model,
        "created_at": created_at(),
        "message": {"role": "assistant", "content": content.unwrap_or("")},
        "done_reason": finish,
        "done": true,
        "total_duration": total,
        "load_duration": 0,
        "prompt_eval_count": usage["prompt_tokens"],
        "prompt_eval_duration": 0,
        "eval_count": usage["completion_tokens"],
        "eval_duration": total,
    })
}

/// Handles `POST /api/chat`.
pub async fn chat(state: Arc<State>, body: &[u8], path: Path, patches: PatchSet) -> Result<http::Response<Body>, ApiError> {
    let started = Instant::now();
    let object = request::json_object(body)?;
    let (openai, stream) = to_openai(&object)?;
    let model = object.get("model").and_then(Value::as_str).unwrap_or(&state.engine.model.id).to_string();
    let translated = serde_json::to_vec(&Value::Object(openai)).map_err(|e| ApiError::Engine(e.to_string()))?;
    let response = completions::generate(state, Endpoint::Chat, &translated, path, patches).await?;
    let (mut parts, inner) = response.into_parts();
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(if stream { "application/x-ndjson" } else { "application/json" }),
    );
    parts.headers.remove(http::header::CACHE_CONTROL);
    if stream {
        let ndjson = Reframed::new(inner, Ndjson { model, started, finish: None, ended: false });
        return Ok(http::Response::from_parts(parts, Body::new(ndjson)));
    }
    let bytes = inner.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let reply: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::Engine(format!("chat answer not JSON: {e}")))?;
    let choice = &reply["choices"][0];
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    let out = done(&model, choice["message"]["content"].as_str(), finish, &reply["usage"], started);
    let mut response = body::json(http::StatusCode::OK, &out);
    *response.headers_mut() = parts.headers;
    Ok(response)
}

/// Ollama's NDJSON from the chat stream: a line per text delta, then the done line once the usage
/// chunk (or `[DONE]`) arrives.
struct Ndjson {
    model: String,
    started: Instant,
    finish: Option<String>,
    ended: bool,
}

impl Ndjson {
    fn line(value: &Value) -> Bytes {
        let mut bytes = serde_json::to_vec(value).unwrap_or_default();
        bytes.push(b'\n');
        Bytes::from(bytes)
    }

    fn finish_with(&mut self, usage: &Value, out: &mut VecDeque<Bytes>) {
        let finish = self.finish.clone().unwrap_or_else(|| "stop".into());
        out.push_back(Self::line(&done(&self.model, None, &finish, usage, self.started)));
        self.ended = true;
    }
}

impl Translate for Ndjson {
    fn chunk(&mut self, chunk: Value, out: &mut VecDeque<Bytes>) {
        if self.ended {
            return;
        }
        if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
            self.finish = Some(reason.to_string());
        }
        if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str().filter(|d| !d.is_empty()) {
            let line =
                json!({"model": self.model, "created_at": created_at(), "message": {"role": "assistant", "content": delta}, "done": false});
            out.push_back(Self::line(&line));
        }
        if chunk["usage"].is_object() {
            self.finish_with(&chunk["usage"], out);
        }
        if chunk["error"].is_object() {
            out.push_back(Self::line(&json!({"error": chunk["error"]["message"]})));
            self.ended = true;
        }
    }

    fn done(&mut self, clean: bool, out: &mut VecDeque<Bytes>) {
        if clean && !self.ended {
            self.finish_with(&Value::Null, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_sampling_and_stream_defaults_to_true() {
        let object = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0, "num_predict": 12, "seed": 3, "num_ctx": 2048}})
            .as_object()
            .unwrap()
            .clone();
        let (openai, stream) = to_openai(&object).unwrap();
        assert!(stream);
        assert_eq!(openai["max_tokens"], 12);
        assert_eq!(openai["temperature"], 0);
        assert_eq!(openai["seed"], 3);
        assert_eq!(openai["stream_options"]["include_usage"], true);
        let unbounded = json!({"messages": [], "stream": false, "options": {"num_predict": -1}}).as_object().unwrap().clone();
        let (openai, stream) = to_openai(&unbounded).unwrap();
        assert!(!stream && openai.get("max_tokens").is_none());
        let bad = json!({"messages": [], "stream": "yes"}).as_object().unwrap().clone();
        assert!(to_openai(&bad).is_err());
    }

    #[test]
    fn created_at_is_rfc3339_utc() {
        let at = created_at();
        assert_eq!(at.len(), "2026-12-01T15:50:52.000000000Z".len(), "{at}");
        assert!(at.ends_with('Z') && at.as_bytes()[10] == b'T', "{at}");
    }
}
