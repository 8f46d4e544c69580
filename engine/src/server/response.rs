//! The JSON the server sends, in OpenAI's exact shapes: chat completions and their stream chunks,
//! legacy text completions and theirs, `usage`, and both log-probability layouts (chat's
//! `logprobs.content[]` and the legacy `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`).

use serde_json::{json, Value};

use super::generation::{FinishReason, TokenLogprob, Usage};
use super::request::Endpoint;

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub logprobs: bool,
}

impl Meta {
    pub fn new(endpoint: Endpoint, model: &str, logprobs: bool) -> Meta {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Meta { id: format!("{prefix}-{:x}{n:06x}", now.as_millis()), created: now.as_secs(), model: model.to_string(), endpoint, logprobs }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// The whole reply of a non-streaming request.
    pub fn full(&self, text: &str, logprobs: &[TokenLogprob], finish: FinishReason, usage: &Usage) -> Value {
        let lp = self.logprobs_json(logprobs);
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp,
                "finish_reason": finish.as_str(),
            }),
            Endpoint::Completion => json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish.as_str()}),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_json(usage),
        })
    }

    /// A stream chunk with one choice: `role` only in the first chat chunk; `finish` in the last.
    pub fn chunk(
        &self,
        text: Option<&str>,
        role: bool,
        logprobs: &[TokenLogprob],
        finish: Option<FinishReason>,
        with_usage: bool,
    ) -> Value {
        let lp = if logprobs.is_empty() { Value::Null } else { self.logprobs_json(logprobs) };
        let finish = finish.map(FinishReason::as_str);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(text) = text {
                    delta.insert("content".into(), json!(text));
                }
                json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
            Endpoint::Completion => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish}),
        };
        let mut chunk = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if with_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The final `include_usage` chunk: no choices, the usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_json(usage),
        })
    }

    fn logprobs_json(&self, tokens: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Chat => chat_logprobs(tokens),
            Endpoint::Completion => legacy_logprobs(tokens),
        }
    }
}

pub fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    })
}

fn token_text(piece: &[u8]) -> String {
    String::from_utf8_lossy(piece).into_owned()
}

/// Chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> =
                t.top.iter().map(|(piece, lp)| json!({"token": token_text(piece), "logprob": lp, "bytes": piece})).collect();
            json!({"token": token_text(&t.piece), "logprob": t.logprob, "bytes": t.piece, "top_logprobs": top})
        })
        .collect();
    json!({"content": content})
}

/// Legacy completions: parallel arrays, `top_logprobs` as one `{token: logprob}` map per token.
fn legacy_logprobs(tokens: &[TokenLogprob]) -> Value {
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let map: serde_json::Map<String, Value> = t.top.iter().map(|(piece, lp)| (token_text(piece), json!(lp))).collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| token_text(&t.piece)).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": tokens.iter().map(|t| t.text_offset).collect::<Vec<_>>(),
    })
}
