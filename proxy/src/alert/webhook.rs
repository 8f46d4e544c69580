//! Posts findings to an HTTP webhook, as plain JSON or as Alertmanager alerts. `send` only queues (a
//! bounded channel, `try_send`); a task on the runtime deduplicates by cause, applies a token-bucket
//! rate limit and posts with bounded concurrency, retries and a per-attempt timeout, so a dead or slow
//! webhook costs the capture worker nothing. Every delivery and every drop is counted.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_store::FindingRecord;
use http::{header, HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::{watch, Semaphore};

use super::gate::{Gate, Refused};
use super::payload::render;
pub use super::payload::WebhookFormat;
use super::AlertSink;
use crate::forward::describe_error;
use crate::metrics::{ALERTS_DROPPED_TOTAL, ALERTS_SENT_TOTAL};

/// First retry delay; doubled per attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The longest `Retry-After` honoured; a webhook asking for more waits this long.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);
/// Response bodies are read (so the connection can be reused) up to this size, then ignored.
const MAX_RESPONSE_BYTES: usize = 64 << 10;
const USER_AGENT: &str = concat!("ctxscope/", env!("CARGO_PKG_VERSION"));

impl FromStr for WebhookFormat {
    type Err = WebhookError;

    fn from_str(text: &str) -> Result<WebhookFormat, WebhookError> {
        match text {
            "json" => Ok(WebhookFormat::Json),
            "alertmanager" => Ok(WebhookFormat::Alertmanager),
            _ => Err(WebhookError::Format(text.into())),
        }
    }
}

/// Where and how findings are posted; [`WebhookConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// `http://host[:port][/path]`.
    pub url: String,
    pub format: WebhookFormat,
    /// Concurrent posts at most.
    pub max_in_flight: usize,
    /// Findings waiting to be posted; beyond this `send` drops (reason `queue_full`).
    pub queue: usize,
    /// Retries after the first attempt (connection errors, timeouts, 408, 429 and 5xx only).
    pub retries: u32,
    /// Per attempt: connect, request and response together.
    pub timeout: Duration,
    /// The same `cause` is posted at most once per window; zero disables deduplication.
    pub dedupe_window: Duration,
    /// Token bucket over all findings: this many at once, refilled at this rate per minute.
    pub max_per_minute: u32,
}

impl WebhookConfig {
    /// JSON format, 4 in flight, 1024 queued, 3 retries, 5 s per attempt, 10 min dedupe, 60 per minute.
    pub fn new(url: impl Into<String>) -> WebhookConfig {
        WebhookConfig {
            url: url.into(),
            format: WebhookFormat::Json,
            max_in_flight: 4,
            queue: 1024,
            retries: 3,
            timeout: Duration::from_secs(5),
            dedupe_window: Duration::from_secs(600),
            max_per_minute: 60,
        }
    }

    /// Checks the URL and the bounds; [`WebhookSink::start`] calls this too.
    pub fn validate(&self) -> Result<(), WebhookError> {
        self.target().map(|_| ())
    }

    fn target(&self) -> Result<Uri, WebhookError> {
        for (name, value) in
            [("max_in_flight", self.max_in_flight), ("queue", self.queue), ("max_per_minute", self.max_per_minute as usize)]
        {
            if value == 0 {
                return Err(WebhookError::Zero(name));
            }
        }
        parse_url(&self.url)
    }
}

fn parse_url(url: &str) -> Result<Uri, WebhookError> {
    let invalid = |reason: &str| WebhookError::Url { url: url.into(), reason: reason.into() };
    let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(WebhookError::Https(url.into())),
        Some(_) => return Err(WebhookError::Scheme(url.into())),
        None => return Err(invalid("missing http://")),
    }
    if uri.host().filter(|host| !host.is_empty()).is_none() {
        return Err(invalid("missing host"));
    }
    Ok(uri)
}

/// Why a webhook sink cannot be configured or started.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("--alert-webhook {url:?} is not a URL like http://127.0.0.1:9093/api/v2/alerts: {reason}")]
    Url { url: String, reason: String },
    #[error("--alert-webhook {0:?}: https:// is not supported (ctxscope's HTTP client speaks plain HTTP only); post to an http:// endpoint, e.g. a local Alertmanager or a TLS-terminating relay")]
    Https(String),
    #[error("--alert-webhook {0:?}: only http:// URLs are supported")]
    Scheme(String),
    #[error("--alert-webhook-format {0:?} is not a format; use json or alertmanager")]
    Format(String),
    #[error("webhook {0} must be at least 1")]
    Zero(&'static str),
}

/// Deliveries and drops of one sink since it started (the same events go to the metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookStats {
    pub delivered: u64,
    /// Given up after the retries (also counted as dropped, reason `failed`).
    pub failed: u64,
    pub deduplicated: u64,
    pub rate_limited: u64,
    pub queue_full: u64,
}

/// Queues findings for the webhook; cheap to clone (every clone feeds the same queue).
#[derive(Clone)]
pub struct WebhookSink {
    tx: mpsc::Sender<FindingRecord>,
    shared: Arc<Shared>,
}

impl WebhookSink {
    /// Validates `config` and starts the delivery task on `runtime`. The task ends once every clone
    /// of the sink is dropped and the queue is empty; posts already started run to completion.
    pub fn start(config: WebhookConfig, runtime: tokio::runtime::Handle) -> Result<WebhookSink, WebhookError> {
        let uri = config.target()?;
        register_series();
        let (tx, rx) = mpsc::channel(config.queue);
        let shared = Arc::new(Shared::new());
        let gate = Gate::new(config.dedupe_window, config.max_per_minute, Instant::now());
        let poster = Arc::new(Poster::new(uri, &config));
        tracing::info!(webhook = %poster.host, format = ?config.format, "posting findings to a webhook");
        runtime.spawn(deliver(rx, gate, poster, shared.clone(), config.max_in_flight));
        Ok(WebhookSink { tx, shared })
    }

    pub fn stats(&self) -> WebhookStats {
        self.shared.counters.snapshot()
    }

    /// Waits (best effort, up to `timeout`) until as many findings have been posted or dropped as had
    /// been queued when it was called; true when they were. Needs the sink's runtime to keep running:
    /// call it from async code on shutdown, after the capture worker (the caller of `send`) is joined.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let target = self.shared.accepted.load(Ordering::Acquire);
        let mut finished = self.shared.finished.subscribe();
        let reached = tokio::time::timeout(timeout, finished.wait_for(|&done| done >= target)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

impl AlertSink for WebhookSink {
    fn send(&self, finding: &FindingRecord) {
        match self.tx.try_send(finding.clone()) {
            Ok(()) => {
                self.shared.accepted.fetch_add(1, Ordering::Release);
            }
            Err(TrySendError::Full(_)) => self.shared.counters.count(Outcome::QueueFull),
            // The delivery task is gone (its runtime shut down).
            Err(TrySendError::Closed(_)) => self.shared.counters.count(Outcome::Failed),
        }
    }
}

/// What became of one finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Delivered,
    Failed,
    Deduplicated,
    RateLimited,
    QueueFull,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    failed: AtomicU64,
    deduplicated: AtomicU64,
    rate_limited: AtomicU64,
    queue_full: AtomicU64,
}

impl Counters {
    fn count(&self, outcome: Outcome) {
        let (counter, dropped) = match outcome {
            Outcome::Delivered => (&self.delivered, None),
            Outcome::Failed => (&self.failed, Some("failed")),
            Outcome::Deduplicated => (&self.deduplicated, Some("deduplicated")),
            Outcome::RateLimited => (&self.rate_limited, Some("rate_limited")),
            Outcome::QueueFull => (&self.queue_full, Some("queue_full")),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Delivered => metrics::counter!(ALERTS_SENT_TOTAL, "sink" => "webhook", "outcome" => "ok").increment(1),
            Outcome::Failed => metrics::counter!(ALERTS_SENT_TOTAL, "sink" => "webhook", "outcome" => "failed").increment(1),
            _ => {}
        }
        if let Some(reason) = dropped {
            metrics::counter!(ALERTS_DROPPED_TOTAL, "reason" => reason).increment(1);
        }
    }

    fn snapshot(&self) -> WebhookStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WebhookStats {
            delivered: load(&self.delivered),
            failed: load(&self.failed),
            deduplicated: load(&self.deduplicated),
            rate_limited: load(&self.rate_limited),
            queue_full: load(&self.queue_full),
        }
    }
}

/// Creates the webhook series at zero so that rate() sees the first alert (never resets them).
fn register_series() {
    for outcome in ["ok", "failed"] {
        metrics::counter!(ALERTS_SENT_TOTAL, "sink" => "webhook", "outcome" => outcome).increment(0);
    }
    for reason in ["deduplicated", "rate_limited", "queue_full", "failed"] {
        metrics::counter!(ALERTS_DROPPED_TOTAL, "reason" => reason).increment(0);
    }
}

/// State the sink's clones share with the delivery task.
struct Shared {
    counters: Counters,
    /// Findings that entered the queue.
    accepted: AtomicU64,
    /// Findings the task is done with (posted, failed or gated), for `flush`.
    finished: watch::Sender<u64>,
}

impl Shared {
    fn new() -> Shared {
        Shared { counters: Counters::default(), accepted: AtomicU64::new(0), finished: watch::Sender::new(0) }
    }

    fn finish(&self, outcome: Outcome) {
        self.counters.count(outcome);
        self.finished.send_modify(|done| *done += 1);
    }
}

/// Receives until every sender is gone: gates each finding, then posts it under an in-flight permit.
/// Waiting for a permit stalls the queue, so a slow webhook fills it and `send` starts dropping.
async fn deliver(mut rx: mpsc::Receiver<FindingRecord>, mut gate: Gate, poster: Arc<Poster>, shared: Arc<Shared>, in_flight: usize) {
    let permits = Arc::new(Semaphore::new(in_flight));
    while let Some(finding) = rx.recv().await {
        if let Err(refused) = gate.admit(&finding.cause, Instant::now()) {
            let outcome = match refused {
                Refused::Deduplicated => Outcome::Deduplicated,
                Refused::RateLimited => Outcome::RateLimited,
            };
            shared.finish(outcome);
            continue;
        }
        // The semaphore is never closed, so acquiring only waits.
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (poster, shared) = (poster.clone(), shared.clone());
        tokio::spawn(async move {
            let outcome = match poster.post(&finding).await {
                Ok(()) => Outcome::Delivered,
                Err(error) => {
                    tracing::warn!(webhook = %poster.host, kind = finding.kind.as_str(), %error, "alert not delivered");
                    Outcome::Failed
                }
            };
            drop(permit);
            shared.finish(outcome);
        });
    }
}

/// Why one post failed.
#[derive(Debug, thiserror::Error)]
enum PostError {
    #[error("cannot encode the finding: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
    #[error("cannot reach the webhook: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the webhook answered {status}")]
    Status { status: StatusCode, retry_after: Option<Duration> },
}

impl PostError {
    /// Connection trouble, timeouts, 408, 429 and 5xx may pass; anything else would fail again.
    fn retryable(&self) -> bool {
        match self {
            PostError::Connect(_) | PostError::Timeout(_) => true,
            PostError::Status { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS || *status == StatusCode::REQUEST_TIMEOUT
            }
            PostError::Encode(_) | PostError::Request(_) => false,
        }
    }

    fn delay(&self, attempt: u32) -> Duration {
        match self {
            PostError::Status { retry_after: Some(after), .. } => *after,
            _ => backoff(attempt),
        }
    }
}

/// One HTTP/1 client for the webhook.
struct Poster {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    /// `host:port` for logs (the path may hold a secret token).
    host: String,
    format: WebhookFormat,
    retries: u32,
    timeout: Duration,
}

impl Poster {
    fn new(uri: Uri, config: &WebhookConfig) -> Poster {
        let client = ctxscope_http::client::client(config.timeout);
        let host = uri.authority().map_or_else(String::new, |a| a.to_string());
        Poster { client, uri, host, format: config.format, retries: config.retries, timeout: config.timeout }
    }

    /// Posts with retries: exponential backoff, or the webhook's `Retry-After` on 429 and 503.
    async fn post(&self, finding: &FindingRecord) -> Result<(), PostError> {
        let body = Bytes::from(render(self.format, finding)?);
        let mut attempt = 0;
        loop {
            let error = match self.attempt(body.clone()).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if attempt >= self.retries || !error.retryable() {
                return Err(error);
            }
            tokio::time::sleep(error.delay(attempt)).await;
            attempt += 1;
        }
    }

    async fn attempt(&self, body: Bytes) -> Result<(), PostError> {
        let request = Request::post(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .body(Full::new(body))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| PostError::Connect(describe_error(&e)))?;
            let status = response.status();
            let retry_after = retry_after(status, response.headers());
            // Read (bounded) for connection reuse; the content does not matter.
            let _ = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(PostError::Status { status, retry_after })
            }
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| PostError::Timeout(self.timeout))?
    }
}

/// `200 ms * 2^attempt`, at most [`MAX_BACKOFF`].
fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1 << attempt.min(16)).min(MAX_BACKOFF)
}

/// `Retry-After` in seconds on 429 and 503, capped; the HTTP-date form falls back to the backoff.
fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let seconds: u64 = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(RETRY_AFTER_CAP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_unknown_ones_are_named() {
        assert_eq!("json".parse::<WebhookFormat>().unwrap(), WebhookFormat::Json);
        assert_eq!("alertmanager".parse::<WebhookFormat>().unwrap(), WebhookFormat::Alertmanager);
        assert!("slack".parse::<WebhookFormat>().unwrap_err().to_string().contains("use json or alertmanager"));
    }

    #[test]
    fn validation_accepts_http_only_and_says_why() {
        assert!(WebhookConfig::new("http://127.0.0.1:9093/api/v2/alerts").validate().is_ok());
        let https = WebhookConfig::new("https://hooks.example.com/x").validate().unwrap_err();
        assert!(matches!(https, WebhookError::Https(_)) && https.to_string().contains("https:// is not supported"));
        assert!(matches!(WebhookConfig::new("ftp://host/x").validate(), Err(WebhookError::Scheme(_))));
        assert!(matches!(WebhookConfig::new("/just/a/path").validate(), Err(WebhookError::Url { .. })));
        assert!(matches!(WebhookConfig::new("not a url").validate(), Err(WebhookError::Url { .. })));
        let mut zero = WebhookConfig::new("http://h");
        zero.queue = 0;
        assert!(matches!(zero.validate(), Err(WebhookError::Zero("queue"))));
    }

    #[test]
    fn backoff_doubles_and_retry_after_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(800));
        assert_eq!(backoff(40), MAX_BACKOFF);
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(StatusCode::SERVICE_UNAVAILABLE, &headers), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(StatusCode::INTERNAL_SERVER_ERROR, &headers), None);
        headers.insert(header::RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers), Some(RETRY_AFTER_CAP));
    }
}
