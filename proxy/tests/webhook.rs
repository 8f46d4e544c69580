//! The webhook alert sink against a real HTTP server on loopback: both payload formats, dedupe by
//! cause, the rate limit, retries honouring Retry-After, and that a hanging or dead webhook never slows
//! `send` and only shows up in the counts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_proxy::alert::webhook::{WebhookConfig, WebhookFormat, WebhookSink, WebhookStats};
use ctxscope_proxy::alert::AlertSink;
use ctxscope_store::{FindingKind, FindingRecord, Severity};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// How the test webhook answers.
#[derive(Clone, Default)]
struct Behaviour {
    /// Answer the first N requests with 503.
    fail_first: usize,
    /// Retry-After value sent with those 503s.
    retry_after: Option<&'static str>,
    /// Sleep this long before answering.
    delay: Duration,
}

/// One request the webhook received.
#[derive(Debug, Clone)]
struct Received {
    content_type: Option<String>,
    body: Value,
    status: u16,
}

/// A real HTTP/1 server on 127.0.0.1 that records every request.
struct Hook {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Hook {
    async fn start(behaviour: Behaviour) -> Hook {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new((behaviour, AtomicUsize::new(0), received.clone()));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| answer(state.clone(), request));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Hook { addr, received }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Bodies of the requests answered 200.
    fn delivered(&self) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r.status == 200).map(|r| r.body).collect()
    }
}

type HookState = (Behaviour, AtomicUsize, Arc<Mutex<Vec<Received>>>);

async fn answer(state: Arc<HookState>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (behaviour, seen, received) = &*state;
    let content_type = request.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    tokio::time::sleep(behaviour.delay).await;
    let fail = seen.fetch_add(1, Ordering::SeqCst) < behaviour.fail_first;
    let status = if fail { 503 } else { 200 };
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    received.lock().unwrap().push(Received { content_type, body, status });
    let mut response = Response::builder().status(status);
    if let (true, Some(after)) = (fail, behaviour.retry_after) {
        response = response.header("retry-after", after);
    }
    Ok(response.body(Full::new(Bytes::new())).unwrap())
}

fn finding(id: u64, cause: &str) -> FindingRecord {
    FindingRecord {
        id,
        kind: FindingKind::EngineTruncation,
        severity: Severity::Critical,
        time_unix_ms: 1_764_421_507_123,
        upstream: "http://127.0.0.1:8000".into(),
        model: Some("qwen".into()),
        conversation: 42,
        turn: 7,
        turn_index: 3,
        summary: "engine processed 4096 of 9000 prompt tokens".into(),
        evidence: json!({"sent": 9000, "processed": 4096}),
        cause: cause.into(),
    }
}

fn start(config: WebhookConfig) -> WebhookSink {
    WebhookSink::start(config, tokio::runtime::Handle::current()).expect("valid webhook config")
}

async fn flushed(sink: &WebhookSink) -> WebhookStats {
    assert!(sink.flush(Duration::from_secs(10)).await, "webhook queue drained");
    sink.stats()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_format_posts_one_document_per_finding() {
    let hook = Hook::start(Behaviour::default()).await;
    let sink = start(WebhookConfig::new(hook.url()));
    let f = finding(1, "truncation:42:7");
    sink.send(&f);
    assert_eq!(flushed(&sink).await, WebhookStats { delivered: 1, ..WebhookStats::default() });
    let requests = hook.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(requests[0].body, json!({"source": "ctxscope", "finding": serde_json::to_value(&f).unwrap()}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_format_posts_an_alert_array() {
    let hook = Hook::start(Behaviour::default()).await;
    let mut config = WebhookConfig::new(hook.url());
    config.format = "alertmanager".parse::<WebhookFormat>().unwrap();
    let sink = start(config);
    sink.send(&finding(1, "truncation:42:7"));
    flushed(&sink).await;
    let expected = json!([{
        "labels": {
            "alertname": "ctxscope_engine_truncation",
            "kind": "engine_truncation",
            "severity": "critical",
            "upstream": "http://127.0.0.1:8000",
            "conversation": "42",
        },
        "annotations": {
            "summary": "engine processed 4096 of 9000 prompt tokens",
            "description": "<evidence>",
        },
        "startsAt": "2025-11-29T13:05:07.123Z",
    }]);
    let mut delivered = hook.delivered();
    assert_eq!(delivered.len(), 1);
    // The description is the evidence as compact JSON; compare it parsed (key order is serde_json's).
    let description = delivered[0][0]["annotations"]["description"].take();
    let description = description.as_str().expect("description is a string");
    assert!(!description.contains(' '), "compact: {description}");
    assert_eq!(serde_json::from_str::<Value>(description).unwrap(), json!({"sent": 9000, "processed": 4096}));
    delivered[0][0]["annotations"]["description"] = json!("<evidence>");
    assert_eq!(delivered, vec![expected]);
    assert_eq!(hook.requests()[0].content_type.as_deref(), Some("application/json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_cause_within_the_window_is_delivered_once() {
    let hook = Hook::start(Behaviour::default()).await;
    let sink = start(WebhookConfig::new(hook.url()));
    sink.send(&finding(1, "cause-a"));
    sink.send(&finding(2, "cause-a"));
    sink.send(&finding(3, "cause-b"));
    let stats = flushed(&sink).await;
    assert_eq!(stats, WebhookStats { delivered: 2, deduplicated: 1, ..WebhookStats::default() });
    let ids: Vec<u64> = hook.delivered().iter().map(|b| b["finding"]["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&1) && ids.contains(&3), "first of cause-a and cause-b delivered: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_the_rate_limit_delivers_at_most_the_limit() {
    let hook = Hook::start(Behaviour::default()).await;
    let mut config = WebhookConfig::new(hook.url());
    config.max_per_minute = 5;
    let sink = start(config);
    for i in 0..20 {
        sink.send(&finding(i, &format!("cause-{i}")));
    }
    let stats = flushed(&sink).await;
    // The bucket refills one token per 12 s, far longer than this burst takes.
    assert_eq!(stats, WebhookStats { delivered: 5, rate_limited: 15, ..WebhookStats::default() });
    assert_eq!(hook.delivered().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_unavailable_is_retried_after_retry_after_and_delivered_once() {
    let hook = Hook::start(Behaviour { fail_first: 1, retry_after: Some("1"), ..Behaviour::default() }).await;
    let sink = start(WebhookConfig::new(hook.url()));
    let started = Instant::now();
    sink.send(&finding(1, "cause"));
    let stats = flushed(&sink).await;
    assert!(started.elapsed() >= Duration::from_millis(900), "waited for Retry-After: {:?}", started.elapsed());
    assert_eq!(stats, WebhookStats { delivered: 1, ..WebhookStats::default() });
    let statuses: Vec<u16> = hook.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200]);
    assert_eq!(hook.delivered().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_webhook_never_slows_send() {
    let hook = Hook::start(Behaviour { delay: Duration::from_secs(10), ..Behaviour::default() }).await;
    let mut config = WebhookConfig::new(hook.url());
    config.queue = 16;
    config.max_in_flight = 2;
    config.max_per_minute = 1_000_000;
    config.timeout = Duration::from_secs(30);
    let sink = start(config);
    let sender = sink.clone();
    // The capture worker is a plain thread; so is this caller.
    let elapsed = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        for i in 0..1000 {
            sender.send(&finding(i, &format!("cause-{i}")));
        }
        started.elapsed()
    })
    .await
    .unwrap();
    assert!(elapsed < Duration::from_millis(200), "1000 sends took {elapsed:?}");
    // 2 posts hang, one finding waits for a permit, 16 wait in the queue: the rest were dropped.
    let stats = sink.stats();
    assert!(stats.queue_full >= 900, "{stats:?}");
    assert_eq!(stats.delivered + stats.failed, 0, "{stats:?}");
    assert!(!sink.flush(Duration::from_millis(100)).await, "flush gives up at its timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_webhook_only_counts_failures() {
    let metrics = ctxscope_proxy::metrics::install();
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let mut config = WebhookConfig::new(format!("http://{addr}/hook"));
    config.retries = 2;
    let sink = start(config);
    let started = Instant::now();
    sink.send(&finding(1, "cause-1"));
    sink.send(&finding(2, "cause-2"));
    assert!(started.elapsed() < Duration::from_millis(50));
    let stats = flushed(&sink).await;
    assert_eq!(stats, WebhookStats { failed: 2, ..WebhookStats::default() });
    let rendered = metrics.render();
    let value = |name: &str, label: &str| -> f64 {
        let line = rendered
            .lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .unwrap_or_else(|| panic!("no {name} {label} in\n{rendered}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("ctxscope_alerts_sent_total", r#"outcome="failed""#) >= 2.0);
    assert!(value("ctxscope_alerts_dropped_total", r#"reason="failed""#) >= 2.0);
}
