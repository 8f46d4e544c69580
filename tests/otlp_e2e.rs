//! OTLP export end to end (`--otlp-endpoint`, issue 26). Two real proxies in front of the real engine
//! export to a real Arize Phoenix (SQLite in a temp dir), are stopped gracefully, and Phoenix's REST API
//! must then hold one trace per turn, conversations groupable by attribute, the token counts and the
//! truncation finding. A collector double (a loopback HTTP server decoding the OTLP protobuf) checks
//! what Phoenix does not keep: the resource and the findings' log records. A dead endpoint costs
//! forwarded requests nothing and ends as counted drops.
//!
//! Phoenix comes from `scripts/phoenix/install.sh` (scripts/test.sh runs it); without it the Phoenix
//! test prints `SKIPPED` (and fails under CI). The model comes from `scripts/fetch-model.sh`.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message;
use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

// ---------------------------------------------------------------------------------------------------
// 1. Phoenix: two proxies, one real engine, read back after a graceful stop
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phoenix_holds_every_turn_and_finding_of_two_proxies_after_they_stop() {
    let Some(root) = phoenix_root() else { return };
    let dir = tempfile::tempdir().unwrap();
    let phoenix = Phoenix::start(&root, &dir.path().join("phoenix")).await;
    let (_engine, engine) = start_engine().await;

    let replicas = ["replica-a", "replica-b"];
    let proxies: Vec<Proxy> = replicas
        .iter()
        .map(|name| {
            Proxy::builder(&engine, &dir.path().join(name))
                .arg("--otlp-endpoint")
                .arg(&phoenix.url)
                .arg("--otlp-no-logs") // Phoenix takes traces only
                .arg("--otlp-instance-id")
                .arg(name)
                .start()
        })
        .collect();

    // Through each proxy: a three-turn conversation the client names, and a one-turn conversation it
    // does not name whose long prompt the engine truncates (SGLang-style auto-truncate, 57 tokens kept).
    let mut expected = Vec::new(); // (replica, input tokens, output tokens)
    for (proxy, name) in proxies.iter().zip(replicas) {
        let session = format!("{name}-chat");
        let mut messages = vec![json!({"role": "system", "content": "You are a terse geography tutor."})];
        for question in ["What is the capital of France?", "And of Spain?", "Which of the two is larger?"] {
            messages.push(json!({"role": "user", "content": question}));
            let body = json!({"model": "smol", "messages": messages, "max_tokens": 8, "temperature": 0});
            let reply = chat(proxy, &body, &[("x-ctxscope-conversation", &session)]).await;
            expected.push((name.to_string(), tokens(&reply, "prompt_tokens"), tokens(&reply, "completion_tokens")));
            messages.push(json!({"role": "assistant", "content": reply["choices"][0]["message"]["content"]}));
        }
        let reply = chat(proxy, &long_prompt(), &[("x-ctxscope-patches", "auto_truncate=64")]).await;
        assert_eq!(reply["usage"]["prompt_tokens"], 57, "the engine did not truncate: {reply}");
        expected.push((name.to_string(), 57, tokens(&reply, "completion_tokens")));
    }
    for proxy in &proxies {
        proxy.wait_turns(4).await;
    }
    let before = phoenix.spans(&[]).await.len();
    // Graceful stop right after capture: whatever is still batched must be posted on the way out.
    for proxy in proxies {
        proxy.stop();
    }
    eprintln!("Phoenix held {before} of {} spans when the proxies were told to stop", expected.len());

    let spans = phoenix.wait_spans(expected.len(), Duration::from_secs(30)).await;
    // One trace per turn.
    let traces: std::collections::BTreeSet<&str> = spans.iter().map(|s| s["context"]["trace_id"].as_str().unwrap()).collect();
    assert_eq!(traces.len(), expected.len(), "one trace per turn");
    let listed = get_json(&format!("{}/v1/projects/default/traces?limit=100", phoenix.url)).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(expected.len()), "Phoenix's trace list: {listed}");
    for span in &spans {
        let attrs = &span["attributes"];
        assert_eq!(span["name"], "chat smol", "{span}");
        assert_eq!(attrs["gen_ai.operation.name"], "chat", "{span}");
        assert_eq!(attrs["gen_ai.provider.name"], "openai", "{span}");
        assert!(attrs["gen_ai.response.model"].is_string(), "no response model: {span}");
        assert!(attrs["ctxscope.prefix_hash"].as_str().is_some_and(|h| h.len() == 64), "{span}");
        assert!(attrs["ctxscope.local.prompt_tokens"].as_u64().is_some(), "no local count: {span}");
        assert!(span["start_time"].as_str() < span["end_time"].as_str(), "{span}");
    }

    // Token counts: the engine's own, span for span.
    let mut seen: Vec<(String, u64, u64)> = spans
        .iter()
        .map(|s| {
            let a = &s["attributes"];
            let replica = a["ctxscope.instance.id"].as_str().unwrap_or_default().to_string();
            (replica, a["gen_ai.usage.input_tokens"].as_u64().unwrap_or(0), a["gen_ai.usage.output_tokens"].as_u64().unwrap_or(0))
        })
        .collect();
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected, "(replica, input tokens, output tokens) per span");

    // Conversations group by attribute: the client's id, or ctxscope's own within a replica.
    for name in replicas {
        let named = phoenix.spans(&[&format!("gen_ai.conversation.id:{name}-chat")]).await;
        assert_eq!(named.len(), 3, "{name}'s named conversation: {}", Value::Array(named.clone()));
        let mut turns: Vec<(u64, String)> = named
            .iter()
            .map(|s| (s["attributes"]["ctxscope.turn.index"].as_u64().unwrap(), s["attributes"]["ctxscope.relation"].to_string()))
            .collect();
        turns.sort();
        assert_eq!(turns, [(0, "\"new\"".into()), (1, "\"extend\"".into()), (2, "\"extend\"".into())], "{name}");
        let conversation = named[0]["attributes"]["ctxscope.conversation.id"].as_u64().unwrap();
        let derived = phoenix.spans(&[&format!("ctxscope.instance.id:{name}"), &format!("ctxscope.conversation.id:{conversation}")]).await;
        assert_eq!(derived.len(), 3, "{name}'s conversation {conversation} by ctxscope's own id");
        assert_eq!(phoenix.spans(&[&format!("ctxscope.instance.id:{name}")]).await.len(), 4, "{name}'s spans");
    }

    // The truncated turns: the finding as a span event, and no client conversation id invented.
    let truncated: Vec<&Value> = spans.iter().filter(|s| s["attributes"]["gen_ai.usage.input_tokens"] == 57).collect();
    assert_eq!(truncated.len(), 2);
    for span in truncated {
        assert!(span["attributes"].get("gen_ai.conversation.id").is_none(), "an id the client never sent: {span}");
        let events = span["events"].as_array().unwrap();
        // (The second replica may also see phantom_cache_reuse: the engine's cache holds the first's prompts.)
        let finding = events
            .iter()
            .find(|e| e["name"] == "ctxscope.finding" && e["attributes"]["ctxscope.finding.kind"] == "engine_truncation")
            .unwrap_or_else(|| panic!("no engine_truncation finding event: {span}"));
        assert_eq!(finding["attributes"]["ctxscope.finding.severity"], "critical", "{finding}");
        let evidence: Value = serde_json::from_str(finding["attributes"]["ctxscope.finding.evidence"].as_str().unwrap()).unwrap();
        assert_eq!(evidence["engine_prompt_tokens"], 57, "{evidence}");
        assert!(finding["attributes"]["ctxscope.finding.summary"].as_str().is_some_and(|s| s.contains("57")), "{finding}");
    }
}

// ---------------------------------------------------------------------------------------------------
// 2. A collector double: the resource, the content, the findings' log records
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_gets_the_resource_spans_content_and_finding_logs() {
    let upstream = Upstream::start().await;
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let with_secret = upstream.url().replace("http://", "http://ops:hunter2@");
    let proxy = Proxy::builder(&with_secret, &dir.path().join("data"))
        .arg("--otlp-endpoint")
        .arg(&collector.url)
        .arg("--otlp-content")
        .arg("--otlp-service-name")
        .arg("fleet-west")
        .arg("--otlp-instance-id")
        .arg("gpu-7")
        .start();
    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4});
    let ok = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[("x-ctxscope-conversation", "c-1")], &body).await;
    assert_eq!(ok.status, 200);
    let refused = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[("x-script", "status400")], &body).await;
    assert_eq!(refused.status, 400);
    proxy.wait_turns(2).await;
    proxy.stop();

    let traces: Vec<ExportTraceServiceRequest> = collector.decoded("/v1/traces");
    let resource_spans: Vec<_> = traces.iter().flat_map(|t| &t.resource_spans).collect();
    assert!(!resource_spans.is_empty(), "nothing posted to /v1/traces");
    for rs in &resource_spans {
        let resource = &rs.resource.as_ref().unwrap().attributes;
        assert_eq!(text(resource, "service.name"), Some("fleet-west".into()));
        assert_eq!(text(resource, "service.instance.id"), Some("gpu-7".into()));
        let upstream = text(resource, "ctxscope.upstream").unwrap();
        assert!(upstream.contains("***@") && !upstream.contains("hunter2"), "credentials exported: {upstream}");
    }
    let spans: Vec<_> = resource_spans.iter().flat_map(|rs| &rs.scope_spans).flat_map(|ss| &ss.spans).collect();
    assert_eq!(spans.len(), 2, "one span per turn");
    let named = spans.iter().find(|s| text(&s.attributes, "gen_ai.conversation.id").as_deref() == Some("c-1")).expect("c-1");
    let input = text(&named.attributes, "gen_ai.input.messages").expect("content was asked for");
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!([{"role": "user", "parts": [{"type": "text", "content": "hello there"}]}])
    );
    assert!(text(&named.attributes, "gen_ai.output.messages").unwrap().contains("You said: hello there"));
    assert_eq!(named.kind, 3, "SPAN_KIND_CLIENT");
    assert!(named.end_time_unix_nano > named.start_time_unix_nano);

    let failed = spans.iter().find(|s| text(&s.attributes, "error.type").as_deref() == Some("400")).expect("the 400 turn");
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(2), "STATUS_CODE_ERROR");
    let event = failed.events.iter().find(|e| e.name == "ctxscope.finding").expect("a finding event on the refused turn");
    assert_eq!(text(&event.attributes, "ctxscope.finding.kind"), Some("context_overflow".into()));

    // The same finding as a log record, in the refused turn's trace.
    let logs: Vec<ExportLogsServiceRequest> = collector.decoded("/v1/logs");
    let records: Vec<_> = logs.iter().flat_map(|l| &l.resource_logs).flat_map(|rl| &rl.scope_logs).flat_map(|sl| &sl.log_records).collect();
    assert_eq!(records.len(), 1, "one log record per finding");
    let record = records[0];
    assert_eq!(record.event_name, "ctxscope.finding");
    assert_eq!(text(&record.attributes, "ctxscope.finding.kind"), Some("context_overflow".into()));
    assert_eq!(record.trace_id, failed.trace_id, "the record is in the turn's trace");
    assert_eq!(record.span_id, failed.span_id);
    assert!(record.severity_number >= 13, "WARN or more: {}", record.severity_number);
}

/// `--otlp-content` follows `--capture`: masked text at `redacted`, no content at all at `hashes`
/// (nothing of the message in any byte posted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_content_is_masked_or_left_out_by_the_capture_level() {
    let upstream = Upstream::start().await;
    for level in ["redacted", "hashes"] {
        let collector = Collector::start().await;
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::builder(&upstream.url(), &dir.path().join("data"))
            .arg("--otlp-endpoint")
            .arg(&collector.url)
            .arg("--otlp-content")
            .arg("--capture")
            .arg(level)
            .start();
        let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "mail ada@example.com"}]});
        assert_eq!(post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body).await.status, 200);
        proxy.wait_turns(1).await;
        proxy.stop();
        let posted: Vec<u8> = collector.bodies.lock().unwrap().iter().flat_map(|(_, b)| b.to_vec()).collect();
        assert!(!posted.windows(15).any(|w| w == b"ada@example.com"), "{level}: the address was exported");
        let traces: Vec<ExportTraceServiceRequest> = collector.decoded("/v1/traces");
        let spans: Vec<_> = traces.iter().flat_map(|t| &t.resource_spans).flat_map(|rs| &rs.scope_spans).flat_map(|ss| &ss.spans).collect();
        assert_eq!(spans.len(), 1, "{level}");
        let (input, output) = (text(&spans[0].attributes, "gen_ai.input.messages"), text(&spans[0].attributes, "gen_ai.output.messages"));
        if level == "redacted" {
            assert!(input.unwrap().contains("mail [redacted:email]"));
            assert!(output.unwrap().contains("You said: mail [redacted:email]"));
        } else {
            assert_eq!((input, output), (None, None), "no content without text");
        }
    }
}

/// A certain compaction (Codex's summary prefix) marks its turn's span `gen_ai.conversation.compacted`;
/// a keep-the-last-N window does not; both finding events name their cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_certain_compaction_marks_the_span_compacted() {
    let upstream = Upstream::start().await;
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&upstream.url(), &dir.path().join("data")).arg("--otlp-endpoint").arg(&collector.url).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    let m = |role: &str, content: &str| json!({"role": role, "content": content});
    let mut sent = 0;
    let mut send = |messages: Vec<Value>| {
        sent += 1;
        let body = json!({"model": "scripted", "messages": messages, "max_tokens": 8});
        let url = url.clone();
        async move { assert_eq!(post_json(&url, &[], &body).await.status, 200) }
    };
    // The scripted upstream answers "You said: <the last user message>".
    let (s1, s2) = (m("system", "You are a coding agent."), m("system", "You are a cook."));
    send(vec![s1.clone(), m("user", "u1")]).await;
    send(vec![s1.clone(), m("user", "u1"), m("assistant", "You said: u1"), m("user", "u2")]).await;
    let summary =
        "Another language model started to solve this problem and produced a summary of its thinking process.\nThe user asked u1 and u2.";
    send(vec![s1, m("user", "u1"), m("user", "u2"), m("user", summary), m("user", "u3")]).await;
    send(vec![s2.clone(), m("user", "a1")]).await;
    send(vec![s2.clone(), m("user", "a1"), m("assistant", "You said: a1"), m("user", "a2")]).await;
    send(vec![s2, m("assistant", "You said: a2"), m("user", "a3")]).await;
    proxy.wait_turns(sent).await;
    proxy.stop();

    let traces: Vec<ExportTraceServiceRequest> = collector.decoded("/v1/traces");
    let spans: Vec<_> = traces.iter().flat_map(|t| &t.resource_spans).flat_map(|rs| &rs.scope_spans).flat_map(|ss| &ss.spans).collect();
    assert_eq!(spans.len(), 6, "one span per turn");
    let compacted = |s: &opentelemetry_proto::tonic::trace::v1::Span| {
        s.attributes.iter().any(|kv| {
            kv.key == "gen_ai.conversation.compacted"
                && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(any_value::Value::BoolValue(true)))
        })
    };
    let causes: Vec<(bool, String)> = spans
        .iter()
        .flat_map(|s| {
            s.events
                .iter()
                .filter(|e| e.name == "ctxscope.finding")
                .map(move |e| (compacted(s), text(&e.attributes, "ctxscope.finding.cause").unwrap_or_default()))
        })
        .collect();
    assert_eq!(spans.iter().filter(|s| compacted(s)).count(), 1, "only the compaction's span: {causes:?}");
    assert!(causes.contains(&(true, "compaction".to_string())), "{causes:?}");
    assert!(causes.contains(&(false, "windowed".to_string())), "{causes:?}");
}

// ---------------------------------------------------------------------------------------------------
// 3. A dead endpoint: forwarded requests unaffected, every span a counted drop, a bounded stop
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_costs_only_counted_drops() {
    let upstream = Upstream::start().await;
    // Accepts connections and never answers: each export waits out its whole timeout.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", blackhole.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in blackhole.incoming().flatten() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let plain = Proxy::builder(&upstream.url(), &dir.path().join("plain")).start();
    let exporting = Proxy::builder(&upstream.url(), &dir.path().join("dead")).arg("--otlp-endpoint").arg(&dead).start();

    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 4});
    let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    const N: usize = 60;
    for i in 0..N + 5 {
        for (name, proxy) in [("plain", &plain), ("dead endpoint", &exporting)] {
            let started = Instant::now();
            let reply = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body).await;
            assert_eq!(reply.status, 200);
            if i >= 5 {
                times.entry(name).or_default().push(started.elapsed());
            }
        }
    }
    let median = |name: &str| {
        let mut t = times[name].clone();
        t.sort();
        t[t.len() / 2]
    };
    let (base, with) = (median("plain"), median("dead endpoint"));
    eprintln!("median forwarded request: {base:?} plain, {with:?} exporting to a dead endpoint");
    assert!(with <= base * 2 + Duration::from_millis(2), "a dead OTLP endpoint slowed requests: {with:?} vs {base:?}");

    // Every turn ends as a counted drop, none as exported.
    exporting.wait_turns((N + 5) as u32).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = exporting.metrics().await;
        let dropped = labelled(&metrics, "ctxscope_otlp_dropped_total", "signal=\"traces\"");
        if dropped >= (N + 5) as f64 {
            assert_eq!(labelled(&metrics, "ctxscope_otlp_exported_total", "signal=\"traces\""), 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "only {dropped} of {} spans counted as dropped:\n{metrics}", N + 5);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stopping = Instant::now();
    exporting.stop();
    eprintln!("stopped in {:?} with a dead OTLP endpoint", stopping.elapsed());
    plain.stop();
}

// ---------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------

/// Phoenix's install folder, or None to skip (only outside CI).
fn phoenix_root() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/phoenix/install.sh");
    let out = Command::new("bash").arg(script).arg("--find").stderr(Stdio::null()).output().ok()?;
    let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && root.is_dir() {
        return Some(root);
    }
    assert!(std::env::var_os("CI").is_none(), "CI must run the Phoenix test: scripts/test.sh installs it (scripts/phoenix/install.sh)");
    eprintln!("SKIPPED: Arize Phoenix is not installed (run scripts/phoenix/install.sh)");
    None
}

/// A Phoenix server on free loopback ports, its SQLite database under `dir`.
struct Phoenix {
    _child: KillOnDrop,
    url: String,
}

impl Phoenix {
    async fn start(root: &Path, dir: &Path) -> Phoenix {
        std::fs::create_dir_all(dir).unwrap();
        let (port, grpc) = (free_port(), free_port());
        let child = Command::new("python3")
            .args(["-m", "phoenix.server.main", "serve"])
            .env("PYTHONPATH", root)
            .env("PHOENIX_WORKING_DIR", dir)
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("phoenix.log")).unwrap())
            .spawn()
            .expect("spawn phoenix");
        let phoenix = Phoenix { _child: KillOnDrop(child), url: format!("http://127.0.0.1:{port}") };
        wait_http_ok(&format!("{}/healthz", phoenix.url), Duration::from_secs(120)).await;
        phoenix
    }

    /// Spans of the default project matching every `key:value` attribute filter.
    async fn spans(&self, filters: &[&str]) -> Vec<Value> {
        let query: String = filters.iter().map(|f| format!("&attribute={}", f.replace(' ', "%20"))).collect();
        let raw = send("GET", &format!("{}/v1/projects/default/spans?limit=1000{query}", self.url), &[], Vec::new()).await;
        match raw.status {
            200 => raw.json()["data"].as_array().cloned().unwrap_or_default(),
            404 => Vec::new(), // no project before the first span
            status => panic!("Phoenix answered {status}: {}", String::from_utf8_lossy(&raw.body)),
        }
    }

    /// Waits (Phoenix inserts asynchronously) until it holds `n` spans; returns them.
    async fn wait_spans(&self, n: usize, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans(&[]).await;
            if spans.len() >= n {
                assert_eq!(spans.len(), n, "more spans than turns: {}", Value::Array(spans));
                return spans;
            }
            assert!(Instant::now() < deadline, "Phoenix holds {} of {n} spans {within:?} after the proxies stopped", spans.len());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// `ctxscope engine` on the default model: the process (killed when dropped) and its URL.
async fn start_engine() -> (KillOnDrop, String) {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let child = Command::new(bin())
        .args(["engine", "--model"])
        .arg(&model)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("CTXSCOPE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ctxscope engine");
    let engine = KillOnDrop(child);
    let url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{url}/health"), Duration::from_secs(60)).await;
    (engine, url)
}

async fn chat(proxy: &Proxy, body: &Value, headers: &[(&str, &str)]) -> Value {
    let raw = post_json(&format!("{}/v1/chat/completions", proxy.url()), headers, body).await;
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    raw.json()
}

fn tokens(reply: &Value, field: &str) -> u64 {
    reply["usage"][field].as_u64().unwrap_or_else(|| panic!("no usage.{field}: {reply}"))
}

/// A report of 400 words and a question about its end: the engine keeps only the first 57 tokens.
fn long_prompt() -> Value {
    json!({
        "model": "smol",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. Read the whole report before you answer."},
            {"role": "user", "content": format!("{}\n\nWhat colour was the last door in the report?", report_words(400))},
        ],
        "max_tokens": 4,
        "temperature": 0,
    })
}

/// The sum of a labelled metric's samples whose labels contain `label`.
fn labelled(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A string attribute's value.
fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    })
}

/// An OTLP/HTTP receiver on a loopback socket: keeps every posted body by path, answers 200.
struct Collector {
    url: String,
    bodies: Arc<Mutex<Vec<(String, Bytes)>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
        let kept = bodies.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let path = request.uri().path().to_string();
                            let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            kept.lock().unwrap().push((path, body));
                            let mut response = http::Response::new(Full::new(Bytes::new()));
                            response.headers_mut().insert("content-type", "application/x-protobuf".parse().unwrap());
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Collector { url, bodies }
    }

    fn decoded<M: Message + Default>(&self, path: &str) -> Vec<M> {
        let bodies = self.bodies.lock().unwrap();
        bodies
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, body)| M::decode(body.as_ref()).unwrap_or_else(|e| panic!("{path}: not OTLP protobuf: {e}")))
            .collect()
    }
}
