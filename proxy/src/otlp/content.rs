//! Message content in the GenAI semantic conventions' JSON shape (`gen_ai.input.messages`,
//! `gen_ai.output.messages`), exported only with `--otlp-content`: prompts are user data, and
//! off by default they never leave the sidecar.

use ctxscope_store::Endpoint;
use serde_json::{json, Value};

use super::summary::Content;

/// `[{"role", "parts": [...]}]` for the request's messages; `None` when the body does not parse.
pub fn input_messages(endpoint: Endpoint, content: &Content) -> Option<String> {
    let body: Vec<u8> = content.request.concat();
    let request = crate::parse::request(endpoint, &body).ok()?;
    let mut messages: Vec<Value> = request.messages.iter().map(|m| message(m)).collect();
    if content.redact {
        messages.iter_mut().for_each(|m| {
            crate::privacy::redact::redact_value(m);
        });
    }
    serde_json::to_string(&messages).ok()
}

/// `[{"role": "assistant", "parts": [{"type": "text", ...}], "finish_reason"}]` for the reply.
pub fn output_messages(content: &Content, finish_reason: Option<&str>) -> String {
    let reply = json!([{
        "role": "assistant",
        "parts": [{"type": "text", "content": content.reply_text}],
        "finish_reason": finish_reason.unwrap_or(""),
    }]);
    reply.to_string()
}

/// One OpenAI-shaped message (what the parsers normalise every API to) in the conventions' shape.
fn message(message: &Value) -> Value {
    let role = message["role"].as_str().unwrap_or("user");
    let mut parts = Vec::new();
    match &message["content"] {
        Value::String(text) if role == "tool" => {
            parts.push(json!({"type": "tool_call_response", "id": message["tool_call_id"], "response": text}))
        }
        Value::String(text) => parts.push(json!({"type": "text", "content": text})),
        Value::Array(items) => {
            for item in items {
                match item["text"].as_str() {
                    Some(text) => parts.push(json!({"type": "text", "content": text})),
                    None => parts.push(json!({"type": item["type"].as_str().unwrap_or("unknown")})),
                }
            }
        }
        _ => {}
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        parts.push(json!({
            "type": "tool_call",
            "id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }));
    }
    let role = if role == "prompt" { "user" } else { role };
    json!({"role": role, "parts": parts})
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn chat_messages_become_role_and_parts() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]});
        let content = Content { request: vec![Bytes::from(body.to_string())], reply_text: "ok".into(), redact: false };
        let input: Value = serde_json::from_str(&input_messages(Endpoint::ChatCompletions, &content).unwrap()).unwrap();
        assert_eq!(input[0], json!({"role": "system", "parts": [{"type": "text", "content": "be brief"}]}));
        assert_eq!(input[1]["parts"], json!([{"type": "text", "content": "hi"}, {"type": "image_url"}]));
        assert_eq!(input[2]["parts"][0], json!({"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"}));
        assert_eq!(input[3]["parts"][0], json!({"type": "tool_call_response", "id": "c1", "response": "42"}));
        let output: Value = serde_json::from_str(&output_messages(&content, Some("stop"))).unwrap();
        assert_eq!(output, json!([{"role": "assistant", "parts": [{"type": "text", "content": "ok"}], "finish_reason": "stop"}]));
    }

    #[test]
    fn a_redacted_turn_exports_its_messages_masked() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "I am a@example.com"}]});
        let content = Content { request: vec![Bytes::from(body.to_string())], reply_text: "[redacted:email]".into(), redact: true };
        let input = input_messages(Endpoint::ChatCompletions, &content).unwrap();
        assert!(input.contains("I am [redacted:email]") && !input.contains("a@example.com"), "{input}");
    }
}
