//! Launch targets with real processes: a small OpenAI-compatible server in Python, started from a
//! launch profile once per configuration. `parallel = 2` runs two configurations side by side (their
//! start and stop times overlap), every launch is recorded and stopped, and a bisect over the
//! profile's toggles names the one that makes the server answer differently.

use std::path::Path;
use std::process::Command;

use ctxscope_replay::{bisect, replay, replay_test_conversation, Endpoints, Metric, Outcome, Plan, Quiet, TargetSpec};
use tokio::sync::watch;

/// Answers every chat request with the last user message echoed (or a wrong answer with `--fault`);
/// notes its start and its stop (on SIGTERM) in $FAKE_LOG.
const SERVER: &str = r#"
import http.server, json, os, signal, sys, time
port = int(sys.argv[1]); fault = "--fault" in sys.argv; log = os.environ["FAKE_LOG"]
def note(what):
    with open(log, "a") as f:
        f.write(f"{what} {os.getpid()} {time.time()}\n")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        text = "something else entirely" if fault else f"about {last}"
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 10, "completion_tokens": 3}}).encode()
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out))); self.end_headers(); self.wfile.write(out)
    def log_message(self, *a): pass
def stop(*_):
    note("stop"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(0.3)
note("start")
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

fn python() -> Option<&'static str> {
    ["python3", "python"].into_iter().find(|p| Command::new(p).arg("-c").arg("pass").status().is_ok_and(|s| s.success()))
}

fn profile(dir: &Path, python: &str, parallel: usize) -> String {
    let script = dir.join("fake.py");
    std::fs::write(&script, SERVER).unwrap();
    let log = dir.join("fake.log");
    let text = format!(
        "command = [{python:?}, {:?}, \"{{port}}\"]\nenv = {{ FAKE_LOG = {:?} }}\nparallel = {parallel}\n\
         [ready]\npath = \"/health\"\ntimeout_s = 20\n[stop]\ngrace_s = 5\n\
         [toggles.a]\nargs = [\"--a\"]\n[toggles.b]\nenv = {{ B = \"1\" }}\n[toggles.fault]\nargs = [\"--fault\"]\n",
        script.display(),
        log.display()
    );
    let path = dir.join("fake.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// (pid, start, stop) of every server that ran.
fn lifetimes(dir: &Path) -> Vec<(String, f64, f64)> {
    let text = std::fs::read_to_string(dir.join("fake.log")).unwrap_or_default();
    let mut out: Vec<(String, f64, f64)> = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let at: f64 = parts[2].parse().unwrap();
        match parts[0] {
            "start" => out.push((parts[1].to_string(), at, f64::INFINITY)),
            _ => out.iter_mut().filter(|l| l.0 == parts[1]).for_each(|l| l.2 = at),
        }
    }
    out
}

fn endpoints(dir: &Path) -> Endpoints {
    Endpoints { launch_dir: Some(dir.join("logs")), ..Endpoints::default() }
}

#[tokio::test]
async fn parallel_launches_overlap_and_every_one_is_stopped() {
    let Some(python) = python() else { return eprintln!("skipped: no python") };
    let dir = tempfile::tempdir().unwrap();
    let profile = profile(dir.path(), python, 2);
    let mut plan = Plan::new(replay_test_conversation(1, 3), TargetSpec::launch(&profile, vec![]));
    plan.targets = ["a", "b", "fault"].iter().map(|t| TargetSpec::launch(&profile, vec![t.to_string()])).collect();
    let (_tx, cancel) = watch::channel(false);
    let report = replay(&plan, &endpoints(dir.path()), &Quiet, cancel, None).await.unwrap();
    assert_eq!(report.launches.len(), 4, "{:#?}", report.launches);
    assert!(report.launches.iter().all(|l| l.error.is_none() && l.startup_s.is_some()), "{:#?}", report.launches);
    for target in ["fake", "fake:a", "fake:b", "fake:fault"] {
        let answered = report.results.iter().filter(|r| r.target == target && matches!(r.outcome, Outcome::Ok(_))).count();
        assert_eq!(answered, 3, "{target}: {:#?}", report.results);
    }
    let b = report.launches.iter().find(|l| l.toggles == ["b"]).unwrap();
    assert_eq!(b.env.get("B").map(String::as_str), Some("1"));
    let lives = lifetimes(dir.path());
    assert_eq!(lives.len(), 4, "{lives:?}");
    assert!(lives.iter().all(|l| l.2.is_finite()), "a server was not stopped with SIGTERM: {lives:?}");
    // Golden alone, then a and b side by side, then fault.
    let overlap = |x: &(String, f64, f64), y: &(String, f64, f64)| x.1 < y.2 && y.1 < x.2;
    let most = lives.iter().map(|x| lives.iter().filter(|y| overlap(x, y)).count()).max().unwrap();
    assert_eq!(most, 2, "parallel = 2 should run two at once, never more: {lives:?}");
}

#[tokio::test]
async fn a_bisect_over_toggles_names_the_one_that_changes_the_answers() {
    let Some(python) = python() else { return eprintln!("skipped: no python") };
    let dir = tempfile::tempdir().unwrap();
    let profile = profile(dir.path(), python, 1);
    let mut plan = Plan::new(replay_test_conversation(1, 2), TargetSpec::launch(&profile, vec![]));
    plan.targets = vec![TargetSpec::launch(&profile, vec![])];
    let (_tx, cancel) = watch::channel(false);
    let toggles = vec!["a".to_string(), "fault".to_string(), "b".to_string()];
    let report = bisect(&plan, &endpoints(dir.path()), toggles, Metric::Exact, 0.2, &Quiet, cancel).await.unwrap();
    let summary = report.bisect.as_ref().unwrap();
    assert_eq!(summary.culprit, ["fault"], "{:#?}", summary.steps);
    assert_eq!(summary.profile.as_deref(), Some(profile.as_str()));
    assert_eq!(report.launches.len(), summary.replays_run + 1);
    let lives = lifetimes(dir.path());
    assert!(lives.iter().all(|l| l.2.is_finite()), "{lives:?}");
    let overlap = |x: &(String, f64, f64), y: &(String, f64, f64)| x.1 < y.2 && y.1 < x.2;
    assert!(lives.iter().all(|x| lives.iter().filter(|y| overlap(x, y)).count() == 1), "parallel = 1 overlapped: {lives:?}");
}
