//! Fleet export over OTLP (`--otlp-endpoint`): every captured turn becomes one span named and
//! attributed by the OpenTelemetry GenAI semantic conventions, every finding a span event and a log
//! record, posted as OTLP/HTTP protobuf to a collector or a tracing backend (Phoenix, Tempo,
//! Langfuse, ClickHouse behind a Collector). The capture worker only hands a summary to a bounded
//! queue ([`OtlpSink`], an alert sink); a task on the runtime batches and posts. Fail-open: a full
//! queue or a dead endpoint costs counted drops (`ctxscope_otlp_dropped_total`), never a wait.

mod content;
mod export;
mod span;
mod summary;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ctxscope_store::{FindingRecord, TurnRecord};
use http::Uri;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use span::{attributes, operation, provider, Origin, FINDING_EVENT};
pub use summary::TurnSummary;

use crate::capture::exchange::Exchange;
use crate::capture::sink::AlertSink;
use crate::metrics::{OTLP_DROPPED_TOTAL, OTLP_EXPORTED_TOTAL};

/// Where and how turns are exported; [`OtlpConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` and `/v1/logs` are appended.
    /// A URL that already ends in `/v1/traces` is taken as the traces endpoint of that base.
    pub endpoint: String,
    /// `service.name` (`--otlp-service-name`).
    pub service_name: String,
    /// `service.instance.id` (`--otlp-instance-id`); `None`: this host's name and the proxy port.
    pub instance_id: Option<String>,
    /// Export message content (`gen_ai.input.messages`, `gen_ai.output.messages`; `--otlp-content`).
    pub content: bool,
    /// Also export each finding as a log record (`--otlp-no-logs` turns it off, for trace-only backends).
    pub logs: bool,
    /// Turns waiting for export; beyond this they are dropped (reason `queue_full`).
    pub queue: usize,
    /// Turns per export request at most.
    pub batch: usize,
    /// A partial batch waits at most this long.
    pub interval: Duration,
    /// Per export request, retries included.
    pub timeout: Duration,
}

impl OtlpConfig {
    /// service `ctxscope`, content and logs as said, 2048 queued, 256 per batch, 1 s, 5 s per request.
    pub fn new(endpoint: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            service_name: "ctxscope".into(),
            instance_id: None,
            content: false,
            logs: true,
            queue: 2048,
            batch: 256,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
        }
    }

    /// Checks the URL and the bounds; [`OtlpExporter::start`] calls this too.
    pub fn validate(&self) -> Result<(), OtlpError> {
        self.endpoints().map(|_| ())
    }

    fn endpoints(&self) -> Result<Endpoints, OtlpError> {
        for (name, value) in [("queue", self.queue), ("batch", self.batch)] {
            if value == 0 {
                return Err(OtlpError::Zero(name));
            }
        }
        Endpoints::parse(&self.endpoint)
    }
}

/// Why OTLP export cannot be configured or started.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("--otlp-endpoint {url:?} is not a URL like http://127.0.0.1:4318: {reason}")]
    Url { url: String, reason: String },
    #[error("--otlp-endpoint {0:?}: https:// is not supported (ctxscope's HTTP client speaks plain HTTP only); export to an http:// OpenTelemetry Collector next to the proxy and let it forward over TLS")]
    Https(String),
    #[error("--otlp-endpoint {0:?}: only http:// URLs are supported (OTLP over HTTP/protobuf, port 4318 by convention)")]
    Scheme(String),
    #[error("OTLP export {0} must be at least 1")]
    Zero(&'static str),
    #[error("cannot set up the OTLP exporter for {endpoint}: {reason}")]
    Build { endpoint: String, reason: String },
}

/// The signal URLs of one OTLP/HTTP base, with the base's credentials taken out.
#[derive(Debug)]
struct Endpoints {
    traces: String,
    logs: String,
    /// The base URL as shown in logs (credentials redacted).
    display: String,
    /// `Basic ...` from the URL's user information.
    authorization: Option<String>,
}

impl Endpoints {
    fn parse(url: &str) -> Result<Endpoints, OtlpError> {
        let display = crate::credentials::redact_url(url);
        let invalid = |reason: &str| OtlpError::Url { url: display.clone(), reason: reason.into() };
        let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(OtlpError::Https(display)),
            Some(_) => return Err(OtlpError::Scheme(display)),
            None => return Err(invalid("missing http://")),
        }
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        let split = crate::credentials::split(authority);
        if split.host.is_empty() || split.host.starts_with(':') {
            return Err(invalid("missing host"));
        }
        let path = uri.path().trim_end_matches('/');
        let base_path = path.strip_suffix("/v1/traces").unwrap_or(path);
        let base = format!("http://{}{base_path}", split.host);
        let authorization = split.basic.and_then(|v| v.to_str().ok().map(str::to_string));
        Ok(Endpoints { traces: format!("{base}/v1/traces"), logs: format!("{base}/v1/logs"), display, authorization })
    }

    fn headers(&self) -> HashMap<String, String> {
        self.authorization.iter().map(|v| ("authorization".to_string(), v.clone())).collect()
    }
}

/// `host:port` for `service.instance.id` when none is given: the machine's name (as the kernel has
/// it, else `$HOSTNAME`) and the proxy's port, unique per replica on one host and across hosts.
pub fn default_instance_id(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    match host {
        Some(host) => format!("{host}:{port}"),
        // No name to go by: a random one, stable for this process.
        None => {
            use opentelemetry_sdk::trace::IdGenerator;
            format!("ctxscope-{}:{port}", opentelemetry_sdk::trace::RandomIdGenerator::default().new_span_id())
        }
    }
}

/// Spans and log records exported and dropped since start (the same events go to the metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtlpStats {
    pub spans_exported: u64,
    pub spans_dropped: u64,
    pub logs_exported: u64,
    pub logs_dropped: u64,
}

/// Why a span or log record was not exported (the `reason` label).
#[derive(Debug, Clone, Copy)]
enum Lost {
    QueueFull,
    ExportFailed,
    Shutdown,
}

impl Lost {
    fn as_str(self) -> &'static str {
        match self {
            Lost::QueueFull => "queue_full",
            Lost::ExportFailed => "export_failed",
            Lost::Shutdown => "shutdown",
        }
    }
}

const TRACES: &str = "traces";
const LOGS: &str = "logs";

/// Counters shared by the sink, the export task and the handle.
#[derive(Default)]
struct Shared {
    /// Turns queued; `settled` counts those exported or dropped after queueing.
    accepted: AtomicU64,
    settled: AtomicU64,
    /// Log records queued (one per finding); `logs_settled` as above.
    logs_accepted: AtomicU64,
    logs_settled: AtomicU64,
    spans_exported: AtomicU64,
    spans_dropped: AtomicU64,
    logs_exported: AtomicU64,
    logs_dropped: AtomicU64,
}

impl Shared {
    fn exported(&self, signal: &'static str, n: u64) {
        let counter = if signal == TRACES { &self.spans_exported } else { &self.logs_exported };
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(OTLP_EXPORTED_TOTAL, "signal" => signal).increment(n);
    }

    fn dropped(&self, signal: &'static str, reason: Lost, n: u64) {
        if n == 0 {
            return;
        }
        let counter = if signal == TRACES { &self.spans_dropped } else { &self.logs_dropped };
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(OTLP_DROPPED_TOTAL, "signal" => signal, "reason" => reason.as_str()).increment(n);
    }

    fn stats(&self) -> OtlpStats {
        OtlpStats {
            spans_exported: self.spans_exported.load(Ordering::Relaxed),
            spans_dropped: self.spans_dropped.load(Ordering::Relaxed),
            logs_exported: self.logs_exported.load(Ordering::Relaxed),
            logs_dropped: self.logs_dropped.load(Ordering::Relaxed),
        }
    }
}

/// Creates the series at zero, so that `rate()` and `increase()` see the first drop.
fn register_series(logs: bool) {
    let signals: &[&'static str] = if logs { &[TRACES, LOGS] } else { &[TRACES] };
    for &signal in signals {
        metrics::counter!(OTLP_EXPORTED_TOTAL, "signal" => signal).absolute(0);
        for reason in [Lost::QueueFull, Lost::ExportFailed, Lost::Shutdown] {
            metrics::counter!(OTLP_DROPPED_TOTAL, "signal" => signal, "reason" => reason.as_str()).absolute(0);
        }
    }
}

/// Queues finished turns for export; cheap to clone (every clone feeds the same queue). Its
/// [`AlertSink::turn`] never waits: a full queue drops the turn and counts it.
#[derive(Clone)]
pub struct OtlpSink {
    tx: mpsc::Sender<TurnSummary>,
    content: bool,
    logs: bool,
    shared: Arc<Shared>,
}

impl AlertSink for OtlpSink {
    /// Findings travel with their turn ([`AlertSink::turn`]), as its span's events.
    fn send(&self, _finding: &FindingRecord) {}

    fn turn(&self, exchange: &Exchange, turn: &TurnRecord, findings: &[FindingRecord]) {
        if self.tx.capacity() == 0 {
            // Full: drop before building the summary.
            let logs = if self.logs { findings.len() as u64 } else { 0 };
            self.shared.dropped(TRACES, Lost::QueueFull, 1);
            self.shared.dropped(LOGS, Lost::QueueFull, logs);
            return;
        }
        self.offer(TurnSummary::new(exchange, turn, findings, self.content));
    }
}

impl OtlpSink {
    /// Queues one turn, or drops it (counted) when the queue is full or the exporter gone; never waits.
    fn offer(&self, summary: TurnSummary) {
        let logs = if self.logs { summary.findings.len() as u64 } else { 0 };
        match self.tx.try_send(summary) {
            Ok(()) => {
                self.shared.logs_accepted.fetch_add(logs, Ordering::Release);
                self.shared.accepted.fetch_add(1, Ordering::Release);
            }
            Err(error) => {
                let reason = if matches!(error, TrySendError::Full(_)) { Lost::QueueFull } else { Lost::Shutdown };
                self.shared.dropped(TRACES, reason, 1);
                self.shared.dropped(LOGS, reason, logs);
            }
        }
    }
}

/// The running exporter: its sink (give it to the capture pipeline) and its task.
pub struct OtlpExporter {
    sink: OtlpSink,
    flush: Arc<Notify>,
    task: JoinHandle<()>,
    endpoint: String,
}

impl OtlpExporter {
    /// Validates `config` and starts the export task on `runtime`. `upstream` is the proxy's upstream
    /// (credentials redacted in what is exported); `instance` the default `service.instance.id`.
    pub fn start(
        config: &OtlpConfig,
        upstream: &crate::Upstream,
        instance: String,
        runtime: &tokio::runtime::Handle,
    ) -> Result<OtlpExporter, OtlpError> {
        let endpoints = config.endpoints()?;
        let build = |reason: String| OtlpError::Build { endpoint: endpoints.display.clone(), reason };
        let instance = config.instance_id.clone().unwrap_or(instance);
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attributes([
                KeyValue::new("service.instance.id", instance.clone()),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("ctxscope.upstream", upstream.display.clone()),
            ])
            .build();
        let mut spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoints.traces.clone())
            .with_timeout(config.timeout)
            .with_headers(endpoints.headers())
            .build()
            .map_err(|e| build(e.to_string()))?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut spans, &resource);
        let logs = if config.logs {
            let mut logs = opentelemetry_otlp::LogExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoints.logs.clone())
                .with_timeout(config.timeout)
                .with_headers(endpoints.headers())
                .build()
                .map_err(|e| build(e.to_string()))?;
            opentelemetry_sdk::logs::LogExporter::set_resource(&mut logs, &resource);
            Some(logs)
        } else {
            None
        };
        register_series(config.logs);
        let origin = Origin {
            instance: instance.clone(),
            upstream: upstream.display.clone(),
            host: upstream.authority.host().to_string(),
            port: upstream.authority.port_u16().or(Some(80)),
        };
        let shared = Arc::new(Shared::default());
        let flush = Arc::new(Notify::new());
        let (tx, rx) = mpsc::channel(config.queue);
        let batcher = export::Batcher::new(spans, logs, origin, config, shared.clone());
        let task = runtime.spawn(export::run(rx, batcher, flush.clone()));
        tracing::info!(endpoint = %endpoints.display, service = %config.service_name, instance = %instance, logs = config.logs, content = config.content, "exporting turns over OTLP");
        let sink = OtlpSink { tx, content: config.content, logs: config.logs, shared };
        Ok(OtlpExporter { sink, flush, task, endpoint: endpoints.display })
    }

    /// A sink feeding this exporter's queue.
    pub fn sink(&self) -> OtlpSink {
        self.sink.clone()
    }

    pub fn stats(&self) -> OtlpStats {
        self.sink.shared.stats()
    }

    /// Exports what is queued and stops, within `within`; true when everything queued was settled
    /// (exported, or dropped by a failed export). Call it after the capture worker (which holds the
    /// other sinks) is joined; what is still queued at the deadline is dropped (reason `shutdown`).
    pub async fn shutdown(self, within: Duration) -> bool {
        let OtlpExporter { sink, flush, mut task, endpoint } = self;
        let shared = sink.shared.clone();
        drop(sink);
        flush.notify_one();
        if tokio::time::timeout(within, &mut task).await.is_ok() {
            return true;
        }
        // Still running: a capture worker that did not drain holds a sink, or an export is stuck.
        task.abort();
        let _ = task.await;
        let lost = shared.accepted.load(Ordering::Acquire).saturating_sub(shared.settled.load(Ordering::Acquire));
        let lost_logs = shared.logs_accepted.load(Ordering::Acquire).saturating_sub(shared.logs_settled.load(Ordering::Acquire));
        if lost == 0 && lost_logs == 0 {
            return true;
        }
        shared.dropped(TRACES, Lost::Shutdown, lost);
        shared.dropped(LOGS, Lost::Shutdown, lost_logs);
        tracing::warn!(%endpoint, spans = lost, logs = lost_logs, "OTLP export not finished within the shutdown grace; dropped");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn endpoints_take_a_base_or_a_traces_url_and_keep_credentials_out() {
        let plain = Endpoints::parse("http://collector:4318/").unwrap();
        assert_eq!((plain.traces.as_str(), plain.logs.as_str()), ("http://collector:4318/v1/traces", "http://collector:4318/v1/logs"));
        let traces = Endpoints::parse("http://phoenix:6006/v1/traces").unwrap();
        assert_eq!(traces.traces, "http://phoenix:6006/v1/traces");
        let based = Endpoints::parse("http://pk:sk@langfuse:3000/api/public/otel").unwrap();
        assert_eq!(based.traces, "http://langfuse:3000/api/public/otel/v1/traces");
        assert_eq!(based.display, "http://***@langfuse:3000/api/public/otel");
        assert_eq!(based.authorization.as_deref(), Some("Basic cGs6c2s="));
        assert!(matches!(Endpoints::parse("https://collector:4318"), Err(OtlpError::Https(_))));
        assert!(matches!(Endpoints::parse("grpc://collector:4317"), Err(OtlpError::Scheme(_))));
        assert!(matches!(Endpoints::parse("collector:4318"), Err(OtlpError::Url { .. }) | Err(OtlpError::Scheme(_))));
    }

    /// A full queue drops at once (counted), and shutdown against an endpoint that never answers
    /// gives up at its deadline, counting what it could not send.
    #[tokio::test]
    async fn a_full_queue_drops_without_waiting_and_shutdown_is_bounded() {
        // Listening but never accepting: connections sit in the backlog, requests never answered.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = OtlpConfig { queue: 2, batch: 1, ..OtlpConfig::new(format!("http://{}", hole.local_addr().unwrap())) };
        let upstream = crate::Upstream::parse("http://127.0.0.1:9").unwrap();
        let exporter = OtlpExporter::start(&config, &upstream, "test:1".into(), &tokio::runtime::Handle::current()).unwrap();
        let (sink, shared) = (exporter.sink(), exporter.sink.shared.clone());
        let started = Instant::now();
        for _ in 0..50 {
            sink.offer(TurnSummary::sample());
        }
        assert!(started.elapsed() < Duration::from_millis(50), "offering blocked: {:?}", started.elapsed());
        assert_eq!(shared.stats().spans_dropped, 48, "two queued, the rest dropped");
        drop(sink);
        let stopping = Instant::now();
        assert!(!exporter.shutdown(Duration::from_millis(300)).await, "nothing could have been exported");
        assert!(stopping.elapsed() < Duration::from_secs(2), "shutdown took {:?}", stopping.elapsed());
        let stats = shared.stats();
        assert_eq!((stats.spans_exported, stats.spans_dropped), (0, 50), "every span accounted for");
    }
}
