//! One home for long runs: a [`Job`] is a replay or a bisect (over this engine's patches or over a
//! launch profile's toggles), checked the same way and run the same way whether the CLI or the web UI
//! asked for it; launch targets are started and stopped by [`crate::launch`] inside either.

use std::path::{Path, PathBuf};

use tokio::sync::watch;

use crate::bisect::{bisect, candidate, template, BisectError};
use crate::launch::{self, Profile};
use crate::metric::Metric;
use crate::model::{ReplayReport, TargetKind, TargetSpec};
use crate::run::{Endpoints, Observer, Plan, PlanError};

/// What a bisect searches.
#[derive(Debug, Clone, PartialEq)]
pub enum Suspects {
    /// This engine's patches (`kv_fp8`, `ctx_shift=256`).
    Patches(Vec<String>),
    /// The toggles of a launch profile, each configuration a launch of the operator's engine.
    Toggles { profile: PathBuf, toggles: Vec<String> },
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("{0}")]
    Profile(String),
    #[error("launch profile {path} was not given to this process with --profile (given: {given}); the web UI may only launch those")]
    ProfileNotAllowed { path: String, given: String },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Bisect(#[from] BisectError),
}

impl Suspects {
    /// From `--patches LIST`, or `--profile FILE` with `--toggles LIST` (exactly one of the two); the
    /// profile is loaded and the toggles checked against it.
    pub fn from_flags(patches: Option<&str>, profile: Option<&Path>, toggles: Option<&str>) -> Result<Suspects, JobError> {
        match (patches, profile, toggles) {
            (Some(list), None, None) => {
                let patches = split_list(list);
                if patches.is_empty() {
                    return Err(JobError::Usage("--patches needs at least one patch (see `ctxscope patches`)"));
                }
                Ok(Suspects::Patches(patches))
            }
            (None, Some(profile), Some(list)) => {
                let toggles = split_list(list);
                if toggles.is_empty() {
                    return Err(JobError::Usage("--toggles needs at least one toggle of the profile"));
                }
                let loaded = Profile::load(profile).map_err(|e| JobError::Profile(e.to_string()))?;
                loaded.check_toggles(&toggles).map_err(|e| JobError::Profile(e.to_string()))?;
                Ok(Suspects::Toggles { profile: profile.to_path_buf(), toggles })
            }
            (None, Some(_), None) => Err(JobError::Usage("--profile needs --toggles a,b,c: the profile's toggles to bisect over")),
            (None, None, Some(_)) => Err(JobError::Usage("--toggles needs --profile FILE: the launch profile they belong to")),
            (None, None, None) => Err(JobError::Usage("give the suspects: --patches LIST (this engine) or --profile FILE --toggles LIST")),
            (Some(_), _, _) => Err(JobError::Usage("give either --patches (this engine) or --profile with --toggles, not both")),
        }
    }

    /// The names searched.
    pub fn names(&self) -> Vec<String> {
        match self {
            Suspects::Patches(list) | Suspects::Toggles { toggles: list, .. } => list.clone(),
        }
    }

    /// The golden target when none is given: the profile without toggles, or this engine.
    pub fn default_golden(&self) -> String {
        match self {
            Suspects::Patches(_) => "engine".into(),
            Suspects::Toggles { profile, .. } => format!("launch={}", profile.display()),
        }
    }

    /// The target a subset runs as (the subset fills in its patches or toggles).
    pub fn template(&self) -> TargetSpec {
        match self {
            Suspects::Patches(_) => TargetSpec::engine(Vec::new(), None, None),
            Suspects::Toggles { profile, .. } => TargetSpec::launch(&profile.display().to_string(), Vec::new()),
        }
    }
}

/// `a, b=1,,c` -> `["a", "b=1", "c"]`.
pub fn split_list(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// What a job does with its plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Replay every target (continuing `resume` when given).
    Replay { resume: Option<Box<ReplayReport>> },
    /// Find the smallest subset of the suspects that diverges.
    Bisect { suspects: Suspects, metric: Metric, threshold: f64 },
}

/// A long run.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub plan: Plan,
    pub work: Work,
}

impl Job {
    /// A bisect's job: a bisect over toggles runs its subsets as launches of the profile.
    pub fn bisect(mut plan: Plan, suspects: Suspects, metric: Metric, threshold: f64) -> Job {
        if let Suspects::Toggles { .. } = suspects {
            plan.targets = vec![suspects.template()];
        }
        Job { plan, work: Work::Bisect { suspects, metric, threshold } }
    }

    /// Checks every launch target's profile (and, with `allowed`, that it is one of those: the web UI
    /// may launch only profiles the operator gave the process at start).
    pub fn check(&self, allowed: Option<&[PathBuf]>) -> Result<(), JobError> {
        for target in &self.targets() {
            let TargetKind::Launch { profile, .. } = &target.kind else { continue };
            if let Some(allowed) = allowed {
                if !allowed.iter().any(|a| same_file(a, Path::new(profile))) {
                    let given = allowed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                    return Err(JobError::ProfileNotAllowed {
                        path: profile.clone(),
                        given: if given.is_empty() { "none".into() } else { given },
                    });
                }
            }
            launch::load_for(target)?;
        }
        Ok(())
    }

    /// Every target the job may run: the plan's, and a bisect's full suspect set.
    fn targets(&self) -> Vec<TargetSpec> {
        let mut targets = self.plan.all_targets();
        if let Work::Bisect { suspects, .. } = &self.work {
            targets.push(candidate(&template(&self.plan), &suspects.names()));
        }
        targets
    }

    /// Whether a target needs this engine in-process (an engine target without a URL).
    pub fn needs_engine(&self) -> bool {
        self.targets().iter().any(|t| matches!(&t.kind, TargetKind::Engine { url: None, .. }))
    }

    /// Runs the job (see the module doc).
    pub async fn run(
        &self,
        endpoints: &Endpoints,
        observer: &dyn Observer,
        cancel: watch::Receiver<bool>,
    ) -> Result<ReplayReport, JobError> {
        // Profiles are loaded and toggles checked again before anything starts, by the replay and
        // the bisect themselves; `check` is for callers that want to refuse early (or apply an
        // allow-list).
        match &self.work {
            Work::Replay { resume } => Ok(launch::replay(&self.plan, endpoints, observer, cancel, resume.as_deref()).await?),
            Work::Bisect { suspects, metric, threshold } => {
                Ok(bisect(&self.plan, endpoints, suspects.names(), *metric, *threshold, observer, cancel).await?)
            }
        }
    }
}

/// Whether two paths name the same file (as written, else canonically).
fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_come_from_exactly_one_kind_of_flag() {
        assert_eq!(Suspects::from_flags(Some("a, b=1,,c"), None, None).unwrap(), Suspects::Patches(split_list("a,b=1,c")));
        for (patches, profile, toggles, expected) in [
            (None, None, None, "give the suspects"),
            (Some("a"), Some(Path::new("p.toml")), Some("x"), "not both"),
            (None, Some(Path::new("p.toml")), None, "needs --toggles"),
            (None, None, Some("x"), "needs --profile"),
            (Some(" , "), None, None, "at least one patch"),
            (None, Some(Path::new("/nonexistent/p.toml")), Some("x"), "cannot read launch profile"),
        ] {
            let e = Suspects::from_flags(patches, profile, toggles).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn a_toggle_bisect_runs_its_subsets_as_launches_and_names_the_profile_golden() {
        let suspects = Suspects::Toggles { profile: "deploy/x.toml".into(), toggles: vec!["a".into()] };
        assert_eq!(suspects.default_golden(), "launch=deploy/x.toml");
        let plan = Plan::new(crate::conversation::tests::detail(1), TargetSpec::parse("launch=deploy/x.toml").unwrap());
        let job = Job::bisect(plan, suspects, Metric::Agreement, 0.2);
        assert_eq!(job.plan.targets, vec![TargetSpec::launch("deploy/x.toml", vec![])]);
        assert!(!job.needs_engine());
        let e = job.check(Some(&[PathBuf::from("deploy/y.toml")])).unwrap_err().to_string();
        assert!(e.contains("was not given to this process with --profile"), "{e}");
    }
}
