//! Report tests on a hand-built run: three targets over four turns with a near tie, a failed turn, a
//! reply without logprobs, markup in the text, probes and a bisection.

use super::*;
use crate::model::*;

fn reply(tokens: &[&str]) -> Reply {
    Reply {
        text: tokens.concat(),
        tokens: tokens
            .iter()
            .map(|t| TokenStep { token: t.to_string(), logprob: -0.1, top: vec![(t.to_string(), -0.1), (" Lyon".into(), -0.12)] })
            .collect(),
        prompt_tokens: Some(1200),
        cached_tokens: Some(1024),
        completion_tokens: Some(tokens.len() as u64),
        finish_reason: Some("stop".into()),
        wall_ms: 12.0,
    }
}

fn text_only(text: &str) -> Reply {
    Reply { tokens: Vec::new(), prompt_tokens: None, cached_tokens: None, ..reply(&[text]) }
}

fn same() -> Divergence {
    Divergence {
        exact: true,
        first_diff: None,
        margin_at_diff: None,
        near_tie: false,
        agreement: 1.0,
        compared_tokens: 11,
        max_logprob_diff: Some(0.0),
        mean_logprob_diff: Some(0.0),
        kl_topk: Some(0.0),
    }
}

fn diverged(at: usize, margin: Option<f64>, near_tie: bool, agreement: f64) -> Divergence {
    Divergence { exact: false, first_diff: Some(at), margin_at_diff: margin, near_tie, agreement, kl_topk: Some(0.0123), ..same() }
}

fn turn(turn: u32, target: &str, outcome: Outcome, vs_golden: Option<Divergence>) -> TurnResult {
    let vs_captured = Some(TextMatch { exact: !matches!(&vs_golden, Some(d) if !d.exact), common_prefix_chars: 40, captured_chars: 52 });
    TurnResult { turn, target: target.into(), outcome, vs_golden, vs_captured, probes: Vec::new() }
}

fn probe(after_turn: u32, question: &str, expected: &str, answer: Outcome, passed: bool) -> ProbeResult {
    ProbeResult { probe: ProbeSpec { after_turn, question: question.into(), expected: expected.into() }, outcome: answer, passed }
}

const GOLDEN_1: &[&str] = &["The", " answer", " is", " <script>", "alert(1)", "</script>", " and", " Paris", " is", " nice", "."];
const FAST_1: &[&str] = &["The", " answer", " is", " <script>", "alert(1)", "</script>", " and", " Lyon", " is", " nice", "."];

pub(super) fn sample() -> ReplayReport {
    let ok = |t: &[&str]| Outcome::Ok(reply(t));
    let base: &[&str] = &["Hello", " there", "."];
    let mut results = vec![
        turn(0, "golden", ok(base), None),
        turn(0, "fast", ok(base), Some(same())),
        turn(0, "remote", ok(base), Some(same())),
        turn(1, "golden", ok(GOLDEN_1), None),
        turn(1, "fast", ok(FAST_1), Some(diverged(7, Some(0.02), true, 0.909))),
        turn(1, "remote", ok(GOLDEN_1), Some(same())),
        turn(2, "golden", ok(&["We", " met", " in", " June", "."]), None),
        turn(2, "fast", ok(&["We", " met", " in", " May", "."]), Some(diverged(3, Some(1.4), false, 0.8))),
        turn(2, "remote", Outcome::Failed { error: "timeout after 30 s\nwhile reading body".into(), status: Some(504) }, None),
        turn(3, "golden", ok(&["Bye", " now", "."]), None),
        turn(3, "fast", ok(&["Bye", " now", "."]), Some(same())),
        turn(
            3,
            "remote",
            Outcome::Ok(text_only("Bye then.")),
            Some(Divergence { first_diff: None, margin_at_diff: None, ..diverged(0, None, false, 0.5) }),
        ),
    ];
    let name_q = "What is my name? & <b>why</b>";
    results[3].probes.push(probe(1, name_q, "Alice", Outcome::Ok(text_only("Alice.")), true));
    results[4].probes.push(probe(1, name_q, "Alice", Outcome::Ok(text_only("I don't know.")), false));
    results[5].probes.push(probe(1, name_q, "Alice", Outcome::Ok(text_only("You are Alice")), true));
    let city_q = "Which city did we pick?";
    results[9].probes.push(probe(3, city_q, "Paris", Outcome::Ok(text_only("Paris")), true));
    results[10].probes.push(probe(3, city_q, "Paris", Outcome::Ok(text_only("paris!")), true));
    results[11].probes.push(probe(3, city_q, "Paris", Outcome::Failed { error: "connection refused".into(), status: None }, false));

    let engine = |name: &str, patches: &[&str], spec: &str| TargetSpec {
        name: name.into(),
        kind: TargetKind::Engine { patches: patches.iter().map(|p| p.to_string()).collect(), path: Some("fast".into()), url: None },
        model: None,
        headers: Vec::new(),
        spec: spec.into(),
    };
    let step = |patches: &[&str], score: f64, diverges: bool, reused: bool| BisectStep {
        patches: patches.iter().map(|p| p.to_string()).collect(),
        score,
        diverges,
        reused,
    };
    ReplayReport {
        schema: REPORT_SCHEMA,
        id: 7,
        conversation: 42,
        started_unix_ms: 1_714_566_896_789,
        finished_unix_ms: 1_714_566_909_089,
        golden: "golden".into(),
        targets: vec![
            engine("golden", &[], "engine:path=golden"),
            engine("fast", &["a", "b", "c"], "engine:patches=a,b,c"),
            TargetSpec {
                name: "remote".into(),
                kind: TargetKind::Url { url: "http://127.0.0.1:9/".into() },
                model: Some("m".into()),
                headers: vec![("authorization".into(), "Bearer x".into())],
                spec: "url=http://127.0.0.1:9/,model=m".into(),
            },
        ],
        turns: 4,
        results,
        bisect: Some(BisectReport {
            patches: vec!["a".into(), "b".into(), "c".into()],
            metric: "agreement".into(),
            threshold: 0.05,
            culprit: vec!["b".into()],
            steps: vec![
                step(&["a", "b", "c"], 0.146, true, false),
                step(&["a"], 0.0, false, false),
                step(&["b", "c"], 0.146, true, false),
                step(&["b"], 0.146, true, false),
                step(&["a", "b", "c"], 0.146, true, true),
            ],
            replays_run: 4,
            naive_replays: 3,
            profile: None,
        }),
        interrupted: false,
        captured_fingerprints: Vec::new(),
        launches: Vec::new(),
    }
}

#[test]
fn table_shows_each_turn_and_target() {
    let t = table(&sample());
    println!("{t}");
    for needle in [
        "replay #7 · conversation #42 · 4 turns · golden: golden",
        "≠@7 (m=0.02, tie)",
        "≠@3 (m=1.40)",
        "90.9%",
        "1200/1024",
        "ERR 504 timeout after 30 s",
        "40/52",
        "fast    2/4 turns exact · mean agreement 92.7% · probes 1/2 passed",
        "remote  2/4 turns exact · mean agreement 83.3% · probes 1/2 passed · 1 failed",
        "golden  golden, 4 turns · probes 2/2 passed",
        "culprit: b",
        "replays run: 4 (naive: 3)",
        "(reused)",
    ] {
        assert!(t.contains(needle), "table lacks {needle:?}");
    }
    let probe_line = t.lines().find(|l| l.contains("What is my name?")).expect("probe row");
    assert!(probe_line.contains("Alice") && probe_line.contains("FAIL"), "{probe_line}");
    let city = t.lines().find(|l| l.contains("Which city")).expect("probe row");
    assert!(city.contains("ERR"), "{city}");
    // The turn rows: 0..3, the failed cell spans remote's group.
    assert_eq!(t.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains('│')).count(), 4);
    assert_eq!(t.lines().filter(|l| l.starts_with("turn")).count(), 1, "three targets fit one band");
    for line in t.lines() {
        assert!(line.chars().count() <= WIDTH, "line over {WIDTH} columns: {line}");
    }
}

#[test]
fn table_wraps_many_targets_into_bands_within_the_width() {
    let mut r = sample();
    for i in 0..4 {
        let name = format!("extra-{i}");
        let mut spec = r.targets[1].clone();
        spec.name = name.clone();
        r.targets.push(spec);
        let copies: Vec<TurnResult> = r.results.iter().filter(|t| t.target == "fast").cloned().collect();
        r.results.extend(copies.into_iter().map(|mut t| {
            t.target = name.clone();
            t
        }));
    }
    let t = table(&r);
    for line in t.lines() {
        assert!(line.chars().count() <= WIDTH, "line over {WIDTH} columns: {line}");
    }
    assert!(t.lines().filter(|l| l.starts_with("turn")).count() >= 2, "expected several bands:\n{t}");
    assert!(t.contains("extra-3"));
}

#[test]
fn json_round_trips() {
    let r = sample();
    let back: ReplayReport = serde_json::from_str(&json(&r)).expect("valid JSON");
    assert_eq!(back, r);
}

#[test]
fn html_escapes_reply_text_and_has_no_script() {
    let h = html(&sample());
    assert!(!h.to_lowercase().contains("<script"), "an unescaped script tag (or any script) in the page");
    assert!(h.contains("&lt;script&gt;"));
    assert!(h.contains("What is my name? &amp; &lt;b&gt;why&lt;/b&gt;"));
    assert!(!h.contains("<b>why"));
    assert!(!h.contains("href=\"http") && !h.contains("src=") && !h.contains("<link"), "external resources");
}

#[test]
fn html_chart_has_one_polyline_per_compared_target() {
    let h = html(&sample());
    let start = h.find(&format!("<svg id=\"{CHART_ID}\"")).expect("chart element");
    let svg = &h[start..start + h[start..].find("</svg>").expect("closed svg")];
    assert!(svg.contains("width=\"780\" height=\"320\""));
    assert_eq!(svg.matches("<polyline").count(), 2, "fast and remote, not golden");
    assert!(svg.contains("data-target=\"fast\"") && svg.contains("data-target=\"remote\""));
    // remote failed at turn 2: three points on its line, a cross for the failure.
    let remote = &svg[svg.find("data-target=\"remote\"").expect("remote series")..];
    let points = remote.split("points=\"").nth(1).and_then(|p| p.split('"').next()).expect("points");
    assert_eq!(points.split(' ').count(), 3, "{points}");
    assert!(remote.contains("class=\"failed\""));
    // The near tie is hollow.
    assert!(svg.contains("fill=\"#fff\" stroke=\"#1f77b4\""));
    assert!(svg.contains(">turn</text>") && svg.contains("1 − agreement with golden"));
}

#[test]
fn html_marks_the_first_divergent_tokens() {
    let h = html(&sample());
    assert!(h.contains(r#"<mark class="tok" title="position 7, logprob -0.100"> Paris</mark>"#));
    assert!(h.contains(r#"<mark class="tok" title="position 7, logprob -0.100"> Lyon</mark>"#));
    assert!(h.contains(r#"<mark class="tok" title="position 3, logprob -0.100"> May</mark>"#));
    assert!(h.contains(r##"<a href="#div-1-1">≠@7 (m=0.02, tie)</a>"##) && h.contains(r#"id="div-1-1""#));
    // Text-only fallback for the reply without logprobs: "Bye now." vs "Bye then.", first at char 4.
    assert!(h.contains("first difference at character 4"));
    assert!(h.contains(r#"<mark class="tok">then.</mark>"#));
    // Exact turns get no context block; failed ones neither.
    assert_eq!(h.matches(r#"<div class="case""#).count(), 3);
}

#[test]
fn html_has_header_probes_and_bisect() {
    let h = html(&sample());
    for needle in [
        "Replay #7 of conversation #42",
        "2024-05-01 12:34:56 UTC",
        "engine:patches=a,b,c",
        "url=http://127.0.0.1:9/,model=m",
        "<h2>Probes</h2>",
        r#"<td class="fail" title="I don&#39;t know.">FAIL</td>"#,
        r#"<td class="fail" title="connection refused">ERR</td>"#,
        r#"<td class="err" colspan="5" title="timeout after 30 s while reading body">ERR 504 timeout after 30 s</td>"#,
        r#"<li class="diverges culprit-step"><code>b</code> → 0.1460 · diverges</li>"#,
        "· reused",
        r#"culprit: <mark>b</mark>"#,
        "replays run: 4 (naive: 3)",
    ] {
        assert!(h.contains(needle), "page lacks {needle:?}");
    }
}

#[test]
fn escape_covers_markup_and_quotes() {
    assert_eq!(escape(r#"<a href="x">'&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

#[test]
fn table_names_the_engine_fingerprints_the_capture_was_served_under() {
    let mut report = sample();
    let print = |turn: u32, fingerprint: &str| crate::model::CapturedFingerprint { turn, fingerprint: fingerprint.repeat(16) };
    report.captured_fingerprints = vec![print(0, "ab12"), print(1, "ab12"), print(2, "cd34")];
    let text = table(&report);
    assert!(text.contains("captured on engine fingerprint ab12ab12ab12: turns 0-1"), "{text}");
    assert!(text.contains("captured on engine fingerprint cd34cd34cd34: turn 2"), "{text}");
    assert!(!table(&sample()).contains("captured on engine fingerprint"));
}
