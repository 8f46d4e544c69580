//! `POST /v1/responses`, OpenAI's Responses API, served statelessly by translation (as `/api/chat`
//! is): `instructions` and `input` items become chat messages for the same generation path, and the
//! answer goes back as a response object, or as `response.*` SSE events when streamed. With
//! `--responses-store DIR` the engine keeps each response (its chat context, input and reply) and
//! answers `previous_response_id` from it, across restarts; without it `previous_response_id` is
//! refused (put `ctxscope proxy --responses-state` in front for state). `truncation: "disabled"` (the
//! default) refuses an overflow with 400 as chat does; `"auto"` drops the oldest turns of the input
//! until the prompt fits and says which in the response's `ctxscope.dropped_items`. Stored responses
//! are served back by `GET /v1/responses/{id}` (and `/input_items`) and forgotten by `DELETE`.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};

use super::body::{self, Body};
use super::completions;
use super::error::ApiError;
use super::reframe::{Reframed, Translate};
use super::request::{self, Endpoint};
use super::response_store::{ResponseStore, StoredResponse};
use super::state::State;
use crate::forward::Path;
use crate::patch::PatchSet;

/// The text of a content value: a string, or its `input_text` / `output_text` / `text` parts.
fn content_text(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                (Some("input_text" | "output_text" | "text"), Some(text)) => Ok(text.to_string()),
                (kind, _) => Err(ApiError::param("input", format!("content part {kind:?} is not supported: this engine reads text only"))),
            })
            .collect(),
        _ => Err(ApiError::param("input", "message content must be a string or a list of text parts")),
    }
}

/// `input` items as chat messages; a `function_call` joins the assistant message before it.
fn items_to_messages(items: &[Value], messages: &mut Vec<Value>) -> Result<(), ApiError> {
    for (i, item) in items.iter().enumerate() {
        match (item.get("type").and_then(Value::as_str), item.get("role").and_then(Value::as_str)) {
            (Some("message") | None, Some(role)) => {
                let content = content_text(item.get("content").unwrap_or(&Value::Null))?;
                messages.push(json!({"role": role, "content": content}));
            }
            (Some("function_call"), _) => {
                let call = json!({"id": item.get("call_id"), "type": "function",
                                  "function": {"name": item.get("name"), "arguments": item.get("arguments").cloned().unwrap_or(json!(""))}});
                match messages.last_mut().filter(|m| m["role"] == "assistant") {
                    Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    },
                    None => messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            (Some("function_call_output"), _) => {
                let output = content_text(item.get("output").unwrap_or(&Value::Null))?;
                messages.push(json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}));
            }
            (Some("reasoning"), _) => {}
            (kind, _) => return Err(ApiError::param("input", format!("input[{i}] of type {kind:?} is not supported by this engine"))),
        }
    }
    Ok(())
}

/// With `truncation: "auto"`: drops the oldest turn after the instructions (its first message up to
/// the next user message) so that the prompt may fit; `None` when only the last user turn is left.
fn drop_oldest(chat: &mut Map<String, Value>, first: usize) -> Option<Vec<Value>> {
    let messages = chat.get_mut("messages")?.as_array_mut()?;
    let last_user = messages.iter().rposition(|m| m["role"] == "user")?;
    if first >= last_user {
        return None;
    }
    let next_user = messages[first + 1..=last_user].iter().position(|m| m["role"] == "user");
    let end = next_user.map_or(last_user, |p| first + 1 + p);
    Some(messages.drain(first..end).collect())
}

/// The store to keep this response in (unless the request says `store: false`) and the messages its
/// `previous_response_id` stands on.
fn chain(state: &State, object: &Map<String, Value>) -> Result<(Option<ResponseStore>, Vec<Value>), ApiError> {
    let previous = object.get("previous_response_id").and_then(Value::as_str);
    let store = match (&state.responses, previous) {
        (Some(Ok(store)), _) => Some(store.clone()),
        (Some(Err(why)), Some(_)) => return Err(ApiError::Engine(why.clone())),
        (None, Some(_)) => {
            return Err(ApiError::param(
                "previous_response_id",
                "this engine keeps no responses (start it with --responses-store DIR): send the whole conversation in `input`, or run `ctxscope proxy --responses-state` in front of it",
            ))
        }
        (_, None) => None,
    };
    let context = match (&store, previous) {
        (Some(store), Some(id)) => {
            store.get(id).map_err(|e| ApiError::Engine(e.to_string()))?.ok_or_else(|| ApiError::ResponseNotFound(id.to_string()))?
        }
        _ => Vec::new(),
    };
    let keep = object.get("store").and_then(Value::as_bool) != Some(false);
    Ok((store.filter(|_| keep), context))
}

/// A chat request, whether it streams, and the messages a later response chained to it carries.
type Translated = (Map<String, Value>, bool, Vec<Value>);

/// Translates a Responses request standing on `context` into a chat request; also says whether it
/// streams, and gives the messages a later response chained to this one carries (all but the
/// instructions).
fn to_chat(object: &Map<String, Value>, context: Vec<Value>) -> Result<Translated, ApiError> {
    match object.get("truncation").and_then(Value::as_str) {
        None | Some("disabled" | "auto") => {}
        Some(other) => return Err(ApiError::param("truncation", format!("truncation must be \"disabled\" or \"auto\", not {other:?}"))),
    }
    let mut messages = Vec::new();
    if let Some(instructions) = object.get("instructions").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": content_text(instructions)?}));
    }
    let instructions = messages.len();
    messages.extend(context);
    match object.get("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => items_to_messages(items, &mut messages)?,
        _ => return Err(ApiError::param("input", "input is required: a string or a list of items")),
    }
    let stream = object.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let carried = messages[instructions..].to_vec();
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    for key in ["model", "temperature", "top_p", "ctxscope"] {
        if let Some(v) = object.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(max) = object.get("max_output_tokens").filter(|v| !v.is_null()) {
        out.insert("max_tokens".into(), max.clone());
    }
    if let Some(Value::Array(tools)) = object.get("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
            .map(|t| json!({"type": "function", "function": {"name": t.get("name"), "description": t.get("description"), "parameters": t.get("parameters")}}))
            .collect();
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    out.insert("stream".into(), json!(stream));
    if stream {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok((out, stream, carried))
}

/// What the response object repeats of the request.
struct Meta {
    id: String,
    message_id: String,
    created_at: u64,
    model: String,
    request: Map<String, Value>,
    /// The response is kept for `previous_response_id`.
    stored: bool,
    /// Messages `truncation: "auto"` dropped, oldest first (`index` in the input after instructions).
    dropped: Vec<Value>,
}

impl Meta {
    fn new(object: &Map<String, Value>, model: String) -> Meta {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Meta {
            id: format!("resp_{:x}{n:06x}", now.as_millis()),
            message_id: format!("msg_{:x}{n:06x}", now.as_millis()),
            created_at: now.as_secs(),
            model,
            request: object.clone(),
            stored: false,
            dropped: Vec::new(),
        }
    }

    /// The response object; `text` and `usage` (chat's) once known.
    fn object(&self, status: &str, text: &str, finish: Option<&str>, usage: Option<&Value>) -> Value {
        let incomplete = finish == Some("length");
        let status = if status == "completed" && incomplete { "incomplete" } else { status };
        let output = if status == "in_progress" { json!([]) } else { json!([self.message(text, "completed")]) };
        let usage = usage.map(|u| {
            let (input, output) = (u["prompt_tokens"].as_u64().unwrap_or(0), u["completion_tokens"].as_u64().unwrap_or(0));
            json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0)},
                   "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input + output})
        });
        let get = |key: &str| self.request.get(key).cloned().unwrap_or(Value::Null);
        let mut object = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status, "error": null,
            "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "instructions": get("instructions"), "max_output_tokens": get("max_output_tokens"), "model": self.model,
            "output": output, "parallel_tool_calls": true, "previous_response_id": get("previous_response_id"), "store": self.stored,
            "temperature": get("temperature"), "top_p": get("top_p"), "truncation": self.request.get("truncation").cloned().unwrap_or(json!("disabled")),
            "tools": self.request.get("tools").cloned().unwrap_or(json!([])), "usage": usage,
        });
        if !self.dropped.is_empty() {
            object["ctxscope"] = json!({"dropped_items": self.dropped});
        }
        object
    }

    fn message(&self, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": self.message_id, "status": status, "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }
}

/// The engine's response store, or why `GET`/`DELETE /v1/responses/{id}` cannot be answered.
fn stored(state: &State, id: &str) -> Result<ResponseStore, ApiError> {
    match &state.responses {
        Some(Ok(store)) => Ok(store.clone()),
        Some(Err(why)) => Err(ApiError::Engine(why.clone())),
        None => {
            Err(ApiError::StoredResponseNotFound(format!("{id} (this engine keeps no responses: start it with --responses-store DIR)")))
        }
    }
}

/// The stored record of `id`, or the 404 that says why there is none.
fn stored_record(state: &State, id: &str) -> Result<StoredResponse, ApiError> {
    let record = stored(state, id)?.get_record(id).map_err(|e| ApiError::Engine(e.to_string()))?;
    record.ok_or_else(|| ApiError::StoredResponseNotFound(id.to_string()))
}

/// Handles `GET /v1/responses/{id}`: the response object as it was returned.
pub fn retrieve(state: &State, id: &str) -> Result<Value, ApiError> {
    stored_record(state, id)?
        .response
        .ok_or_else(|| ApiError::StoredResponseNotFound(format!("{id} (stored by an older version, which kept only its messages)")))
}

/// Handles `GET /v1/responses/{id}/input_items?order=asc|desc&limit=N`: what the response stood on
/// (its context and input, its own reply left out) as message items, newest first unless
/// `order=asc`, at most `limit` (1 to 100, default 20) of them, as OpenAI lists them.
pub fn input_items(state: &State, id: &str, query: Option<&str>) -> Result<Value, ApiError> {
    let (mut ascending, mut limit) = (false, 20usize);
    for (key, value) in query.unwrap_or("").split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, ""))) {
        match key {
            "order" if value == "asc" || value == "desc" => ascending = value == "asc",
            "order" => return Err(ApiError::param("order", format!("order must be \"asc\" or \"desc\", not {value:?}"))),
            "limit" => match value.parse::<usize>() {
                Ok(n @ 1..=100) => limit = n,
                _ => return Err(ApiError::param("limit", format!("limit must be a whole number from 1 to 100, not {value:?}"))),
            },
            _ => {}
        }
    }
    let mut record = stored_record(state, id)?;
    record.messages.pop();
    let mut data: Vec<Value> = record
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let kind = if m["role"] == "assistant" { "output_text" } else { "input_text" };
            json!({"type": "message", "id": format!("{id}_item_{i}"), "status": "completed", "role": m["role"],
                   "content": [{"type": kind, "text": m["content"].as_str().unwrap_or("")}]})
        })
        .collect();
    if !ascending {
        data.reverse();
    }
    let has_more = data.len() > limit;
    data.truncate(limit);
    let (first, last) = (data.first().map(|d| d["id"].clone()), data.last().map(|d| d["id"].clone()));
    Ok(json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}))
}

/// Handles `DELETE /v1/responses/{id}`.
pub fn delete(state: &State, id: &str) -> Result<Value, ApiError> {
    let store = stored(state, id)?;
    match store.delete(id).map_err(|e| ApiError::Engine(e.to_string()))? {
        true => {
            store.flush();
            Ok(json!({"id": id, "object": "response", "deleted": true}))
        }
        false => Err(ApiError::StoredResponseNotFound(id.to_string())),
    }
}

/// Handles `POST /v1/responses`.
pub async fn create(state: Arc<State>, body: &[u8], path: Path, patches: PatchSet) -> Result<http::Response<Body>, ApiError> {
    let object = request::json_object(body)?;
    let (store, context) = chain(&state, &object)?;
    let (mut chat, stream, carried) = to_chat(&object, context)?;
    let first = chat["messages"].as_array().map_or(0, Vec::len) - carried.len();
    let auto = object.get("truncation").and_then(Value::as_str) == Some("auto");
    let mut dropped = Vec::new();
    let response = loop {
        let translated = serde_json::to_vec(&Value::Object(chat.clone())).map_err(|e| ApiError::Engine(e.to_string()))?;
        match completions::generate(state.clone(), Endpoint::Chat, &translated, path, patches.clone()).await {
            Err(error @ ApiError::ContextLength { .. }) if auto => match drop_oldest(&mut chat, first) {
                Some(gone) => {
                    for message in gone {
                        dropped.push(json!({"index": dropped.len(), "role": message["role"]}));
                    }
                }
                None => return Err(error),
            },
            other => break other?,
        }
    };
    let carried = chat["messages"].as_array().map_or(&[][..], Vec::as_slice)[first..].to_vec();
    let save = store.map(|store| Save { store, carried });
    let model = object.get("model").and_then(Value::as_str).unwrap_or(&state.engine.model.id).to_string();
    let mut meta = Meta::new(&object, model);
    meta.stored = save.is_some();
    meta.dropped = dropped;
    let (parts, inner) = response.into_parts();
    if stream {
        let events = EventBody { meta, text: String::new(), finish: None, started: false, ended: false, sequence: 0, save };
        return Ok(http::Response::from_parts(parts, Body::new(Reframed::new(inner, events))));
    }
    let bytes = inner.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let reply: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::Engine(format!("chat answer not JSON: {e}")))?;
    let choice = &reply["choices"][0];
    let text = choice["message"]["content"].as_str().unwrap_or("");
    let out = meta.object("completed", text, choice["finish_reason"].as_str(), Some(&reply["usage"]));
    if let Some(save) = save {
        save.put(&meta.id, text, &out);
    }
    let mut response = body::json(http::StatusCode::OK, &out);
    response
        .headers_mut()
        .extend(parts.headers.into_iter().filter_map(|(k, v)| k.filter(|k| k != http::header::CONTENT_LENGTH).map(|k| (k, v))));
    Ok(response)
}

/// Re-frames the chat SSE body as Responses events: created, in_progress, the message item and its
/// text part opened, a `response.output_text.delta` per chat delta, then the closing events and
/// `response.completed` (with usage) when chat's usage chunk (or `[DONE]`) arrives.
struct EventBody {
    meta: Meta,
    text: String,
    finish: Option<String>,
    started: bool,
    ended: bool,
    sequence: u64,
    save: Option<Save>,
}

/// Where a finished response is kept, with the messages it carries before its reply.
struct Save {
    store: ResponseStore,
    carried: Vec<Value>,
}

impl Save {
    fn put(self, id: &str, reply: &str, response: &Value) {
        let mut messages = self.carried;
        messages.push(json!({"role": "assistant", "content": reply}));
        match self.store.put(id, &messages, response) {
            Ok(()) => self.store.flush(),
            Err(error) => {
                tracing::warn!(%error, id, "response not stored; previous_response_id to it will 404")
            }
        }
    }
}

impl EventBody {
    fn event(&mut self, out: &mut VecDeque<Bytes>, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push_back(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        self.started = true;
        let response = self.meta.object("in_progress", "", None, None);
        self.event(out, "response.created", json!({"response": response}));
        self.event(out, "response.in_progress", json!({"response": response}));
        let item = json!({"type": "message", "id": self.meta.message_id, "status": "in_progress", "role": "assistant", "content": []});
        self.event(out, "response.output_item.added", json!({"output_index": 0, "item": item}));
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        self.event(
            out,
            "response.content_part.added",
            json!({"item_id": self.meta.message_id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    fn finish_with(&mut self, out: &mut VecDeque<Bytes>, usage: Option<&Value>) {
        self.ended = true;
        let (id, text) = (self.meta.message_id.clone(), self.text.clone());
        self.event(out, "response.output_text.done", json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text}));
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.event(out, "response.content_part.done", json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}));
        self.event(out, "response.output_item.done", json!({"output_index": 0, "item": self.meta.message(&text, "completed")}));
        let response = self.meta.object("completed", &text, self.finish.as_deref(), usage);
        if let Some(save) = self.save.take() {
            save.put(&self.meta.id, &text, &response);
        }
        let kind = if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.event(out, kind, json!({"response": response}));
    }
}

impl Translate for EventBody {
    fn chunk(&mut self, chunk: Value, out: &mut VecDeque<Bytes>) {
        if self.ended {
            return;
        }
        if !self.started {
            self.start(out);
        }
        if let Some(error) = chunk.get("error").filter(|e| e.is_object()) {
            self.event(out, "error", json!({"code": error["code"], "message": error["message"], "param": error["param"]}));
            let mut response = self.meta.object("failed", &self.text.clone(), None, None);
            response["error"] = json!({"code": "server_error", "message": error["message"]});
            self.event(out, "response.failed", json!({"response": response}));
            self.ended = true;
            return;
        }
        if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
            self.finish = Some(reason.to_string());
        }
        if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str().filter(|d| !d.is_empty()) {
            self.text.push_str(delta);
            let id = self.meta.message_id.clone();
            self.event(out, "response.output_text.delta", json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": delta}));
        }
        if chunk["usage"].is_object() {
            self.finish_with(out, Some(&chunk["usage"]));
        }
    }

    fn done(&mut self, clean: bool, out: &mut VecDeque<Bytes>) {
        if !clean || self.ended {
            return;
        }
        if !self.started {
            self.start(out);
        }
        self.finish_with(out, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn instructions_and_items_become_chat_messages() {
        let request = object(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "stream": true,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
        }));
        let (chat, stream, carried) = to_chat(&request, Vec::new()).unwrap();
        assert_eq!(carried.len(), 3, "all but the instructions");
        assert!(stream);
        assert_eq!(chat["max_tokens"], 9);
        assert_eq!(chat["stream_options"]["include_usage"], true);
        let messages = chat["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(messages[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(messages[2]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(messages[3], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        assert_eq!(chat["tools"][0]["function"]["name"], "get_weather");
    }

    #[test]
    fn unknown_truncation_and_other_parts_are_refused_clearly() {
        let bad = to_chat(&object(json!({"input": "hi", "truncation": "sometimes"})), Vec::new()).unwrap_err();
        assert!(bad.to_string().contains("\"sometimes\""), "{bad}");
        for ok in ["disabled", "auto"] {
            assert!(to_chat(&object(json!({"input": "hi", "truncation": ok})), Vec::new()).is_ok());
        }
        assert!(to_chat(&object(json!({"model": "m"})), Vec::new()).is_err());
        let image =
            to_chat(&object(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})), Vec::new());
        assert!(image.unwrap_err().to_string().contains("input_image"));
    }

    #[test]
    fn auto_truncation_drops_whole_turns_oldest_first_and_keeps_the_last_question() {
        let roles = |chat: &Map<String, Value>| {
            chat["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        let input = json!(["system", "user", "assistant", "tool", "user", "assistant", "user"].map(|r| json!({"role": r, "content": r})));
        let mut chat = object(json!({"messages": input}));
        assert_eq!(drop_oldest(&mut chat, 1).unwrap().len(), 3);
        assert_eq!(roles(&chat), ["system", "user", "assistant", "user"]);
        assert_eq!(drop_oldest(&mut chat, 1).unwrap().len(), 2);
        assert_eq!(roles(&chat), ["system", "user"]);
        assert!(drop_oldest(&mut chat, 1).is_none(), "the last user turn stays");
    }

    #[test]
    fn a_chained_request_stands_on_its_context_after_its_own_instructions() {
        let context = vec![json!({"role": "user", "content": "a"}), json!({"role": "assistant", "content": "A"})];
        let (chat, _, carried) = to_chat(&object(json!({"instructions": "Be brief.", "input": "b"})), context).unwrap();
        let contents: Vec<&str> = chat["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(contents, ["Be brief.", "a", "A", "b"]);
        assert_eq!(carried.len(), 3);
        let missing = ApiError::ResponseNotFound("resp_x".into());
        assert_eq!(missing.status(), 404);
        assert_eq!(missing.body()["error"]["code"], "previous_response_not_found");
        assert_eq!(missing.body()["error"]["message"], "Previous response with id 'resp_x' not found.");
    }

    #[test]
    fn the_response_object_reports_usage_and_length() {
        let meta = Meta::new(&object(json!({"instructions": "x", "max_output_tokens": 2})), "m".into());
        let usage = json!({"prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}});
        let out = meta.object("completed", "Hi", Some("length"), Some(&usage));
        assert_eq!(out["status"], "incomplete");
        assert_eq!(out["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(
            out["usage"],
            json!({"input_tokens": 30, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 32})
        );
        assert_eq!(out["output"][0]["content"][0]["text"], "Hi");
        assert!(out["id"].as_str().unwrap().starts_with("resp_"));
    }
}
