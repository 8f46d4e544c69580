//! The open-loop load generator. A scheduler thread issues requests at fixed intervals from the start
//! time, whatever the responses do; latency is measured from each request's SCHEDULED send time, so a
//! stall shows up in every request it delays (no coordinated omission). A pool of pre-connected
//! keep-alive connections, each driven by its own task, takes the requests; a request scheduled while
//! no connection was idle, or sent more than [`LATE`] after its time, is counted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, Mutex};

use crate::client::{self, Sender};
use crate::error::BenchError;
use crate::stats::Percentiles;
use crate::upstream::{Emissions, STREAM_EVENTS};

/// A request sent this long after its scheduled time counts as late.
pub const LATE: Duration = Duration::from_millis(1);

/// Request ids are unique across pools: the upstream files stream emissions under them.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// A small non-streaming chat request.
    Small,
    /// A streamed chat request answered with `STREAM_EVENTS` paced events.
    Stream,
}

struct Job {
    id: u64,
    scheduled: Instant,
    results: mpsc::UnboundedSender<Sample>,
}

/// One request's timeline.
pub struct Sample {
    pub scheduled: Instant,
    pub sent: Option<Instant>,
    pub done: Instant,
    pub ok: bool,
    pub first_chunk: Option<Instant>,
    pub last_chunk: Option<Instant>,
    /// Streams: arrival minus emission of each event, in ns.
    pub chunk_delays_ns: Vec<u64>,
}

/// One constant-rate run.
pub struct Run {
    pub samples: Vec<Sample>,
    pub scheduled: usize,
    pub exhausted: usize,
    pub start: Instant,
}

/// Keep-alive connections to one target, each served by a task taking jobs from a shared queue.
pub struct Pool {
    jobs: mpsc::UnboundedSender<Job>,
    idle: Arc<AtomicUsize>,
}

impl Pool {
    pub async fn new(addr: SocketAddr, connections: usize, kind: Kind, emissions: Arc<Emissions>) -> Result<Pool, BenchError> {
        let (jobs, queue) = mpsc::unbounded_channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let idle = Arc::new(AtomicUsize::new(0));
        for _ in 0..connections {
            let sender = client::connect(addr).await?;
            let (queue, idle, emissions) = (queue.clone(), idle.clone(), emissions.clone());
            tokio::spawn(worker(addr, kind, sender, queue, idle, emissions));
        }
        Ok(Pool { jobs, idle })
    }

    /// Sends `rate` requests a second for `duration` and waits for every response (or a deadline).
    pub async fn run(&self, rate: f64, duration: Duration) -> Result<Run, BenchError> {
        let count = (rate * duration.as_secs_f64()).round() as u64;
        let first = NEXT_ID.fetch_add(count, Ordering::Relaxed);
        let (results, mut received) = mpsc::unbounded_channel();
        let (jobs, idle) = (self.jobs.clone(), self.idle.clone());
        let (start, exhausted) = tokio::task::spawn_blocking(move || schedule(jobs, results, rate, count, first, idle))
            .await
            .map_err(|e| BenchError::Setup(format!("scheduler thread failed: {e}")))?;
        let mut samples = Vec::with_capacity(count as usize);
        // Every job holds a results sender: the channel closes when the last response is in.
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(sample) = received.recv().await {
                samples.push(sample);
            }
        })
        .await;
        Ok(Run { samples, scheduled: count as usize, exhausted, start })
    }
}

/// The scheduler: fixed intervals from `start`, slept on a real thread (no async timer wheel).
fn schedule(
    jobs: mpsc::UnboundedSender<Job>,
    results: mpsc::UnboundedSender<Sample>,
    rate: f64,
    count: u64,
    first: u64,
    idle: Arc<AtomicUsize>,
) -> (Instant, usize) {
    let start = Instant::now() + Duration::from_millis(2);
    let mut exhausted = 0;
    for i in 0..count {
        let at = start + Duration::from_nanos((i as f64 * 1e9 / rate) as u64);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        if idle.load(Ordering::Relaxed) == 0 {
            exhausted += 1;
        }
        if jobs.send(Job { id: first + i, scheduled: at, results: results.clone() }).is_err() {
            break;
        }
    }
    (start, exhausted)
}

async fn worker(
    addr: SocketAddr,
    kind: Kind,
    sender: Sender,
    queue: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    idle: Arc<AtomicUsize>,
    emissions: Arc<Emissions>,
) {
    let mut sender = Some(sender);
    loop {
        idle.fetch_add(1, Ordering::Relaxed);
        let job = queue.lock().await.recv().await;
        idle.fetch_sub(1, Ordering::Relaxed);
        let Some(job) = job else { return };
        let sample = one(addr, kind, &mut sender, &job, &emissions).await;
        let _ = job.results.send(sample);
    }
}

fn request_body(kind: Kind, id: u64) -> Bytes {
    Bytes::from(match kind {
        Kind::Small => format!(r#"{{"model":"bench","messages":[{{"role":"user","content":"hello {id}"}}],"max_tokens":16}}"#),
        Kind::Stream => format!(r#"{{"model":"bench","messages":[{{"role":"user","content":"stream {id}"}}],"stream":true}}"#),
    })
}

/// Sends one request and times it; a failed connection is replaced on the next job.
async fn one(addr: SocketAddr, kind: Kind, sender: &mut Option<Sender>, job: &Job, emissions: &Emissions) -> Sample {
    let mut sample = Sample {
        scheduled: job.scheduled,
        sent: None,
        done: job.scheduled,
        ok: false,
        first_chunk: None,
        last_chunk: None,
        chunk_delays_ns: Vec::new(),
    };
    let usable = matches!(sender, Some(s) if !s.is_closed());
    if !usable {
        *sender = client::connect(addr).await.ok();
    }
    let Some(conn) = sender.as_mut() else {
        sample.done = Instant::now();
        return sample;
    };
    let request = client::post(addr, request_body(kind, job.id), &[("x-bench-id", job.id.to_string())]);
    if conn.ready().await.is_err() {
        *sender = None;
        sample.done = Instant::now();
        return sample;
    }
    sample.sent = Some(Instant::now());
    let response = match conn.send_request(request).await {
        Ok(response) => response,
        Err(_) => {
            *sender = None;
            sample.done = Instant::now();
            return sample;
        }
    };
    let status_ok = response.status() == http::StatusCode::OK;
    let mut body = response.into_body();
    let mut arrivals = Vec::with_capacity(if kind == Kind::Stream { STREAM_EVENTS } else { 0 });
    let mut previous_newline = false;
    let mut body_ok = true;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            body_ok = false;
            break;
        };
        let (Kind::Stream, Some(data)) = (kind, frame.data_ref()) else { continue };
        let now = Instant::now();
        for &byte in data.iter() {
            let newline = byte == b'\n';
            if newline && previous_newline {
                arrivals.push(now);
            }
            previous_newline = newline;
        }
    }
    sample.done = Instant::now();
    sample.ok = status_ok && body_ok;
    if kind == Kind::Stream {
        let emitted = emissions.take(job.id).unwrap_or_default();
        sample.ok &= arrivals.len() == STREAM_EVENTS && emitted.len() == STREAM_EVENTS;
        sample.first_chunk = arrivals.first().copied();
        sample.last_chunk = arrivals.last().copied();
        sample.chunk_delays_ns =
            arrivals.iter().zip(&emitted).map(|(arrived, sent)| arrived.saturating_duration_since(*sent).as_nanos() as u64).collect();
    }
    if !body_ok {
        *sender = None;
    }
    sample
}

/// What several runs of one target add up to.
pub struct Summary {
    pub scheduled: usize,
    pub errors: usize,
    pub achieved: f64,
    /// From scheduled send time to the last response byte.
    pub latency: Percentiles,
    /// Actual send time minus scheduled send time: the generator's own delay.
    pub lag: Percentiles,
    pub late: usize,
    pub exhausted: usize,
    /// Streams: first event's arrival minus the scheduled send time.
    pub ttfb: Percentiles,
    /// Streams: each event's arrival minus its emission at the upstream.
    pub chunk: Percentiles,
    /// Streams: last event's arrival minus the first's.
    pub span: Percentiles,
}

impl Summary {
    pub fn of(runs: &[Run]) -> Summary {
        let samples = || runs.iter().flat_map(|r| r.samples.iter());
        let ns = |d: Duration| d.as_nanos() as u64;
        let scheduled = runs.iter().map(|r| r.scheduled).sum();
        let ok = samples().filter(|s| s.ok).count();
        let window: f64 =
            runs.iter().filter_map(|r| r.samples.iter().map(|s| s.done).max().map(|end| end.duration_since(r.start).as_secs_f64())).sum();
        let lags: Vec<u64> = samples().filter_map(|s| s.sent.map(|t| ns(t.saturating_duration_since(s.scheduled)))).collect();
        let ok_samples = || samples().filter(|s| s.ok);
        let chunks: Vec<u64> = ok_samples().flat_map(|s| s.chunk_delays_ns.iter().copied()).collect();
        Summary {
            scheduled,
            errors: scheduled - ok,
            achieved: if window > 0.0 { ok as f64 / window } else { 0.0 },
            latency: Percentiles::of(&ok_samples().map(|s| ns(s.done.saturating_duration_since(s.scheduled))).collect::<Vec<_>>()),
            late: lags.iter().filter(|&&lag| lag > ns(LATE)).count(),
            lag: Percentiles::of(&lags),
            exhausted: runs.iter().map(|r| r.exhausted).sum(),
            ttfb: Percentiles::of(
                &ok_samples().filter_map(|s| s.first_chunk.map(|t| ns(t.saturating_duration_since(s.scheduled)))).collect::<Vec<_>>(),
            ),
            chunk: Percentiles::of(&chunks),
            span: Percentiles::of(
                &ok_samples().filter_map(|s| Some(ns(s.last_chunk?.saturating_duration_since(s.first_chunk?)))).collect::<Vec<_>>(),
            ),
        }
    }
}
