//! The HTML report's divergence chart: an inline SVG drawn here, no script. x is the turn, y is
//! 1 − token agreement with golden (0..1); one polyline with points per non-golden target (golden is
//! the zero line by definition), near ties drawn hollow, failed turns as a cross on the top edge.

use super::view::escape;
use super::view::{self, clip};
use crate::model::{Outcome, ReplayReport};
use std::fmt::Write as _;

/// The `id` of the chart's `<svg>` element.
pub const CHART_ID: &str = "divergence-chart";

const WIDTH: f64 = 780.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 46.0;
const LEGEND: f64 = 190.0;
const PLOT_W: f64 = WIDTH - LEFT - LEGEND;
const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;

/// Series colours, distinguishable and readable on white; reused past eight targets.
const PALETTE: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

/// The colour of the `i`th non-golden target, shared with the tables so a target keeps its colour.
pub(crate) fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// The chart as one `<svg>` element with explicit width and height.
pub(crate) fn chart(report: &ReplayReport) -> String {
    let turns = view::turns(report);
    let (lo, hi) = (turns.first().copied().unwrap_or(0), turns.last().copied().unwrap_or(0));
    let x = |turn: u32| -> f64 {
        if hi == lo {
            LEFT + PLOT_W / 2.0
        } else {
            LEFT + f64::from(turn - lo) / f64::from(hi - lo) * PLOT_W
        }
    };
    let y = |v: f64| -> f64 { TOP + (1.0 - v.clamp(0.0, 1.0)) * PLOT_H };

    let mut s = String::new();
    // Writing into a String cannot fail; the results of write! below are ignored for that reason.
    let _ = write!(
        s,
        r#"<svg id="{CHART_ID}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="Divergence from golden per turn">"#
    );
    s.push_str("<title>1 − agreement with golden, per turn and target</title>");

    // Grid and y axis.
    for i in 0..=4 {
        let v = f64::from(i) / 4.0;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line class="grid" x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{v:.2}</text>"##,
            LEFT + PLOT_W,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    // x ticks: every turn, thinned to about twenty labels.
    let step = turns.len().div_ceil(20).max(1);
    for (i, &t) in turns.iter().enumerate() {
        let xx = x(t);
        let _ = write!(s, r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/>"##, TOP + PLOT_H, TOP + PLOT_H + 4.0);
        if i % step == 0 {
            let _ = write!(s, r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{t}</text>"#, TOP + PLOT_H + 16.0);
        }
    }
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">turn</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle" font-size="12">1 − agreement with golden</text>"##,
        LEFT + PLOT_W / 2.0,
        HEIGHT - 8.0,
        TOP + PLOT_H / 2.0
    );

    let others: Vec<&str> = view::target_order(report).into_iter().filter(|n| *n != report.golden).collect();
    if others.is_empty() {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">no target to compare with golden</text>"#,
            LEFT + PLOT_W / 2.0,
            TOP + PLOT_H / 2.0
        );
    }

    // One series per target.
    for (i, name) in others.iter().enumerate() {
        let c = colour(i);
        let mut points = Vec::new();
        let mut marks = String::new();
        for &t in &turns {
            let Some(r) = view::result(report, t, name) else { continue };
            let xx = x(t);
            match (&r.outcome, &r.vs_golden) {
                (Outcome::Failed { error, status }, _) => {
                    let _ = write!(
                        marks,
                        r#"<text class="failed" x="{xx:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="{c}">×<title>{} · turn {t}: failed: {}</title></text>"#,
                        TOP + 5.0,
                        escape(name),
                        escape(&clip(&view::failure(error, *status), 120))
                    );
                }
                (Outcome::Ok(_), Some(d)) => {
                    let (xx, yy) = (xx, y(1.0 - d.agreement));
                    points.push(format!("{xx:.1},{yy:.1}"));
                    let fill = if d.near_tie { "#fff" } else { c };
                    let _ = write!(
                        marks,
                        r#"<circle cx="{xx:.1}" cy="{yy:.1}" r="4" fill="{fill}" stroke="{c}" stroke-width="2"><title>{} · turn {t}: agreement {} · {}</title></circle>"#,
                        escape(name),
                        view::percent(d.agreement),
                        escape(&view::diff_cell(d))
                    );
                }
                (Outcome::Ok(_), None) => {}
            }
        }
        let _ = write!(
            s,
            r#"<g class="series" data-target="{}"><polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>{marks}</g>"#,
            escape(name),
            points.join(" ")
        );
    }

    // Legend.
    let lx = LEFT + PLOT_W + 16.0;
    let mut ly = TOP + 8.0;
    for (i, name) in others.iter().enumerate() {
        let c = colour(i);
        let _ = write!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(&clip(name, 22))
        );
        ly += 18.0;
    }
    let _ = write!(
        s,
        r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#fff" stroke="#555" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="11">near tie</text><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="#555">×</text><text x="{:.1}" y="{:.1}" font-size="11">failed turn</text><text x="{lx:.1}" y="{:.1}" font-size="11" fill="#555">golden: 0 by definition</text>"##,
        lx + 11.0,
        ly + 8.0,
        lx + 28.0,
        ly + 12.0,
        lx + 11.0,
        ly + 31.0,
        lx + 28.0,
        ly + 30.0,
        ly + 50.0
    );
    s.push_str("</svg>");
    s
}
