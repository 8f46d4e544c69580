//! Scoring: every finding attributed to the scenario whose conversation raised it, precision and
//! recall per kind, and the markdown report.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::corpus::*;
use super::support::*;
use super::{target_key, Lab, Outcome};

/// A finding as the admin API lists it, attributed to a scenario (or to none).
pub struct Found {
    scenario: Option<usize>,
    config: Config,
    endpoint: String,
    record: Value,
}

/// Every finding of every proxy, attributed to the scenario whose conversation it was raised on.
pub async fn collect(lab: &Lab, outcomes: &[Outcome]) -> Vec<Found> {
    let mut found = Vec::new();
    for (at, endpoint) in lab.endpoints.iter().enumerate() {
        endpoint.settle().await;
        for (config, admin) in &endpoint.admins {
            let records = get_json(&format!("{admin}/api/findings")).await;
            for record in records.as_array().expect("findings list") {
                let conversation = record["conversation"].as_u64();
                let mine = |o: &Outcome| {
                    o.endpoint == at && conversation.is_some_and(|c| o.conversations.get(config).is_some_and(|cs| cs.contains(&c)))
                };
                let scenario = outcomes.iter().position(mine);
                found.push(Found { scenario, config: *config, endpoint: endpoint.label.clone(), record: record.clone() });
            }
        }
    }
    found
}

/// Kind -> (expected, found, TP, FP, FN) over scenarios in one configuration; plus the problems
/// worth failing on.
pub struct Score {
    config: Config,
    rows: BTreeMap<&'static str, [usize; 5]>,
    /// The same, per cause of `history_dropped` (expected: `expect_cause`; found: a finding naming it).
    causes: BTreeMap<&'static str, [usize; 5]>,
    pub problems: Vec<String>,
}

pub fn score(config: Config, scenarios: &[&Scenario], outcomes: &[Outcome], found: &[Found]) -> Score {
    let mut rows: BTreeMap<&'static str, [usize; 5]> = KINDS.iter().map(|k| (*k, [0; 5])).collect();
    let mut causes: BTreeMap<&'static str, [usize; 5]> = CAUSES.iter().map(|k| (*k, [0; 5])).collect();
    let mut problems = Vec::new();
    let found: Vec<&Found> = found.iter().filter(|f| f.config == config).collect();
    let at = config.name();
    for (i, (scenario, outcome)) in scenarios.iter().zip(outcomes).enumerate() {
        let mine: Vec<&Value> = found.iter().filter(|f| f.scenario == Some(i)).map(|f| &f.record).collect();
        let kinds: BTreeSet<String> = mine.iter().filter_map(|r| r["kind"].as_str()).map(str::to_string).collect();
        let expect = scenario.expected(config);
        for kind in KINDS {
            let (expected, raised) = (expect.contains(kind), kinds.contains(kind));
            let row = rows.get_mut(kind).unwrap();
            row[0] += usize::from(expected);
            row[1] += usize::from(raised);
            match (expected, raised) {
                (true, true) => row[2] += 1,
                (false, true) => {
                    row[3] += 1;
                    for r in mine.iter().filter(|r| r["kind"] == kind) {
                        problems.push(format!(
                            "false positive in {} ({at}): {kind}\n```json\n{}\n```",
                            outcome.name,
                            serde_json::to_string_pretty(r).unwrap()
                        ));
                    }
                }
                (true, false) => {
                    row[4] += 1;
                    problems.push(format!(
                        "missed in {} ({at}): {kind} (found: {kinds:?}; conversations {:?})",
                        outcome.name,
                        outcome.conversations.get(&config)
                    ));
                }
                (false, false) => {}
            }
        }
        let named: BTreeSet<&str> =
            mine.iter().filter(|r| r["kind"] == "history_dropped").filter_map(|r| r["evidence"]["cause"].as_str()).collect();
        let expected_cause = scenario.expect_cause.get("history_dropped").filter(|_| expect.contains("history_dropped"));
        for cause in CAUSES {
            let (expected, raised) = (expected_cause.is_some_and(|c| c == cause), named.contains(cause));
            let row = causes.get_mut(cause).unwrap();
            row[0] += usize::from(expected);
            row[1] += usize::from(raised);
            row[2] += usize::from(expected && raised);
            row[3] += usize::from(!expected && raised);
            row[4] += usize::from(expected && !raised);
        }
        if let (Some(want), Some(got)) = (scenario.expect_conversations, outcome.conversations.get(&config)) {
            if got.len() != want {
                problems.push(format!("{} ({at}): threaded into {} conversation(s) {got:?}, expected {want}", outcome.name, got.len()));
            }
        }
        for (kind, cause) in &scenario.expect_cause {
            for r in mine.iter().filter(|r| r["kind"] == kind.as_str() && r["evidence"]["cause"] != cause.as_str()) {
                problems.push(format!(
                    "{} ({at}): {kind} names cause {} instead of {cause:?}\n```json\n{r}\n```",
                    outcome.name, r["evidence"]["cause"]
                ));
            }
        }
    }
    for f in found.iter().filter(|f| f.scenario.is_none()) {
        let kind = KINDS.iter().find(|k| f.record["kind"] == **k).copied().unwrap_or("unknown");
        if let Some(row) = rows.get_mut(kind) {
            row[1] += 1;
            row[3] += 1;
        }
        problems.push(format!(
            "finding on no scenario's conversation ({}, {at}): {kind}\n```json\n{}\n```",
            f.endpoint,
            serde_json::to_string_pretty(&f.record).unwrap()
        ));
    }
    // Cross-talk: no conversation may hold turns of two scenarios.
    for (i, a) in outcomes.iter().enumerate() {
        for b in &outcomes[i + 1..] {
            let (ca, cb) = (a.conversations.get(&config), b.conversations.get(&config));
            let shared: Vec<_> = ca.zip(cb).map(|(x, y)| x.intersection(y).collect()).unwrap_or_default();
            if a.endpoint == b.endpoint && !shared.is_empty() {
                problems.push(format!("{} and {} were threaded into the same conversation(s) {shared:?} ({at})", a.name, b.name));
            }
        }
    }
    Score { config, rows, causes, problems }
}

pub fn ratio(num: usize, den: usize) -> String {
    if den == 0 {
        "n/a".into()
    } else {
        format!("{:.2}", num as f64 / den as f64)
    }
}

pub fn report(lab: &Lab, scenarios: &[&Scenario], outcomes: &[Outcome], found: &[Found], scores: &[Score], seconds: f64) -> String {
    let mut out = String::from("# Scenario corpus: findings against labeled causes\n\n");
    out += &format!("{} scenarios run in {seconds:.0} s (`cargo test --test scenarios`).\n", outcomes.len());
    for note in &lab.skipped {
        out += &format!("\n**Skipped:** {note}.\n");
    }
    out += "\n## Per kind\n\nCounted per scenario: expected = scenarios labeled with the kind, found = scenarios (and unattributed findings) where it was raised. ";
    out += "The same traffic goes through a chain of proxies, one per configuration: with no count of the prompt (no tokenizer) and with the served model's tokenizer (exact).\n";
    for score in scores {
        let config = score.config;
        out += &format!("\n### {}\n\n", config.name());
        out += "| kind | scenarios | expected | found | TP | FP | FN | precision | recall |\n|---|---|---|---|---|---|---|---|---|\n";
        let mut total = [0usize; 5];
        for (kind, row) in &score.rows {
            let names: Vec<&str> =
                scenarios.iter().zip(outcomes).filter(|(s, _)| s.expected(config).contains(*kind)).map(|(_, o)| o.name.as_str()).collect();
            let [e, f, tp, fp, fnn] = *row;
            out += &format!(
                "| {kind} | {} | {e} | {f} | {tp} | {fp} | {fnn} | {} | {} |\n",
                names.join(", "),
                ratio(tp, tp + fp),
                ratio(tp, tp + fnn)
            );
            total.iter_mut().zip(row).for_each(|(t, r)| *t += r);
        }
        let [e, f, tp, fp, fnn] = total;
        out += &format!(
            "| **all** | {} | {e} | {f} | {tp} | {fp} | {fnn} | {} | {} |\n",
            outcomes.len(),
            ratio(tp, tp + fp),
            ratio(tp, tp + fnn)
        );
    }
    out += "\n## history_dropped by cause\n\nCounted per scenario: expected = scenarios labeled with the cause (`expect_cause`), found = scenarios whose `history_dropped` finding named it.\n";
    for score in scores {
        out += &format!(
            "\n### {}\n\n| cause | expected | found | TP | FP | FN | precision | recall |\n|---|---|---|---|---|---|---|---|\n",
            score.config.name()
        );
        for (cause, [e, f, tp, fp, fnn]) in &score.causes {
            out += &format!("| {cause} | {e} | {f} | {tp} | {fp} | {fnn} | {} | {} |\n", ratio(*tp, tp + fp), ratio(*tp, tp + fnn));
        }
    }
    out += "\n## Per scenario (exact tokenizer)\n\n| scenario | target | conversations | expected | raised | refused | seconds |\n|---|---|---|---|---|---|---|\n";
    for (i, (scenario, o)) in scenarios.iter().zip(outcomes).enumerate() {
        let raised: BTreeMap<String, usize> =
            found.iter().filter(|f| f.scenario == Some(i) && f.config == Config::Exact).fold(BTreeMap::new(), |mut m, f| {
                *m.entry(f.record["kind"].as_str().unwrap_or("?").to_string()).or_default() += 1;
                m
            });
        let raised: Vec<String> = raised.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        let expect: Vec<&str> = scenario.expect.iter().map(String::as_str).collect();
        out += &format!(
            "| {} | {} ({}) | {} | {} | {} | {} | {:.1} |\n",
            o.name,
            target_key(o.target),
            lab.endpoints[o.endpoint].label,
            o.conversations.get(&Config::Exact).map_or(0, BTreeSet::len),
            if expect.is_empty() { "none".into() } else { expect.join(", ") },
            if raised.is_empty() { "none".into() } else { raised.join(", ") },
            o.refused.as_deref().unwrap_or("no"),
            o.seconds
        );
    }
    out += "\n## Evidence\n\n";
    for (scenario, o) in scenarios.iter().zip(outcomes) {
        let reply: String = o.last_reply.chars().take(100).collect();
        out += &format!(
            "- **{}**: {} Prompt tokens engine/local/cached per step: {}. Last reply: {reply:?}.\n",
            o.name,
            scenario.description,
            o.usage.join(", ")
        );
        for note in &o.notes {
            out += &format!("  - {note}\n");
        }
    }
    for f in found.iter().filter(|f| f.scenario.is_some()) {
        let name = &outcomes[f.scenario.unwrap()].name;
        let how = format!(
            "{}, {}",
            f.record["evidence"]["method"].as_str().unwrap_or("?"),
            f.record["evidence"]["confidence"].as_str().unwrap_or("?")
        );
        out += &format!(
            "- {name} ({}): `{}` {} ({how})\n",
            f.config.name(),
            f.record["kind"].as_str().unwrap_or("?"),
            f.record["summary"].as_str().unwrap_or("")
        );
    }
    out += "\n## Problems\n\n";
    let problems: Vec<&String> = scores.iter().flat_map(|s| &s.problems).collect();
    if problems.is_empty() {
        out += "None: every injected cause was found and clean traffic raised nothing, in every configuration.\n";
    }
    for p in problems {
        out += &format!("- {p}\n");
    }
    out
}
