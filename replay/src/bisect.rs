//! Which patches make a conversation diverge: delta debugging (Zeller's ddmin) over the patch list
//! finds a 1-minimal subset whose replay scores above a threshold against golden. Golden is replayed
//! once and reused; subsets are memoized (order-insensitive), reused answers recorded as such.

use std::collections::BTreeMap;

use tokio::sync::watch;

use crate::launch::replay;
use crate::metric::{score, Metric};
use crate::model::{BisectReport, BisectStep, Outcome, ReplayReport, TargetKind, TargetSpec};
use crate::run::{merge, Endpoints, Observer, Plan, PlanError};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BisectError {
    #[error("nothing to bisect: give at least one patch")]
    NoPatches,
    #[error("patch `{0}` is listed twice")]
    DuplicatePatch(String),
    #[error("the `probes` metric needs probes: add at least one")]
    NoProbes,
    #[error("threshold must be a number in [0, 1) (any non-negative number for kl), got {0}")]
    Threshold(f64),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the golden target `{target}` failed on every turn, so nothing can be compared (first error: {error})")]
    GoldenFailed { target: String, error: String },
    #[error("target `{target}` failed on every turn; check the patch names and parameters (first error: {error})")]
    CandidateFailed { target: String, error: String },
    #[error("configuration `{target}` did not start, so it cannot be compared (not a divergence): {error}")]
    LaunchFailed { target: String, error: String },
}

/// Scores a patch subset (None: stop, the run was cancelled).
pub(crate) trait Oracle {
    async fn score(&mut self, subset: &[String]) -> Result<Option<f64>, BisectError>;
}

/// Memoized answers and the record of every step.
struct Memo<O> {
    oracle: O,
    threshold: f64,
    answers: BTreeMap<Vec<String>, f64>,
    steps: Vec<BisectStep>,
    runs: usize,
    /// The smallest diverging subset seen (the culprit when cancelled midway).
    smallest: Vec<String>,
}

impl<O: Oracle> Memo<O> {
    fn new(oracle: O, threshold: f64) -> Memo<O> {
        Memo { oracle, threshold, answers: BTreeMap::new(), steps: Vec::new(), runs: 0, smallest: Vec::new() }
    }

    /// Whether `subset` diverges; None when cancelled.
    async fn diverges(&mut self, subset: &[String]) -> Result<Option<bool>, BisectError> {
        let mut key = subset.to_vec();
        key.sort();
        let (score, reused) = match self.answers.get(&key) {
            Some(score) => (*score, true),
            None => {
                let Some(score) = self.oracle.score(subset).await? else { return Ok(None) };
                self.runs += 1;
                self.answers.insert(key, score);
                (score, false)
            }
        };
        let diverges = score > self.threshold;
        if diverges && (self.smallest.is_empty() || subset.len() < self.smallest.len()) {
            self.smallest = subset.to_vec();
        }
        self.steps.push(BisectStep { patches: subset.to_vec(), score, diverges, reused });
        Ok(Some(diverges))
    }
}

/// ddmin over `patches` with any oracle (the fidelity sweep's too): the culprit (None when cancelled),
/// every step, the runs made, and the oracle back.
pub(crate) async fn search<O: Oracle>(
    oracle: O,
    threshold: f64,
    patches: &[String],
) -> Result<(Option<Vec<String>>, Vec<BisectStep>, usize, O), BisectError> {
    let mut memo = Memo::new(oracle, threshold);
    let found = ddmin(&mut memo, patches).await?;
    Ok((found, memo.steps, memo.runs, memo.oracle))
}

/// ddmin: a 1-minimal diverging subset of `all` (empty when `all` does not diverge); None when
/// cancelled.
async fn ddmin<O: Oracle>(memo: &mut Memo<O>, all: &[String]) -> Result<Option<Vec<String>>, BisectError> {
    macro_rules! test {
        ($subset:expr) => {
            match memo.diverges($subset).await? {
                Some(answer) => answer,
                None => return Ok(None),
            }
        };
    }
    if !test!(all) {
        return Ok(Some(Vec::new()));
    }
    let mut current = all.to_vec();
    let mut n = 2;
    while current.len() >= 2 {
        let parts = split(&current, n);
        let mut next = None;
        for part in &parts {
            if test!(part) {
                next = Some((part.clone(), 2));
                break;
            }
        }
        // With two parts each complement is the other part, already tested.
        if next.is_none() && n > 2 {
            for part in &parts {
                let complement: Vec<String> = current.iter().filter(|p| !part.contains(p)).cloned().collect();
                if test!(&complement) {
                    next = Some((complement, (n - 1).max(2)));
                    break;
                }
            }
        }
        match next {
            Some((subset, granularity)) => (current, n) = (subset, granularity),
            None if n < current.len() => n = (2 * n).min(current.len()),
            None => break,
        }
    }
    Ok(Some(current))
}

/// `items` in `n` contiguous parts of near-equal size, in order.
fn split(items: &[String], n: usize) -> Vec<Vec<String>> {
    let n = n.clamp(1, items.len().max(1));
    let (base, extra) = (items.len() / n, items.len() % n);
    let mut parts = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        parts.push(items[start..start + len].to_vec());
        start += len;
    }
    parts
}

/// Replays one patch subset against the golden report, collecting every replay.
struct ReplayOracle<'a> {
    plan: Plan,
    endpoints: &'a Endpoints,
    observer: &'a dyn Observer,
    cancel: watch::Receiver<bool>,
    template: TargetSpec,
    metric: Metric,
    golden: ReplayReport,
    /// Targets and results of every subset replayed, for the combined report.
    runs: Vec<ReplayReport>,
}

impl Oracle for ReplayOracle<'_> {
    async fn score(&mut self, subset: &[String]) -> Result<Option<f64>, BisectError> {
        if *self.cancel.borrow() {
            return Ok(None);
        }
        let target = candidate(&self.template, subset);
        let mut plan = self.plan.clone();
        plan.targets = vec![target.clone()];
        let report = replay(&plan, self.endpoints, self.observer, self.cancel.clone(), Some(&self.golden)).await?;
        // A Ctrl-C while the engine was starting also ends its launch in an error: that is an
        // interruption, not a configuration that cannot start.
        if report.interrupted || *self.cancel.borrow() {
            self.runs.push(report);
            return Ok(None);
        }
        if let Some(error) = report.launches.iter().find(|l| l.target == target.name).and_then(|l| l.error.clone()) {
            return Err(BisectError::LaunchFailed { target: target.name, error });
        }
        if let Some(error) = all_failed(&report, &target.name) {
            return Err(BisectError::CandidateFailed { target: target.name, error });
        }
        let value = score(&report, &target.name, self.metric).unwrap_or(0.0);
        self.runs.push(report);
        Ok(Some(value))
    }
}

/// The target a subset runs as: the plan's first engine or launch target (else golden, if it is
/// one) with its path, url, model and headers, and this patch set (or these toggles of its profile).
pub(crate) fn template(plan: &Plan) -> TargetSpec {
    let engine = |t: &&TargetSpec| matches!(t.kind, TargetKind::Engine { .. } | TargetKind::Launch { .. });
    plan.targets
        .iter()
        .find(engine)
        .or(Some(&plan.golden).filter(engine))
        .cloned()
        .unwrap_or_else(|| TargetSpec::engine(Vec::new(), None, None))
}

/// The target a subset runs as, shaped like `template` (see [`template`]).
pub(crate) fn candidate(template: &TargetSpec, subset: &[String]) -> TargetSpec {
    let (path, url) = match &template.kind {
        TargetKind::Engine { path, url, .. } => (path.clone(), url.clone()),
        TargetKind::Launch { profile, .. } => {
            let mut target = TargetSpec::launch(profile, subset.to_vec());
            target.model = template.model.clone();
            target.headers = template.headers.clone();
            return target;
        }
        TargetKind::Url { .. } => (None, None),
    };
    let mut target = TargetSpec::engine(subset.to_vec(), path, url);
    target.model = template.model.clone();
    target.headers = template.headers.clone();
    target
}

/// The first error when every result of `target` failed.
fn all_failed(report: &ReplayReport, target: &str) -> Option<String> {
    let mut results = report.results.iter().filter(|r| r.target == target).peekable();
    results.peek()?;
    let mut first = None;
    for result in results {
        match &result.outcome {
            Outcome::Ok(_) => return None,
            Outcome::Failed { error, .. } => first = first.or(Some(error.clone())),
        }
    }
    first
}

fn check(plan: &Plan, patches: &[String], metric: Metric, threshold: f64) -> Result<(), BisectError> {
    if patches.is_empty() {
        return Err(BisectError::NoPatches);
    }
    if let Some((_, p)) = patches.iter().enumerate().find(|(i, p)| patches[..*i].contains(p)) {
        return Err(BisectError::DuplicatePatch(p.clone()));
    }
    if metric == Metric::Probes && plan.probes.is_empty() {
        return Err(BisectError::NoProbes);
    }
    let valid = if metric.is_fraction() { (0.0..1.0).contains(&threshold) } else { threshold >= 0.0 && threshold.is_finite() };
    if !valid {
        return Err(BisectError::Threshold(threshold));
    }
    Ok(())
}

/// Bisects `patches` (see the module doc) and returns one report holding golden and every subset
/// replayed as targets, with `bisect` set. The plan's `targets` only lend the engine target's shape
/// (path, url, model, headers); its golden, conversation, probes and options are used as they are.
/// Turns golden fails are left out of the subset replays. `replays_run` counts subset replays, not
/// golden's. A cancel returns what was found so far with `interrupted: true` (the culprit is then the
/// smallest diverging subset seen, maybe not minimal).
pub async fn bisect(
    plan: &Plan,
    endpoints: &Endpoints,
    patches: Vec<String>,
    metric: Metric,
    threshold: f64,
    observer: &dyn Observer,
    cancel: watch::Receiver<bool>,
) -> Result<ReplayReport, BisectError> {
    check(plan, &patches, metric, threshold)?;
    if let Some(profile) = crate::launch::load_for(&template(plan))? {
        profile.check_toggles(&patches).map_err(|e| PlanError::Profile(e.to_string()))?;
    }
    let mut golden_plan = plan.clone();
    golden_plan.targets.clear();
    let golden = replay(&golden_plan, endpoints, observer, cancel.clone(), None).await?;
    let mut subset_plan = golden_plan;
    let answered = answered_turns(&golden);
    if answered.is_empty() && !golden.interrupted {
        let error = all_failed(&golden, &golden.golden).unwrap_or_else(|| "no result".into());
        return Err(BisectError::GoldenFailed { target: golden.golden.clone(), error });
    }
    subset_plan.options.turns = Some(answered.clone());
    subset_plan.probes.retain(|p| answered.contains(&p.after_turn));
    let oracle = ReplayOracle {
        plan: subset_plan,
        endpoints,
        observer,
        cancel,
        template: template(plan),
        metric,
        golden: golden.clone(),
        runs: Vec::new(),
    };
    let mut memo = Memo::new(oracle, threshold);
    let found = if golden.interrupted { None } else { ddmin(&mut memo, &patches).await? };
    let interrupted = found.is_none();
    let culprit = found.unwrap_or_else(|| memo.smallest.clone());
    let profile = match &memo.oracle.template.kind {
        TargetKind::Launch { profile, .. } => Some(profile.clone()),
        _ => None,
    };
    let summary = BisectReport {
        naive_replays: patches.len(),
        profile,
        patches,
        metric: metric.to_string(),
        threshold,
        culprit,
        steps: memo.steps,
        replays_run: memo.runs,
    };
    Ok(combine(golden, memo.oracle.runs, summary, interrupted))
}

fn answered_turns(report: &ReplayReport) -> Vec<u32> {
    report.results.iter().filter(|r| r.target == report.golden && matches!(r.outcome, Outcome::Ok(_))).map(|r| r.turn).collect()
}

/// Golden's report with every subset's target, results and launches added.
fn combine(report: ReplayReport, runs: Vec<ReplayReport>, summary: BisectReport, interrupted: bool) -> ReplayReport {
    let mut report = merge(report, runs);
    report.interrupted |= interrupted;
    report.bisect = Some(summary);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores a subset by a table of per-patch effects: the max effect, plus `pair` when both
    /// members of the pair are present.
    struct Table<'a> {
        effects: Vec<(&'a str, f64)>,
        pair: Option<(&'a str, &'a str, f64)>,
    }

    impl Oracle for Table<'_> {
        async fn score(&mut self, subset: &[String]) -> Result<Option<f64>, BisectError> {
            let has = |name: &str| subset.iter().any(|p| p == name);
            let mut value = self.effects.iter().filter(|(n, _)| has(n)).map(|(_, e)| *e).fold(0.0, f64::max);
            if let Some((a, b, e)) = self.pair {
                if has(a) && has(b) {
                    value = value.max(e);
                }
            }
            Ok(Some(value))
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    async fn run<'a>(table: Table<'a>, patches: &[&str], threshold: f64) -> (Vec<String>, Memo<Table<'a>>) {
        let mut memo = Memo::new(table, threshold);
        let found = ddmin(&mut memo, &names(patches)).await.unwrap().unwrap();
        (found, memo)
    }

    #[tokio::test]
    async fn names_the_single_fault_among_four() {
        for fault in ["a", "b", "c", "d"] {
            let table = Table { effects: vec![(fault, 1.0)], pair: None };
            let (culprit, memo) = run(table, &["a", "b", "c", "d"], 0.5).await;
            assert_eq!(culprit, names(&[fault]));
            // The full set, then at most two halves per level.
            assert!(memo.runs <= 5, "{} runs for {fault}", memo.runs);
        }
    }

    #[tokio::test]
    async fn a_single_fault_costs_logarithmic_replays() {
        let patches: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = patches.iter().map(String::as_str).collect();
        for fault in [0, 7, 15] {
            let table = Table { effects: vec![(refs[fault], 1.0)], pair: None };
            let (culprit, memo) = run(table, &refs, 0.5).await;
            assert_eq!(culprit, vec![patches[fault].clone()]);
            assert!(memo.runs <= 1 + 2 * 4, "{} runs, naive 16", memo.runs);
        }
    }

    #[tokio::test]
    async fn only_the_patch_past_the_threshold_alone_is_named() {
        let effects = vec![("rmsnorm_bf16", 0.02), ("kv_fp8", 0.1), ("rope_bf16", 0.4), ("act_q8", 0.08), ("residual_gemm_bf16", 0.01)];
        let patches = ["rmsnorm_bf16", "kv_fp8", "rope_bf16", "act_q8", "residual_gemm_bf16"];
        let (culprit, memo) = run(Table { effects, pair: None }, &patches, 0.2).await;
        assert_eq!(culprit, names(&["rope_bf16"]));
        assert!(memo.runs < 2 * patches.len());
    }

    #[tokio::test]
    async fn an_interaction_is_found_as_a_pair() {
        let table = Table { effects: vec![], pair: Some(("b", "g", 0.9)) };
        let (culprit, _) = run(table, &["a", "b", "c", "d", "e", "f", "g", "h"], 0.5).await;
        assert_eq!(culprit, names(&["b", "g"]));
    }

    #[tokio::test]
    async fn nothing_diverges_means_no_culprit() {
        let (culprit, memo) = run(Table { effects: vec![("a", 0.1)], pair: None }, &["a", "b"], 0.5).await;
        assert!(culprit.is_empty());
        assert_eq!((memo.runs, memo.steps.len()), (1, 1));
    }

    #[tokio::test]
    async fn repeated_subsets_are_reused_not_rerun() {
        let mut memo = Memo::new(Table { effects: vec![("a", 1.0)], pair: None }, 0.5);
        assert_eq!(memo.diverges(&names(&["a", "b"])).await.unwrap(), Some(true));
        assert_eq!(memo.diverges(&names(&["b", "a"])).await.unwrap(), Some(true));
        assert_eq!(memo.runs, 1);
        assert_eq!(memo.steps.iter().map(|s| s.reused).collect::<Vec<_>>(), [false, true]);
    }

    #[test]
    fn split_is_contiguous_and_balanced() {
        let parts = split(&names(&["a", "b", "c", "d", "e"]), 3);
        assert_eq!(parts, vec![names(&["a", "b"]), names(&["c", "d"]), names(&["e"])]);
    }

    #[test]
    fn checks_and_candidate_shape() {
        let plan = Plan::new(crate::conversation::tests::detail(1), TargetSpec::parse("engine").unwrap());
        assert_eq!(check(&plan, &[], Metric::Agreement, 0.1), Err(BisectError::NoPatches));
        assert_eq!(check(&plan, &names(&["a", "a"]), Metric::Agreement, 0.1), Err(BisectError::DuplicatePatch("a".into())));
        assert_eq!(check(&plan, &names(&["a"]), Metric::Probes, 0.1), Err(BisectError::NoProbes));
        assert_eq!(check(&plan, &names(&["a"]), Metric::Exact, 1.5), Err(BisectError::Threshold(1.5)));
        let mut shaped = plan.clone();
        shaped.targets = vec![TargetSpec::parse("engine:path=fast,url=http://h:1").unwrap()];
        let c = candidate(&template(&shaped), &names(&["kv_fp8"]));
        assert_eq!(c.kind, TargetKind::Engine { patches: names(&["kv_fp8"]), path: Some("fast".into()), url: Some("http://h:1".into()) });
        assert_eq!(c.name, "engine:kv_fp8@fast");
    }
}
