//! Replays and bisects started from the UI (`POST /ui/api/replays/start`): checked against the store
//! and the targets this process can reach, run in the background one at a time with their progress
//! kept for the page to poll (`GET /ui/api/replays/running`), and stored as the CLI stores them. An
//! `engine:` target needs this engine's URL, which `ctxscope serve` gives; a plain proxy runs `url=`
//! targets only (the sidecar does not link the engine).

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    pub patches: String,
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
    runs: Mutex<VecDeque<RunView>>,
}

impl Launcher {
    /// `engine_url`: this process's engine (`serve`), for `engine:` targets.
    pub fn new(engine_url: Option<String>) -> Launcher {
        Launcher { engine_url, runs: Mutex::new(VecDeque::new()) }
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
    let golden = match TargetSpec::parse(&request.golden) {
        Ok(g) => g,
        Err(e) => return bad(format!("golden: {e}")),
    };
    let mut plan = Plan::new(detail, golden);
    if let Some(max_tokens) = request.max_tokens {
        plan.options = ReplayOptions { max_tokens, ..plan.options.clone() };
    }
    for spec in &request.targets {
        match TargetSpec::parse(spec) {
            Ok(t) => plan.targets.push(t),
            Err(e) => return bad(format!("target {spec:?}: {e}")),
        }
    }
    let launcher = &state.launcher;
    let needs_engine = plan.all_targets().iter().any(|t| matches!(&t.kind, TargetKind::Engine { url: None, .. }));
    if needs_engine && launcher.engine_url.is_none() {
        return bad("engine: targets need this process's engine (ctxscope serve); a proxy replays url= targets only");
    }
    let bisect = match &request.bisect {
        Some(b) => {
            let metric = match Metric::from_str(&b.metric) {
                Ok(m) => m,
                Err(e) => return bad(e),
            };
            let patches: Vec<String> = b.patches.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect();
            if patches.is_empty() {
                return bad("bisect needs at least one patch");
            }
            Some((patches, metric, b.threshold))
        }
        None if plan.targets.is_empty() => return bad("give at least one target (or a bisect)"),
        None => None,
    };
    {
        let Ok(mut runs) = launcher.runs.lock() else { return bad("the run list is unavailable") };
        if runs.iter().any(|r| r.state == "running") {
            return json_error(StatusCode::CONFLICT, "busy", "a replay started here is still running; wait for it", None);
        }
        plan.id = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64;
        let kind = if bisect.is_some() { "bisect" } else { "replay" };
        runs.push_back(RunView {
            id: plan.id,
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
    let id = plan.id;
    let state = state.clone();
    tokio::spawn(async move {
        let endpoints = Endpoints { engine_url: state.launcher.engine_url.clone() };
        let progress = Progress { state: state.clone(), id };
        let (_cancel, watch) = tokio::sync::watch::channel(false);
        let result = match bisect {
            Some((patches, metric, threshold)) => {
                ctxscope_replay::bisect(&plan, &endpoints, patches, metric, threshold, &progress, watch).await.map_err(|e| e.to_string())
            }
            None => ctxscope_replay::replay(&plan, &endpoints, &progress, watch, None).await.map_err(|e| e.to_string()),
        };
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
    fn a_start_request_is_strict_and_defaults_golden_and_metric() {
        let r: StartRequest = serde_json::from_str(r#"{"conversation": 3, "targets": ["engine:patches=kv_fp8"]}"#).unwrap();
        assert_eq!((r.conversation, r.golden.as_str(), r.targets.len()), (3, "engine", 1));
        let b: StartRequest = serde_json::from_str(r#"{"conversation": 3, "bisect": {"patches": "kv_fp8"}}"#).unwrap();
        assert_eq!(b.bisect.unwrap().metric, "agreement");
        assert!(serde_json::from_str::<StartRequest>(r#"{"conversation": 3, "target": []}"#).is_err(), "unknown fields are refused");
    }
}
