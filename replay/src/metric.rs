//! One number per target for "how far from golden": the metrics bisection thresholds on, also used
//! by the CLI and the reports. 0 means "like golden"; every metric but `kl` is in [0, 1]; a turn the
//! target failed while golden answered counts as fully diverged (1, for `kl` too).

use std::fmt;
use std::str::FromStr;

use crate::model::{Divergence, Outcome, ReplayReport, TurnResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// 1 - mean token agreement with golden over turns.
    Agreement,
    /// Fraction of probes failed.
    Probes,
    /// Fraction of turns not exactly equal to golden.
    Exact,
    /// Fraction of turns whose first difference is not a near tie.
    FirstDiff,
    /// Mean over turns of the top-k KL(golden || target) in nats (needs logprobs on both sides): the
    /// continuous measure that orders numerical patches by how far they move the distribution.
    Kl,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown metric `{0}`: use agreement, probes, exact, first_diff or kl")]
pub struct MetricError(pub String);

impl Metric {
    pub const ALL: [Metric; 5] = [Metric::Agreement, Metric::Probes, Metric::Exact, Metric::FirstDiff, Metric::Kl];

    /// Scores of this metric lie in [0, 1].
    pub fn is_fraction(self) -> bool {
        self != Metric::Kl
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Agreement => "agreement",
            Metric::Probes => "probes",
            Metric::Exact => "exact",
            Metric::FirstDiff => "first_diff",
            Metric::Kl => "kl",
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = MetricError;

    fn from_str(text: &str) -> Result<Metric, MetricError> {
        let wanted = text.trim().replace('-', "_");
        Metric::ALL.into_iter().find(|m| m.as_str() == wanted).ok_or_else(|| MetricError(text.to_string()))
    }
}

/// Scores `target` in `report` under `metric`. None when there is nothing to score: no probes (for
/// `probes`), or no turn golden answered and the target has a result for (the golden target itself
/// included, for the other metrics).
pub fn score(report: &ReplayReport, target: &str, metric: Metric) -> Option<f64> {
    let results = report.results.iter().filter(|r| r.target == target);
    if metric == Metric::Probes {
        let passed: Vec<bool> = results.flat_map(|r| r.probes.iter().map(|p| p.passed)).collect();
        return fraction(passed.iter().filter(|p| !**p).count(), passed.len());
    }
    if target == report.golden {
        return None;
    }
    let per_turn: Vec<f64> = results.filter(|r| golden_answered(report, r.turn)).filter_map(|r| turn_score(r, metric)).collect();
    (!per_turn.is_empty()).then(|| per_turn.iter().sum::<f64>() / per_turn.len() as f64)
}

fn golden_answered(report: &ReplayReport, turn: u32) -> bool {
    report.results.iter().any(|r| r.target == report.golden && r.turn == turn && matches!(r.outcome, Outcome::Ok(_)))
}

/// One turn's contribution (failed: 1; no comparison although both answered: skipped).
fn turn_score(result: &TurnResult, metric: Metric) -> Option<f64> {
    if let Outcome::Failed { .. } = result.outcome {
        return Some(1.0);
    }
    let d: &Divergence = result.vs_golden.as_ref()?;
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    Some(match metric {
        Metric::Agreement => 1.0 - d.agreement,
        Metric::Exact => flag(!d.exact),
        Metric::FirstDiff => flag(d.first_diff.is_some() && !d.near_tie),
        Metric::Kl => d.kl_topk?,
        Metric::Probes => 0.0,
    })
}

fn fraction(part: usize, whole: usize) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ProbeResult, ProbeSpec, Reply, REPORT_SCHEMA};

    fn reply() -> Outcome {
        Outcome::Ok(Reply {
            text: String::new(),
            tokens: Vec::new(),
            prompt_tokens: None,
            cached_tokens: None,
            completion_tokens: None,
            finish_reason: None,
            wall_ms: 0.0,
        })
    }

    fn diverged(agreement: f64, near_tie: bool) -> Divergence {
        Divergence {
            exact: agreement == 1.0,
            first_diff: (agreement < 1.0).then_some(1),
            margin_at_diff: None,
            near_tie,
            agreement,
            compared_tokens: 4,
            max_logprob_diff: None,
            mean_logprob_diff: None,
            kl_topk: None,
        }
    }

    fn result(target: &str, turn: u32, outcome: Outcome, vs_golden: Option<Divergence>, probes: &[bool]) -> TurnResult {
        let probe = ProbeSpec { after_turn: turn, question: "q".into(), expected: "a".into() };
        let probes = probes.iter().map(|p| ProbeResult { probe: probe.clone(), outcome: reply(), passed: *p }).collect();
        TurnResult { turn, target: target.into(), outcome, vs_golden, vs_captured: None, probes }
    }

    fn report(results: Vec<TurnResult>) -> ReplayReport {
        ReplayReport {
            schema: REPORT_SCHEMA,
            id: 0,
            conversation: 1,
            started_unix_ms: 0,
            finished_unix_ms: 0,
            golden: "golden".into(),
            targets: Vec::new(),
            turns: 4,
            results,
            bisect: None,
            interrupted: false,
            captured_fingerprints: Vec::new(),
            launches: Vec::new(),
        }
    }

    #[test]
    fn metrics_over_turns() {
        let failed = Outcome::Failed { error: "boom".into(), status: Some(500) };
        let r = report(vec![
            result("golden", 0, reply(), None, &[true]),
            result("golden", 1, reply(), None, &[]),
            result("golden", 2, reply(), None, &[]),
            result("golden", 3, failed.clone(), None, &[]),
            result("p", 0, reply(), Some(diverged(1.0, false)), &[false]),
            result("p", 1, reply(), Some(diverged(0.5, true)), &[]),
            result("p", 2, failed.clone(), None, &[]),
            result("p", 3, reply(), None, &[]),
        ]);
        // Turn 3 is not scored: golden failed there.
        assert_eq!(score(&r, "p", Metric::Agreement), Some((0.0 + 0.5 + 1.0) / 3.0));
        assert_eq!(score(&r, "p", Metric::Exact), Some(2.0 / 3.0));
        assert_eq!(score(&r, "p", Metric::FirstDiff), Some(1.0 / 3.0), "the near tie does not count");
        assert_eq!(score(&r, "p", Metric::Probes), Some(1.0));
        assert_eq!(score(&r, "golden", Metric::Probes), Some(0.0));
        assert_eq!(score(&r, "golden", Metric::Agreement), None);
        assert_eq!(score(&r, "absent", Metric::Exact), None);
    }

    #[test]
    fn metric_names_round_trip() {
        for m in Metric::ALL {
            assert_eq!(m.as_str().parse::<Metric>(), Ok(m));
        }
        assert_eq!("first-diff".parse::<Metric>(), Ok(Metric::FirstDiff));
        assert!("entropy".parse::<Metric>().unwrap_err().to_string().contains("agreement, probes"));
    }
}
