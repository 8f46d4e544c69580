//! One turn as one span, by the OpenTelemetry GenAI semantic conventions: named `{operation} {model}`,
//! kind CLIENT, `gen_ai.*` for what the conventions define (`gen_ai.conversation.id` only when the
//! client sent one), `ctxscope.*` for what only ctxscope knows (its derived conversation, the turn,
//! how it threads, the local token count, the prefix hash). Each finding is a span event and a log
//! record carrying the span's trace context. Start and end are the exchange's real times.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctxscope_store::{Endpoint, FindingKind, FindingRecord, Relation, Severity};
use opentelemetry::logs::{AnyValue, LogRecord as _, Severity as LogSeverity};
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::logs::SdkLogRecord;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::content;
use super::summary::TurnSummary;

/// The event (span event and log record) that carries a finding.
pub const FINDING_EVENT: &str = "ctxscope.finding";

/// Per-proxy facts every span repeats.
#[derive(Debug, Clone)]
pub struct Origin {
    /// `service.instance.id`, repeated on the span for backends that keep no resource attributes
    /// (Phoenix): with `ctxscope.conversation.id` it names a conversation fleet-wide.
    pub instance: String,
    /// The upstream URL, credentials redacted.
    pub upstream: String,
    /// The upstream's host and port (`server.address`, `server.port`).
    pub host: String,
    pub port: Option<u16>,
}

/// `chat` for the chat-shaped APIs, `text_completion` for `/v1/completions`.
pub fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::ChatCompletions | Endpoint::AnthropicMessages | Endpoint::OllamaChat | Endpoint::Responses => "chat",
    }
}

/// The API family the request spoke, as `gen_ai.provider.name` names it: an OpenAI-compatible
/// engine is `openai`, as the conventions ask of an OpenAI client whatever serves it.
pub fn provider(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Responses => "openai",
        Endpoint::AnthropicMessages => "anthropic",
        Endpoint::OllamaChat => "ollama",
    }
}

fn relation(relation: &Relation) -> &'static str {
    match relation {
        Relation::New => "new",
        Relation::Extend { .. } => "extend",
        Relation::Regenerate { .. } => "regenerate",
        Relation::Branch { .. } => "branch",
        Relation::Diverged { .. } => "diverged",
    }
}

/// When the request arrived and when its response ended.
pub fn times(turn: &TurnSummary) -> (SystemTime, SystemTime) {
    let start = UNIX_EPOCH + Duration::from_millis(turn.time_unix_ms);
    (start, start + Duration::from_micros(turn.total_us))
}

fn int(key: &'static str, value: u64) -> KeyValue {
    KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX))
}

fn string(key: &'static str, value: impl Into<String>) -> KeyValue {
    KeyValue::new(key, value.into())
}

/// The span's attributes.
pub fn attributes(turn: &TurnSummary, origin: &Origin) -> Vec<KeyValue> {
    let provider = provider(turn.endpoint);
    let mut out = vec![
        string("gen_ai.operation.name", operation(turn.endpoint)),
        string("gen_ai.provider.name", provider),
        // The attribute `gen_ai.provider.name` replaced; backends that predate it still read it.
        string("gen_ai.system", provider),
        string("server.address", origin.host.clone()),
    ];
    out.extend(origin.port.map(|p| int("server.port", u64::from(p))));
    out.extend(turn.request_model.as_ref().map(|m| string("gen_ai.request.model", m.clone())));
    out.extend(turn.response_model.as_ref().map(|m| string("gen_ai.response.model", m.clone())));
    out.extend(turn.response_id.as_ref().map(|id| string("gen_ai.response.id", id.clone())));
    if let Some(reason) = &turn.finish_reason {
        out.push(KeyValue::new("gen_ai.response.finish_reasons", Value::Array(Array::String(vec![StringValue::from(reason.clone())]))));
    }
    out.extend(request_params(&turn.params));
    if let Some(usage) = &turn.usage {
        out.extend(usage.prompt_tokens.map(|t| int("gen_ai.usage.input_tokens", t)));
        out.extend(usage.completion_tokens.map(|t| int("gen_ai.usage.output_tokens", t)));
        out.extend(usage.cached_tokens.map(|t| int("gen_ai.usage.cache_read.input_tokens", t)));
    }
    // Only an id the client sent: the conventions reserve it for the application's own conversation id.
    out.extend(turn.client_conversation.as_ref().map(|c| string("gen_ai.conversation.id", c.clone())));
    if turn.findings.iter().any(certain_compaction) {
        out.push(KeyValue::new("gen_ai.conversation.compacted", true));
    }
    if turn.status != 0 {
        out.push(int("http.response.status_code", u64::from(turn.status)));
    }
    if let Some(kind) = error_type(turn) {
        out.push(string("error.type", kind));
    }

    out.push(int("ctxscope.conversation.id", turn.conversation));
    out.push(int("ctxscope.turn.id", turn.turn_id));
    out.push(int("ctxscope.turn.index", u64::from(turn.index)));
    out.push(string("ctxscope.relation", relation(&turn.relation)));
    out.push(string("ctxscope.prefix_hash", turn.prefix_hash.clone()));
    out.push(int("ctxscope.message_count", u64::from(turn.message_count)));
    out.extend(turn.local_prompt_tokens.map(|t| int("ctxscope.local.prompt_tokens", t)));
    out.extend(turn.tokenizer.as_ref().map(|t| string("ctxscope.local.tokenizer", t.clone())));
    out.push(string("ctxscope.upstream", origin.upstream.clone()));
    out.push(string("ctxscope.instance.id", origin.instance.clone()));
    out.push(string("ctxscope.endpoint", turn.endpoint.as_str()));
    out.push(KeyValue::new("ctxscope.stream", turn.stream));
    out.extend(turn.ttfb_us.map(|t| int("ctxscope.ttfb_us", t)));
    out.push(int("ctxscope.findings", turn.findings.len() as u64));
    if let Some(content) = &turn.content {
        out.extend(content::input_messages(turn.endpoint, content).map(|m| string("gen_ai.input.messages", m)));
        out.push(string("gen_ai.output.messages", content::output_messages(content, turn.finish_reason.as_deref())));
    }
    out
}

/// `gen_ai.request.*` from the sampling parameters as sent.
fn request_params(params: &serde_json::Map<String, serde_json::Value>) -> Vec<KeyValue> {
    let mut out = Vec::new();
    for (name, key) in [
        ("temperature", "gen_ai.request.temperature"),
        ("top_p", "gen_ai.request.top_p"),
        ("top_k", "gen_ai.request.top_k"),
        ("presence_penalty", "gen_ai.request.presence_penalty"),
        ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ] {
        out.extend(params.get(name).and_then(serde_json::Value::as_f64).map(|v| KeyValue::new(key, v)));
    }
    let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"].iter().find_map(|k| params.get(*k)?.as_u64());
    out.extend(max_tokens.map(|t| int("gen_ai.request.max_tokens", t)));
    out.extend(params.get("seed").and_then(serde_json::Value::as_i64).map(|s| KeyValue::new("gen_ai.request.seed", s)));
    let stop: Vec<StringValue> = match params.get("stop") {
        Some(serde_json::Value::String(s)) => vec![StringValue::from(s.clone())],
        Some(serde_json::Value::Array(items)) => {
            items.iter().filter_map(|s| s.as_str()).map(|s| StringValue::from(s.to_string())).collect()
        }
        _ => Vec::new(),
    };
    if !stop.is_empty() {
        out.push(KeyValue::new("gen_ai.request.stop_sequences", Value::Array(Array::String(stop))));
    }
    out
}

/// `error.type`: the HTTP status for an error response, `_OTHER` for a failure under a 2xx (a cut
/// stream, a client gone, an unreachable upstream).
fn error_type(turn: &TurnSummary) -> Option<String> {
    match (turn.status, &turn.error) {
        (400.., _) => Some(turn.status.to_string()),
        (_, Some(_)) => Some("_OTHER".into()),
        _ => None,
    }
}

fn finding_attributes(finding: &FindingRecord) -> Vec<KeyValue> {
    let mut out = vec![
        string("ctxscope.finding.kind", finding.kind.as_str()),
        string("ctxscope.finding.severity", finding.severity.as_str()),
        string("ctxscope.finding.summary", finding.summary.clone()),
        string("ctxscope.finding.evidence", finding.evidence.to_string()),
        int("ctxscope.finding.id", finding.id),
    ];
    // The named cause (history_dropped's edit, cache_miss's break), when the evidence has one.
    if let Some(cause) = finding.evidence.get("cause").and_then(serde_json::Value::as_str) {
        out.push(string("ctxscope.finding.cause", cause.to_string()));
    }
    out
}

/// A `history_dropped` finding whose cause is a compaction recognised for certain: by a harness's
/// marker or by the summary holding the reply it replaced (not by structure alone).
fn certain_compaction(finding: &FindingRecord) -> bool {
    let e = &finding.evidence;
    finding.kind == FindingKind::HistoryDropped
        && e["cause"] == "compaction"
        && matches!(e["summary"]["recognised_by"].as_str(), Some("marker" | "carries_reply"))
}

/// The turn as a span with `ids` (trace, span), its findings as events at the turn's end.
pub fn span(turn: &TurnSummary, origin: &Origin, ids: (TraceId, SpanId), scope: &InstrumentationScope) -> SpanData {
    let (start, end) = times(turn);
    let name = match &turn.request_model {
        Some(model) => format!("{} {model}", operation(turn.endpoint)),
        None => operation(turn.endpoint).to_string(),
    };
    let mut events = SpanEvents::default();
    events.events = turn.findings.iter().map(|f| Event::new(FINDING_EVENT, end, finding_attributes(f), 0)).collect();
    let status = match (&turn.error, turn.status) {
        (Some(error), _) => Status::Error { description: Cow::Owned(error.clone()) },
        (None, 400..) => Status::Error { description: Cow::Owned(format!("HTTP {}", turn.status)) },
        _ => Status::Unset,
    };
    SpanData {
        span_context: SpanContext::new(ids.0, ids.1, TraceFlags::SAMPLED, false, TraceState::default()),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Client,
        name: Cow::Owned(name),
        start_time: start,
        end_time: end,
        attributes: attributes(turn, origin),
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

/// Fills `record` (made by an SDK logger) with one finding of `turn`, tied to the turn's span.
pub fn finding_log(record: &mut SdkLogRecord, turn: &TurnSummary, finding: &FindingRecord, ids: (TraceId, SpanId)) {
    let (_, end) = times(turn);
    record.set_event_name(FINDING_EVENT);
    record.set_timestamp(end);
    record.set_observed_timestamp(SystemTime::now());
    let (number, text) = match finding.severity {
        Severity::Info => (LogSeverity::Info, "INFO"),
        Severity::Warning => (LogSeverity::Warn, "WARN"),
        Severity::Critical => (LogSeverity::Error, "ERROR"),
    };
    record.set_severity_number(number);
    record.set_severity_text(text);
    record.set_body(AnyValue::String(finding.summary.clone().into()));
    record.set_trace_context(ids.0, ids.1, Some(TraceFlags::SAMPLED));
    for kv in finding_attributes(finding) {
        record.add_attribute(kv.key, any(kv.value));
    }
    record.add_attribute("ctxscope.conversation.id", AnyValue::Int(turn.conversation as i64));
    record.add_attribute("ctxscope.turn.id", AnyValue::Int(turn.turn_id as i64));
    if let Some(conversation) = &turn.client_conversation {
        record.add_attribute("gen_ai.conversation.id", AnyValue::String(conversation.clone().into()));
    }
}

/// A span attribute's value as a log attribute's.
fn any(value: Value) -> AnyValue {
    match value {
        Value::Bool(b) => AnyValue::Boolean(b),
        Value::I64(i) => AnyValue::Int(i),
        Value::F64(f) => AnyValue::Double(f),
        Value::String(s) => AnyValue::String(s),
        other => AnyValue::String(other.to_string().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turn() -> TurnSummary {
        TurnSummary::sample()
    }

    fn finding(kind: FindingKind) -> FindingRecord {
        FindingRecord {
            id: 11,
            kind,
            severity: Severity::Critical,
            time_unix_ms: 1_764_421_507_123,
            upstream: "http://e".into(),
            model: Some("smol".into()),
            conversation: 3,
            turn: 7,
            turn_index: 2,
            summary: "engine processed 100 of 180 prompt tokens".into(),
            evidence: json!({"engine_prompt_tokens": 100, "local_prompt_tokens": 180}),
            cause: "c".into(),
        }
    }

    fn origin() -> Origin {
        Origin { instance: "replica-a".into(), upstream: "http://***@127.0.0.1:8000".into(), host: "127.0.0.1".into(), port: Some(8000) }
    }

    fn get<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
        attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
    }

    #[test]
    fn a_turn_maps_to_gen_ai_and_ctxscope_attributes() {
        let attrs = attributes(&turn(), &origin());
        let expect = [
            ("gen_ai.operation.name", Value::from("chat")),
            ("gen_ai.provider.name", Value::from("openai")),
            ("gen_ai.request.model", Value::from("smol")),
            ("gen_ai.response.model", Value::from("smol-135m")),
            ("gen_ai.usage.input_tokens", Value::I64(100)),
            ("gen_ai.usage.output_tokens", Value::I64(5)),
            ("gen_ai.usage.cache_read.input_tokens", Value::I64(64)),
            ("gen_ai.request.temperature", Value::F64(0.0)),
            ("gen_ai.request.max_tokens", Value::I64(16)),
            ("gen_ai.request.seed", Value::I64(1)),
            ("server.address", Value::from("127.0.0.1")),
            ("server.port", Value::I64(8000)),
            ("ctxscope.conversation.id", Value::I64(3)),
            ("ctxscope.turn.id", Value::I64(7)),
            ("ctxscope.turn.index", Value::I64(2)),
            ("ctxscope.relation", Value::from("extend")),
            ("ctxscope.local.prompt_tokens", Value::I64(180)),
            ("ctxscope.prefix_hash", Value::from("ab".repeat(32))),
            ("ctxscope.upstream", Value::from("http://***@127.0.0.1:8000")),
            ("ctxscope.instance.id", Value::from("replica-a")),
        ];
        for (key, value) in expect {
            assert_eq!(get(&attrs, key), Some(&value), "{key}");
        }
        let reasons = Value::Array(Array::String(vec![StringValue::from("stop")]));
        assert_eq!(get(&attrs, "gen_ai.response.finish_reasons"), Some(&reasons));
        // No client-sent id, no compaction, no content, no error: none of those attributes.
        for absent in ["gen_ai.conversation.id", "gen_ai.conversation.compacted", "gen_ai.input.messages", "error.type"] {
            assert_eq!(get(&attrs, absent), None, "{absent}");
        }
        // Every key is namespaced: the conventions' own, or ctxscope's.
        let foreign: Vec<_> = attrs
            .iter()
            .map(|kv| kv.key.as_str())
            .filter(|k| !["gen_ai.", "ctxscope.", "server.", "http.", "error."].iter().any(|p| k.starts_with(p)))
            .collect();
        assert!(foreign.is_empty(), "{foreign:?}");
    }

    #[test]
    fn client_conversation_and_compaction_only_when_there() {
        let mut t = turn();
        t.client_conversation = Some("session-42".into());
        t.findings = vec![finding(FindingKind::HistoryDropped)];
        t.findings[0].evidence = json!({"cause": "compaction", "summary": {"recognised_by": "marker", "harness": "codex"}});
        let attrs = attributes(&t, &origin());
        assert_eq!(get(&attrs, "gen_ai.conversation.id"), Some(&Value::from("session-42")));
        assert_eq!(get(&attrs, "gen_ai.conversation.compacted"), Some(&Value::Bool(true)));
        assert_eq!(get(&finding_attributes(&t.findings[0]), "ctxscope.finding.cause"), Some(&Value::from("compaction")));
        // Pruning, or a summary recognised only by its shape, is not a certain compaction.
        for evidence in [json!({"cause": "pruned"}), json!({"cause": "compaction", "summary": {"recognised_by": "structure"}})] {
            t.findings[0].evidence = evidence;
            assert_eq!(get(&attributes(&t, &origin()), "gen_ai.conversation.compacted"), None);
        }
    }

    #[test]
    fn the_span_carries_real_times_a_name_and_one_event_per_finding() {
        let mut t = turn();
        t.findings = vec![finding(FindingKind::EngineTruncation)];
        let scope = InstrumentationScope::builder("ctxscope").build();
        let ids = (TraceId::from(1u128), SpanId::from(2u64));
        let span = span(&t, &origin(), ids, &scope);
        assert_eq!(span.name, "chat smol");
        assert_eq!(span.span_kind, SpanKind::Client);
        assert_eq!(span.start_time, UNIX_EPOCH + Duration::from_millis(1_764_421_507_123));
        assert_eq!(span.end_time.duration_since(span.start_time).unwrap(), Duration::from_millis(250));
        assert_eq!(span.status, Status::Unset);
        assert_eq!(span.events.len(), 1);
        let event = &span.events.events[0];
        assert_eq!(event.name, FINDING_EVENT);
        assert_eq!(event.timestamp, span.end_time);
        assert_eq!(get(&event.attributes, "ctxscope.finding.kind"), Some(&Value::from("engine_truncation")));
        assert_eq!(get(&event.attributes, "ctxscope.finding.severity"), Some(&Value::from("critical")));
        let evidence = get(&event.attributes, "ctxscope.finding.evidence").unwrap().as_str();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&evidence).unwrap()["local_prompt_tokens"], 180);
    }

    #[test]
    fn an_error_response_sets_error_type_and_status() {
        let mut t = turn();
        t.status = 400;
        t.error = Some("the request exceeds the available context size".into());
        let attrs = attributes(&t, &origin());
        assert_eq!(get(&attrs, "error.type"), Some(&Value::from("400")));
        let scope = InstrumentationScope::builder("ctxscope").build();
        let span = span(&t, &origin(), (TraceId::from(1u128), SpanId::from(2u64)), &scope);
        assert!(matches!(span.status, Status::Error { .. }));
        t.status = 200;
        assert_eq!(get(&attributes(&t, &origin()), "error.type"), Some(&Value::from("_OTHER")));
    }
}
