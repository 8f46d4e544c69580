//! What the capture worker hands to the OTLP exporter for one finished turn: the stored turn's
//! fields a span needs, its findings, the conversation id the client sent, and the model the
//! response named. Built on the capture worker, so it copies little: the request body travels (as
//! shared frames, no copy) only with `--otlp-content`, and the response is read only for its model.

use bytes::Bytes;
use ctxscope_store::{CaptureLevel, Endpoint, FindingRecord, Relation, TurnRecord, Usage};
use serde::Deserialize;

use crate::capture::exchange::Exchange;

/// Responses larger than this are not searched for their model (the span then has no
/// `gen_ai.response.model`).
const MAX_SNIFF_BYTES: usize = 256 << 10;
/// A streamed response names its model in its first events; this many frames are read at most.
const MAX_SNIFF_FRAMES: usize = 8;

/// One finished turn, as the exporter needs it.
#[derive(Debug, Clone)]
pub struct TurnSummary {
    pub turn_id: u64,
    pub conversation: u64,
    pub index: u32,
    pub relation: Relation,
    pub time_unix_ms: u64,
    pub total_us: u64,
    pub headers_us: Option<u64>,
    pub ttfb_us: Option<u64>,
    pub endpoint: Endpoint,
    pub status: u16,
    pub stream: bool,
    pub request_model: Option<String>,
    pub response_model: Option<String>,
    pub response_id: Option<String>,
    /// Sampling parameters as sent (temperature, top_p, max_tokens, seed, stop...).
    pub params: serde_json::Map<String, serde_json::Value>,
    pub usage: Option<Usage>,
    pub local_prompt_tokens: Option<u64>,
    pub tokenizer: Option<String>,
    pub message_count: u32,
    /// The chain hash over the request's messages (`TurnRecord::head`).
    pub prefix_hash: String,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// `x-ctxscope-conversation` or `--session-header`: the only conversation id a client sent.
    pub client_conversation: Option<String>,
    pub findings: Vec<FindingRecord>,
    /// With `--otlp-content` only: the request body's frames and the reply text.
    pub content: Option<Content>,
}

/// Message content, carried only with `--otlp-content` (and never for a turn captured with
/// `--capture hashes`).
#[derive(Debug, Clone)]
pub struct Content {
    pub request: Vec<Bytes>,
    /// The reply as stored (masked under `--capture redacted`).
    pub reply_text: String,
    /// The turn was captured with `--capture redacted`: the request's messages are masked as they
    /// are mapped (the body travels as sent).
    pub redact: bool,
}

impl TurnSummary {
    /// The summary of a stored turn; `content` also carries the request body and the reply, as
    /// much of them as the turn's capture level keeps (none at `hashes`).
    pub fn new(exchange: &Exchange, turn: &TurnRecord, findings: &[FindingRecord], content: bool) -> TurnSummary {
        let content = (content && turn.capture != CaptureLevel::Hashes).then(|| Content {
            request: exchange.request.lock().map(|c| c.chunks.clone()).unwrap_or_default(),
            reply_text: turn.reply_text.clone(),
            redact: turn.capture == CaptureLevel::Redacted,
        });
        TurnSummary {
            turn_id: turn.id,
            conversation: turn.conversation,
            index: turn.index,
            relation: turn.relation.clone(),
            time_unix_ms: turn.time_unix_ms,
            total_us: turn.timing.total_us,
            headers_us: turn.timing.headers_us,
            ttfb_us: turn.timing.ttfb_us,
            endpoint: turn.endpoint,
            status: turn.status,
            stream: turn.stream,
            request_model: turn.model.clone(),
            response_model: response_model(&exchange.response.chunks, exchange.response.len, turn.stream),
            response_id: turn.responses.as_ref().and_then(|r| r.response_id.clone()),
            params: turn.params.clone(),
            usage: turn.usage.clone(),
            local_prompt_tokens: turn.local_tokens.as_ref().map(|l| l.prompt),
            tokenizer: turn.local_tokens.as_ref().map(|l| l.tokenizer.clone()),
            message_count: turn.message_count,
            prefix_hash: turn.head.clone(),
            finish_reason: turn.finish_reason.clone(),
            error: turn.error.clone(),
            client_conversation: exchange.conversation_name.clone(),
            findings: findings.to_vec(),
            content,
        }
    }
}

#[cfg(test)]
impl TurnSummary {
    /// A finished turn with usage, parameters and timings, no findings (for tests).
    #[cfg(test)]
    pub fn sample() -> TurnSummary {
        TurnSummary {
            turn_id: 7,
            conversation: 3,
            index: 2,
            relation: Relation::Extend { parent_turn: 6 },
            time_unix_ms: 1_764_421_507_123,
            total_us: 250_000,
            headers_us: Some(1_000),
            ttfb_us: Some(2_000),
            endpoint: Endpoint::ChatCompletions,
            status: 200,
            stream: false,
            request_model: Some("smol".into()),
            response_model: Some("smol-135m".into()),
            response_id: None,
            params: serde_json::json!({"temperature": 0.0, "max_tokens": 16, "seed": 1, "stop": "END"}).as_object().unwrap().clone(),
            usage: Some(Usage { prompt_tokens: Some(100), completion_tokens: Some(5), cached_tokens: Some(64), sources: vec![] }),
            local_prompt_tokens: Some(180),
            tokenizer: Some("tokenizer.json".into()),
            message_count: 5,
            prefix_hash: "ab".repeat(32),
            finish_reason: Some("stop".into()),
            error: None,
            client_conversation: None,
            findings: Vec::new(),
            content: None,
        }
    }
}

/// Where each API puts the model in a response or in its first streamed events: top level (OpenAI,
/// Ollama, Anthropic's whole message), `message` (Anthropic's `message_start`), `response`
/// (Responses API events).
#[derive(Deserialize)]
struct Named {
    model: Option<String>,
    message: Option<Inner>,
    response: Option<Inner>,
}

#[derive(Deserialize)]
struct Inner {
    model: Option<String>,
}

impl Named {
    fn model(self) -> Option<String> {
        self.model.or(self.message.and_then(|m| m.model)).or(self.response.and_then(|r| r.model)).filter(|m| !m.is_empty())
    }
}

/// The model the upstream named in its response, if it did (`gen_ai.response.model`).
pub fn response_model(chunks: &[Bytes], len: usize, stream: bool) -> Option<String> {
    if stream {
        // SSE `data:` lines or NDJSON lines; the model is in the first event that names one.
        let mut head = Vec::new();
        for chunk in chunks.iter().take(MAX_SNIFF_FRAMES) {
            head.extend_from_slice(chunk);
        }
        return head.split(|&b| b == b'\n').find_map(|line| {
            let line = line.strip_prefix(b"data:").unwrap_or(line);
            serde_json::from_slice::<Named>(line.trim_ascii()).ok().and_then(Named::model)
        });
    }
    if len == 0 || len > MAX_SNIFF_BYTES {
        return None;
    }
    let body: Vec<u8> = chunks.concat();
    serde_json::from_slice::<Named>(&body).ok().and_then(Named::model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&str]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::from(p.to_string())).collect()
    }

    #[test]
    fn model_from_a_whole_response_wherever_the_api_puts_it() {
        let openai = frames(&[r#"{"choices":[{"message":{"content":"hi"}}],"#, r#""model":"smol-135m","usage":{}}"#]);
        assert_eq!(response_model(&openai, 60, false).as_deref(), Some("smol-135m"));
        let none = frames(&[r#"{"choices":[]}"#]);
        assert_eq!(response_model(&none, 14, false), None);
        assert_eq!(response_model(&frames(&["not json"]), 8, false), None);
    }

    #[test]
    fn model_from_the_first_streamed_event_that_names_one() {
        let sse = frames(&["data: {\"choices\":[],\"model\":\"m1\"}\n\n", "data: [DONE]\n\n"]);
        assert_eq!(response_model(&sse, 0, true).as_deref(), Some("m1"));
        let anthropic = frames(&["event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\"}}\n\n"]);
        assert_eq!(response_model(&anthropic, 0, true).as_deref(), Some("claude-x"));
        let responses = frames(&["event: response.created\ndata: {\"response\":{\"model\":\"gpt-r\"}}\n\n"]);
        assert_eq!(response_model(&responses, 0, true).as_deref(), Some("gpt-r"));
        let ollama = frames(&["{\"model\":\"llama3\",\"message\":{\"content\":\"a\"}}\n"]);
        assert_eq!(response_model(&ollama, 0, true).as_deref(), Some("llama3"));
    }
}
