//! Launch profiles end to end with real processes: a conversation captured through `ctxscope serve`,
//! then `ctxscope bisect --profile` and `ctxscope fidelity --bisect --profile` over six toggles of
//! deploy/profiles/llama-server.toml (llama.cpp's real server, one toggle a wrong RoPE base) name the
//! planted one; the same over deploy/profiles/ctxscope-engine.toml (this engine as a process, its
//! patches as toggles); a SIGINT halfway leaves no launched process or bound port behind; bad profiles
//! get clear errors and leave nothing running.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ctxscope_replay::{LaunchRecord, ProbeSpec, ReplayReport};
use serde_json::{json, Value};
use support::*;

const TURNS: usize = 5;
const TOGGLES: &str = "no_cont_batching,cache_reuse,swa_full,no_warmup,one_thread,rope_base";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/replay");
const PROFILES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/profiles");

/// What the tests share: the captured conversation and a copy of a shipped profile whose engine
/// carries a marker in its argv (so leftovers can be found in /proc).
struct Lab {
    dir: tempfile::TempDir,
    data: PathBuf,
    model: PathBuf,
    conversation: u64,
    marker: String,
}

impl Lab {
    async fn capture() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
        let serve = Serve::start(&model, &data, &[]).await;
        let turns: Vec<String> = serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/secret_word_turns.json")).unwrap()).unwrap();
        let mut messages = Vec::new();
        for user in turns.iter().take(TURNS) {
            messages.push(json!({"role": "user", "content": user}));
            let request = json!({"model": "m", "messages": messages, "temperature": 0, "max_tokens": 24});
            let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), &[], &request).await;
            assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
            messages.push(json!({"role": "assistant", "content": raw.json()["choices"][0]["message"]["content"]}));
        }
        let list = serve.wait_turns(TURNS as u64).await;
        let conversation = list[0]["id"].as_u64().unwrap_or_else(|| panic!("no conversation: {list}"));
        serve.stop();
        let marker = format!("launch-e2e-{}", std::process::id());
        Lab { dir, data, model, conversation, marker }
    }

    /// A shipped profile copied into the lab, `extra` appended to its command (the marker's place).
    fn profile(&self, name: &str, extra: &[&str]) -> PathBuf {
        let text = std::fs::read_to_string(format!("{PROFILES}/{name}.toml")).unwrap();
        let (head, rest) = text.split_once("command = [").unwrap();
        let end = rest.find(']').unwrap();
        let added: String = extra.iter().map(|a| format!(", {a:?}")).collect();
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, format!("{head}command = [{}{added}{}", &rest[..end], &rest[end..])).unwrap();
        path
    }

    fn command(&self, args: &[&str], env: &[(&str, &Path)]) -> Command {
        let mut command = Command::new(bin());
        command.args(args).arg("--data").arg(&self.data).arg("--launch-logs").arg(self.dir.path().join("logs"));
        command.env("CTXSCOPE_LOG", "warn").env("MODEL", &self.model);
        for (name, value) in env {
            command.env(name, value);
        }
        command
    }

    fn run(&self, args: &[&str], env: &[(&str, &Path)]) -> Output {
        self.command(args, env).output().expect("run ctxscope")
    }

    /// Processes whose argv holds the marker (left over from a launch).
    fn leftovers(&self) -> Vec<String> {
        processes_with(&self.marker)
    }
}

fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == std::process::id().to_string() {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        let state = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = state.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
        if cmdline.contains(needle) && !zombie {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

fn report_of(out: &Output, what: &str) -> ReplayReport {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed ({}):\n{stderr}", out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not a report ({e}):\n{stderr}"))
}

/// Every launch started, stopped, and its port free again.
fn all_stopped(lab: &Lab, launches: &[LaunchRecord]) {
    assert!(lab.leftovers().is_empty(), "launched processes left running: {:?}", lab.leftovers());
    for launch in launches.iter().filter(|l| l.error.is_none()) {
        assert!(launch.startup_s.is_some_and(|s| s > 0.0), "{launch:?}");
        assert!(!listening(launch.port), "port {} still has a listener", launch.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bisect_over_llama_server_toggles_names_the_planted_one_and_cleans_up() {
    let Some(server) = llama_server_bin() else {
        return optional_missing("llama.cpp's llama-server", "set LLAMA_SERVER or run scripts/llama_cpp/install.sh");
    };
    let clock = Instant::now();
    let lab = Lab::capture().await;
    let profile = lab.profile("llama-server", &["--alias", &lab.marker]);
    let env = [("LLAMA_SERVER", server.as_path())];
    let conversation = lab.conversation.to_string();
    // KL from golden, not token agreement: a greedy continuation of a 135M model flips at near-ties
    // when llama.cpp splits a batch differently (cache_reuse alone moved agreement by 0.23).
    let kl = ["--metric", "kl", "--threshold", "0.05"];
    let mut args = vec!["bisect", &conversation, "--profile", profile.to_str().unwrap(), "--toggles", TOGGLES, "--max-tokens", "24"];
    args.extend(kl);
    args.push("--json");
    let report = report_of(&lab.run(&args, &env), "bisect --profile");
    eprintln!("bisect over {TOGGLES}: {:.1} s", clock.elapsed().as_secs_f64());
    let bisect = report.bisect.as_ref().expect("a bisect summary");
    assert_eq!(bisect.culprit, ["rope_base"], "{:#?}", bisect.steps);
    assert_eq!(bisect.profile.as_deref(), Some(profile.to_str().unwrap()));
    assert_eq!(report.golden, "llama-server");
    // Golden, then one launch per subset replayed (reused answers launch nothing).
    assert_eq!(report.launches.len(), bisect.replays_run + 1, "{:#?}", report.launches);
    let golden = &report.launches[0];
    assert!(golden.toggles.is_empty() && !golden.argv.iter().any(|a| a == "--rope-freq-base"), "{golden:?}");
    let culprit = report.launches.iter().find(|l| l.toggles == ["rope_base"]).expect("the culprit was launched alone");
    assert!(culprit.argv.windows(2).any(|w| w == ["--rope-freq-base", "1000"]), "{culprit:?}");
    // What /proc saw of the live process: its argv, the environment the toggle set, its libraries.
    assert!(culprit.fingerprint.get("argv").is_some_and(|a| a.contains("--rope-freq-base 1000")), "{:?}", culprit.fingerprint);
    let threaded = report.launches.iter().find(|l| l.toggles.contains(&"one_thread".to_string())).expect("one_thread launched");
    assert_eq!(threaded.env.get("LLAMA_ARG_THREADS").map(String::as_str), Some("1"));
    assert_eq!(threaded.fingerprint.get("env.LLAMA_ARG_THREADS").map(String::as_str), Some("1"), "{:?}", threaded.fingerprint);
    assert!(culprit.fingerprint.keys().any(|k| k.starts_with("lib.libggml")), "{:?}", culprit.fingerprint.keys());
    for launch in &report.launches {
        let log = launch.stderr.as_deref().expect("a log path");
        assert!(std::fs::metadata(log).is_ok_and(|m| m.len() > 0), "{log} is empty");
    }
    all_stopped(&lab, &report.launches);

    // By fidelity: the sweep's planted facts are lost only with the wrong RoPE base.
    let clock = Instant::now();
    let args = [
        "fidelity",
        "--bisect",
        "--profile",
        profile.to_str().unwrap(),
        "--toggles",
        TOGGLES,
        "--lengths",
        "256",
        "--depths",
        "0.5",
        "--turns",
        "2",
        "--json",
    ];
    let out = Command::new(bin())
        .args(args)
        .arg("--launch-logs")
        .arg(lab.dir.path().join("logs"))
        .env("CTXSCOPE_LOG", "warn")
        .env("MODEL", &lab.model)
        .env("LLAMA_SERVER", &server)
        .output()
        .unwrap();
    assert!(out.status.success(), "fidelity --bisect failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("fidelity bisect over {TOGGLES}: {:.1} s", clock.elapsed().as_secs_f64());
    assert_eq!(answer["bisect"]["culprit"], json!(["rope_base"]), "{:#}", answer["bisect"]);
    let launches: Vec<LaunchRecord> = serde_json::from_value(answer["golden"]["launches"].clone()).unwrap();
    assert_eq!(launches.len(), answer["bisect"]["replays_run"].as_u64().unwrap() as usize + 1);
    all_stopped(&lab, &launches);

    // Interrupted halfway: SIGINT once a subset's engine is up; nothing is left behind.
    let data = lab.data.to_str().unwrap();
    let path = profile.to_str().unwrap();
    let bisect = ["bisect", &conversation, "--data", data, "--profile", path, "--toggles", TOGGLES, "--max-tokens", "24", "--json"];
    interrupted_halfway(&lab, &bisect, &server);
    let fidelity = ["fidelity", "--bisect", "--profile", path, "--toggles", TOGGLES, "--lengths", "256", "--depths", "0.5", "--turns", "2"];
    interrupted_halfway(&lab, &fidelity, &server);
    // From the web UI's API: only a profile given with --profile, by name.
    from_the_admin_api(&lab, &profile, &server).await;
}

/// A proxy started with `--profile` runs a toggle bisect asked for by name over the admin API (as the
/// conversation page's form asks), and refuses a profile it was not given.
async fn from_the_admin_api(lab: &Lab, profile: &Path, server: &Path) {
    // The proxy reads the profile with its own environment: fill in the two variables.
    let text = std::fs::read_to_string(profile).unwrap();
    let fixed = text.replace("${LLAMA_SERVER:-llama-server}", server.to_str().unwrap()).replace("${MODEL}", lab.model.to_str().unwrap());
    let named = lab.dir.path().join("ui").join("llama-ui.toml");
    std::fs::create_dir_all(named.parent().unwrap()).unwrap();
    std::fs::write(&named, fixed).unwrap();
    let logs = lab.dir.path().join("logs-ui");
    let proxy = Proxy::builder("http://127.0.0.1:9", &lab.data)
        .arg("--profile")
        .arg(named.to_str().unwrap())
        .arg("--launch-logs")
        .arg(logs.to_str().unwrap())
        .start();
    let admin = proxy.admin_url();
    let running = get_json(&format!("{admin}/ui/api/replays/running")).await;
    assert_eq!(running["profiles"][0]["name"], "llama-ui", "{running}");
    assert!(running["profiles"][0]["toggles"].as_array().unwrap().iter().any(|t| t["name"] == "rope_base"), "{running}");

    let refused = json!({"conversation": lab.conversation, "targets": [format!("launch={}", profile.display())]});
    let answer = post_json(&format!("{admin}/ui/api/replays/start"), &[], &refused).await;
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert!(String::from_utf8_lossy(&answer.body).contains("was not given to this process with --profile"));

    let bisect = json!({"profile": "llama-ui", "toggles": "swa_full,rope_base", "metric": "kl", "threshold": 0.05});
    let start = json!({"conversation": lab.conversation, "max_tokens": 24, "bisect": bisect});
    let answer = post_json(&format!("{admin}/ui/api/replays/start"), &[], &start).await;
    assert_eq!(answer.status, 202, "{}", String::from_utf8_lossy(&answer.body));
    let id = answer.json()["id"].clone();
    let done = |v: &Value| v["runs"].as_array().is_some_and(|r| r.iter().any(|r| r["id"] == id && r["state"] != "running"));
    let runs = wait_json(&format!("{admin}/ui/api/replays/running"), Duration::from_secs(300), done).await;
    let run = runs["runs"].as_array().unwrap().iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(run["state"], "done", "{run}");
    assert!(run["summary"].as_str().unwrap_or("").contains("rope_base"), "{run}");
    assert!(lab.leftovers().is_empty(), "left running after the UI's bisect: {:?}", lab.leftovers());
    assert!(walk(&logs).iter().any(|p| p.to_string_lossy().ends_with("llama-ui_rope_base.stderr.log")), "{:?}", walk(&logs));
    proxy.stop();
}

/// `ctxscope ARGS` (a bisect or a fidelity bisect over the marked profile) gets SIGINT once a
/// subset's engine is up: it exits within a minute and leaves no launched process or bound port.
fn interrupted_halfway(lab: &Lab, args: &[&str], server: &Path) {
    let logs = lab.dir.path().join(format!("logs-interrupted-{}", args[0]));
    let mut child: Child = Command::new(bin())
        .args(args)
        .arg("--launch-logs")
        .arg(&logs)
        .env("CTXSCOPE_LOG", "warn")
        .env("MODEL", &lab.model)
        .env("LLAMA_SERVER", server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Golden's log, then a subset's: the second engine is starting or serving.
    let deadline = Instant::now() + Duration::from_secs(120);
    let launched = || walk(&logs).iter().filter(|p| p.to_string_lossy().ends_with(".stderr.log")).count();
    while launched() < 2 || lab.leftovers().is_empty() {
        assert!(Instant::now() < deadline, "{}: no second launch within 120 s", args[0]);
        assert!(child.try_wait().unwrap().is_none(), "{} ended before it could be interrupted", args[0]);
        std::thread::sleep(Duration::from_millis(100));
    }
    // The ports the running engines hold, from their argv.
    let ports: Vec<u16> = lab
        .leftovers()
        .iter()
        .filter_map(|p| p.split_whitespace().skip_while(|a| *a != "--port").nth(1).and_then(|n| n.parse().ok()))
        .collect();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{} did not stop within 60 s of SIGINT", args[0]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(lab.leftovers().is_empty(), "left running after SIGINT: {:?}\n{stderr}", lab.leftovers());
    // Nothing listens on them any more (connections the killed engine held may linger in the kernel's
    // closing states for a moment; those are no process's).
    for port in ports {
        assert_eq!(ctxscope_common::process::listening_pid(port).ok().flatten(), None, "port {port} still has a listener");
        assert!(!listening(port), "port {port} is still in LISTEN state");
    }
    if let Ok(report) = serde_json::from_slice::<ReplayReport>(&out.stdout) {
        assert!(report.interrupted, "a report after SIGINT says interrupted");
    }
}

/// Whether a socket listens on `port` (from /proc/net/tcp{,6}).
fn listening(port: u16) -> bool {
    ctxscope_common::process::is_listening(port).expect("read /proc/net/tcp")
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bisect_over_this_engines_patches_launched_as_a_process() {
    let lab = Lab::capture().await;
    let profile = lab.profile("ctxscope-engine", &["--max-batch", &format!("{}", 15), "--ctx", "2048"]);
    let probes: Vec<ProbeSpec> = serde_json::from_slice(&std::fs::read(format!("{FIXTURES}/secret_word_probes.json")).unwrap()).unwrap();
    let kept: Vec<&ProbeSpec> = probes.iter().filter(|p| (p.after_turn as usize) < TURNS).collect();
    let probes_file = lab.dir.path().join("probes.json");
    std::fs::write(&probes_file, serde_json::to_vec(&kept).unwrap()).unwrap();
    let conversation = lab.conversation.to_string();
    let args = [
        "bisect",
        &conversation,
        "--profile",
        profile.to_str().unwrap(),
        "--toggles",
        "rmsnorm_bf16,prefix_cache_off,ctx_shift",
        "--metric",
        "probes",
        "--probes",
        probes_file.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--json",
    ];
    let bin = bin();
    let env = [("CTXSCOPE_BIN", bin.as_path()), ("CTXSCOPE_MODEL", lab.model.as_path()), ("CTX_SHIFT", Path::new("96"))];
    let report = report_of(&lab.run(&args, &env), "bisect --profile ctxscope-engine");
    let bisect = report.bisect.as_ref().unwrap();
    assert_eq!(bisect.culprit, ["ctx_shift"], "{:#?}", bisect.steps);
    let shifted = report.launches.iter().find(|l| l.toggles == ["ctx_shift"]).expect("ctx_shift launched alone");
    assert!(shifted.argv.windows(2).any(|w| w == ["--patches", "ctx_shift=96"]), "{shifted:?}");
    assert!(processes_with("--max-batch 15").is_empty(), "{:?}", processes_with("--max-batch 15"));
    for launch in &report.launches {
        assert!(!listening(launch.port), "port {} still has a listener", launch.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_profiles_get_clear_errors_and_leave_nothing_running() {
    let lab = Lab::capture().await;
    let conversation = lab.conversation.to_string();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let sleep = "sleep 31.4159";
    let cases = [
        ("missing", "command = [\"/nonexistent/engine-server\", \"{port}\"]\n[toggles.x]\nargs = [\"-x\"]", "does not exist"),
        ("unknown", "command = [\"sh\", \"{port}\"]\nreadiness = \"/health\"\n[toggles.x]\nargs = [\"-x\"]", "unknown field `readiness`"),
        (
            "never-ready",
            &format!("command = [\"sh\", \"-c\", \"{sleep}; echo {{port}}\"]\n[ready]\ntimeout_s = 1\n[toggles.x]\nargs = [\"-x\"]"),
            "was not ready within 1s",
        ),
        (
            "ignores-term",
            &format!(
                "command = [\"sh\", \"-c\", \"trap '' TERM; {sleep} & wait; echo {{port}}\"]\n[ready]\ntimeout_s = 1\n[stop]\ngrace_s = 1\n[toggles.x]\nargs = [\"-x\"]"
            ),
            "was not ready within 1s",
        ),
        ("port-taken", &format!("command = [\"sh\", \"-c\", \"{sleep}\"]\nport = {taken_port}\n[toggles.x]\nargs = [\"-x\"]"), "already taken"),
        ("exits", "command = [\"sh\", \"-c\", \"echo 'error: unknown argument --frobnicate {port}' >&2; exit 2\"]\n[toggles.x]\nargs = [\"-x\"]", "unknown argument --frobnicate"),
    ];
    for (name, text, expected) in cases {
        let path = lab.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let started = Instant::now();
        let out = lab.run(&["bisect", &conversation, "--profile", path.to_str().unwrap(), "--toggles", "x"], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: succeeded:\n{stderr}");
        assert!(stderr.contains(expected), "{name}: expected {expected:?} in:\n{stderr}");
        assert!(started.elapsed() < Duration::from_secs(30), "{name}: took {:?}", started.elapsed());
        assert!(processes_with(sleep).is_empty(), "{name}: left running: {:?}", processes_with(sleep));
    }
    drop(taken);
}
