//! The HTML report in a real browser: headless Chromium renders the page to a PNG (checked for size
//! and content) and, on a copy with a one-line probe script, reports the divergence chart's rendered
//! box through `document.title` in `--dump-dom`. Skips when Chromium is absent, unless `CI` is set.
//! Install: `apt-get install -y --no-install-recommends chromium`.

use ctxscope_replay::report::{html, CHART_ID};
use ctxscope_replay::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const WINDOW: (u32, u32) = (1200, 900);
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(120);

fn reply(tokens: &[&str]) -> Reply {
    Reply {
        text: tokens.concat(),
        tokens: tokens
            .iter()
            .map(|t| TokenStep { token: t.to_string(), logprob: -0.2, top: vec![(t.to_string(), -0.2), (" Rome".into(), -0.25)] })
            .collect(),
        prompt_tokens: Some(900),
        cached_tokens: Some(512),
        completion_tokens: Some(tokens.len() as u64),
        finish_reason: Some("stop".into()),
        wall_ms: 20.0,
    }
}

fn divergence(agreement: f64, first_diff: Option<usize>, near_tie: bool) -> Divergence {
    Divergence {
        exact: first_diff.is_none(),
        first_diff,
        margin_at_diff: first_diff.map(|_| if near_tie { 0.03 } else { 0.9 }),
        near_tie,
        agreement,
        compared_tokens: 8,
        max_logprob_diff: Some(0.05),
        mean_logprob_diff: Some(0.01),
        kl_topk: Some(0.004),
    }
}

/// Two targets against golden over four turns: drift, a near tie, a failure, a probe, a bisection.
fn report() -> ReplayReport {
    let golden: &[&str] = &["We", " chose", " Paris", " for", " the", " <script>", " trip", "."];
    let other: &[&str] = &["We", " chose", " Rome", " for", " the", " <script>", " trip", "."];
    let target = |name: &str, patches: &[&str]| TargetSpec {
        name: name.into(),
        kind: TargetKind::Engine { patches: patches.iter().map(|p| p.to_string()).collect(), path: None, url: None },
        model: None,
        headers: Vec::new(),
        spec: format!("engine:patches={}", patches.join(",")),
    };
    let row = |turn: u32, name: &str, outcome: Outcome, vs_golden: Option<Divergence>| TurnResult {
        turn,
        target: name.into(),
        outcome,
        vs_golden,
        vs_captured: Some(TextMatch { exact: true, common_prefix_chars: 30, captured_chars: 30 }),
        probes: Vec::new(),
    };
    let mut results = Vec::new();
    for turn in 0..4u32 {
        results.push(row(turn, "golden", Outcome::Ok(reply(golden)), None));
        let fast = match turn {
            0 => (reply(golden), divergence(1.0, None, false)),
            1 => (reply(other), divergence(0.875, Some(2), true)),
            _ => (reply(other), divergence(0.6, Some(2), false)),
        };
        results.push(row(turn, "fast", Outcome::Ok(fast.0), Some(fast.1)));
        if turn == 2 {
            results.push(row(turn, "remote", Outcome::Failed { error: "connection refused".into(), status: None }, None));
        } else {
            results.push(row(turn, "remote", Outcome::Ok(reply(golden)), Some(divergence(1.0, None, false))));
        }
    }
    let spec = ProbeSpec { after_turn: 3, question: "Which city?".into(), expected: "Paris".into() };
    for (i, passed) in [(9, true), (10, false), (11, true)] {
        let answer = if passed { "Paris" } else { "Rome" };
        results[i].probes.push(ProbeResult { probe: spec.clone(), outcome: Outcome::Ok(reply(&[answer])), passed });
    }
    let step = |p: &[&str], score: f64, diverges: bool| BisectStep {
        patches: p.iter().map(|s| s.to_string()).collect(),
        score,
        diverges,
        reused: false,
    };
    ReplayReport {
        schema: REPORT_SCHEMA,
        id: 3,
        conversation: 11,
        started_unix_ms: 1_700_000_000_000,
        finished_unix_ms: 1_700_000_004_500,
        golden: "golden".into(),
        targets: vec![target("golden", &[]), target("fast", &["kv_q8", "spec"]), target("remote", &[])],
        turns: 4,
        results,
        bisect: Some(BisectReport {
            patches: vec!["kv_q8".into(), "spec".into()],
            metric: "agreement".into(),
            threshold: 0.05,
            culprit: vec!["kv_q8".into()],
            steps: vec![step(&["kv_q8", "spec"], 0.23, true), step(&["kv_q8"], 0.23, true), step(&["spec"], 0.0, false)],
            replays_run: 3,
            naive_replays: 2,
            profile: None,
        }),
        interrupted: false,
        captured_fingerprints: Vec::new(),
        launches: Vec::new(),
    }
}

/// The Chromium binary on PATH, or None (then: panic under CI, skip otherwise).
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

fn require_chromium() -> Option<PathBuf> {
    let found = chromium();
    if found.is_none() {
        let how = "install it with `apt-get install -y --no-install-recommends chromium`";
        if std::env::var_os("CI").is_some() {
            panic!("chromium is not installed but CI is set: {how}");
        }
        eprintln!("note: skipping the browser check, chromium is not installed ({how})");
    }
    found
}

/// Runs Chromium headless on `page` with `args`, killing it past CHROMIUM_TIMEOUT.
fn run_chromium(bin: &Path, profile: &Path, args: &[String], page: &Path) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("running: {cmd:?}");
    let mut child = cmd.spawn().expect("start chromium");
    let started = Instant::now();
    while child.try_wait().expect("wait for chromium").is_none() {
        if started.elapsed() > CHROMIUM_TIMEOUT {
            let _ = child.kill();
            panic!("chromium did not finish within {CHROMIUM_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(out.status.success(), "chromium failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

/// Width and height from a PNG's IHDR chunk, which must come first.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24, "PNG too short: {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk is not IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[test]
fn renders_in_headless_chromium_with_a_visible_chart() {
    let Some(bin) = require_chromium() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let page = html(&report());
    assert!(!page.to_lowercase().contains("<script"), "the report itself must carry no script");
    let page_path = dir.path().join("report.html");
    std::fs::write(&page_path, &page).expect("write report");

    // 1. Screenshot: the right size, and not one flat colour (a blank 1200x900 PNG is ~4 KB).
    let png_path = dir.path().join("report.png");
    run_chromium(
        &bin,
        &dir.path().join("profile-shot"),
        &["--hide-scrollbars".into(), "--force-device-scale-factor=1".into(), format!("--screenshot={}", png_path.display())],
        &page_path,
    );
    let png = std::fs::read(&png_path).expect("chromium wrote no screenshot");
    let (w, h) = png_size(&png);
    eprintln!("screenshot: {w}x{h}, {} bytes", png.len());
    assert_eq!((w, h), WINDOW, "screenshot size");
    assert!(png.len() > 15_000, "screenshot is only {} bytes: the page looks blank", png.len());

    // 2. The chart's rendered box, read back through the title of a probe copy of the page.
    let probe = format!(
        "<script>(function(){{var r=document.getElementById('{CHART_ID}').getBoundingClientRect();\
         document.title='chart:'+r.width+'x'+r.height;}})();</script></body>"
    );
    let probe_path = dir.path().join("probe.html");
    std::fs::write(&probe_path, page.replacen("</body>", &probe, 1)).expect("write probe page");
    let out = run_chromium(&bin, &dir.path().join("profile-dom"), &["--dump-dom".into()], &probe_path);
    let dom = String::from_utf8_lossy(&out.stdout);
    let title = dom.split_once("<title>").and_then(|(_, rest)| rest.split_once("</title>")).map(|(t, _)| t.to_string()).unwrap_or_default();
    eprintln!("probe title: {title:?}");
    let size =
        title.strip_prefix("chart:").unwrap_or_else(|| panic!("the probe script did not run or found no #{CHART_ID}: title {title:?}"));
    let (cw, ch) = size.split_once('x').expect("WxH");
    let (cw, ch): (f64, f64) = (cw.parse().expect("width"), ch.parse().expect("height"));
    assert!(cw > 0.0 && ch > 0.0, "chart rendered with zero size: {cw}x{ch}");
    // The text the page escaped stays text in the rendered DOM.
    assert!(dom.contains("&lt;script&gt;"), "escaped reply text missing from the DOM");
}
