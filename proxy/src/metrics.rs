//! Every metric the proxy emits, in one catalogue, with low-cardinality labels only (endpoint kind,
//! status code, drop reason): never a prompt, a path or a request id.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS_TOTAL: &str = "ctxscope_requests_total";
pub const PROMPT_TOKENS: &str = "ctxscope_prompt_tokens";
pub const CACHED_TOKENS: &str = "ctxscope_cached_tokens";
pub const CAPTURE_DROPPED_TOTAL: &str = "ctxscope_capture_dropped_total";
pub const PROXY_OVERHEAD_SECONDS: &str = "ctxscope_proxy_overhead_seconds";
pub const UPSTREAM_ERRORS_TOTAL: &str = "ctxscope_upstream_errors_total";
pub const SLOW_BODIES_TOTAL: &str = "ctxscope_slow_request_bodies_total";
pub const TURNS_CAPTURED_TOTAL: &str = "ctxscope_turns_captured_total";
pub const CAPTURE_QUEUE_DEPTH: &str = "ctxscope_capture_queue_depth";
pub const CAPTURE_SECONDS: &str = "ctxscope_capture_seconds";
pub const TTFB_SECONDS: &str = "ctxscope_upstream_ttfb_seconds";
pub const FINDINGS_TOTAL: &str = "ctxscope_findings_total";
pub const DETECT_SECONDS: &str = "ctxscope_detect_seconds";
pub const UPSTREAM_PROMPT_TOKENS_TOTAL: &str = "ctxscope_upstream_prompt_tokens_total";
pub const UPSTREAM_CACHED_TOKENS_TOTAL: &str = "ctxscope_upstream_cached_tokens_total";
pub const UPSTREAM_LOCAL_PROMPT_TOKENS_TOTAL: &str = "ctxscope_upstream_local_prompt_tokens_total";
pub const UPSTREAM_LAST_PROMPT_TOKENS: &str = "ctxscope_upstream_last_prompt_tokens";
pub const UPSTREAM_MAX_PROMPT_TOKENS: &str = "ctxscope_upstream_max_prompt_tokens";
pub const UPSTREAM_TOKEN_RATIO: &str = "ctxscope_upstream_token_ratio";
pub const UPSTREAM_CACHE_REPORTED: &str = "ctxscope_upstream_cache_reported";
pub const ALERTS_SENT_TOTAL: &str = "ctxscope_alerts_sent_total";
pub const ALERTS_DROPPED_TOTAL: &str = "ctxscope_alerts_dropped_total";
pub const UPSTREAM_COUNT_FAILURES_TOTAL: &str = "ctxscope_upstream_count_failures_total";
pub const UPSTREAM_COUNT_SECONDS: &str = "ctxscope_upstream_count_seconds";
pub const STORE_DAMAGE_TOTAL: &str = "ctxscope_store_damage_total";
pub const STORE_REOPENS_TOTAL: &str = "ctxscope_store_reopens_total";
pub const OTLP_EXPORTED_TOTAL: &str = "ctxscope_otlp_exported_total";
pub const OTLP_DROPPED_TOTAL: &str = "ctxscope_otlp_dropped_total";
pub const OTLP_EXPORT_SECONDS: &str = "ctxscope_otlp_export_seconds";
pub const HISTORY_EDITS_TOTAL: &str = "ctxscope_history_edits_total";
pub const CONTEXT_PRESSURE: &str = "ctxscope_context_pressure";

/// Every metric name above, for checks that dashboards and alert rules only use real ones.
pub const ALL: [&str; 31] = [
    REQUESTS_TOTAL,
    SLOW_BODIES_TOTAL,
    PROMPT_TOKENS,
    CACHED_TOKENS,
    CAPTURE_DROPPED_TOTAL,
    PROXY_OVERHEAD_SECONDS,
    UPSTREAM_ERRORS_TOTAL,
    TURNS_CAPTURED_TOTAL,
    CAPTURE_QUEUE_DEPTH,
    CAPTURE_SECONDS,
    TTFB_SECONDS,
    FINDINGS_TOTAL,
    DETECT_SECONDS,
    UPSTREAM_PROMPT_TOKENS_TOTAL,
    UPSTREAM_CACHED_TOKENS_TOTAL,
    UPSTREAM_LOCAL_PROMPT_TOKENS_TOTAL,
    UPSTREAM_LAST_PROMPT_TOKENS,
    UPSTREAM_MAX_PROMPT_TOKENS,
    UPSTREAM_TOKEN_RATIO,
    UPSTREAM_CACHE_REPORTED,
    ALERTS_SENT_TOTAL,
    ALERTS_DROPPED_TOTAL,
    UPSTREAM_COUNT_FAILURES_TOTAL,
    UPSTREAM_COUNT_SECONDS,
    STORE_DAMAGE_TOTAL,
    STORE_REOPENS_TOTAL,
    OTLP_EXPORTED_TOTAL,
    OTLP_DROPPED_TOTAL,
    OTLP_EXPORT_SECONDS,
    HISTORY_EDITS_TOTAL,
    CONTEXT_PRESSURE,
];

/// Why a capture was dropped (the `reason` label of `ctxscope_capture_dropped_total`).
#[derive(Debug, Clone, Copy)]
pub enum DropReason {
    QueueFull,
    StoreUnavailable,
    StoreWrite,
    BodyTooLarge,
    Parse,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::StoreUnavailable => "store_unavailable",
            DropReason::StoreWrite => "store_write",
            DropReason::BodyTooLarge => "body_too_large",
            DropReason::Parse => "parse",
        }
    }
}

pub fn dropped(reason: DropReason) {
    metrics::counter!(CAPTURE_DROPPED_TOTAL, "reason" => reason.as_str()).increment(1);
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let tokens = [16.0, 64.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];
            let seconds = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(PROMPT_TOKENS.into()), &tokens)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(CACHED_TOKENS.into()), &tokens))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds))
                .expect("static bucket lists are non-empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (embedding program); then ours only renders zeros.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            register_findings();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(REQUESTS_TOTAL, "Requests through the proxy by endpoint kind and status.");
    metrics::describe_histogram!(PROMPT_TOKENS, "Prompt tokens per captured request (engine-reported, else local).");
    metrics::describe_histogram!(CACHED_TOKENS, "Engine-reported cached prompt tokens per captured request.");
    metrics::describe_counter!(CAPTURE_DROPPED_TOTAL, "Exchanges not captured, by reason; traffic still flowed.");
    metrics::describe_counter!(STORE_DAMAGE_TOTAL, "Damage found in the capture store (records lost from its log).");
    metrics::describe_counter!(STORE_REOPENS_TOTAL, "Times the capture store was reopened after sled failed to write (a full disk).");
    metrics::describe_histogram!(PROXY_OVERHEAD_SECONDS, "Time spent in the proxy itself before and after the upstream.");
    metrics::describe_counter!(UPSTREAM_ERRORS_TOTAL, "Upstream connection failures answered with 502.");
    metrics::describe_counter!(SLOW_BODIES_TOTAL, "Requests answered 408: the body arrived too slowly (--body-timeout, --body-min-rate).");
    metrics::describe_counter!(TURNS_CAPTURED_TOTAL, "Turns written to the store.");
    metrics::describe_gauge!(CAPTURE_QUEUE_DEPTH, "Exchanges waiting in the capture queue.");
    metrics::describe_histogram!(CAPTURE_SECONDS, "Capture pipeline time per exchange (parse, thread, count, store).");
    metrics::describe_histogram!(TTFB_SECONDS, "Upstream time to first response byte for captured requests.");
    metrics::describe_counter!(FINDINGS_TOTAL, "Findings raised by the detectors, by kind and severity (once per cause).");
    metrics::describe_counter!(
        HISTORY_EDITS_TOTAL,
        "Turns whose harness edited the history, by cause (compaction, windowed, pruned, rewritten, truncated_in_place, media_stripped, reasoning_dropped); every turn, not once per conversation."
    );
    metrics::describe_histogram!(DETECT_SECONDS, "Detector time per captured turn (on the capture worker, off the request path).");
    metrics::describe_counter!(UPSTREAM_PROMPT_TOKENS_TOTAL, "Prompt tokens the upstream reported, summed.");
    metrics::describe_counter!(UPSTREAM_CACHED_TOKENS_TOTAL, "Cached prompt tokens the upstream reported, summed.");
    metrics::describe_counter!(
        UPSTREAM_LOCAL_PROMPT_TOKENS_TOTAL,
        "Prompt tokens counted locally (tokenizer and template), summed over turns the upstream also counted."
    );
    metrics::describe_gauge!(UPSTREAM_LAST_PROMPT_TOKENS, "Prompt tokens the upstream reported for the latest captured turn.");
    metrics::describe_gauge!(UPSTREAM_MAX_PROMPT_TOKENS, "Largest prompt the upstream has reported processing.");
    metrics::describe_gauge!(
        UPSTREAM_TOKEN_RATIO,
        "Median engine/local prompt token ratio over recent turns (1 when the configured tokenizer matches)."
    );
    metrics::describe_gauge!(UPSTREAM_CACHE_REPORTED, "1 once the upstream has reported a prefix-cache hit, else 0.");
    metrics::describe_counter!(ALERTS_SENT_TOTAL, "Alert deliveries to sinks, by sink and outcome.");
    metrics::describe_counter!(
        UPSTREAM_COUNT_FAILURES_TOTAL,
        "Prompts the upstream was asked to count (--count-with upstream) that stayed uncounted, by reason; traffic unaffected."
    );
    metrics::describe_histogram!(
        UPSTREAM_COUNT_SECONDS,
        "Time to count one prompt through the upstream's endpoints (on the capture worker)."
    );
    metrics::describe_counter!(ALERTS_DROPPED_TOTAL, "Alerts not delivered, by reason (deduplicated, rate_limited, queue_full, failed).");
    metrics::describe_counter!(
        OTLP_EXPORTED_TOTAL,
        "Spans (one per turn) and log records (one per finding) accepted by the OTLP endpoint."
    );
    metrics::describe_counter!(
        OTLP_DROPPED_TOTAL,
        "Spans and log records not exported over OTLP, by signal and reason (queue_full, export_failed, shutdown); traffic unaffected."
    );
    metrics::describe_gauge!(
        CONTEXT_PRESSURE,
        "The latest captured turn's prompt tokens over its context limit (the engine's, or --context-limit); only when the limit is known."
    );
    metrics::describe_histogram!(OTLP_EXPORT_SECONDS, "Time to post one OTLP batch (off the capture worker and the request path).");
}

/// Creates every findings series at zero so that rate() and increase() see the first finding.
pub fn register_findings() {
    use ctxscope_store::{FindingKind, Severity};
    for kind in FindingKind::ALL {
        for severity in Severity::ALL {
            metrics::counter!(FINDINGS_TOTAL, "kind" => kind.as_str(), "severity" => severity.as_str()).absolute(0);
        }
    }
}

/// Counts one request by endpoint kind and status (both from fixed sets).
pub fn requests(endpoint: &'static str, status: http::StatusCode) {
    metrics::counter!(REQUESTS_TOTAL, "endpoint" => endpoint, "status" => status_label(status)).increment(1);
}

fn status_label(status: http::StatusCode) -> &'static str {
    // StatusCode::as_str borrows; map to the static table hyper keeps for canonical codes.
    match status.as_u16() {
        200 => "200",
        201 => "201",
        204 => "204",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        408 => "408",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 300 => "2xx",
        s if s < 400 => "3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

/// Time the proxy spent on a request outside the upstream's own time.
pub fn overhead(spent: std::time::Duration) {
    metrics::histogram!(PROXY_OVERHEAD_SECONDS).record(spent.as_secs_f64());
}
