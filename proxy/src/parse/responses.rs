//! OpenAI's Responses API, `/v1/responses`, whole and streamed (`response.*` SSE events). Input items
//! become chat-shaped messages and the output items one assistant message, so hashing, threading,
//! token counting, the detectors and replay work on them unchanged (the mapping: docs/capture.md).

use serde_json::{json, Map, Value};

use super::sse::Event;
use super::{ParseError, ParsedResponse};
use ctxscope_store::Usage;

/// What a Responses request carries beyond its messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponsesRequest {
    pub previous_response_id: Option<String>,
    /// The first message is the request's `instructions`.
    pub instructions: bool,
    /// Messages made from the request's own `input`.
    pub input_messages: u32,
    pub truncation: Option<String>,
    pub store: Option<bool>,
    pub conversation: Option<Value>,
}

/// Role of the pseudo-message that carries an item this mapping does not know, verbatim.
pub const OPAQUE_ROLE: &str = "responses_item";

/// Takes `instructions` and `input` out of the request object: instructions first (as a system
/// message), then the input items mapped to messages.
pub fn request_messages(object: &mut Map<String, Value>) -> Result<(Vec<Value>, ResponsesRequest), ParseError> {
    let input = object.remove("input").filter(|v| !v.is_null()).ok_or(ParseError::Missing("input"))?;
    let input = match input {
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        Value::Array(items) => items_to_messages(&items),
        _ => return Err(ParseError::Missing("input")),
    };
    let mut messages = Vec::with_capacity(input.len() + 1);
    let instructions = object.remove("instructions").filter(|v| !v.is_null() && v.as_str() != Some(""));
    let info = ResponsesRequest {
        previous_response_id: object.get("previous_response_id").and_then(Value::as_str).map(str::to_string),
        instructions: instructions.is_some(),
        input_messages: input.len() as u32,
        truncation: object.get("truncation").and_then(Value::as_str).map(str::to_string),
        store: object.get("store").and_then(Value::as_bool),
        conversation: object.get("conversation").filter(|v| !v.is_null()).cloned(),
    };
    if let Some(instructions) = instructions {
        messages.push(json!({"role": "system", "content": content(&instructions)}));
    }
    messages.extend(input);
    Ok((messages, info))
}

/// The assistant turn being gathered from consecutive assistant-side items.
#[derive(Default)]
struct Assistant {
    open: bool,
    text: String,
    calls: Vec<Value>,
    reasoning: Vec<Value>,
}

impl Assistant {
    fn flush(&mut self, out: &mut Vec<Value>) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let mut message = json!({"role": "assistant", "content": std::mem::take(&mut self.text)});
        if !self.calls.is_empty() {
            message["tool_calls"] = Value::Array(std::mem::take(&mut self.calls));
        }
        if !self.reasoning.is_empty() {
            message["reasoning_items"] = Value::Array(std::mem::take(&mut self.reasoning));
        }
        out.push(message);
    }
}

/// Input or output items as chat-shaped messages. Consecutive assistant messages, `function_call`s and
/// `reasoning` items make one assistant message (`content`, `tool_calls`, `reasoning_items` kept
/// opaque), as the reply to the response that produced them is; `function_call_output` is a `tool`
/// message; other messages keep their role; unknown item types pass verbatim as [`OPAQUE_ROLE`].
pub fn items_to_messages(items: &[Value]) -> Vec<Value> {
    let mut out = Vec::with_capacity(items.len());
    let mut assistant = Assistant::default();
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        let role = item.get("role").and_then(Value::as_str);
        match (kind, role) {
            (Some("message") | None, Some("assistant")) => {
                assistant.open = true;
                assistant.text.push_str(&text_of(item.get("content").unwrap_or(&Value::Null)));
            }
            (Some("function_call"), _) => {
                assistant.open = true;
                let call_id = item.get("call_id").or_else(|| item.get("id")).cloned().unwrap_or(Value::Null);
                let name = item.get("name").cloned().unwrap_or(Value::Null);
                let arguments = item.get("arguments").cloned().unwrap_or(Value::String(String::new()));
                assistant.calls.push(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            (Some("reasoning"), _) => {
                assistant.open = true;
                assistant.reasoning.push(without_status(item));
            }
            (Some("message") | None, Some(role)) => {
                assistant.flush(&mut out);
                out.push(json!({"role": role, "content": content(item.get("content").unwrap_or(&Value::Null))}));
            }
            (Some("function_call_output"), _) => {
                assistant.flush(&mut out);
                let call_id = item.get("call_id").cloned().unwrap_or(Value::Null);
                let output = item.get("output").map(content).unwrap_or(Value::String(String::new()));
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            _ => {
                assistant.flush(&mut out);
                out.push(json!({"role": OPAQUE_ROLE, "item": without_status(item)}));
            }
        }
    }
    assistant.flush(&mut out);
    out
}

/// Chat-shaped messages back to Responses input items (the inverse of [`items_to_messages`]), for
/// a stateless upstream that must be sent the whole chain (`--responses-state`).
pub fn messages_to_items(messages: &[Value]) -> Vec<Value> {
    let mut items = Vec::with_capacity(messages.len());
    for message in messages {
        match message.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                if let Some(Value::Array(reasoning)) = message.get("reasoning_items") {
                    items.extend(reasoning.iter().cloned());
                }
                let text = text_of(message.get("content").unwrap_or(&Value::Null));
                let calls = message.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                if !text.is_empty() || calls.is_empty() {
                    items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}));
                }
                for call in calls {
                    let function = call.get("function").cloned().unwrap_or(Value::Null);
                    items.push(json!({
                        "type": "function_call", "call_id": call.get("id").cloned().unwrap_or(Value::Null),
                        "name": function.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": function.get("arguments").cloned().unwrap_or(Value::String(String::new())),
                    }));
                }
            }
            Some("tool") => items.push(json!({
                "type": "function_call_output", "call_id": message.get("tool_call_id").cloned().unwrap_or(Value::Null),
                "output": message.get("content").cloned().unwrap_or(Value::String(String::new())),
            })),
            Some(OPAQUE_ROLE) => items.push(message.get("item").cloned().unwrap_or(Value::Null)),
            Some(role) => {
                let content = match message.get("content") {
                    Some(Value::Array(parts)) => Value::Array(parts.iter().map(input_part).collect()),
                    Some(other) => other.clone(),
                    None => Value::String(String::new()),
                };
                items.push(json!({"type": "message", "role": role, "content": content}));
            }
            None => {}
        }
    }
    items
}

/// A chat `text` part as a Responses `input_text` part; other parts as they are.
fn input_part(part: &Value) -> Value {
    match (part.get("type").and_then(Value::as_str), part.get("text")) {
        (Some("text"), Some(text)) => json!({"type": "input_text", "text": text}),
        _ => part.clone(),
    }
}

/// Message content: a string as is; `input_text` / `output_text` parts as chat `text` parts, made one
/// string when there is nothing else; other parts (images, files) verbatim.
fn content(value: &Value) -> Value {
    let Value::Array(parts) = value else {
        return value.clone();
    };
    let is_text = |p: &Value| matches!(p.get("type").and_then(Value::as_str), Some("input_text" | "output_text" | "text"));
    if parts.iter().all(is_text) {
        return Value::String(text_of(value));
    }
    let parts = parts.iter().map(|p| {
        if is_text(p) {
            json!({"type": "text", "text": p.get("text").cloned().unwrap_or(Value::Null)})
        } else {
            p.clone()
        }
    });
    Value::Array(parts.collect())
}

/// The text of a content value (a string, or the `text` of its parts).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(),
        _ => String::new(),
    }
}

/// An item kept opaque, less its `status` (output items carry one that resent input items may not).
fn without_status(item: &Value) -> Value {
    let mut item = item.clone();
    if let Some(object) = item.as_object_mut() {
        object.remove("status");
    }
    item
}

/// A whole response object (a non-streamed body, or the `response` of `response.completed`).
pub fn complete(value: &Value) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: 1, ..Default::default() };
    absorb_response(value, &mut parsed);
    let output = value.get("output").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    reply_from_items(output, &mut parsed);
    parsed
}

/// Id, status, usage and error of a response object.
fn absorb_response(value: &Value, parsed: &mut ParsedResponse) {
    if let Some(id) = value.get("id").and_then(Value::as_str) {
        parsed.response_id = Some(id.to_string());
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        parsed.usage = Some(usage_of(usage));
    }
    let dropped = value.pointer("/ctxscope/dropped_items").filter(|d| d.as_array().is_some_and(|a| !a.is_empty()));
    if let Some(dropped) = dropped {
        parsed.dropped_items = Some(dropped.clone());
    }
    if let Some(message) = value.pointer("/error/message").and_then(Value::as_str) {
        parsed.error = Some(message.to_string());
    }
    let status = value.get("status").and_then(Value::as_str);
    parsed.finish_reason = match status {
        Some("completed") => Some("stop".into()),
        Some("incomplete") => match value.pointer("/incomplete_details/reason").and_then(Value::as_str) {
            Some("max_output_tokens") => Some("length".into()),
            Some(reason) => Some(reason.to_string()),
            None => Some("incomplete".into()),
        },
        Some("failed") => Some("error".into()),
        Some(other) => Some(other.to_string()),
        None => parsed.finish_reason.take(),
    };
}

/// The reply message and text from output items; a completed response that called tools finished
/// with `tool_calls`, as chat's does.
fn reply_from_items(output: &[Value], parsed: &mut ParsedResponse) {
    let mut messages = items_to_messages(output);
    let mut reply = match messages.iter().position(|m| m.get("role").and_then(Value::as_str) == Some("assistant")) {
        Some(i) => messages.remove(i),
        None => json!({"role": "assistant", "content": ""}),
    };
    if !messages.is_empty() {
        parsed.notes.push(format!("{} output item(s) beside the assistant message kept in `output_items`", messages.len()));
        reply["output_items"] = Value::Array(messages);
    }
    parsed.reply_text = reply.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
    if reply.get("tool_calls").is_some() && parsed.finish_reason.as_deref() == Some("stop") {
        parsed.finish_reason = Some("tool_calls".into());
    }
    parsed.reply_message = Some(reply);
}

/// Responses usage: `input_tokens` (with `input_tokens_details.cached_tokens`) and `output_tokens`.
pub fn usage_of(usage: &Value) -> Usage {
    let num = |v: Option<&Value>| v.and_then(Value::as_u64);
    Usage {
        prompt_tokens: num(usage.get("input_tokens")),
        completion_tokens: num(usage.get("output_tokens")),
        cached_tokens: num(usage.pointer("/input_tokens_details/cached_tokens")),
        sources: vec!["openai_responses".into()],
    }
}

/// A streamed response: the final `response.completed` (or `.incomplete`, `.failed`) object when it
/// came; otherwise the items gathered from `response.output_item.*` and the text and argument deltas.
pub fn stream(events: &[Event]) -> ParsedResponse {
    let mut parsed = ParsedResponse { events: events.len() as u32, ..Default::default() };
    let mut items: Vec<Value> = Vec::new();
    let mut last: Option<&Value> = None;
    for event in events {
        let Some(data) = &event.data else { continue };
        let kind = data.get("type").and_then(Value::as_str).or(event.name.as_deref()).unwrap_or_default();
        let index = locate(&items, data, kind == "response.output_item.added");
        match kind {
            "response.created" | "response.in_progress" => {
                if let Some(response) = data.get("response") {
                    absorb_response(response, &mut parsed);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => last = data.get("response"),
            "response.output_item.added" | "response.output_item.done" => {
                if let (Some(i), Some(item)) = (index, data.get("item")) {
                    *slot(&mut items, i) = item.clone();
                }
            }
            "response.output_text.delta" => {
                if let (Some(i), Some(delta)) = (index, data.get("delta").and_then(Value::as_str)) {
                    append_text(slot(&mut items, i), delta);
                }
            }
            "response.function_call_arguments.delta" => {
                if let (Some(i), Some(delta)) = (index, data.get("delta").and_then(Value::as_str)) {
                    let item = slot(&mut items, i);
                    let current = item.get("arguments").and_then(Value::as_str).unwrap_or_default().to_string();
                    item["arguments"] = Value::String(current + delta);
                }
            }
            "error" => {
                let message = data.get("message").or_else(|| data.pointer("/error/message")).and_then(Value::as_str);
                parsed.error = Some(message.map_or_else(|| data.to_string(), str::to_string));
            }
            _ => {}
        }
    }
    items.retain(|i| !i.is_null());
    match last {
        Some(response) => {
            absorb_response(response, &mut parsed);
            let output = response.get("output").and_then(Value::as_array).filter(|o| !o.is_empty());
            reply_from_items(output.map_or(items.as_slice(), Vec::as_slice), &mut parsed);
        }
        None => {
            parsed.notes.push("stream ended without response.completed".into());
            parsed.finish_reason = None;
            reply_from_items(&items, &mut parsed);
        }
    }
    parsed
}

/// The output item an event is about: its `output_index`, else the item with its `item_id` (or its
/// item's `id`; llama.cpp sends no `output_index`), else a new one when it adds, else the last.
fn locate(items: &[Value], data: &Value, adding: bool) -> Option<usize> {
    if let Some(i) = data.get("output_index").and_then(Value::as_u64) {
        return Some(i as usize);
    }
    let id = data.get("item_id").or_else(|| data.pointer("/item/id")).and_then(Value::as_str);
    if let Some(i) = id.and_then(|id| items.iter().position(|item| item.get("id").and_then(Value::as_str) == Some(id))) {
        return Some(i);
    }
    if adding || items.is_empty() {
        Some(items.len())
    } else {
        Some(items.len() - 1)
    }
}

fn slot(items: &mut Vec<Value>, index: usize) -> &mut Value {
    if items.len() <= index {
        items.resize(index + 1, Value::Null);
    }
    &mut items[index]
}

/// Adds a text delta to a message item being streamed (its last `output_text` part).
fn append_text(item: &mut Value, delta: &str) {
    if item.is_null() {
        *item = json!({"type": "message", "role": "assistant", "content": []});
    }
    if !item.get("content").is_some_and(Value::is_array) {
        item["content"] = json!([]);
    }
    let Some(parts) = item.get_mut("content").and_then(Value::as_array_mut) else {
        return;
    };
    if parts.last().and_then(|p| p.get("type")).and_then(Value::as_str) != Some("output_text") {
        parts.push(json!({"type": "output_text", "text": ""}));
    }
    if let Some(part) = parts.last_mut() {
        let current = part.get("text").and_then(Value::as_str).unwrap_or_default().to_string();
        part["text"] = Value::String(current + delta);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{request, response};
    use super::*;
    use ctxscope_store::Endpoint;

    fn sse(events: &[Value]) -> String {
        events.iter().map(|e| format!("event: {}\ndata: {}\n\n", e["type"].as_str().unwrap(), e)).collect()
    }

    #[test]
    fn string_input_with_instructions_and_fields() {
        let body = br#"{"model":"m","instructions":"be brief","input":"hi","previous_response_id":"resp_1","truncation":"auto","store":false,"max_output_tokens":9,"tools":[{"type":"function","name":"ls","parameters":{}}]}"#;
        let r = request(Endpoint::Responses, body).unwrap();
        assert_eq!(r.messages, vec![json!({"role": "system", "content": "be brief"}), json!({"role": "user", "content": "hi"})]);
        let info = r.responses.unwrap();
        assert_eq!(info.previous_response_id.as_deref(), Some("resp_1"));
        assert!(info.instructions);
        assert_eq!((info.input_messages, info.truncation.as_deref(), info.store), (1, Some("auto"), Some(false)));
        assert_eq!(r.params["max_output_tokens"], 9);
        assert_eq!(r.tools.unwrap().names, vec!["ls"]);
    }

    #[test]
    fn items_map_to_chat_messages_and_back() {
        let items = json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed"},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "web_search_call", "id": "ws_1"}
        ]);
        let messages = items_to_messages(items.as_array().unwrap());
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[0], json!({"role": "user", "content": "weather?"}));
        assert_eq!(messages[1]["content"], "Checking.");
        assert_eq!(
            messages[1]["tool_calls"][0],
            json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})
        );
        assert_eq!(messages[1]["reasoning_items"][0], json!({"type": "reasoning", "id": "rs_1", "summary": []}));
        assert_eq!(messages[2], json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}));
        assert_eq!(messages[3]["role"], OPAQUE_ROLE);
        // Back to items, and again to messages: the same messages (so the same hashes).
        assert_eq!(items_to_messages(&messages_to_items(&messages)), messages);
    }

    #[test]
    fn whole_response_with_a_function_call() {
        let body = json!({
            "id": "resp_9", "object": "response", "status": "completed",
            "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "ls", "arguments": "{}", "status": "completed"}],
            "usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 6, "total_tokens": 46}
        });
        let p = response(Endpoint::Responses, Some("application/json"), 200, body.to_string().as_bytes(), false);
        assert_eq!(p.response_id.as_deref(), Some("resp_9"));
        assert_eq!(p.finish_reason.as_deref(), Some("tool_calls"));
        let u = p.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (Some(40), Some(32), Some(6)));
        assert_eq!(p.reply_message.unwrap()["tool_calls"][0]["id"], "call_1");
        assert_eq!(p.dropped_items, None);
        let told = complete(&json!({"status": "completed", "output": [], "ctxscope": {"dropped_items": [{"index": 0, "role": "user"}]}}));
        assert_eq!(told.dropped_items, Some(json!([{"index": 0, "role": "user"}])));
    }

    #[test]
    fn the_reply_hashes_like_the_items_a_stateless_client_resends() {
        let output = json!([{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}]);
        let p = complete(&json!({"id": "r", "status": "completed", "output": output}));
        let resent = items_to_messages(output.as_array().unwrap());
        assert_eq!(ctxscope_store::message_hash(&p.reply_message.unwrap()).0, ctxscope_store::message_hash(&resent[0]).0);
    }

    fn streamed_events() -> Vec<Value> {
        vec![
            json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_s", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "m", "role": "assistant", "content": []}}),
            json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hel"}),
            json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "lo"}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{\"p\":"}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "1}"}),
            json!({"type": "response.completed", "response": {"id": "resp_s", "status": "completed", "output": [], "usage": {"input_tokens": 12, "output_tokens": 3}}}),
        ]
    }

    #[test]
    fn streamed_deltas_split_across_chunks() {
        let body = sse(&streamed_events());
        // The capture sees the whole body whatever the frames were; cut it anywhere and join again.
        let bytes = body.as_bytes();
        let mut joined = Vec::new();
        for chunk in bytes.chunks(7) {
            joined.extend_from_slice(chunk);
        }
        let p = response(Endpoint::Responses, Some("text/event-stream"), 200, &joined, true);
        assert_eq!(p.reply_text, "Hello");
        assert_eq!(p.events, 8);
        assert_eq!(p.response_id.as_deref(), Some("resp_s"));
        assert_eq!(p.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(p.usage.unwrap().prompt_tokens, Some(12));
        assert_eq!(p.reply_message.unwrap()["tool_calls"][0]["function"]["arguments"], "{\"p\":1}");
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }

    #[test]
    fn llama_cpp_events_without_output_index_are_matched_by_item_id() {
        let events = vec![
            json!({"type": "response.created", "response": {"id": "resp_l", "object": "response", "status": "in_progress"}}),
            json!({"type": "response.output_item.added", "item": {"content": [], "id": "msg_a", "role": "assistant", "status": "in_progress", "type": "message"}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_a", "delta": "A"}),
            json!({"type": "response.output_text.delta", "item_id": "msg_a", "delta": "w"}),
        ];
        let p = response(Endpoint::Responses, Some("text/event-stream"), 200, sse(&events).as_bytes(), true);
        assert_eq!(p.reply_text, "Aw");
        assert_eq!(p.response_id.as_deref(), Some("resp_l"));
    }

    #[test]
    fn a_stream_cut_short_keeps_what_arrived() {
        let events = streamed_events();
        let body = sse(&events[..4]);
        // Cut mid-event too: the half event is dropped, not misread.
        let cut = format!("{body}event: response.output_text.delta\ndata: {{\"type\":\"resp");
        let p = response(Endpoint::Responses, Some("text/event-stream"), 200, cut.as_bytes(), true);
        assert_eq!(p.reply_text, "Hello");
        assert_eq!(p.finish_reason, None);
        assert!(p.notes.iter().any(|n| n.contains("without response.completed")));
    }

    #[test]
    fn malformed_bodies_fail_open() {
        assert!(matches!(request(Endpoint::Responses, b"{\"input\":"), Err(ParseError::NotJson(_))));
        assert_eq!(request(Endpoint::Responses, br#"{"model":"m"}"#), Err(ParseError::Missing("input")));
        assert_eq!(request(Endpoint::Responses, br#"{"input":7}"#), Err(ParseError::Missing("input")));
        let p = response(Endpoint::Responses, Some("application/json"), 200, b"{not json", false);
        assert!(p.notes[0].contains("not JSON"));
        let p = response(Endpoint::Responses, Some("text/event-stream"), 200, b"data: {\"type\":7}\n\ndata: nonsense\n\n", true);
        assert!(p.reply_message.is_some() && p.reply_text.is_empty());
        let p = response(Endpoint::Responses, Some("application/json"), 404, br#"{"error":{"message":"Previous response with id 'x' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}"#, false);
        assert!(p.error.unwrap().contains("not found"));
    }
}
