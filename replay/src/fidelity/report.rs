//! Fidelity reports: a terminal table (recall per target, golden's beside every cell), the JSON form
//! of [`FidelityReport`], and an HTML page with an inline SVG chart of mean recall by length per
//! target, drawn with the replay report's palette and escaping.

use std::fmt::Write as _;

use super::run::{Cell, FidelityReport};
use crate::report::escape;

/// The table: one row per length x turns x depth, one column per target.
pub fn table(report: &FidelityReport) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:>7}  {:>5}  {:>5}  {:>7}", "LENGTH", "TURNS", "DEPTH", "TOKENS");
    for t in &report.targets {
        let _ = write!(out, "  {:>22}", clip(t, 22));
    }
    out.push('\n');
    for &length in &report.lengths {
        for &turns in &report.turns {
            for &depth in &report.depths {
                let row: Vec<&Cell> = report.cells.iter().filter(|c| c.length == length && c.turns == turns && c.depth == depth).collect();
                let tokens = row.first().and_then(|c| c.prompt_tokens).map_or("-".to_string(), |t| t.to_string());
                let _ = write!(out, "{length:>7}  {turns:>5}  {depth:>5.2}  {tokens:>7}");
                for t in &report.targets {
                    let text = match row.iter().find(|c| &c.target == t) {
                        Some(c) if *t == report.targets[0] => format!("{:.2}", c.recall),
                        Some(c) => format!("{:.2} (golden {:.2})", c.recall, c.golden),
                        None => "-".into(),
                    };
                    let _ = write!(out, "  {text:>22}");
                }
                out.push('\n');
            }
        }
    }
    let _ = writeln!(out, "\nmean recall by length (golden first):");
    for t in &report.targets {
        let means: Vec<String> = report.lengths.iter().map(|&l| format!("{l}: {:.2}", mean(report, t, l))).collect();
        let _ = writeln!(out, "  {:<24} {}", clip(t, 24), means.join("  "));
    }
    let _ = writeln!(out, "{} conversations, {} probes each, seed {}, {:.1} s", report.conversations.len(), 5, report.seed, report.wall_s);
    out.push_str(&launches(&report.launches));
    out
}

/// The launched configurations as text (nothing when none was launched).
pub fn launches(launches: &[crate::model::LaunchRecord]) -> String {
    crate::report::launches(launches).iter().map(|l| format!("{l}\n")).collect()
}

/// The report as pretty JSON.
pub fn json(report: &FidelityReport) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default() + "\n"
}

/// Mean recall of `target` over every conversation of `length`.
pub fn mean(report: &FidelityReport, target: &str, length: usize) -> f64 {
    let cells: Vec<f64> = report.cells.iter().filter(|c| c.target == target && c.length == length).map(|c| c.recall).collect();
    cells.iter().sum::<f64>() / cells.len().max(1) as f64
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

const W: f64 = 720.0;
const H: f64 = 300.0;
const LEFT: f64 = 56.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;
const LEGEND: f64 = 200.0;

/// A self-contained HTML page: the chart, then the table.
pub fn html(report: &FidelityReport) -> String {
    let (pw, ph) = (W - LEFT - LEGEND, H - TOP - BOTTOM);
    let n = report.lengths.len();
    let x = |i: usize| {
        if n <= 1 {
            LEFT + pw / 2.0
        } else {
            LEFT + i as f64 / (n - 1) as f64 * pw
        }
    };
    let y = |v: f64| TOP + (1.0 - v.clamp(0.0, 1.0)) * ph;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg id="fidelity-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="Recall by context length">"#
    );
    svg.push_str("<title>mean recall of planted facts by conversation length, per target</title>");
    for i in 0..=4 {
        let v = f64::from(i) / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{v:.2}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y(v) + 4.0,
            yy = y(v)
        );
    }
    for (i, l) in report.lengths.iter().enumerate() {
        let _ = write!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{l}</text>"#, x(i), H - BOTTOM + 16.0);
    }
    let _ =
        write!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">length (tokens)</text>"#, LEFT + pw / 2.0, H - 6.0);
    for (k, t) in report.targets.iter().enumerate() {
        let colour = if k == 0 { "#000000" } else { crate::report::colour(k - 1) };
        let points: Vec<String> =
            report.lengths.iter().enumerate().map(|(i, &l)| format!("{:.1},{:.1}", x(i), y(mean(report, t, l)))).collect();
        let dash = if k == 0 { r#" stroke-dasharray="6 3""# } else { "" };
        let _ = write!(svg, r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#, points.join(" "));
        for p in &points {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(svg, r#"<circle cx="{px}" cy="{py}" r="3" fill="{colour}"/>"#);
        }
        let ly = TOP + 14.0 + k as f64 * 18.0;
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="4" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            W - LEGEND + 12.0,
            ly - 4.0,
            W - LEGEND + 30.0,
            ly,
            escape(&clip(t, 26))
        );
    }
    svg.push_str("</svg>");
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ctxscope fidelity sweep</title></head><body style=\"font-family:sans-serif\">\n<h1>Context fidelity</h1>\n<p>Recall of planted facts (name, number, code, changing list, tic-tac-toe state), seed {}; golden is the dashed line.</p>\n{svg}\n<pre>{}</pre>\n</body></html>\n",
        report.seed,
        escape(&table(report))
    )
}
