//! Targets that launch: `launch=FILE.toml[,toggles=a+b]` starts the operator's own engine from a
//! launch profile ([`profile`]), waits for it, replays against it and stops it ([`instance`]). A run
//! with launch targets goes in phases: golden (launched first when it is a launch target) with every
//! target that needs no launch, then the launch targets one at a time (`parallel = N` in the profile:
//! N at once), each compared with golden's results. Every launch is recorded in the report (argv,
//! environment, start-up time, logs, the live process's fingerprint); one that fails to start is
//! recorded with its error and its last log lines, and has no results: it is never a divergence.

pub mod instance;
pub mod profile;

use std::collections::BTreeMap;
use std::path::Path;

use tokio::sync::watch;

pub use instance::{kill_all, Instance, LaunchError};
pub use profile::{Profile, ProfileError};

use crate::model::{LaunchRecord, ReplayReport, TargetKind, TargetSpec};
use crate::run::{self, merge, replay_reachable, Endpoints, Observer, Plan, PlanError};

/// Replays the plan (see [`crate::run`] for what is compared and reused), starting and stopping the
/// engines of launch targets as the module doc says.
pub async fn replay(
    plan: &Plan,
    endpoints: &Endpoints,
    observer: &dyn Observer,
    cancel: watch::Receiver<bool>,
    resume: Option<&ReplayReport>,
) -> Result<ReplayReport, PlanError> {
    // A conversation captured without text is refused before any engine starts.
    run::check_text(&plan.conversation)?;
    let all = plan.all_targets();
    if !all.iter().any(is_launch) {
        return replay_reachable(plan, endpoints, observer, cancel, resume).await;
    }
    // Every profile checked before anything starts; how many of each may run at once.
    let mut parallel = BTreeMap::new();
    for target in &all {
        if let Some(profile) = load_for(target)? {
            parallel.insert(target.name.clone(), profile.parallel.max(1));
        }
    }
    let dir = endpoints.launch_logs().join(plan.id.to_string());
    let mut first = plan.clone();
    first.targets.retain(|t| !is_launch(t) || *t == plan.golden);
    let golden = if is_launch(&plan.golden) && !reusable(resume, &plan.golden, plan) { vec![plan.golden.clone()] } else { Vec::new() };
    let (mut running, mut records) = start_all(&golden, &dir, &cancel).await;
    if let Some(failed) = records.iter().find_map(|r| r.error.clone()) {
        return Err(PlanError::Launch { target: plan.golden.name.clone(), error: failed });
    }
    let result = replay_reachable(&first, &reaching(endpoints, &running), observer, cancel.clone(), resume).await;
    stop_all(&mut running).await;
    let mut report = result?;

    let pending: Vec<TargetSpec> = plan.targets.iter().filter(|t| is_launch(t) && **t != plan.golden).cloned().collect();
    let mut at = 0;
    while at < pending.len() && !*cancel.borrow() {
        let width = parallel.get(&pending[at].name).copied().unwrap_or(1);
        let batch: Vec<TargetSpec> = pending[at..(at + width).min(pending.len())].to_vec();
        at += batch.len();
        let needed: Vec<TargetSpec> = batch.iter().filter(|t| !reusable(resume, t, plan)).cloned().collect();
        let (mut running, started) = start_all(&needed, &dir, &cancel).await;
        records.extend(started);
        let runnable: Vec<TargetSpec> =
            batch.iter().filter(|t| running.iter().any(|(n, _)| *n == t.name) || !needed.contains(t)).cloned().collect();
        if runnable.is_empty() {
            continue;
        }
        let mut step = plan.clone();
        step.targets = runnable;
        // Golden's results (and anything resumed) are reused, not asked again.
        let known = merge(report.clone(), resume.into_iter().cloned().collect());
        let result = replay_reachable(&step, &reaching(endpoints, &running), observer, cancel.clone(), Some(&known)).await;
        stop_all(&mut running).await;
        report = merge(report, vec![result?]);
    }
    report.interrupted |= *cancel.borrow() && at < pending.len();
    report.launches.extend(records);
    Ok(report)
}

/// Whether a target is started from a launch profile.
pub fn is_launch(target: &TargetSpec) -> bool {
    matches!(target.kind, TargetKind::Launch { .. })
}

/// The profile of a launch target, loaded and with its toggles checked (None for other targets).
pub fn load_for(target: &TargetSpec) -> Result<Option<Profile>, PlanError> {
    let TargetKind::Launch { profile, toggles } = &target.kind else { return Ok(None) };
    let loaded = Profile::load(Path::new(profile)).map_err(|e| PlanError::Profile(e.to_string()))?;
    loaded.check_toggles(toggles).map_err(|e| PlanError::Profile(e.to_string()))?;
    Ok(Some(loaded))
}

/// Whether every result of `target` the plan asks for can come from `resume` (so it need not be
/// launched): the replay's own reuse rule, turn by turn.
fn reusable(resume: Option<&ReplayReport>, target: &TargetSpec, plan: &Plan) -> bool {
    let turns = crate::conversation::Conversation::from_detail(&plan.conversation).turns;
    let wanted = turns.iter().filter(|t| plan.options.turns.as_ref().is_none_or(|w| w.contains(&t.turn)));
    wanted.into_iter().all(|turn| {
        let probes = plan.probes.iter().filter(|p| p.after_turn == turn.turn).count();
        run::reusable(resume, target, turn.turn, probes).is_some()
    })
}

/// `endpoints` with the running launched engines' URLs added.
pub fn reaching(endpoints: &Endpoints, running: &[(String, Instance)]) -> Endpoints {
    let mut reach = endpoints.clone();
    reach.launched.extend(running.iter().map(|(name, instance)| (name.clone(), instance.url.clone())));
    reach
}

/// Starts each target (concurrently), returning those running by name and a record of every one.
pub async fn start_all(targets: &[TargetSpec], dir: &Path, cancel: &watch::Receiver<bool>) -> (Vec<(String, Instance)>, Vec<LaunchRecord>) {
    let starts = targets.iter().map(|t| start_target(t, dir, cancel));
    let mut running = Vec::new();
    let mut records = Vec::new();
    for (target, outcome) in targets.iter().zip(futures_join_all(starts).await) {
        match outcome {
            Ok((instance, record)) => {
                running.push((target.name.clone(), instance));
                records.push(record);
            }
            Err(record) => records.push(record),
        }
    }
    (running, records)
}

/// Stops every instance (concurrently).
pub async fn stop_all(running: &mut [(String, Instance)]) {
    futures_join_all(running.iter_mut().map(|(_, instance)| instance.stop())).await;
}

/// Runs futures to completion together, answers in order (no `futures` crate here).
async fn futures_join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, future) in out.iter_mut().zip(pinned.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *slot = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Starts one launch target: the instance and its record, or a record saying why it did not start.
async fn start_target(target: &TargetSpec, dir: &Path, cancel: &watch::Receiver<bool>) -> Result<(Instance, LaunchRecord), LaunchRecord> {
    let TargetKind::Launch { profile: path, toggles } = &target.kind else {
        return Err(LaunchRecord { target: target.name.clone(), error: Some("not a launch target".into()), ..LaunchRecord::default() });
    };
    let mut record =
        LaunchRecord { target: target.name.clone(), profile: path.clone(), toggles: toggles.clone(), ..LaunchRecord::default() };
    let fail = |mut record: LaunchRecord, error: String| {
        record.error = Some(error);
        record
    };
    let profile = match Profile::load(Path::new(path)) {
        Ok(profile) => profile,
        Err(e) => return Err(fail(record, e.to_string())),
    };
    let port = match profile.port {
        Some(port) => port,
        None => match free_port() {
            Ok(port) => port,
            Err(e) => return Err(fail(record, format!("no free port: {e}"))),
        },
    };
    let configuration = match profile.configuration(toggles, port) {
        Ok(c) => c,
        Err(e) => return Err(fail(record, e.to_string())),
    };
    record.argv = redact_argv(&configuration.argv);
    record.env = configuration.env.iter().map(|(k, v)| (k.clone(), ctxscope_common::process::redact_env(k, v))).collect();
    record.port = configuration.port;
    let stem = file_stem(&target.name);
    record.stdout = Some(dir.join(format!("{stem}.stdout.log")).display().to_string());
    record.stderr = Some(dir.join(format!("{stem}.stderr.log")).display().to_string());
    match instance::start(&profile, &configuration, dir, &stem, cancel).await {
        Ok(instance) => {
            record.pid = Some(instance.pid);
            record.startup_s = Some(instance.startup.as_secs_f64());
            record.fingerprint = process_fingerprint(instance.pid);
            Ok((instance, record))
        }
        Err(e) => Err(fail(record, e.to_string())),
    }
}

/// What /proc says the launched process runs (empty where it cannot be read).
fn process_fingerprint(pid: u32) -> BTreeMap<String, String> {
    match ctxscope_common::process::inspect(pid) {
        Ok(info) => info.fields(),
        Err(error) => {
            tracing::debug!(%error, pid, "launched process not readable");
            BTreeMap::new()
        }
    }
}

/// A target name as a file name (`llama-server:kv_q4+rope` -> `llama-server_kv_q4+rope`).
fn file_stem(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.') { c } else { '_' }).collect()
}

/// A free loopback port (bound, then released for the engine to take).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((profile::HOST, 0))?.local_addr()?.port())
}

/// Values of secret-looking flags (`--api-key X`, `--hf-token=X`) replaced by `<redacted>`.
pub fn redact_argv(argv: &[String]) -> Vec<String> {
    let secret = |flag: &str| {
        let name = flag.trim_start_matches('-').to_ascii_uppercase().replace('-', "_");
        flag.starts_with('-') && ctxscope_common::process::redact_env(&name, "x") != "x"
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for arg in argv {
        if hide_next {
            out.push(crate::target::REDACTED.to_string());
            hide_next = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, _)) if secret(flag) => out.push(format!("{flag}={}", crate::target::REDACTED)),
            None if secret(arg) => {
                out.push(arg.clone());
                hide_next = true;
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_flags_are_redacted() {
        let argv: Vec<String> = ["srv", "--api-key", "sk-1", "--hf-token=hf_2", "--port", "8"].iter().map(|s| s.to_string()).collect();
        assert_eq!(redact_argv(&argv), ["srv", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8"]);
    }

    #[test]
    fn file_stems_are_plain() {
        assert_eq!(file_stem("llama-server:kv_q4+rope"), "llama-server_kv_q4+rope");
        assert_eq!(file_stem("../x y"), ".._x_y");
    }
}
