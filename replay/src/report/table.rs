//! The terminal report: one row per turn with a column group per target (golden first), then the
//! probes, a summary line per target and the bisect path. Target groups that do not fit in
//! [`WIDTH`] columns wrap into further bands, each repeating the turn column.

use super::view::{self, clip};
use crate::model::{LaunchRecord, Outcome, ReplayReport};

/// The width the table aims to fit.
pub const WIDTH: usize = 120;

const GROUP_SEP: &str = " │ ";
const COL_SEP: &str = " ";

/// The whole report as plain text for a terminal, lines at most [`WIDTH`] characters where the
/// content allows (long names and questions are clipped with `…`).
pub fn table(report: &ReplayReport) -> String {
    let mut lines = header(report);
    lines.extend(fingerprints(report));
    lines.push(String::new());
    lines.extend(turn_table(report));
    lines.extend(LEGEND.iter().map(|l| l.to_string()));
    let probes = probes(report);
    if !probes.is_empty() {
        lines.push(String::new());
        lines.extend(probes);
    }
    lines.push(String::new());
    lines.extend(summary(report));
    if report.bisect.is_some() {
        lines.push(String::new());
        lines.extend(bisect(report));
    }
    if !report.launches.is_empty() {
        lines.push(String::new());
        lines.extend(launches(&report.launches));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// "captured on engine fingerprint 1a2b3c4d5e6f: turns 0-3", one line per run of turns.
fn fingerprints(report: &ReplayReport) -> Vec<String> {
    let mut runs: Vec<(&str, u32, u32)> = Vec::new();
    for f in &report.captured_fingerprints {
        match runs.last_mut() {
            Some((last, _, end)) if *last == f.fingerprint => *end = f.turn,
            _ => runs.push((&f.fingerprint, f.turn, f.turn)),
        }
    }
    runs.into_iter()
        .map(|(print, a, b)| {
            let turns = if a == b { format!("turn {a}") } else { format!("turns {a}-{b}") };
            format!("captured on engine fingerprint {}: {turns}", &print[..print.len().min(12)])
        })
        .collect()
}

fn header(report: &ReplayReport) -> Vec<String> {
    let mut lines = vec![format!(
        "replay #{} · conversation #{} · {} turns · golden: {} · {}, {}{}",
        report.id,
        report.conversation,
        report.turns,
        report.golden,
        view::utc(report.started_unix_ms),
        view::duration(report),
        if report.interrupted { " · INTERRUPTED (partial)" } else { "" }
    )];
    let name_w = report.targets.iter().map(|t| t.name.chars().count().min(16)).max().unwrap_or(0);
    for (i, t) in report.targets.iter().enumerate() {
        let lead = if i == 0 { "targets: " } else { "         " };
        let name = pad_left(&clip(&t.name, 16), name_w);
        let room = WIDTH.saturating_sub(lead.len() + name_w + 3);
        lines.push(format!("{lead}{name} = {}", clip(&t.spec, room)));
    }
    lines
}

/// What the short column titles mean.
const LEGEND: [&str; 3] = [
    "vs golden: = same text, ≠@N first differing token (m = golden's top-1 minus top-2 logprob there, tie = near tie)",
    "agree: token agreement with golden · KL: mean top-k KL(golden || target) · p/c: prompt/cached tokens",
    "capt: vs the captured reply, = or common-prefix/captured length in characters",
];

/// How a column is aligned within its width.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

struct Column {
    title: &'static str,
    align: Align,
    max: usize,
}

const GOLDEN_COLUMNS: &[Column] =
    &[Column { title: "p/c", align: Align::Right, max: 15 }, Column { title: "capt", align: Align::Right, max: 11 }];

const TARGET_COLUMNS: &[Column] = &[
    Column { title: "vs golden", align: Align::Left, max: 22 },
    Column { title: "agree", align: Align::Right, max: 6 },
    Column { title: "KL", align: Align::Right, max: 7 },
    Column { title: "p/c", align: Align::Right, max: 15 },
    Column { title: "capt", align: Align::Right, max: 11 },
];

/// A cell row of one group: its column texts, or one text spanning the group (a failed turn).
enum Cells {
    Columns(Vec<String>),
    Span(String),
    Missing,
}

/// One target's column group, laid out.
struct Group {
    name: String,
    columns: &'static [Column],
    widths: Vec<usize>,
    rows: Vec<Cells>,
}

impl Group {
    fn width(&self) -> usize {
        let cols = self.widths.iter().sum::<usize>() + COL_SEP.len() * self.widths.len().saturating_sub(1);
        cols.max(self.name.chars().count())
    }

    fn title_line(&self) -> String {
        pad_right(&self.name, self.width())
    }

    fn column_line(&self) -> String {
        let titles: Vec<String> = self.columns.iter().zip(&self.widths).map(|(c, w)| align(&clip(c.title, *w), *w, c.align)).collect();
        pad_right(&titles.join(COL_SEP), self.width())
    }

    fn row_line(&self, i: usize) -> String {
        let text = match &self.rows[i] {
            Cells::Columns(cells) => cells
                .iter()
                .zip(self.columns.iter().zip(&self.widths))
                .map(|(s, (c, w))| align(&clip(s, *w), *w, c.align))
                .collect::<Vec<_>>()
                .join(COL_SEP),
            Cells::Span(s) => clip(s, self.width()),
            Cells::Missing => String::new(),
        };
        pad_right(&text, self.width())
    }
}

fn group(report: &ReplayReport, name: &str, turns: &[u32]) -> Group {
    let golden = name == report.golden;
    let columns = if golden { GOLDEN_COLUMNS } else { TARGET_COLUMNS };
    let rows: Vec<Cells> = turns
        .iter()
        .map(|&turn| match view::result(report, turn, name) {
            None => Cells::Missing,
            Some(r) => match &r.outcome {
                Outcome::Failed { error, status } => Cells::Span(format!("ERR {}", view::failure(error, *status))),
                Outcome::Ok(reply) => {
                    let tokens = view::tokens_cell(reply);
                    let captured = view::captured_cell(r.vs_captured.as_ref());
                    if golden {
                        Cells::Columns(vec![tokens, captured])
                    } else {
                        let (diff, agree, kl) = match &r.vs_golden {
                            Some(d) => (view::diff_cell(d), view::percent(d.agreement), view::kl_cell(d)),
                            None => ("—".into(), "—".into(), "—".into()),
                        };
                        Cells::Columns(vec![diff, agree, kl, tokens, captured])
                    }
                }
            },
        })
        .collect();
    let widths = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let cells = rows.iter().filter_map(|r| match r {
                Cells::Columns(cells) => Some(cells[i].chars().count()),
                _ => None,
            });
            cells.chain([c.title.len()]).max().unwrap_or(0).min(c.max)
        })
        .collect();
    Group { name: clip(name, 24), columns, widths, rows }
}

fn turn_table(report: &ReplayReport) -> Vec<String> {
    let turns = view::turns(report);
    if turns.is_empty() {
        return vec!["no turns were replayed".into()];
    }
    let groups: Vec<Group> = view::target_order(report).into_iter().map(|n| group(report, n, &turns)).collect();
    let turn_w = turns.iter().map(|t| t.to_string().len()).max().unwrap_or(1).max(4);

    // Pack the groups into bands that fit the width; a band holds at least one group.
    let mut bands: Vec<Vec<&Group>> = Vec::new();
    let mut used = 0;
    for g in &groups {
        let need = GROUP_SEP.len() + g.width();
        match bands.last_mut() {
            Some(band) if used + need <= WIDTH => {
                band.push(g);
                used += need;
            }
            _ => {
                bands.push(vec![g]);
                used = turn_w + need;
            }
        }
    }

    let mut lines = Vec::new();
    for (b, band) in bands.iter().enumerate() {
        if b > 0 {
            lines.push(String::new());
        }
        let join = |lead: String, parts: Vec<String>| -> String {
            let mut line = lead;
            for p in parts {
                line.push_str(GROUP_SEP);
                line.push_str(&p);
            }
            line.trim_end().to_string()
        };
        lines.push(join(" ".repeat(turn_w), band.iter().map(|g| g.title_line()).collect()));
        lines.push(join(pad_left("turn", turn_w), band.iter().map(|g| g.column_line()).collect()));
        let rule: Vec<String> = band.iter().map(|g| "─".repeat(g.width())).collect();
        lines.push(format!("{}─┼─{}", "─".repeat(turn_w), rule.join("─┼─")));
        for (i, turn) in turns.iter().enumerate() {
            lines.push(join(pad_left(&turn.to_string(), turn_w), band.iter().map(|g| g.row_line(i)).collect()));
        }
    }
    lines
}

fn probes(report: &ReplayReport) -> Vec<String> {
    let rows = view::probe_rows(report);
    if rows.is_empty() {
        return Vec::new();
    }
    let names: Vec<String> = view::target_order(report).into_iter().map(|n| clip(n, 12)).collect();
    let widths: Vec<usize> = names.iter().map(|n| n.chars().count().max(4)).collect();
    let fixed = 5 + 2 + 16 + 2 + widths.iter().map(|w| w + 2).sum::<usize>();
    let question_w = WIDTH.saturating_sub(fixed).clamp(16, 48);
    let line = |after: String, question: String, expected: String, cells: Vec<String>| -> String {
        let mut s = format!("{}  {}  {}", pad_left(&after, 5), pad_right(&question, question_w), pad_right(&expected, 16));
        for (cell, w) in cells.iter().zip(&widths) {
            s.push_str("  ");
            s.push_str(&pad_right(cell, *w));
        }
        s.trim_end().to_string()
    };
    let mut lines = vec!["probes".to_string()];
    lines.push(line("after".into(), "question".into(), "expected".into(), names.clone()));
    for row in rows {
        lines.push(line(
            row.spec.after_turn.to_string(),
            clip(&row.spec.question, question_w),
            clip(&row.spec.expected, 16),
            row.results.iter().map(|p| view::probe_cell(*p).to_string()).collect(),
        ));
    }
    lines
}

fn summary(report: &ReplayReport) -> Vec<String> {
    let sums = view::summaries(report);
    let name_w = sums.iter().map(|s| s.name.chars().count().min(24)).max().unwrap_or(0);
    let mut lines = vec!["summary".to_string()];
    for s in sums {
        let mut parts = Vec::new();
        if s.golden {
            parts.push(format!("golden, {} turns", s.turns));
        } else {
            parts.push(format!("{}/{} turns exact", s.exact, s.turns));
            parts.push(match s.mean_agreement {
                Some(a) => format!("mean agreement {}", view::percent(a)),
                None => "mean agreement —".into(),
            });
        }
        if s.probes > 0 {
            parts.push(format!("probes {}/{} passed", s.probes_passed, s.probes));
        }
        if s.failed > 0 {
            parts.push(format!("{} failed", s.failed));
        }
        lines.push(format!("{}  {}", pad_right(&clip(s.name, 24), name_w), parts.join(" · ")));
    }
    lines
}

fn bisect(report: &ReplayReport) -> Vec<String> {
    let Some(b) = &report.bisect else {
        return Vec::new();
    };
    let over = match &b.profile {
        Some(profile) => format!("the toggles of {profile}: "),
        None => String::new(),
    };
    let mut lines =
        vec![format!("bisect over {over}{} (metric {}, threshold {})", clip(&view::patch_set(&b.patches), 72), b.metric, b.threshold)];
    let set_w = b.steps.iter().map(|s| view::patch_set(&s.patches).chars().count()).max().unwrap_or(0).min(60);
    let num_w = b.steps.len().to_string().len();
    for (i, s) in b.steps.iter().enumerate() {
        let set = pad_right(&clip(&view::patch_set(&s.patches), set_w), set_w);
        let verdict = if s.diverges { "diverges" } else { "ok" };
        let reused = if s.reused { "  (reused)" } else { "" };
        lines.push(format!("  {:>num_w$}. {set}  → {:.4}  {verdict}{reused}", i + 1, s.score));
    }
    lines.push(if b.culprit.is_empty() {
        "culprit: none (the full set did not diverge)".into()
    } else {
        format!("culprit: {}", view::patch_set(&b.culprit))
    });
    lines.push(format!("replays run: {} (naive: {})", b.replays_run, b.naive_replays));
    lines
}

/// Every launched configuration: how it started, what it ran, what /proc saw, where its logs are.
pub fn launches(launches: &[LaunchRecord]) -> Vec<String> {
    if launches.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!("launched configurations ({})", launches.len())];
    for l in launches {
        let state = match (&l.error, l.startup_s) {
            (Some(_), _) => "did not start".to_string(),
            (None, Some(s)) => format!("ready in {s:.1} s, pid {}, port {}", l.pid.unwrap_or(0), l.port),
            (None, None) => "started".to_string(),
        };
        lines.push(format!("  {}: {state}", l.target));
        lines.push(format!("    argv: {}", l.argv.join(" ")));
        if !l.env.is_empty() {
            let env: Vec<String> = l.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            lines.push(format!("    env:  {}", clip(&env.join(" "), 160)));
        }
        if !l.fingerprint.is_empty() {
            let libs = l.fingerprint.keys().filter(|k| k.starts_with("lib.")).count();
            let exe = l.fingerprint.get("exe").map_or("?", String::as_str);
            let build = l.fingerprint.get("exe.build_id").map(|b| format!(" (build id {})", clip(b, 16))).unwrap_or_default();
            lines.push(format!("    process: {exe}{build}, {libs} shared libraries"));
        }
        if let Some(error) = &l.error {
            lines.extend(error.lines().map(|e| format!("    error: {e}")));
        }
        if let (Some(out), Some(err)) = (&l.stdout, &l.stderr) {
            lines.push(format!("    logs: {out} {err}"));
        }
    }
    lines
}

fn pad_right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(width.saturating_sub(n)))
}

fn pad_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(width.saturating_sub(n)))
}

fn align(s: &str, width: usize, a: Align) -> String {
    match a {
        Align::Left => pad_right(s, width),
        Align::Right => pad_left(s, width),
    }
}
