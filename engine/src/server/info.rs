//! The small routes: `GET /health`, `GET /v1/models` (with the backend the engine runs on), and
//! llama.cpp-compatible `POST /tokenize` (`{"content", "add_special", "parse_special"}` -> `{"tokens"}`),
//! `POST /detokenize` (`{"tokens"}` -> `{"content"}`) and `POST /apply-template` (`{"messages"}` ->
//! `{"prompt"}`). `/tokenize` also takes vLLM's chat form (`{"messages", "tools"}` -> `{"count",
//! "tokens", "max_model_len"}`): the prompt a chat completion would compute, template and BOS included.
//! `GET /props` says what this engine is running (model, default path and patch set, context length,
//! weight type, KV cache dtype, prefix cache), for the proxy's engine fingerprint.

use serde_json::{json, Value};

use super::error::ApiError;
use super::request::{json_object, render_chat, tokenize_prompt};
use super::state::State;

pub fn health() -> Value {
    json!({"status": "ok"})
}

pub fn models(state: &State) -> Value {
    let model = &state.engine.model;
    json!({
        "object": "list",
        "data": [{
            "id": model.id,
            "object": "model",
            "created": 0,
            "owned_by": "ctxscope",
            "max_model_len": state.engine.options.ctx,
            "backend": state.engine.backend,
        }],
    })
}

/// What is running, as settings: `engine` is always `ctxscope`, so a fingerprint tells it apart.
pub fn props(state: &State) -> Value {
    let engine = &state.engine;
    let patches = &state.config.default_patches;
    let wq = engine.model.weights.layers.first().map(|l| l.wq.quant.ggml_type);
    let weights = wq.map(|t| t.name().map_or_else(|| format!("ggml type {}", t.0), str::to_string));
    json!({
        "engine": "ctxscope",
        "model": engine.model.id,
        "model_fingerprint": engine.model.fingerprint,
        "architecture": engine.model.config.architecture,
        "backend": engine.backend,
        "default_path": state.config.default_path.as_str(),
        "default_patches": patches.to_string(),
        "n_ctx": engine.options.ctx,
        "n_ctx_train": engine.model.config.ctx_len,
        "weight_type": weights,
        "kv_dtype": if patches.kv_fp8 { "fp8_e4m3" } else { "f32" },
        "max_batch": engine.options.max_batch,
        "step_tokens": engine.options.step_tokens,
        "prefix_cache_tokens": if patches.prefix_cache_off { 0 } else { engine.options.prefix_cache_tokens },
    })
}

/// llama.cpp's `/apply-template`: the chat prompt text, generation prompt included, not tokenized.
pub fn apply_template(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let body = json_object(body)?;
    let messages = chat_messages(&body)?;
    Ok(json!({"prompt": render_chat(&body, messages, &state.engine.model)?}))
}

fn chat_messages(body: &serde_json::Map<String, Value>) -> Result<&[Value], ApiError> {
    match body.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => Ok(list),
        Some(Value::Array(_)) => Err(ApiError::param("messages", "`messages` must contain at least one message")),
        None | Some(Value::Null) => Err(ApiError::param("messages", "`messages` is required")),
        Some(_) => Err(ApiError::param("messages", "`messages` must be an array of message objects")),
    }
}

pub fn tokenize(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let body = json_object(body)?;
    if body.contains_key("messages") {
        // vLLM's chat form: exactly the ids a chat completion of these messages starts from.
        let messages = chat_messages(&body)?;
        let tokens = tokenize_prompt(&state.engine.model, &render_chat(&body, messages, &state.engine.model)?);
        return Ok(json!({"count": tokens.len(), "tokens": tokens, "max_model_len": state.engine.options.ctx}));
    }
    let content = match body.get("content") {
        Some(Value::String(s)) => s.as_str(),
        None | Some(Value::Null) => return Err(ApiError::param("content", "`content` is required")),
        Some(_) => return Err(ApiError::param("content", "`content` must be a string")),
    };
    let flag = |key: &'static str, default: bool| match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::param(key, format!("`{key}` must be true or false, got {v}"))),
    };
    let add_special = flag("add_special", false)?;
    let parse_special = flag("parse_special", true)?;
    let tok = &state.engine.model.tokenizer;
    let mut tokens = tok.encode(content, parse_special);
    if add_special {
        if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
            tokens.insert(0, bos);
        }
    }
    Ok(json!({"tokens": tokens}))
}

pub fn detokenize(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let body = json_object(body)?;
    let ids = body
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|ids| ids.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect::<Option<Vec<u32>>>())
        .ok_or_else(|| ApiError::param("tokens", "`tokens` must be a list of token ids"))?;
    Ok(json!({"content": state.engine.model.tokenizer.decode(&ids)}))
}
