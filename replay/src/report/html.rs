//! The HTML report: one self-contained file (inline CSS and SVG; no script, font or stylesheet from
//! elsewhere) that opens from disk or an attachment. Sections: header, divergence chart, per-turn
//! table, per-target summary, first divergent tokens in context, probes, bisect path.

use super::chart::{self, chart};
use super::context::context;
use super::view::{self, clip, escape};
use crate::model::{Outcome, ReplayReport, TargetKind, TargetSpec};
use std::fmt::Write as _;

const CSS: &str = "
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:16px 0 4px}
table{border-collapse:collapse;margin:4px 0}th,td{padding:2px 8px;border:1px solid #ddd;text-align:left;vertical-align:top}
thead th{background:#f4f4f4}.wide{overflow-x:auto}table.turns td,table.turns th{white-space:nowrap}td a{color:inherit}td.num{text-align:right;font-variant-numeric:tabular-nums}
.eq{color:#1a7f37}.ne{color:#b42318;font-weight:600}.tie{color:#9a6700}
td.err,.fail{background:#fdecea;color:#b42318}.pass{background:#e9f6ec;color:#1a7f37}
.swatch{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px}
code,.toks{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.toks{white-space:pre-wrap;word-break:break-word}
.tok{white-space:pre;border:1px solid #e2e2e2;border-radius:3px;padding:0 1px;margin-right:1px}
mark{background:#ffd84d;color:#000;border-color:#c9a400}mark.end{font-style:italic}
.more{color:#999}.note,.alts{color:#555;margin:2px 0}
ol.bisect li.diverges{color:#b42318}ol.bisect li.culprit-step{font-weight:700}
.culprit mark{padding:1px 6px;font-weight:700}
.badge{background:#b42318;color:#fff;border-radius:3px;padding:1px 6px;font-size:12px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:0}dt{color:#555}dd{margin:0}
";

/// The whole report as one HTML document.
pub fn html(report: &ReplayReport) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ctxscope replay #{} · conversation #{}</title><style>{CSS}</style></head><body>\n",
        report.id, report.conversation
    );
    header(&mut s, report);
    s.push_str("<h2>Divergence from golden</h2>\n");
    s.push_str(&chart(report));
    s.push_str("\n<h2>Turns</h2>\n");
    turns_table(&mut s, report);
    summary(&mut s, report);
    divergences(&mut s, report);
    probes(&mut s, report);
    bisect(&mut s, report);
    launches(&mut s, report);
    s.push_str("</body></html>\n");
    s
}

fn header(s: &mut String, report: &ReplayReport) {
    let _ = write!(s, "<h1>Replay #{} of conversation #{}", report.id, report.conversation);
    if report.interrupted {
        s.push_str(r#" <span class="badge">interrupted: partial</span>"#);
    }
    s.push_str("</h1>\n<dl>");
    let rows = [
        ("conversation", format!("#{}", report.conversation)),
        ("turns", report.turns.to_string()),
        ("golden", escape(&report.golden)),
        ("started", view::utc(report.started_unix_ms)),
        ("finished", view::utc(report.finished_unix_ms)),
        ("took", view::duration(report)),
        ("schema", report.schema.to_string()),
    ];
    for (k, v) in rows {
        let _ = write!(s, "<dt>{k}</dt><dd>{v}</dd>");
    }
    s.push_str("</dl>\n<h2>Targets</h2>\n<table class=\"targets\"><thead><tr><th>name</th><th>spec</th><th>kind</th><th>model</th></tr></thead><tbody>\n");
    for t in &report.targets {
        let golden = if t.name == report.golden { " <em>(golden)</em>" } else { "" };
        let _ = writeln!(
            s,
            "<tr><td>{}{}{golden}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            swatch(report, &t.name),
            escape(&t.name),
            escape(&t.spec),
            escape(&kind(t)),
            escape(t.model.as_deref().unwrap_or("as captured"))
        );
    }
    s.push_str("</tbody></table>\n");
}

fn kind(t: &TargetSpec) -> String {
    match &t.kind {
        TargetKind::Engine { patches, path, url } => format!(
            "engine, patches [{}]{}{}",
            patches.join(", "),
            path.as_ref().map(|p| format!(", path {p}")).unwrap_or_default(),
            url.as_ref().map_or_else(|| ", in-process".to_string(), |u| format!(", at {u}"))
        ),
        TargetKind::Url { url } => format!("OpenAI-compatible endpoint {url}"),
        TargetKind::Launch { profile, toggles } => {
            let on = if toggles.is_empty() { "no toggles".to_string() } else { format!("toggles [{}]", toggles.join(", ")) };
            format!("launched from {profile}, {on}")
        }
    }
}

/// The chart colour of a non-golden target as a small square; nothing for golden.
fn swatch(report: &ReplayReport, name: &str) -> String {
    let others = view::target_order(report).into_iter().filter(|n| *n != report.golden);
    match others.enumerate().find(|(_, n)| *n == name) {
        Some((i, _)) => format!(r#"<span class="swatch" style="background:{}"></span>"#, chart::colour(i)),
        None => String::new(),
    }
}

/// The anchor of one (target, turn) divergence in the context section.
fn anchor(target_index: usize, turn: u32) -> String {
    format!("div-{target_index}-{turn}")
}

fn turns_table(s: &mut String, report: &ReplayReport) {
    let turns = view::turns(report);
    if turns.is_empty() {
        s.push_str("<p>No turns were replayed.</p>\n");
        return;
    }
    let order = view::target_order(report);
    let span = |name: &str| if name == report.golden { 2 } else { 5 };
    s.push_str("<div class=\"wide\"><table class=\"turns\"><thead><tr><th rowspan=\"2\">turn</th>");
    for name in &order {
        let _ = write!(s, r#"<th colspan="{}">{}{}</th>"#, span(name), swatch(report, name), escape(name));
    }
    s.push_str("</tr><tr>");
    for name in &order {
        if *name != report.golden {
            s.push_str("<th>vs golden</th><th>agree</th><th>KL</th>");
        }
        s.push_str("<th>prompt/cached</th><th>vs captured</th>");
    }
    s.push_str("</tr></thead><tbody>\n");
    for &turn in &turns {
        let _ = write!(s, r#"<tr><td class="num">{turn}</td>"#);
        for (i, name) in order.iter().enumerate() {
            let Some(r) = view::result(report, turn, name) else {
                let _ = write!(s, r#"<td colspan="{}"></td>"#, span(name));
                continue;
            };
            match &r.outcome {
                Outcome::Failed { error, status } => {
                    let _ = write!(
                        s,
                        r#"<td class="err" colspan="{}" title="{}">ERR {}</td>"#,
                        span(name),
                        escape(&clip(error, 500)),
                        escape(&clip(&view::failure(error, *status), 60))
                    );
                }
                Outcome::Ok(reply) => {
                    if *name != report.golden {
                        match &r.vs_golden {
                            Some(d) => {
                                let class = if d.exact {
                                    "eq"
                                } else if d.near_tie {
                                    "tie"
                                } else {
                                    "ne"
                                };
                                let cell = escape(&view::diff_cell(d));
                                let cell = if d.exact { cell } else { format!(r##"<a href="#{}">{cell}</a>"##, anchor(i, turn)) };
                                let _ = write!(
                                    s,
                                    r#"<td class="{class}">{cell}</td><td class="num">{}</td><td class="num">{}</td>"#,
                                    view::percent(d.agreement),
                                    view::kl_cell(d)
                                );
                            }
                            None => s.push_str("<td>—</td><td>—</td><td>—</td>"),
                        }
                    }
                    let captured = r.vs_captured.as_ref();
                    let class = if captured.is_some_and(|m| m.exact) { "num eq" } else { "num" };
                    let _ = write!(
                        s,
                        r#"<td class="num">{}</td><td class="{class}">{}</td>"#,
                        view::tokens_cell(reply),
                        view::captured_cell(captured)
                    );
                }
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
}

fn summary(s: &mut String, report: &ReplayReport) {
    s.push_str("<h2>Summary</h2>\n<table class=\"summary\"><thead><tr><th>target</th><th>turns exact</th><th>mean agreement</th><th>probes passed</th><th>failed turns</th></tr></thead><tbody>\n");
    for t in view::summaries(report) {
        let (exact, agreement) = if t.golden {
            ("golden".to_string(), "—".to_string())
        } else {
            (format!("{}/{}", t.exact, t.turns), t.mean_agreement.map_or_else(|| "—".into(), view::percent))
        };
        let probes = if t.probes > 0 { format!("{}/{}", t.probes_passed, t.probes) } else { "—".into() };
        let _ = write!(
            s,
            r#"<tr><td>{}{}</td><td class="num">{exact}</td><td class="num">{agreement}</td><td class="num">{probes}</td><td class="num">{}</td></tr>"#,
            swatch(report, t.name),
            escape(t.name),
            t.failed
        );
        s.push('\n');
    }
    s.push_str("</tbody></table>\n");
}

fn divergences(s: &mut String, report: &ReplayReport) {
    s.push_str("<h2>First divergent tokens</h2>\n");
    let mut any = false;
    for (i, name) in view::target_order(report).into_iter().enumerate() {
        if name == report.golden {
            continue;
        }
        for r in report.results.iter().filter(|r| r.target == name) {
            let (Some(d), Outcome::Ok(reply)) = (&r.vs_golden, &r.outcome) else { continue };
            if d.exact {
                continue;
            }
            let Some(Outcome::Ok(golden)) = view::result(report, r.turn, &report.golden).map(|g| &g.outcome) else {
                continue;
            };
            any = true;
            let _ = write!(
                s,
                r#"<div class="case" id="{}"><h3>{} · turn {} · {} · agreement {}</h3>"#,
                anchor(i, r.turn),
                escape(name),
                r.turn,
                escape(&view::diff_cell(d)),
                view::percent(d.agreement)
            );
            s.push_str(&context(&report.golden, golden, name, reply, d));
            s.push_str("</div>\n");
        }
    }
    if !any {
        s.push_str("<p>Every reply matched golden (or could not be compared).</p>\n");
    }
}

fn probes(s: &mut String, report: &ReplayReport) {
    let rows = view::probe_rows(report);
    if rows.is_empty() {
        return;
    }
    let order = view::target_order(report);
    s.push_str("<h2>Probes</h2>\n<table class=\"probes\"><thead><tr><th>after turn</th><th>question</th><th>expected</th>");
    for name in &order {
        let _ = write!(s, "<th>{}{}</th>", swatch(report, name), escape(name));
    }
    s.push_str("</tr></thead><tbody>\n");
    for row in rows {
        let _ = write!(
            s,
            r#"<tr><td class="num">{}</td><td>{}</td><td><code>{}</code></td>"#,
            row.spec.after_turn,
            escape(&row.spec.question),
            escape(&row.spec.expected)
        );
        for p in &row.results {
            let cell = view::probe_cell(*p);
            let class = match cell {
                "pass" => "pass",
                "FAIL" | "ERR" => "fail",
                _ => "",
            };
            let answer = match p.map(|p| &p.outcome) {
                Some(Outcome::Ok(reply)) => clip(&reply.text, 300),
                Some(Outcome::Failed { error, status }) => view::failure(error, *status),
                None => String::new(),
            };
            let _ = write!(s, r#"<td class="{class}" title="{}">{cell}</td>"#, escape(&answer));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
}

/// Every launched configuration: argv, environment, start-up, process, error, logs.
fn launches(s: &mut String, report: &ReplayReport) {
    if report.launches.is_empty() {
        return;
    }
    s.push_str("<h2>Launched configurations</h2>\n<table class=\"launches\"><thead><tr><th>configuration</th><th>ready</th><th>argv</th><th>environment</th><th>process</th><th>logs</th></tr></thead><tbody>\n");
    for l in &report.launches {
        let ready = match (&l.error, l.startup_s) {
            (Some(e), _) => format!("<span class=\"badge\">did not start</span><pre>{}</pre>", escape(e)),
            (None, Some(t)) => format!("{t:.1} s (pid {})", l.pid.unwrap_or(0)),
            (None, None) => String::new(),
        };
        let env: Vec<String> = l.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let libs = l.fingerprint.keys().filter(|k| k.starts_with("lib.")).count();
        let process = l.fingerprint.get("exe").map(|exe| format!("{} · {libs} libraries", escape(exe))).unwrap_or_default();
        let logs = [&l.stdout, &l.stderr].iter().filter_map(|p| p.as_deref()).map(escape).collect::<Vec<_>>().join("<br>");
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{ready}</td><td><code>{}</code></td><td><code>{}</code></td><td>{process}</td><td>{logs}</td></tr>",
            escape(&l.target),
            escape(&l.argv.join(" ")),
            escape(&env.join(" "))
        );
    }
    s.push_str("</tbody></table>\n");
}

fn bisect(s: &mut String, report: &ReplayReport) {
    let Some(b) = &report.bisect else { return };
    let _ = write!(
        s,
        "<h2>Bisect</h2>\n<p>Over {}<code>{}</code>, metric <code>{}</code>, threshold {}.</p>\n<ol class=\"bisect\">\n",
        b.profile.as_ref().map(|p| format!("the toggles of <code>{}</code>: ", escape(p))).unwrap_or_default(),
        escape(&view::patch_set(&b.patches)),
        escape(&b.metric),
        b.threshold
    );
    for step in &b.steps {
        let mut classes = vec![if step.diverges { "diverges" } else { "ok" }];
        if !b.culprit.is_empty() && step.patches == b.culprit {
            classes.push("culprit-step");
        }
        let _ = writeln!(
            s,
            "<li class=\"{}\"><code>{}</code> → {:.4} · {}{}</li>",
            classes.join(" "),
            escape(&view::patch_set(&step.patches)),
            step.score,
            if step.diverges { "diverges" } else { "ok" },
            if step.reused { " · reused" } else { "" }
        );
    }
    s.push_str("</ol>\n");
    if b.culprit.is_empty() {
        s.push_str("<p class=\"culprit\">culprit: none (the full set did not diverge)</p>\n");
    } else {
        let _ = writeln!(s, "<p class=\"culprit\">culprit: <mark>{}</mark></p>", escape(&view::patch_set(&b.culprit)));
    }
    let _ = writeln!(s, "<p>replays run: {} (naive: {})</p>", b.replays_run, b.naive_replays);
}
