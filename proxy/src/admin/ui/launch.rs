//! Replays and bisects started from the UI (`POST /ui/api/replays/start`): built into the replay
//! crate's [`Job`] (the CLI's job type), checked against the store and the targets this process can
//! reach, run in the background one at a time with their progress kept for the page to poll
//! (`GET /ui/api/replays/running`), and stored as the CLI stores them. An `engine:` target needs this
//! engine's URL, which `ctxscope serve` gives; a plain proxy runs `url=` targets, and `launch=NAME`
//! targets only of the profiles given at start with `--profile` (never a command typed in a browser).

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::path::{Path, PathBuf};

use ctxscope_replay::job::{split_list, Job, Suspects, Work};
use ctxscope_replay::{Endpoints, Metric, Observer, Plan, ReplayOptions, TargetKind, TargetSpec, TurnResult};
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::admin::AdminState;
use crate::body::{json_error, ProxyBody};

/// Runs kept for the page after they end.
const KEPT_RUNS: usize = 16;
/// A start request's body bound.
pub const MAX_START_BYTES: usize = 64 << 10;

/// What the form sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    pub conversation: u64,
    /// Target specs as `ctxscope replay --target` takes them.
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default = "default_golden")]
    pub golden: String,
    /// With patches: a bisect over them instead of a replay.
    #[serde(default)]
    pub bisect: Option<BisectRequest>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BisectRequest {
    /// A comma-separated patch list (`kv_fp8,ctx_shift=256`).
    #[serde(default)]
    pub patches: Option<String>,
    /// Or a profile given at start (`--profile`), by its file stem or path...
    #[serde(default)]
    pub profile: Option<String>,
    /// ...and its toggles to bisect over, comma-separated.
    #[serde(default)]
    pub toggles: Option<String>,
    #[serde(default = "default_metric")]
    pub metric: String,
    #[serde(default)]
    pub threshold: f64,
}

fn default_golden() -> String {
    "engine".into()
}

fn default_metric() -> String {
    "agreement".into()
}

/// One run as the page sees it.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub id: u64,
    pub conversation: u64,
    pub kind: &'static str,
    pub done: usize,
    pub total: usize,
    /// `running`, `done` or `failed`.
    pub state: &'static str,
    pub error: Option<String>,
    pub summary: Option<String>,
}

/// The runs started here (the running one and the last few), and what they may reach.
pub struct Launcher {
    engine_url: Option<String>,
    /// Launch profiles the operator allowed (`--profile`).
    profiles: Vec<PathBuf>,
    launch_logs: PathBuf,
    runs: Mutex<VecDeque<RunView>>,
}

impl Launcher {
    /// `engine_url`: this process's engine (`serve`), for `engine:` targets; `profiles`: the launch
    /// profiles runs may start; `launch_logs`: where those engines' logs go.
    pub fn new(engine_url: Option<String>, profiles: Vec<PathBuf>, launch_logs: PathBuf) -> Launcher {
        Launcher { engine_url, profiles, launch_logs, runs: Mutex::new(VecDeque::new()) }
    }

    /// The allowed profiles' names (file stems), for the page.
    pub fn profile_names(&self) -> Vec<String> {
        self.profiles.iter().map(|p| stem(p)).collect()
    }

    /// The allowed profiles as the page lists them: name and toggles (with descriptions); a profile
    /// that no longer loads is listed with its error.
    pub fn profile_views(&self) -> Vec<serde_json::Value> {
        let view = |path: &PathBuf| match ctxscope_replay::launch::Profile::load(path) {
            Ok(profile) => {
                let toggles: Vec<serde_json::Value> =
                    profile.toggles.iter().map(|(name, t)| json!({"name": name, "description": t.description})).collect();
                json!({"name": stem(path), "toggles": toggles})
            }
            Err(e) => json!({"name": stem(path), "toggles": [], "error": e.to_string()}),
        };
        self.profiles.iter().map(view).collect()
    }

    /// An allowed profile by stem or by path as given.
    fn profile(&self, name: &str) -> Option<&PathBuf> {
        self.profiles.iter().find(|p| stem(p) == name || p.as_path() == Path::new(name))
    }

    /// `launch=NAME` of a UI target resolved to the allowed profile's path (other targets unchanged).
    fn resolve(&self, mut target: TargetSpec) -> Result<TargetSpec, String> {
        if let TargetKind::Launch { profile, .. } = &mut target.kind {
            let path = self.profile(profile).ok_or_else(|| {
                format!(
                    "launch profile `{profile}` was not given to this process with --profile (given: {})",
                    self.profile_names().join(", ")
                )
            })?;
            let full = path.display().to_string();
            target.spec = target.spec.replacen(&format!("launch={profile}"), &format!("launch={full}"), 1);
            *profile = full;
        }
        Ok(target)
    }

    /// Whether `engine:` targets can run here.
    pub fn can_run_engine(&self) -> bool {
        self.engine_url.is_some()
    }

    pub fn runs(&self) -> Vec<RunView> {
        self.runs.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default()
    }

    fn update(&self, id: u64, change: impl FnOnce(&mut RunView)) {
        if let Ok(mut runs) = self.runs.lock() {
            if let Some(run) = runs.iter_mut().find(|r| r.id == id) {
                change(run);
            }
        }
    }
}

/// Counts turns as they complete.
struct Progress {
    state: Arc<AdminState>,
    id: u64,
}

impl Observer for Progress {
    fn on_result(&self, _: &TurnResult, done: usize, total: usize) {
        self.state.launcher.update(self.id, |r| {
            r.done = done;
            r.total = total;
        });
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned())
}

fn bad(message: impl std::fmt::Display) -> Response<ProxyBody> {
    json_error(StatusCode::BAD_REQUEST, "invalid_request_error", &message.to_string(), None)
}

/// Checks a start request and launches it; answers with the run's id.
pub fn start(state: &Arc<AdminState>, body: &[u8]) -> Response<ProxyBody> {
    let request: StartRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad(format!("not a replay request: {e}")),
    };
    let Some(store) = state.store.clone() else {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "capture is off: there is no store to replay from", None);
    };
    let detail = match store.conversation_detail(request.conversation) {
        Ok(d) => d,
        Err(e) => return json_error(StatusCode::NOT_FOUND, "not_found", &e.to_string(), None),
    };
    let launcher = &state.launcher;
    let golden = match TargetSpec::parse(&request.golden).map_err(|e| e.to_string()).and_then(|g| launcher.resolve(g)) {
        Ok(g) => g,
        Err(e) => return bad(format!("golden: {e}")),
    };
    let mut plan = Plan::new(detail, golden);
    if let Some(max_tokens) = request.max_tokens {
        plan.options = ReplayOptions { max_tokens, ..plan.options.clone() };
    }
    for spec in &request.targets {
        match TargetSpec::parse(spec).map_err(|e| e.to_string()).and_then(|t| launcher.resolve(t)) {
            Ok(t) => plan.targets.push(t),
            Err(e) => return bad(format!("target {spec:?}: {e}")),
        }
    }
    let job = match &request.bisect {
        Some(b) => {
            let metric = match Metric::from_str(&b.metric) {
                Ok(m) => m,
                Err(e) => return bad(e),
            };
            let profile =
                match b.profile.as_deref().filter(|p| !p.trim().is_empty()).map(|name| launcher.profile(name).ok_or(name)).transpose() {
                    Ok(p) => p,
                    Err(name) => return bad(format!("launch profile `{name}` was not given to this process with --profile")),
                };
            let patches = b.patches.as_deref().filter(|p| !split_list(p).is_empty());
            let suspects = match Suspects::from_flags(patches, profile.map(PathBuf::as_path), b.toggles.as_deref()) {
                Ok(s) => s,
                Err(e) => return bad(format!("bisect: {e}")),
            };
            if request.golden == default_golden() && matches!(suspects, Suspects::Toggles { .. }) {
                plan.golden = TargetSpec::parse(&suspects.default_golden()).unwrap_or(plan.golden);
            }
            Job::bisect(plan, suspects, metric, b.threshold)
        }
        None if plan.targets.is_empty() => return bad("give at least one target (or a bisect)"),
        None => Job { plan, work: Work::Replay { resume: None } },
    };
    if let Err(e) = job.check(Some(&launcher.profiles)) {
        return bad(e);
    }
    if job.needs_engine() && launcher.engine_url.is_none() {
        return bad("engine: targets need this process's engine (ctxscope serve); a proxy replays url= and launch= targets only");
    }
    let id = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64;
    {
        let Ok(mut runs) = launcher.runs.lock() else { return bad("the run list is unavailable") };
        if runs.iter().any(|r| r.state == "running") {
            return json_error(StatusCode::CONFLICT, "busy", "a replay started here is still running; wait for it", None);
        }
        let kind = if matches!(job.work, Work::Bisect { .. }) { "bisect" } else { "replay" };
        runs.push_back(RunView {
            id,
            conversation: request.conversation,
            kind,
            done: 0,
            total: 0,
            state: "running",
            error: None,
            summary: None,
        });
        while runs.len() > KEPT_RUNS {
            runs.pop_front();
        }
    }
    let mut job = job;
    job.plan.id = id;
    let state = state.clone();
    tokio::spawn(async move {
        let mut endpoints = Endpoints::engine(state.launcher.engine_url.clone());
        endpoints.launch_dir = Some(state.launcher.launch_logs.clone());
        let progress = Progress { state: state.clone(), id };
        let (_cancel, watch) = tokio::sync::watch::channel(false);
        let result = job.run(&endpoints, &progress, watch).await.map_err(|e| e.to_string());
        let stored = result.and_then(|report| {
            let entry = ctxscope_replay::report::entry(&report).map_err(|e| e.to_string())?;
            store.insert_replay(&entry).map_err(|e| e.to_string())?;
            Ok(entry.summary)
        });
        state.launcher.update(id, |r| match stored {
            Ok(summary) => {
                r.state = "done";
                r.summary = Some(summary);
            }
            Err(error) => {
                tracing::warn!(%error, id, "replay started from the UI failed");
                r.state = "failed";
                r.error = Some(error);
            }
        });
    });
    crate::admin::json_response(StatusCode::ACCEPTED, json!({"id": id}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_targets_name_only_profiles_given_at_start() {
        let launcher = Launcher::new(None, vec![PathBuf::from("/etc/ctxscope/llama-server.toml")], PathBuf::from("logs"));
        let t = launcher.resolve(TargetSpec::parse("launch=llama-server,toggles=kv_q4").unwrap()).unwrap();
        assert_eq!(t.kind, TargetKind::Launch { profile: "/etc/ctxscope/llama-server.toml".into(), toggles: vec!["kv_q4".into()] });
        assert_eq!(t.spec, "launch=/etc/ctxscope/llama-server.toml,toggles=kv_q4");
        assert_eq!(t.name, "llama-server:kv_q4");
        let e = launcher.resolve(TargetSpec::parse("launch=/tmp/evil.toml").unwrap()).unwrap_err();
        assert!(e.contains("was not given to this process with --profile"), "{e}");
        let url = TargetSpec::parse("url=http://h:1").unwrap();
        assert_eq!(launcher.resolve(url.clone()).unwrap(), url);
    }

    #[test]
    fn a_start_request_is_strict_and_defaults_golden_and_metric() {
        let r: StartRequest = serde_json::from_str(r#"{"conversation": 3, "targets": ["engine:patches=kv_fp8"]}"#).unwrap();
        assert_eq!((r.conversation, r.golden.as_str(), r.targets.len()), (3, "engine", 1));
        let b: StartRequest = serde_json::from_str(r#"{"conversation": 3, "bisect": {"patches": "kv_fp8"}}"#).unwrap();
        assert_eq!(b.bisect.unwrap().metric, "agreement");
        let t: StartRequest = serde_json::from_str(r#"{"conversation": 3, "bisect": {"profile": "llama", "toggles": "a,b"}}"#).unwrap();
        assert_eq!(t.bisect.unwrap().toggles.as_deref(), Some("a,b"));
        assert!(serde_json::from_str::<StartRequest>(r#"{"conversation": 3, "target": []}"#).is_err(), "unknown fields are refused");
    }
}
