//! Reading and validating `/v1/chat/completions` and `/v1/completions` bodies into a [`Job`]: the
//! prompt tokens (chat rendered with the model's own template), the completion budget clamped to the
//! context, sampling, stop strings, logprobs and streaming options. Every refusal is an [`ApiError`]
//! that names the parameter; nothing is silently cut.

use ctxscope_formats::RenderOptions;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::model::Model;
use crate::sample::SamplingParams;

type Object = Map<String, Value>;

/// Which OpenAI endpoint a job came from (it decides the response shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt: Vec<u32>,
    /// Completion tokens allowed: the request's, clamped to what the context leaves.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];
const MAX_TOP_LOGPROBS: usize = 20;

/// Parses the body as a JSON object, telling invalid UTF-8 from invalid JSON.
pub fn json_object(body: &[u8]) -> Result<Object, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::InvalidUtf8(e.valid_up_to()))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::InvalidJson("expected a JSON object at the top level".into())),
        Err(e) => Err(ApiError::InvalidJson(e.to_string())),
    }
}

/// The body's own patch set, `"ctxscope": {"patches": ["name", "name=value", ...]}`, if it has one.
pub fn body_patches(body: &Object, arch: crate::patch::Arch) -> Result<Option<crate::patch::PatchSet>, ApiError> {
    let Some(field) = body.get("ctxscope").filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = || ApiError::param("ctxscope", "`ctxscope` must be an object like {\"patches\": [\"rope_bf16\", \"ctx_shift=2048\"]}");
    let object = field.as_object().ok_or_else(bad)?;
    if let Some(key) = object.keys().find(|k| k.as_str() != "patches") {
        return Err(ApiError::param("ctxscope", format!("unknown field `ctxscope.{key}`; the only field is `patches`")));
    }
    let Some(list) = object.get("patches").filter(|v| !v.is_null()) else { return Ok(None) };
    let items = match list {
        Value::Array(items) => items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>().ok_or_else(bad)?,
        Value::String(text) => vec![text.as_str()],
        _ => return Err(bad()),
    };
    let set = crate::patch::PatchSet::from_items(items.into_iter().flat_map(|i| i.split(',')))
        .and_then(|set| set.check_applies(arch).map(|()| set))
        .map_err(|e| ApiError::param("ctxscope", e.to_string()))?;
    Ok(Some(set))
}

/// A `/v1/chat/completions` request.
pub fn chat(body: &Object, model: &Model, ctx: usize) -> Result<Job, ApiError> {
    let messages = match body.get("messages") {
        None | Some(Value::Null) => return Err(ApiError::param("messages", "`messages` is required")),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::param("messages", "`messages` must be an array of message objects")),
    };
    if messages.is_empty() {
        return Err(ApiError::param("messages", "`messages` must contain at least one message"));
    }
    let text = render_chat(body, messages, model)?;
    let prompt = tokenize_prompt(model, &text);
    let logprobs = opt_bool(body, "logprobs")?.unwrap_or(false);
    let top = match opt_u64(body, "top_logprobs")? {
        Some(n) if n as usize > MAX_TOP_LOGPROBS => {
            return Err(ApiError::param("top_logprobs", format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")))
        }
        Some(n) => n as usize,
        None => 0,
    };
    finish(body, prompt, ctx, logprobs, top)
}

/// A `/v1/completions` request.
pub fn completion(body: &Object, model: &Model, ctx: usize) -> Result<Job, ApiError> {
    let prompt = match body.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(text)) => tokenize_prompt(model, text),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(text)] => tokenize_prompt(model, text),
            ids if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                let vocab = model.tokenizer.vocab_size() as u64;
                let mut tokens = Vec::with_capacity(ids.len());
                for id in ids.iter().filter_map(Value::as_u64) {
                    if id >= vocab {
                        return Err(ApiError::param("prompt", format!("token id {id} is outside the vocabulary (size {vocab})")));
                    }
                    tokens.push(id as u32);
                }
                tokens
            }
            _ => {
                return Err(ApiError::param(
                    "prompt",
                    "`prompt` must be a string, a list of one string, or a list of token ids (one prompt per request)",
                ))
            }
        },
        Some(_) => return Err(ApiError::param("prompt", "`prompt` must be a string or a list of token ids")),
    };
    if opt_bool(body, "echo")?.unwrap_or(false) {
        return Err(ApiError::param("echo", "`echo` is not supported by this engine"));
    }
    let top = match opt_u64(body, "logprobs")? {
        Some(n) if n as usize > MAX_TOP_LOGPROBS => {
            return Err(ApiError::param("logprobs", format!("`logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")))
        }
        other => other,
    };
    finish(body, prompt, ctx, top.is_some(), top.unwrap_or(0) as usize)
}

/// What both endpoints share: budget, sampling, stops, streaming.
fn finish(body: &Object, prompt: Vec<u32>, ctx: usize, logprobs: bool, top: usize) -> Result<Job, ApiError> {
    let param = if body.get("max_completion_tokens").is_some_and(|v| !v.is_null()) { "max_completion_tokens" } else { "max_tokens" };
    let requested = match body.get(param) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => return Err(ApiError::param(param, format!("`{param}` must be at least 1, got {n}"))),
            None if v.as_u64().is_some() => Some(usize::MAX),
            None => return Err(ApiError::param(param, format!("`{param}` must be a positive integer, got {v}"))),
        },
    };
    if prompt.is_empty() {
        return Err(ApiError::param("prompt", "the prompt is empty"));
    }
    if prompt.len() >= ctx {
        let completion = requested.unwrap_or(1).min(u32::MAX as usize);
        return Err(ApiError::ContextLength { ctx, prompt: prompt.len(), completion });
    }
    let room = ctx - prompt.len();
    let max_tokens = requested.unwrap_or(room).min(room);
    if let Some(n) = opt_u64(body, "n")? {
        if n != 1 {
            return Err(ApiError::param("n", format!("`n` must be 1 (this engine returns one choice), got {n}")));
        }
    }
    let temperature = opt_f64(body, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::param("temperature", format!("`temperature` must be between 0 and 2, got {temperature}")));
    }
    let top_p = opt_f64(body, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::param("top_p", format!("`top_p` must be in (0, 1], got {top_p}")));
    }
    let seed = match body.get("seed") {
        None | Some(Value::Null) => random_seed(),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|n| n as u64))
            .ok_or_else(|| ApiError::param("seed", format!("`seed` must be an integer, got {v}")))?,
    };
    let stops = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::param("stop", "`stop` must be a string or a list of strings"))?,
        Some(_) => return Err(ApiError::param("stop", "`stop` must be a string or a list of strings")),
    };
    let stream = opt_bool(body, "stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        Some(Value::Object(o)) => opt_bool(o, "include_usage")?.unwrap_or(false),
        None | Some(Value::Null) => false,
        Some(_) => return Err(ApiError::param("stream_options", "`stream_options` must be an object")),
    };
    let sampling = SamplingParams { temperature: temperature as f32, top_p: top_p as f32, seed, top_logprobs: top, logprobs };
    Ok(Job { prompt, max_tokens, sampling, stops, stream, include_usage })
}

/// The prompt text a chat request's messages (and `tools`) render to with the model's template and
/// the generation prompt; each message is checked first.
pub fn render_chat(body: &Object, messages: &[Value], model: &Model) -> Result<String, ApiError> {
    for (i, message) in messages.iter().enumerate() {
        check_message(i, message)?;
    }
    let tok = &model.tokenizer;
    let bos = tok.bos().and_then(|id| tok.token_text(id)).unwrap_or("");
    let eos = tok.eos().and_then(|id| tok.token_text(id)).unwrap_or("");
    let tools = body.get("tools").filter(|t| !t.is_null());
    let options = RenderOptions { add_generation_prompt: true, bos_token: bos, eos_token: eos, tools };
    model
        .template
        .render(messages, &options)
        .map_err(|e| ApiError::param("messages", format!("the model's chat template cannot render these messages: {e}")))
}

/// Prompt text to tokens: special tokens parsed, BOS only where the tokenizer asks for it.
pub fn tokenize_prompt(model: &Model, text: &str) -> Vec<u32> {
    let tok = &model.tokenizer;
    let mut tokens = tok.encode(text, true);
    if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
        if tokens.first() != Some(&bos) {
            tokens.insert(0, bos);
        }
    }
    tokens
}

fn check_message(i: usize, message: &Value) -> Result<(), ApiError> {
    let Some(m) = message.as_object() else {
        return Err(ApiError::param("messages", format!("messages[{i}] must be an object with `role` and `content`")));
    };
    let role = match m.get("role") {
        Some(Value::String(role)) => role.as_str(),
        None | Some(Value::Null) => return Err(ApiError::param("messages", format!("messages[{i}] has no `role`"))),
        Some(other) => return Err(ApiError::param("messages", format!("messages[{i}].role must be a string, got {other}"))),
    };
    if !ROLES.contains(&role) {
        return Err(ApiError::param(
            "messages",
            format!("messages[{i}] has an unknown role {role:?}; expected one of {}", ROLES.join(", ")),
        ));
    }
    let has_tool_calls = m.get("tool_calls").is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    match m.get("content") {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                if kind != Some("text") || !part.get("text").is_some_and(Value::is_string) {
                    return Err(ApiError::param(
                        "messages",
                        format!("messages[{i}].content[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}); this model reads text only"),
                    ));
                }
            }
            Ok(())
        }
        None | Some(Value::Null) if role == "assistant" && has_tool_calls => Ok(()),
        None | Some(Value::Null) => Err(ApiError::param("messages", format!("messages[{i}] ({role}) has no `content`"))),
        Some(other) => {
            Err(ApiError::param("messages", format!("messages[{i}].content must be a string or a list of text parts, got {other}")))
        }
    }
}

fn opt_bool(body: &Object, key: &'static str) -> Result<Option<bool>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::param(key, format!("`{key}` must be true or false, got {v}"))),
    }
}

fn opt_u64(body: &Object, key: &'static str) -> Result<Option<u64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| ApiError::param(key, format!("`{key}` must be a non-negative integer, got {v}"))),
    }
}

fn opt_f64(body: &Object, key: &'static str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::param(key, format!("`{key}` must be a number, got {v}"))),
    }
}

/// A seed for requests that give none: time and a counter, so concurrent requests differ.
fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_checked_one_by_one() {
        assert!(check_message(0, &serde_json::json!({"role": "user", "content": "hi"})).is_ok());
        let unknown = check_message(1, &serde_json::json!({"role": "wizard", "content": "hi"})).unwrap_err();
        assert!(unknown.to_string().contains("unknown role \"wizard\""), "{unknown}");
        let missing = check_message(2, &serde_json::json!({"role": "user"})).unwrap_err();
        assert!(missing.to_string().contains("messages[2] (user) has no `content`"), "{missing}");
        let calls = serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]});
        assert!(check_message(3, &calls).is_ok());
    }

    #[test]
    fn bodies_distinguish_bad_utf8_from_bad_json() {
        assert!(matches!(json_object(b"{\"a\": \"\xff\"}"), Err(ApiError::InvalidUtf8(7))));
        assert!(matches!(json_object(b"{\"a\": "), Err(ApiError::InvalidJson(_))));
        assert!(matches!(json_object(b"[1]"), Err(ApiError::InvalidJson(_))));
    }
}
