//! Bisect by fidelity: which patches of a set make the sweep lose recall. The golden sweep runs once;
//! each subset's sweep is scored by the share of golden's recall it lost, and replay's ddmin finds a
//! 1-minimal subset scoring above the threshold.

use super::run::{sweep, FidelityReport, SweepError, SweepOptions};
use crate::bisect::{search, BisectError, Oracle};
use crate::model::{BisectReport, TargetSpec};

/// Share of golden's recall that `candidate` lost over the same conversations (0 when golden recalls
/// nothing).
pub fn recall_lost(golden: &FidelityReport, candidate: &FidelityReport, target: &str) -> f64 {
    let total = |r: &FidelityReport, name: &str| r.cells.iter().filter(|c| c.target == name).map(|c| c.recall).sum::<f64>();
    let golden_total = total(golden, &golden.targets[0]);
    if golden_total <= 0.0 {
        return 0.0;
    }
    ((golden_total - total(candidate, target)) / golden_total).max(0.0)
}

struct SweepOracle<'a> {
    golden: FidelityReport,
    golden_spec: TargetSpec,
    engine_url: Option<&'a str>,
    options: &'a SweepOptions,
    error: Option<SweepError>,
}

impl Oracle for SweepOracle<'_> {
    async fn score(&mut self, subset: &[String]) -> Result<Option<f64>, BisectError> {
        let candidate = TargetSpec::engine(subset.to_vec(), None, None);
        match sweep(&self.golden_spec, std::slice::from_ref(&candidate), self.engine_url, self.options, &|_| {}).await {
            Ok(report) => {
                let mine = || report.cells.iter().filter(|c| c.target == candidate.name);
                let failed = mine().flat_map(|c| &c.answers).find(|a| a.answer.starts_with("error: "));
                if let (Some(first), true) = (failed, mine().all(|c| c.answers.iter().all(|a| a.answer.starts_with("error: ")))) {
                    let error = first.answer.trim_start_matches("error: ").to_string();
                    return Err(BisectError::CandidateFailed { target: candidate.name.clone(), error });
                }
                Ok(Some(recall_lost(&self.golden, &report, &candidate.name)))
            }
            Err(error) => {
                self.error = Some(error);
                Ok(None)
            }
        }
    }
}

/// Runs the golden sweep, then bisects `patches` on this engine; returns the golden sweep and the
/// bisection (metric `fidelity`: share of golden's recall lost).
pub async fn bisect(
    golden: &TargetSpec,
    patches: Vec<String>,
    engine_url: Option<&str>,
    options: &SweepOptions,
    threshold: f64,
) -> Result<(FidelityReport, BisectReport), SweepError> {
    let golden_report = sweep(golden, &[], engine_url, options, &|_| {}).await?;
    let oracle = SweepOracle { golden: golden_report.clone(), golden_spec: golden.clone(), engine_url, options, error: None };
    let (found, steps, runs, oracle) = search(oracle, threshold, &patches).await.map_err(|e| SweepError::Bisect(e.to_string()))?;
    if let Some(error) = oracle.error {
        return Err(error);
    }
    let culprit = found.unwrap_or_default();
    let report =
        BisectReport { naive_replays: patches.len(), patches, metric: "fidelity".into(), threshold, culprit, steps, replays_run: runs };
    Ok((golden_report, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fidelity::Cell;

    fn report(target: &str, recalls: &[f64]) -> FidelityReport {
        let cell = |recall: f64| Cell {
            target: target.into(),
            length: 1,
            turns: 1,
            depth: 0.0,
            recall,
            golden: 0.0,
            prompt_tokens: None,
            answers: Vec::new(),
        };
        FidelityReport {
            seed: 0,
            targets: vec![target.into()],
            lengths: vec![1],
            turns: vec![1],
            depths: vec![0.0],
            cells: recalls.iter().map(|r| cell(*r)).collect(),
            conversations: Vec::new(),
            wall_s: 0.0,
        }
    }

    #[test]
    fn recall_lost_is_the_share_of_golden_recall_missing() {
        let golden = report("golden", &[0.4, 0.4]);
        assert!((recall_lost(&golden, &report("engine:x", &[0.2, 0.2]), "engine:x") - 0.5).abs() < 1e-9);
        assert_eq!(recall_lost(&golden, &report("engine:x", &[0.6, 0.4]), "engine:x"), 0.0);
        assert_eq!(recall_lost(&report("golden", &[0.0]), &report("engine:x", &[0.0]), "engine:x"), 0.0);
    }
}
