//! Anthropic `/v1/messages`, whole and streamed (`message_start`, `content_block_*`, `message_delta`
//! events, thinking and signature deltas included). The top-level `system` becomes a leading system
//! message so that threading sees it.

use serde_json::{json, Map, Value};

use super::sse::Event;
use super::{usage, ParseError, ParsedResponse};

/// Takes the messages out of the request object (no copy), with `system` first.
pub fn request_messages(object: &mut Map<String, Value>) -> Result<Vec<Value>, ParseError> {
    let Some(Value::Array(messages)) = object.remove("messages") else { return Err(ParseError::Missing("messages")) };
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = object.remove("system").filter(|s| !s.is_null()) {
        out.push(json!({"role": "system", "content": system}));
    }
    out.extend(messages);
    Ok(out)
}

pub fn complete(value: &Value) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: 1, ..Default::default() };
    if let Some(u) = value.get("usage") {
        usage::anthropic(u, &mut parsed.usage);
    }
    parsed.finish_reason = value.get("stop_reason").and_then(Value::as_str).map(str::to_string);
    let blocks = value.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    parsed.reply_text = text_of(&blocks);
    parsed.reply_message = Some(json!({"role": "assistant", "content": blocks}));
    parsed
}

fn text_of(blocks: &[Value]) -> String {
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect()
}

pub fn stream(events: &[Event]) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: events.len() as u32, ..Default::default() };
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial_json: Vec<String> = Vec::new();
    let mut stopped = false;
    for event in events {
        let Some(data) = &event.data else { continue };
        let kind = data.get("type").and_then(Value::as_str).or(event.name.as_deref()).unwrap_or_default();
        match kind {
            "message_start" => {
                if let Some(u) = data.get("message").and_then(|m| m.get("usage")) {
                    usage::anthropic(u, &mut parsed.usage);
                }
            }
            "content_block_start" => {
                let index = data.get("index").and_then(Value::as_u64).unwrap_or(blocks.len() as u64) as usize;
                while blocks.len() <= index {
                    blocks.push(Value::Null);
                    partial_json.push(String::new());
                }
                blocks[index] = data.get("content_block").cloned().unwrap_or(Value::Null);
            }
            "content_block_delta" => {
                let index = data.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let Some(delta) = data.get("delta") else { continue };
                let Some(block) = blocks.get_mut(index) else { continue };
                match delta.get("type").and_then(Value::as_str) {
                    // `text_delta` appends its `text` to the block's `text`, and so on.
                    Some(kind @ ("text_delta" | "thinking_delta" | "signature_delta")) => {
                        let key = kind.trim_end_matches("_delta");
                        let piece = delta.get(key).and_then(Value::as_str).unwrap_or_default();
                        let current = block.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
                        block[key] = Value::String(current + piece);
                    }
                    Some("input_json_delta") => {
                        partial_json[index].push_str(delta.get("partial_json").and_then(Value::as_str).unwrap_or_default());
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = data.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if let (Some(block), Some(json)) = (blocks.get_mut(index), partial_json.get(index)) {
                    if !json.is_empty() {
                        block["input"] = serde_json::from_str(json).unwrap_or(Value::String(json.clone()));
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = data.get("delta").and_then(|d| d.get("stop_reason")).and_then(Value::as_str) {
                    parsed.finish_reason = Some(reason.to_string());
                }
                if let Some(u) = data.get("usage") {
                    usage::anthropic(u, &mut parsed.usage);
                }
            }
            "message_stop" => stopped = true,
            "error" => {
                parsed.error = data.get("error").and_then(|e| e.get("message")).and_then(Value::as_str).map(str::to_string);
            }
            _ => {}
        }
    }
    if !stopped {
        parsed.notes.push("stream ended without message_stop".into());
    }
    blocks.retain(|b| !b.is_null());
    parsed.reply_text = text_of(&blocks);
    parsed.reply_message = Some(json!({"role": "assistant", "content": blocks}));
    parsed
}

#[cfg(test)]
mod tests {
    use super::super::{request, response};
    use super::*;
    use ctxscope_store::Endpoint;

    #[test]
    fn system_becomes_first_message() {
        let r = request(
            Endpoint::AnthropicMessages,
            br#"{"model":"c","system":"be nice","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0], json!({"role": "system", "content": "be nice"}));
        assert_eq!(r.params["max_tokens"], 5);
    }

    #[test]
    fn whole_response() {
        let body = br#"{"type":"message","content":[{"type":"text","text":"Hi there"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"cache_read_input_tokens":100,"output_tokens":3}}"#;
        let p = response(Endpoint::AnthropicMessages, Some("application/json"), 200, body, false);
        assert_eq!(p.reply_text, "Hi there");
        assert_eq!(p.finish_reason.as_deref(), Some("end_turn"));
        let u = p.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (Some(105), Some(100), Some(3)));
    }

    #[test]
    fn streamed_text_and_tool_use() {
        let body = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"check.\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"ls\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"p\\\":\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\".\\\"}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        let p = response(Endpoint::AnthropicMessages, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_text, "Let me check.");
        assert_eq!(p.finish_reason.as_deref(), Some("tool_use"));
        let u = p.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(20), Some(15)));
        assert_eq!(p.reply_message.unwrap()["content"][1]["input"], json!({"p": "."}));
        assert!(p.notes.is_empty());
    }

    #[test]
    fn streamed_thinking_block_is_kept_whole() {
        let body = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Two plus \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"two is four.\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBsig==\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"4\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        let p = response(Endpoint::AnthropicMessages, Some("text/event-stream"), 200, body.as_bytes(), true);
        assert_eq!(p.reply_text, "4");
        let msg = p.reply_message.unwrap();
        assert_eq!(msg["content"][0], json!({"type": "thinking", "thinking": "Two plus two is four.", "signature": "EqQBsig=="}));
        assert_eq!(msg["content"][1], json!({"type": "text", "text": "4"}));
        assert_eq!(msg["content"].as_array().unwrap().len(), 2);
    }
}
