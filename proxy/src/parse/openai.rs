//! OpenAI `/v1/chat/completions` and `/v1/completions`, whole and streamed (SSE `data:` chunks with
//! `choices[].delta`, tool-call fragments merged by index, usage from any chunk, `[DONE]` at the end).
//! The model's reasoning (`reasoning_content` or `reasoning`) is kept in the reply message under the
//! key the upstream used, so that a later request that drops it can be told apart.

use ctxscope_store::Endpoint;
use serde_json::{json, Map, Value};

use super::sse::Event;
use super::{usage, ParseError, ParsedResponse};

/// Takes the messages out of the request object (no copy).
pub fn request_messages(object: &mut Map<String, Value>) -> Result<Vec<Value>, ParseError> {
    match object.remove("messages") {
        Some(Value::Array(messages)) => Ok(messages),
        _ => Err(ParseError::Missing("messages")),
    }
}

/// A completions prompt as a single pseudo-message, so that it hashes and threads like chat.
pub fn prompt_messages(object: &mut Map<String, Value>) -> Result<Vec<Value>, ParseError> {
    let prompt = object.remove("prompt").ok_or(ParseError::Missing("prompt"))?;
    let prompt = match prompt {
        Value::Array(mut items) if items.len() == 1 && items[0].is_string() => items.remove(0),
        other => other,
    };
    Ok(vec![json!({"role": "prompt", "content": prompt})])
}

/// Text of a message `content`, whether a string or a list of parts.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(),
        _ => String::new(),
    }
}

pub fn complete(endpoint: Endpoint, value: &Value) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: 1, ..Default::default() };
    usage::absorb(value, &mut parsed.usage);
    let choice = value.get("choices").and_then(|c| c.get(0));
    let Some(choice) = choice else {
        parsed.notes.push("response has no choices".into());
        return parsed;
    };
    parsed.finish_reason = choice.get("finish_reason").and_then(Value::as_str).map(str::to_string);
    if endpoint == Endpoint::Completions {
        parsed.reply_text = choice.get("text").and_then(Value::as_str).unwrap_or_default().to_string();
        parsed.reply_message = Some(json!({"role": "completion", "content": parsed.reply_text}));
        return parsed;
    }
    if let Some(message) = choice.get("message") {
        parsed.reply_text = message.get("content").map(content_text).unwrap_or_default();
        parsed.reply_message = Some(reply_message(&parsed.reply_text, reasoning_of(message), message.get("tool_calls").cloned()));
    }
    parsed
}

/// Where servers put reasoning on a message or delta: DeepSeek, SGLang and older vLLM use the first,
/// newer vLLM and OpenRouter the second. The first wins when both are present.
const REASONING_KEYS: [&str; 2] = ["reasoning_content", "reasoning"];

/// A message's or delta's non-empty reasoning string, with the key it came under.
fn reasoning_of(message: &Value) -> Option<(&'static str, &str)> {
    REASONING_KEYS.into_iter().find_map(|key| Some((key, message.get(key)?.as_str().filter(|s| !s.is_empty())?)))
}

/// The assistant message a client resends next turn: role, content, reasoning (under the upstream's
/// key, when not empty), tool calls.
fn reply_message(text: &str, reasoning: Option<(&str, &str)>, tool_calls: Option<Value>) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if let Some((key, reasoning)) = reasoning.filter(|(_, r)| !r.is_empty()) {
        message[key] = Value::String(reasoning.to_string());
    }
    if let Some(calls) = tool_calls.filter(|c| c.as_array().is_some_and(|a| !a.is_empty())) {
        message["tool_calls"] = calls;
    }
    message
}

pub fn stream(endpoint: Endpoint, events: &[Event]) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: events.len() as u32, ..Default::default() };
    let mut calls: Vec<Value> = Vec::new();
    let (mut reasoning_key, mut reasoning) = (REASONING_KEYS[1], String::new());
    let mut done = false;
    for event in events {
        done |= event.done;
        let Some(data) = &event.data else { continue };
        usage::absorb(data, &mut parsed.usage);
        if let Some(error) = data.get("error") {
            let message = error.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| error.to_string());
            parsed.error = Some(message);
        }
        let Some(choice) = data.get("choices").and_then(|c| c.get(0)) else { continue };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            parsed.finish_reason = Some(reason.to_string());
        }
        if endpoint == Endpoint::Completions {
            parsed.reply_text.push_str(choice.get("text").and_then(Value::as_str).unwrap_or_default());
            continue;
        }
        let Some(delta) = choice.get("delta") else { continue };
        if let Some(content) = delta.get("content") {
            parsed.reply_text.push_str(&content_text(content));
        }
        if let Some((key, piece)) = reasoning_of(delta) {
            if key == REASONING_KEYS[0] {
                reasoning_key = key;
            }
            reasoning.push_str(piece);
        }
        if let Some(Value::Array(fragments)) = delta.get("tool_calls") {
            for fragment in fragments {
                merge_tool_call(&mut calls, fragment);
            }
        }
    }
    if !done && parsed.finish_reason.is_none() {
        parsed.notes.push("stream ended without finish_reason or [DONE]".into());
    }
    parsed.reply_message = Some(if endpoint == Endpoint::Completions {
        json!({"role": "completion", "content": parsed.reply_text})
    } else {
        reply_message(&parsed.reply_text, Some((reasoning_key, &reasoning)), Some(Value::Array(calls)))
    });
    parsed
}

/// Streamed tool calls arrive as fragments keyed by `index`; names and arguments concatenate.
fn merge_tool_call(calls: &mut Vec<Value>, fragment: &Value) {
    let index = fragment.get("index").and_then(Value::as_u64).unwrap_or(calls.len() as u64) as usize;
    while calls.len() <= index {
        calls.push(json!({"id": null, "type": "function", "function": {"name": "", "arguments": ""}}));
    }
    let call = &mut calls[index];
    if let Some(id) = fragment.get("id").filter(|v| !v.is_null()) {
        call["id"] = id.clone();
    }
    if let Some(kind) = fragment.get("type").and_then(Value::as_str) {
        call["type"] = Value::String(kind.to_string());
    }
    if let Some(function) = fragment.get("function") {
        for key in ["name", "arguments"] {
            if let Some(piece) = function.get(key).and_then(Value::as_str) {
                let current = call["function"][key].as_str().unwrap_or_default().to_string();
                call["function"][key] = Value::String(current + piece);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{response, sse};
    use super::*;

    #[test]
    fn whole_chat_response() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2}}"#;
        let p = response(Endpoint::ChatCompletions, Some("application/json"), 200, body, false);
        assert_eq!(p.reply_text, "Paris.");
        assert_eq!(p.finish_reason.as_deref(), Some("stop"));
        assert_eq!(p.usage.unwrap().prompt_tokens, Some(12));
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "Paris."}));
    }

    #[test]
    fn streamed_chat_with_usage_chunk_and_tool_calls() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n",
            "data: [DONE]\n\n"
        );
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_text, "Hello");
        assert_eq!(p.events, 7);
        assert_eq!(p.finish_reason.as_deref(), Some("tool_calls"));
        let u = p.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (Some(30), Some(16)));
        let msg = p.reply_message.unwrap();
        assert_eq!(msg["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(msg["tool_calls"][0]["id"], "c1");
        assert!(p.notes.is_empty());
    }

    #[test]
    fn llama_cpp_final_chunk_timings() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}],\"timings\":{\"prompt_n\":3,\"cache_n\":40,\"predicted_n\":1}}\n\ndata: [DONE]\n\n";
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body.as_bytes(), true);
        let u = p.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (Some(43), Some(40)));
    }

    #[test]
    fn truncated_stream_is_noted() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\ndata: {\"choi";
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body, true);
        assert_eq!(p.reply_text, "par");
        assert_eq!(p.notes.len(), 1);
    }

    #[test]
    fn completions_whole_and_streamed() {
        let whole = br#"{"choices":[{"text":" world","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}"#;
        let p = response(Endpoint::Completions, Some("application/json"), 200, whole, false);
        assert_eq!(p.reply_text, " world");
        let streamed = "data: {\"choices\":[{\"text\":\" wor\"}]}\n\ndata: {\"choices\":[{\"text\":\"ld\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let p = response(Endpoint::Completions, Some("text/event-stream"), 200, streamed.as_bytes(), true);
        assert_eq!(p.reply_text, " world");
        assert_eq!(sse::events(streamed.as_bytes()).len(), 3);
        let req = super::super::request(Endpoint::Completions, br#"{"prompt":["Hello"]}"#).unwrap();
        assert_eq!(req.messages[0]["content"], "Hello");
    }

    #[test]
    fn whole_chat_keeps_reasoning_content() {
        let body =
            br#"{"choices":[{"message":{"role":"assistant","content":"4","reasoning_content":"2+2 is 4."},"finish_reason":"stop"}]}"#;
        let p = response(Endpoint::ChatCompletions, Some("application/json"), 200, body, false);
        assert_eq!(p.reply_text, "4");
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "4", "reasoning_content": "2+2 is 4."}));
    }

    #[test]
    fn whole_chat_without_reasoning_adds_no_key() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"4","reasoning_content":null,"reasoning":""},"finish_reason":"stop"}]}"#;
        let p = response(Endpoint::ChatCompletions, Some("application/json"), 200, body, false);
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "4"}));
    }

    #[test]
    fn streamed_chat_concatenates_reasoning_content() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Two plus \"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"two is four.\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"4\",\"reasoning_content\":null}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_text, "4");
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."}));
    }

    #[test]
    fn streamed_chat_keeps_reasoning_key() {
        let body = concat!(
            "data: {\"choices\":[{\"delta\":{\"reasoning\":\"Think\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning\":\"ing.\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Done\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_text, "Done");
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "Done", "reasoning": "Thinking."}));
    }

    #[test]
    fn streamed_chat_prefers_reasoning_content_when_both_keys_come() {
        let body = "data: {\"choices\":[{\"delta\":{\"reasoning\":\"Hm.\",\"reasoning_content\":\"Hm.\",\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let p = response(Endpoint::ChatCompletions, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_message.unwrap(), json!({"role": "assistant", "content": "ok", "reasoning_content": "Hm."}));
    }
}
