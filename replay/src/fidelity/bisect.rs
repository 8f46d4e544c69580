//! Bisect by fidelity: which patches of a set make the sweep lose recall. The golden sweep runs once;
//! each subset's sweep is scored by the share of golden's recall it lost, and replay's ddmin finds a
//! 1-minimal subset scoring above the threshold.

use super::run::{sweep, FidelityReport, SweepError, SweepOptions};
use crate::bisect::{candidate, search, BisectError, Oracle};
use crate::launch;
use crate::model::{BisectReport, LaunchRecord, TargetKind, TargetSpec};
use crate::run::Endpoints;

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
    template: TargetSpec,
    endpoints: &'a Endpoints,
    options: &'a SweepOptions,
    error: Option<SweepError>,
    /// Engines started for the subsets.
    launches: Vec<LaunchRecord>,
}

impl Oracle for SweepOracle<'_> {
    async fn score(&mut self, subset: &[String]) -> Result<Option<f64>, BisectError> {
        let candidate = candidate(&self.template, subset);
        // The candidate alone: golden's recall is already known.
        match sweep(&candidate, &[], self.endpoints, self.options, &|_| {}).await {
            Ok(report) => {
                self.launches.extend(report.launches.iter().cloned());
                let mine = || report.cells.iter().filter(|c| c.target == candidate.name);
                let failed = mine().flat_map(|c| &c.answers).find(|a| a.answer.starts_with("error: "));
                if let (Some(first), true) = (failed, mine().all(|c| c.answers.iter().all(|a| a.answer.starts_with("error: ")))) {
                    let error = first.answer.trim_start_matches("error: ").to_string();
                    return Err(BisectError::CandidateFailed { target: candidate.name.clone(), error });
                }
                Ok(Some(recall_lost(&self.golden, &report, &candidate.name)))
            }
            Err(SweepError::Launch(error)) => Err(BisectError::LaunchFailed { target: candidate.name.clone(), error }),
            Err(error) => {
                self.error = Some(error);
                Ok(None)
            }
        }
    }
}

/// ddmin over `suspects` by recall lost: golden's sweep (with the launches of every subset added to
/// it) and the bisect summary. `template` is what a subset runs as: an engine target (the suspects are
/// patches) or a launch target (the suspects are its profile's toggles).
pub async fn bisect(
    golden: &TargetSpec,
    template: &TargetSpec,
    suspects: Vec<String>,
    endpoints: &Endpoints,
    options: &SweepOptions,
    threshold: f64,
) -> Result<(FidelityReport, BisectReport), SweepError> {
    let profile = match &template.kind {
        TargetKind::Launch { profile, .. } => {
            let loaded = launch::load_for(template).map_err(|e| SweepError::Launch(e.to_string()))?;
            if let Some(loaded) = loaded {
                loaded.check_toggles(&suspects).map_err(|e| SweepError::Launch(e.to_string()))?;
            }
            Some(profile.clone())
        }
        _ => None,
    };
    let golden_report = sweep(golden, &[], endpoints, options, &|_| {}).await?;
    let oracle =
        SweepOracle { golden: golden_report.clone(), template: template.clone(), endpoints, options, error: None, launches: Vec::new() };
    let (found, steps, runs, oracle) = search(oracle, threshold, &suspects).await.map_err(|e| SweepError::Bisect(e.to_string()))?;
    if let Some(error) = oracle.error {
        return Err(error);
    }
    let culprit = found.unwrap_or_default();
    let mut golden_report = golden_report;
    golden_report.launches.extend(oracle.launches);
    let report = BisectReport {
        naive_replays: suspects.len(),
        profile,
        patches: suspects,
        metric: "fidelity".into(),
        threshold,
        culprit,
        steps,
        replays_run: runs,
    };
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
            launches: Vec::new(),
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
