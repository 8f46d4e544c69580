//! The export task: takes turn summaries off the bounded queue, gathers them into batches (up to
//! `batch` turns, or whatever arrived within `interval` of the first), maps each batch to spans and
//! log records and posts it once (the OTLP exporter retries within its timeout). Every span and
//! record ends counted, exported or dropped. When asked to flush it posts as soon as the queue is
//! empty; when every sender is gone it posts what it holds and ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::logs::{Logger as _, LoggerProvider as _};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanExporter as _};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::span::{finding_log, span, Origin};
use super::summary::TurnSummary;
use super::{Lost, OtlpConfig, Shared, LOGS, TRACES};
use crate::metrics::OTLP_EXPORT_SECONDS;

/// At most one export-failure warning per this long; the rest are counted.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Maps and posts batches; owned by the export task.
pub struct Batcher {
    spans: opentelemetry_otlp::SpanExporter,
    logs: Option<opentelemetry_otlp::LogExporter>,
    /// Makes the SDK's log records (their constructor is the logger's); it has no processor.
    logger: SdkLogger,
    _provider: SdkLoggerProvider,
    origin: Origin,
    scope: InstrumentationScope,
    ids: RandomIdGenerator,
    batch: usize,
    interval: Duration,
    shared: Arc<Shared>,
    warned: Option<Instant>,
}

impl Batcher {
    pub fn new(
        spans: opentelemetry_otlp::SpanExporter,
        logs: Option<opentelemetry_otlp::LogExporter>,
        origin: Origin,
        config: &OtlpConfig,
        shared: Arc<Shared>,
    ) -> Batcher {
        let provider = SdkLoggerProvider::builder().build();
        let scope = InstrumentationScope::builder("ctxscope").with_version(env!("CARGO_PKG_VERSION")).build();
        Batcher {
            spans,
            logs,
            logger: provider.logger_with_scope(scope.clone()),
            _provider: provider,
            origin,
            scope,
            ids: RandomIdGenerator::default(),
            batch: config.batch,
            interval: config.interval,
            shared,
            warned: None,
        }
    }

    /// Posts one batch: its spans, then its findings' log records.
    async fn export(&mut self, turns: Vec<TurnSummary>) {
        if turns.is_empty() {
            return;
        }
        let ids: Vec<(TraceId, SpanId)> = turns.iter().map(|_| (self.ids.new_trace_id(), self.ids.new_span_id())).collect();
        // Mapping parses request bodies with --otlp-content: off the runtime's worker threads, which
        // also serve the proxied traffic.
        let findings = if self.logs.is_some() { turns.iter().map(|t| t.findings.len() as u64).sum() } else { 0 };
        let (origin, scope, span_ids) = (self.origin.clone(), self.scope.clone(), ids.clone());
        let mapped = tokio::task::spawn_blocking(move || {
            let spans: Vec<_> = turns.iter().zip(&span_ids).map(|(turn, ids)| span(turn, &origin, *ids, &scope)).collect();
            (turns, spans)
        })
        .await;
        let (turns, spans) = match mapped {
            Ok(mapped) => mapped,
            Err(error) => {
                // The mapping panicked: the batch is lost; say so and count it.
                tracing::error!(%error, "OTLP span mapping failed");
                self.shared.dropped(TRACES, Lost::ExportFailed, ids.len() as u64);
                self.shared.settled.fetch_add(ids.len() as u64, Ordering::Release);
                self.shared.dropped(LOGS, Lost::ExportFailed, findings);
                self.shared.logs_settled.fetch_add(findings, Ordering::Release);
                return;
            }
        };
        let started = Instant::now();
        let result = self.spans.export(spans).await;
        metrics::histogram!(OTLP_EXPORT_SECONDS, "signal" => TRACES).record(started.elapsed().as_secs_f64());
        self.settle(TRACES, turns.len() as u64, result);
        self.shared.settled.fetch_add(turns.len() as u64, Ordering::Release);

        let Some(logs) = &self.logs else { return };
        let mut records = Vec::new();
        for (turn, ids) in turns.iter().zip(&ids) {
            for finding in &turn.findings {
                let mut record: SdkLogRecord = self.logger.create_log_record();
                finding_log(&mut record, turn, finding, *ids);
                records.push(record);
            }
        }
        if records.is_empty() {
            return;
        }
        let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> = records.iter().map(|r| (r, &self.scope)).collect();
        let started = Instant::now();
        let result = logs.export(LogBatch::new(&pairs)).await;
        metrics::histogram!(OTLP_EXPORT_SECONDS, "signal" => LOGS).record(started.elapsed().as_secs_f64());
        let n = records.len() as u64;
        self.settle(LOGS, n, result);
        self.shared.logs_settled.fetch_add(n, Ordering::Release);
    }

    fn settle(&mut self, signal: &'static str, n: u64, result: opentelemetry_sdk::error::OTelSdkResult) {
        match result {
            Ok(()) => self.shared.exported(signal, n),
            Err(error) => {
                self.shared.dropped(signal, Lost::ExportFailed, n);
                if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    self.warned = Some(Instant::now());
                    tracing::warn!(signal, dropped = n, %error, "OTLP export failed; traffic and capture unaffected");
                }
            }
        }
    }
}

/// Runs until every sender is dropped and what was queued is posted.
pub async fn run(mut rx: mpsc::Receiver<TurnSummary>, mut batcher: Batcher, flush: Arc<Notify>) {
    let mut pending = Vec::new();
    let mut due = Instant::now();
    let mut flushing = false;
    loop {
        tokio::select! {
            biased;
            turn = rx.recv() => match turn {
                Some(turn) => {
                    if pending.is_empty() {
                        due = Instant::now() + batcher.interval;
                    }
                    pending.push(turn);
                    // Post a full batch; while flushing, post whenever the queue runs dry.
                    let full = pending.len() >= batcher.batch;
                    let dry = flushing && rx.is_empty();
                    if !full && !dry {
                        continue;
                    }
                }
                None => {
                    batcher.export(std::mem::take(&mut pending)).await;
                    return;
                }
            },
            () = flush.notified() => flushing = true,
            () = tokio::time::sleep_until(due), if !pending.is_empty() => {}
        }
        batcher.export(std::mem::take(&mut pending)).await;
    }
}
