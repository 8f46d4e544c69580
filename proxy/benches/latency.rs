//! The proxy's added latency against going direct, open loop: starts a paced in-process upstream and
//! the real release `ctxscope proxy` (capture on, plus a `--no-capture` one as a reference), measures
//! small requests at fixed rates, 200-event streams per chunk, and capture cost along 100-turn
//! conversations, direct vs proxied, and prints markdown tables. With `LATENCY_OTLP=1` a fourth path,
//! a capturing proxy that also exports every turn over OTLP (`--otlp-endpoint`) to an in-process
//! receiver, joins the load phases in the same run, and the conversation phase is left out.
//! Run with `scripts/bench.sh` or `cargo bench -p ctxscope-proxy --bench latency`.

#[path = "latency/client.rs"]
mod client;
#[path = "latency/conversation.rs"]
mod conversation;
#[path = "latency/error.rs"]
mod error;
#[path = "latency/load.rs"]
mod load;
#[path = "latency/machine.rs"]
mod machine;
#[path = "latency/otlp_sink.rs"]
mod otlp_sink;
#[path = "latency/proxy_proc.rs"]
mod proxy_proc;
#[path = "latency/stats.rs"]
mod stats;
#[path = "latency/upstream.rs"]
mod upstream;

use std::process::ExitCode;
use std::time::Duration;

use client::Admin;
use error::BenchError;
use load::{Kind, Pool, Run, Summary};
use proxy_proc::ProxyProcess;
use stats::{median, signed_us, us};
use upstream::{Upstream, STREAM_EVENTS, STREAM_PACING};

/// Knobs, from the environment so `scripts/bench.sh` can pass them through.
struct Plan {
    rates: Vec<f64>,
    /// Measured seconds per target and rate, split into two alternating rounds.
    seconds: f64,
    warmup: f64,
    stream_rate: f64,
    stream_seconds: f64,
    conversations: usize,
    turns: usize,
    connections: usize,
    /// `LATENCY_OTLP=1`: also measure a proxy exporting over OTLP; skip the conversation phase.
    otlp: bool,
}

impl Plan {
    fn from_env() -> Plan {
        let quick = std::env::var("LATENCY_QUICK").is_ok_and(|v| v == "1");
        let rates = std::env::var("LATENCY_RATES").ok().map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect());
        let scale = if quick { 0.2 } else { 1.0 };
        Plan {
            rates: rates.filter(|r: &Vec<f64>| !r.is_empty()).unwrap_or_else(|| vec![500.0, 2000.0, 5000.0]),
            seconds: 10.0 * scale,
            warmup: 1.0,
            stream_rate: 20.0,
            stream_seconds: 8.0 * scale,
            conversations: if quick { 1 } else { 3 },
            turns: 100,
            connections: 64,
            otlp: std::env::var("LATENCY_OTLP").is_ok_and(|v| v == "1"),
        }
    }
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("latency bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(Plan::from_env())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(plan: Plan) -> Result<(), BenchError> {
    let load_before = machine::loadavg();
    let usage = machine::Usage::start();
    let mut children_ticks = 0;
    let upstream = Upstream::start().await?;
    let bin = proxy_proc::binary();
    let proxy = ProxyProcess::start(&bin, upstream.addr, true).await?;
    let bare = ProxyProcess::start(&bin, upstream.addr, false).await?;
    eprintln!(
        "latency bench: upstream {} proxy {} (capture) {} (--no-capture), {}",
        upstream.addr,
        proxy.listen,
        bare.listen,
        bin.display()
    );
    let mut targets = vec![(DIRECT, upstream.addr), (PROXY, proxy.listen), (BARE, bare.listen)];
    // The OTLP variant: the same capturing proxy, exporting every turn to an in-process receiver.
    let sink = if plan.otlp { Some(otlp_sink::OtlpSink::start().await?) } else { None };
    let exporting = match &sink {
        Some(sink) => Some(ProxyProcess::start_with(&bin, upstream.addr, true, &["--otlp-endpoint".into(), sink.url()]).await?),
        None => None,
    };
    if let Some(exporting) = &exporting {
        targets.insert(2, (OTLP, exporting.listen));
    }

    let mut small = Vec::new();
    for &rate in &plan.rates {
        eprintln!("latency bench: small requests at {rate} req/s");
        small.push((rate, compare(&upstream, &targets, Kind::Small, plan.connections, rate, plan.seconds, plan.warmup).await?));
    }
    eprintln!("latency bench: streams at {} /s", plan.stream_rate);
    let streams = compare(&upstream, &targets, Kind::Stream, 16, plan.stream_rate, plan.stream_seconds, plan.warmup).await?;
    let mut admin = Admin::new(proxy.admin);
    let captured = admin.metric("ctxscope_turns_captured_total").await?;
    let dropped = admin.metric("ctxscope_capture_dropped_total").await? + 0.0;
    children_ticks += proxy.cpu_ticks();
    proxy.stop();
    let export = match (exporting, &sink) {
        (Some(exporting), Some(sink)) => {
            let mut admin = Admin::new(exporting.admin);
            // The last partial batch goes out within a second.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let report = ExportReport {
                captured: admin.metric("ctxscope_turns_captured_total").await?,
                exported: admin.metric("ctxscope_otlp_exported_total").await?,
                dropped: admin.metric("ctxscope_otlp_dropped_total").await? + 0.0,
                posts: sink.posts.load(std::sync::atomic::Ordering::Relaxed),
                bytes: sink.bytes.load(std::sync::atomic::Ordering::Relaxed),
            };
            children_ticks += exporting.cpu_ticks();
            exporting.stop();
            Some(report)
        }
        _ => None,
    };
    if let Some(export) = export {
        children_ticks += bare.cpu_ticks();
        bare.stop();
        print_header(&plan, &load_before, usage.others_share(children_ticks));
        print_small(&small);
        print_streams(&streams);
        println!("Capture during the load phases above: {captured:.0} turns captured, {dropped:.0} dropped.\n");
        print_export(&small, &streams, &export);
        return Ok(());
    }

    eprintln!("latency bench: {} conversations of {} turns (fresh proxy and store)", plan.conversations, plan.turns);
    let proxy = ProxyProcess::start(&bin, upstream.addr, true).await?;
    let report = conversation::run(&proxy, bare.listen, upstream.addr, plan.conversations, plan.turns).await?;
    children_ticks += proxy.cpu_ticks() + bare.cpu_ticks();
    proxy.stop();
    bare.stop();

    print_header(&plan, &load_before, usage.others_share(children_ticks));
    print_small(&small);
    print_streams(&streams);
    println!("Capture during the load phases above: {captured:.0} turns captured, {dropped:.0} dropped.\n");
    print_conversation(&plan, &report);
    Ok(())
}

const DIRECT: &str = "direct";
const PROXY: &str = "proxy";
const BARE: &str = "proxy --no-capture";
const OTLP: &str = "proxy --otlp-endpoint";

/// What the exporting proxy sent during the load phases.
struct ExportReport {
    captured: f64,
    exported: f64,
    dropped: f64,
    posts: u64,
    bytes: u64,
}

/// The exporting proxy against the same proxy without export, same run: latency ratios.
fn print_export(small: &[(f64, Vec<(&'static str, Summary)>)], streams: &[(&'static str, Summary)], export: &ExportReport) {
    fn find<'a>(results: &'a [(&'static str, Summary)], name: &str) -> Option<&'a Summary> {
        results.iter().find(|(n, _)| *n == name).map(|(_, s)| s)
    }
    println!("### OTLP export: `proxy --otlp-endpoint` against `proxy` (capture alone), same run\n");
    println!("Ratio = the exporting proxy's percentile over the capturing proxy's; 1.00 is no added latency.\n");
    println!("| load | proxy p50 | exporting p50 | ratio p50 | proxy p99 | exporting p99 | ratio p99 |");
    println!("|---|---|---|---|---|---|---|");
    let row = |load: String, proxy: &stats::Percentiles, with: &stats::Percentiles| {
        println!(
            "| {load} | {} | {} | {:.2} | {} | {} | {:.2} |",
            us(proxy.p50),
            us(with.p50),
            with.p50 / proxy.p50,
            us(proxy.p99),
            us(with.p99),
            with.p99 / proxy.p99
        );
    };
    for (rate, summaries) in small {
        if let (Some(p), Some(o)) = (find(summaries, PROXY), find(summaries, OTLP)) {
            row(format!("small, {rate:.0} req/s"), &p.latency, &o.latency);
        }
    }
    if let (Some(p), Some(o)) = (find(streams, PROXY), find(streams, OTLP)) {
        row("streams, TTFB".into(), &p.ttfb, &o.ttfb);
        row("streams, chunk delay".into(), &p.chunk, &o.chunk);
    }
    println!(
        "\nThe exporting proxy captured {:.0} turns and exported {:.0} spans in {} OTLP posts ({:.1} KiB), {:.0} dropped.\n",
        export.captured,
        export.exported,
        export.posts,
        export.bytes as f64 / 1024.0,
        export.dropped
    );
}

/// One load against every target: warm-up first, then two rounds, the second in reverse order.
async fn compare(
    upstream: &Upstream,
    targets: &[(&'static str, std::net::SocketAddr)],
    kind: Kind,
    connections: usize,
    rate: f64,
    seconds: f64,
    warmup: f64,
) -> Result<Vec<(&'static str, Summary)>, BenchError> {
    let mut pools = Vec::new();
    for &(name, addr) in targets {
        let pool = Pool::new(addr, connections, kind, upstream.emissions.clone()).await?;
        pool.run(rate, Duration::from_secs_f64(warmup)).await?;
        pools.push((name, pool));
    }
    let half = Duration::from_secs_f64(seconds / 2.0);
    let mut runs: Vec<Vec<Run>> = pools.iter().map(|_| Vec::new()).collect();
    let order: Vec<usize> = (0..pools.len()).chain((0..pools.len()).rev()).collect();
    for i in order {
        runs[i].push(pools[i].1.run(rate, half).await?);
    }
    Ok(pools.iter().zip(&runs).map(|((name, _), runs)| (*name, Summary::of(runs))).collect())
}

fn print_header(plan: &Plan, load_before: &str, others: f64) {
    println!(
        "Machine: {} cores, {}; load average before {load_before}, after {}; other processes used {:.0}% of the machine's CPU during the run.",
        machine::cores(),
        machine::cpu_model(),
        machine::loadavg(),
        others * 100.0
    );
    println!(
        "Load generator, upstream and proxy share these cores. Rates {:?} req/s for {} s per path (+{} s warm-up); \
         streams of {STREAM_EVENTS} events {} µs apart at {}/s for {} s per path.\n",
        plan.rates,
        plan.seconds,
        plan.warmup,
        STREAM_PACING.as_micros(),
        plan.stream_rate,
        plan.stream_seconds
    );
}

/// The direct summary and the others.
fn split<'a>(results: &'a [(&'static str, Summary)]) -> Option<(&'a Summary, &'a [(&'static str, Summary)])> {
    let ((_, direct), rest) = results.split_first()?;
    Some((direct, rest))
}

fn print_small(results: &[(f64, Vec<(&'static str, Summary)>)]) {
    println!("### Small non-streaming requests, open loop (latency from scheduled send time, µs)\n");
    println!("| rate (req/s) | path | sent | errors | achieved (req/s) | p50 | p90 | p99 | p99.9 | max | send lag p99 | late (>1 ms) | no idle conn |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (rate, summaries) in results {
        for (name, s) in summaries {
            println!(
                "| {rate:.0} | {name} | {} | {} | {:.0} | {} | {} | {} | {} |",
                s.scheduled,
                s.errors,
                s.achieved,
                s.latency.cells(),
                us(s.lag.p99),
                s.late,
                s.exhausted
            );
        }
    }
    println!("\n### Added latency, small requests (percentile through the proxy minus the same percentile direct, µs)\n");
    println!("| rate (req/s) | path | added p50 | added p90 | added p99 | added p99.9 | goal: added p99 ≤ 500 µs |");
    println!("|---|---|---|---|---|---|---|");
    for (rate, summaries) in results {
        let Some((d, rest)) = split(summaries) else { continue };
        for (name, p) in rest {
            let added_p99 = p.latency.p99 - d.latency.p99;
            println!(
                "| {rate:.0} | {name} | {} | {} | {} | {} | {} |",
                signed_us(p.latency.p50 - d.latency.p50),
                signed_us(p.latency.p90 - d.latency.p90),
                signed_us(added_p99),
                signed_us(p.latency.p999 - d.latency.p999),
                if added_p99 <= 500.0 { "met" } else { "not met" }
            );
        }
    }
    println!();
}

fn print_streams(results: &[(&'static str, Summary)]) {
    println!("### Streams of {STREAM_EVENTS} SSE events (µs)\n");
    println!("Chunk delay = arrival of event i at the client minus its emission at the upstream (same clock).\n");
    println!("| path | streams | errors | TTFB p50 | TTFB p99 | chunk delay p50 | p90 | p99 | p99.9 | max | stream span p50 | span p99 |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, s) in results {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            s.scheduled,
            s.errors,
            us(s.ttfb.p50),
            us(s.ttfb.p99),
            s.chunk.cells(),
            us(s.span.p50),
            us(s.span.p99)
        );
    }
    let Some((direct, rest)) = split(results) else { return };
    let intervals = (STREAM_EVENTS - 1) as f64;
    println!("\n| path | added TTFB p50 | added TTFB p99 | added chunk delay p50 | added chunk delay p99 | span difference / {intervals:.0}, p50 | p99 | goal: per-chunk < 50 µs |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, proxy) in rest {
        let (chunk_p50, chunk_p99) = (proxy.chunk.p50 - direct.chunk.p50, proxy.chunk.p99 - direct.chunk.p99);
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            signed_us(proxy.ttfb.p50 - direct.ttfb.p50),
            signed_us(proxy.ttfb.p99 - direct.ttfb.p99),
            signed_us(chunk_p50),
            signed_us(chunk_p99),
            signed_us((proxy.span.p50 - direct.span.p50) / intervals),
            signed_us((proxy.span.p99 - direct.span.p99) / intervals),
            match (chunk_p50 < 50.0, chunk_p99 < 50.0) {
                (true, true) => "met at p50 and p99",
                (true, false) => "met at p50, not at p99",
                _ => "not met",
            }
        );
    }
    println!();
}

fn print_conversation(plan: &Plan, report: &conversation::Report) {
    println!(
        "### Capture cost along {} conversation(s) of {} turns (closed loop, one request at a time, µs)\n",
        plan.conversations, plan.turns
    );
    println!("Added = through the proxy minus direct for the same request, median over the group's turns.\n");
    println!("| turns | messages | request KiB | capture p50 | capture mean | capture max | direct p50 | added, --no-capture | added, capture on | added max, capture on |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (first, last) in [(1, 10), (41, 50), (91, 100)] {
        let group: Vec<&conversation::TurnTiming> = report.turns.iter().filter(|t| t.turn >= first && t.turn <= last).collect();
        let (Some(low), Some(high)) = (group.iter().map(|t| t.messages).min(), group.iter().map(|t| t.messages).max()) else { continue };
        let capture: Vec<f64> = group.iter().map(|t| t.capture_s * 1e6).collect();
        let added = |ns: fn(&conversation::TurnTiming) -> u64| -> Vec<f64> {
            group.iter().map(|t| (ns(t) as f64 - t.direct_ns as f64) / 1e3).collect()
        };
        let (bare, proxied) = (added(|t| t.bare_ns), added(|t| t.proxy_ns));
        let kib = |pick: fn(&conversation::TurnTiming) -> usize| group.iter().map(|t| pick(t)).max().unwrap_or(0) as f64 / 1024.0;
        println!(
            "| {first}–{last} | {low}–{high} | ≤ {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            kib(|t| t.request_bytes),
            us(median(&capture)),
            us(capture.iter().sum::<f64>() / capture.len() as f64),
            us(capture.iter().copied().fold(0.0, f64::max)),
            us(median(&group.iter().map(|t| t.direct_ns as f64 / 1e3).collect::<Vec<_>>())),
            signed_us(median(&bare)),
            signed_us(median(&proxied)),
            signed_us(proxied.iter().copied().fold(f64::MIN, f64::max))
        );
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "\nStore on disk after the first {}-turn conversation: {:.2} MiB (allocated {:.2} MiB) for {:.2} MiB of request bodies sent; \
         after all {}: {:.2} MiB (allocated {:.2} MiB). Turns per conversation the proxy threaded: {:?}; captures dropped: {:.0}.\n",
        plan.turns,
        mib(report.store_after_first.0),
        mib(report.store_after_first.1),
        mib(report.request_bytes_first),
        plan.conversations,
        mib(report.store_after_all.0),
        mib(report.store_after_all.1),
        report.captured_turns,
        report.dropped + 0.0
    );
}
