//! Reading the LLM APIs the proxy understands: requests (messages, model, sampling parameters) and
//! responses, streamed or not (reply text and message, finish reason, usage in every engine's form).

pub mod anthropic;
pub mod message;
pub mod ollama;
pub mod openai;
pub mod responses;
pub mod skim;
pub mod sse;
pub mod usage;

use ctxscope_store::{Endpoint, ToolsDigest, Usage};
use serde_json::{Map, Value};

use message::Message;

/// Request fields the capture needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedRequest {
    pub model: Option<String>,
    /// Chat messages in OpenAI shape (Anthropic's `system` becomes a leading system message;
    /// a completions prompt becomes one `{"role":"prompt"}` message).
    pub messages: Vec<Message>,
    pub params: Map<String, Value>,
    pub stream: bool,
    /// Tool definitions in brief (OpenAI `tools`, Anthropic `tools`).
    pub tools: Option<ToolsDigest>,
    /// Responses API requests: the fields that chain and bound the context.
    pub responses: Option<responses::ResponsesRequest>,
}

/// Response fields the capture needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedResponse {
    pub reply_text: String,
    /// The assistant message as a client would send it back next turn.
    pub reply_message: Option<Value>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// SSE events or NDJSON lines (streaming); 1 otherwise.
    pub events: u32,
    /// An error the upstream reported in the body.
    pub error: Option<String>,
    /// The error object as the upstream sent it (llama.cpp adds `n_prompt_tokens` and `n_ctx`).
    pub error_object: Option<Value>,
    pub notes: Vec<String>,
    /// The Responses API response `id`.
    pub response_id: Option<String>,
    /// Input items the engine says it dropped to fit (`truncation: "auto"`; `ctxscope.dropped_items`).
    pub dropped_items: Option<Value>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    #[error("request has no {0}")]
    Missing(&'static str),
}

/// Responses API fields copied into the turn record besides [`PARAMS`].
const RESPONSES_PARAMS: [&str; 8] =
    ["max_output_tokens", "truncation", "store", "previous_response_id", "conversation", "tool_choice", "parallel_tool_calls", "reasoning"];

/// Sampling parameters copied into the turn record, whatever the API.
const PARAMS: [&str; 14] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "n",
    "stream_options",
    "options",
];

pub fn request(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, ParseError> {
    let mut value: Value = serde_json::from_slice(body).map_err(|e| ParseError::NotJson(e.to_string()))?;
    let object = value.as_object_mut().ok_or(ParseError::NotJson("not an object".into()))?;
    let mut parsed = head(endpoint, object);
    let messages = match endpoint {
        Endpoint::ChatCompletions | Endpoint::OllamaChat => openai::request_messages(object)?,
        Endpoint::Completions => openai::prompt_messages(object)?,
        Endpoint::AnthropicMessages => anthropic::request_messages(object)?,
        Endpoint::Responses => {
            let (messages, info) = responses::request_messages(object)?;
            parsed.responses = Some(info);
            messages
        }
    };
    parsed.messages = messages.into_iter().map(Message::new).collect();
    Ok(parsed)
}

/// A request's fields besides its messages (and, for the Responses API, besides its input).
pub fn head(endpoint: Endpoint, object: &Map<String, Value>) -> ParsedRequest {
    let mut parsed = ParsedRequest {
        model: object.get("model").and_then(Value::as_str).map(str::to_string),
        stream: object.get("stream").and_then(Value::as_bool).unwrap_or(endpoint == Endpoint::OllamaChat),
        params: PARAMS.iter().filter_map(|k| object.get(*k).map(|v| (k.to_string(), v.clone()))).collect(),
        messages: Vec::new(),
        tools: object.get("tools").filter(|t| !t.is_null()).map(tools_digest),
        responses: None,
    };
    if endpoint == Endpoint::Responses {
        let extra = RESPONSES_PARAMS.iter().filter_map(|k| object.get(*k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone())));
        parsed.params.extend(extra.collect::<Vec<_>>());
    }
    parsed
}

/// Parses a response body; `streaming` is the request's `stream` flag (content type decides when known).
pub fn response(endpoint: Endpoint, content_type: Option<&str>, status: u16, body: &[u8], streaming: bool) -> ParsedResponse {
    let is_sse = content_type.map_or(streaming, |ct| ct.starts_with("text/event-stream"));
    let is_ndjson = content_type.is_some_and(|ct| ct.contains("ndjson")) || (endpoint == Endpoint::OllamaChat && streaming && !is_sse);
    let mut parsed = if !(200..300).contains(&status) {
        error_response(body)
    } else if is_sse {
        match endpoint {
            Endpoint::AnthropicMessages => anthropic::stream(&sse::events(body)),
            Endpoint::Responses => responses::stream(&sse::events(body)),
            _ => openai::stream(endpoint, &sse::events(body)),
        }
    } else if is_ndjson {
        ollama::stream(&sse::ndjson(body))
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => match endpoint {
                Endpoint::AnthropicMessages => anthropic::complete(&value),
                Endpoint::OllamaChat => ollama::stream(&[value]),
                Endpoint::Responses => responses::complete(&value),
                _ => openai::complete(endpoint, &value),
            },
            Err(e) => ParsedResponse { notes: vec![format!("response body is not JSON: {e}")], events: 1, ..Default::default() },
        }
    };
    if let Some(usage) = &mut parsed.usage {
        usage.sources.dedup();
    }
    parsed
}

/// Hash and names of tool definitions, in the order sent.
fn tools_digest(tools: &Value) -> ToolsDigest {
    let hash = ctxscope_store::to_hex(&ctxscope_store::message_hash(tools).0);
    let list = tools.as_array().map(Vec::as_slice).unwrap_or_default();
    let names = list
        .iter()
        .map(|t| t.pointer("/function/name").or_else(|| t.get("name")).and_then(Value::as_str).unwrap_or("").to_string())
        .collect();
    ToolsDigest { hash, names }
}

/// An upstream error body: the message of `{"error": {"message": ...}}` (or `"error": "..."`), else the text.
fn error_response(body: &[u8]) -> ParsedResponse {
    let text = String::from_utf8_lossy(body);
    let object = serde_json::from_slice::<Value>(body).ok().and_then(|mut v| v.get_mut("error").map(Value::take));
    let message =
        object.as_ref().and_then(|error| error.get("message").and_then(Value::as_str).or_else(|| error.as_str()).map(str::to_string));
    let message = message.unwrap_or_else(|| text.chars().take(2000).collect());
    ParsedResponse { error: Some(message), error_object: object, events: 1, ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_keep_the_engine_message() {
        let body = br#"{"error":{"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#;
        let parsed = response(Endpoint::ChatCompletions, Some("application/json"), 400, body, false);
        assert_eq!(parsed.error.as_deref(), Some("the request exceeds the available context size"));
        let plain = response(Endpoint::ChatCompletions, None, 500, b"boom", false);
        assert_eq!(plain.error.as_deref(), Some("boom"));
    }

    #[test]
    fn request_params_model_and_stream() {
        let body = br#"{"model":"m","stream":true,"temperature":0.2,"seed":7,"messages":[{"role":"user","content":"hi"}]}"#;
        let parsed = request(Endpoint::ChatCompletions, body).unwrap();
        assert_eq!(parsed.model.as_deref(), Some("m"));
        assert!(parsed.stream);
        assert_eq!(parsed.params["seed"], 7);
        assert_eq!(parsed.messages.len(), 1);
        assert!(matches!(request(Endpoint::ChatCompletions, b"{not json"), Err(ParseError::NotJson(_))));
        assert_eq!(request(Endpoint::ChatCompletions, br#"{"model":"m"}"#), Err(ParseError::Missing("messages")));
    }
}
