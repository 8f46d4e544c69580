//! The deployment artefacts under `deploy/` against the real things they describe: promtool accepts the
//! alert rules, the example config and every dashboard query, and its rule unit tests fire each alert on
//! synthetic series; every metric name they use is one the proxy exports (and the pre-registered ones
//! are on a live `/metrics`); a real Prometheus scraping a real `ctxscope serve` fires on a real
//! engine truncation. Needs Debian's `prometheus` package (promtool, prometheus): scripts/test.sh
//! installs it; elsewhere set CTXSCOPE_SKIP_PROMETHEUS=1 to skip what needs it.

#[path = "deploy/promql.rs"]
mod promql;
mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ctxscope_proxy::metrics as m;
use ctxscope_store::{FindingKind, Severity};
use promql::*;
use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

/// Metrics that exist from startup, before any traffic (the alert rules' `increase() > 0` needs them).
const PRE_REGISTERED: [&str; 1] = [m::FINDINGS_TOTAL];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------------
// 1. promtool: syntax, config, dashboard queries, and rule unit tests
// ---------------------------------------------------------------------------------------------------

#[test]
fn promtool_accepts_the_rules_the_config_and_the_dashboard_queries() {
    let Some(promtool) = prometheus_tool("promtool") else { return };
    let dir = tempfile::tempdir().unwrap();
    let alerts = repo().join("deploy/prometheus/alerts.yml");
    run_ok(Command::new(&promtool).args(["check", "rules"]).arg(&alerts));
    // The example config names alerts.yml relative to itself; promtool checks that file through it.
    let checked = run_ok(Command::new(&promtool).args(["check", "config"]).arg(repo().join("deploy/prometheus/prometheus.yml")));
    assert!(checked.contains("alerts.yml"), "prometheus.yml does not load alerts.yml:\n{checked}");

    // Every dashboard query parses as PromQL (Grafana's variables replaced by what they expand to).
    let mut recording = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (panel, expr) in dashboard_exprs() {
        let promql = expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$instance", ".*").replace("$upstream", ".*");
        let record = format!("dashboard:{}", panel.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>());
        recording += &format!("      - record: {record}\n        expr: {}\n", serde_json::to_string(&promql).unwrap());
    }
    let queries = dir.path().join("dashboard_queries.yml");
    std::fs::write(&queries, recording).unwrap();
    run_ok(Command::new(&promtool).args(["check", "rules"]).arg(&queries));

    // Each alert fires on the series it is about, and not on the ones it is not. promtool compares
    // annotations verbatim; the wording is not under test, so the rules are tested without them.
    let rules = dir.path().join("alerts_without_annotations.yml");
    std::fs::write(&rules, strip_block(&read("deploy/prometheus/alerts.yml"), "annotations:")).unwrap();
    let unit = dir.path().join("alerts_test.yml");
    std::fs::write(&unit, read("tests/fixtures/deploy/alerts_test.yml").replace("RULES", &rules.display().to_string())).unwrap();
    run_ok(Command::new(&promtool).args(["test", "rules"]).arg(&unit));
}

/// The fleet artefacts: fleet.yml loads both rule files, the fleet rules use only catalogued metrics,
/// and each fleet alert fires on the series it is about (tests/fixtures/deploy/fleet_test.yml).
#[test]
fn promtool_accepts_the_fleet_config_and_fires_the_fleet_alerts() {
    let Some(promtool) = prometheus_tool("promtool") else { return };
    let checked = run_ok(Command::new(&promtool).args(["check", "config"]).arg(repo().join("deploy/prometheus/fleet.yml")));
    for file in ["alerts.yml", "fleet-rules.yml"] {
        assert!(checked.contains(file), "fleet.yml does not load {file}:\n{checked}");
    }
    let fleet = read("deploy/prometheus/fleet-rules.yml");
    let histograms = histogram_names();
    let exprs = rule_exprs(&fleet);
    assert!(exprs.len() >= 3, "found {} expressions in fleet-rules.yml", exprs.len());
    for expr in &exprs {
        let unknown: Vec<_> = metric_names(expr).into_iter().filter(|n| !resolves(n, &histograms)).collect();
        assert!(unknown.is_empty(), "fleet-rules.yml uses {unknown:?}, not in ctxscope_proxy::metrics::ALL: {expr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("fleet_without_annotations.yml");
    std::fs::write(&rules, strip_block(&fleet, "annotations:")).unwrap();
    let unit = dir.path().join("fleet_test.yml");
    std::fs::write(&unit, read("tests/fixtures/deploy/fleet_test.yml").replace("RULES", &rules.display().to_string())).unwrap();
    run_ok(Command::new(&promtool).args(["test", "rules"]).arg(&unit));
}

// ---------------------------------------------------------------------------------------------------
// 2. Metric names: the rules and the dashboard use only exported metrics; a live proxy exports them
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_use_only_metrics_the_proxy_exports() {
    let histograms = histogram_names();
    let known = |name: &str| resolves(name, &histograms);

    let alerts = read("deploy/prometheus/alerts.yml");
    let exprs = rule_exprs(&alerts);
    let rules = alerts.lines().filter(|l| l.trim_start().starts_with("- alert:")).count();
    assert!(rules > 0 && exprs.len() == rules, "found {} expressions for {rules} alerts in alerts.yml", exprs.len());
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        let unknown: Vec<_> = names.iter().filter(|n| !known(n)).collect();
        assert!(unknown.is_empty(), "alerts.yml uses {unknown:?}, not in ctxscope_proxy::metrics::ALL: {expr}");
        used.extend(names);
    }
    assert!(used.contains(m::FINDINGS_TOTAL), "no alert on {}", m::FINDINGS_TOTAL);

    // dashboard_exprs() also checks the JSON parses and that every panel has a query.
    for (panel, expr) in dashboard_exprs() {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "dashboard panel {panel:?} queries no ctxscope metric: {expr}");
        let unknown: Vec<_> = names.iter().filter(|n| !known(n)).collect();
        assert!(unknown.is_empty(), "dashboard panel {panel:?} uses {unknown:?}, not in ctxscope_proxy::metrics::ALL: {expr}");
        used.extend(names);
    }
    let base: BTreeSet<&str> = used.iter().map(|n| base_name(n, &histograms)).collect();
    let unused: Vec<_> = m::ALL.iter().filter(|n| !base.contains(**n)).collect();
    eprintln!("catalogue metrics in neither alerts.yml nor the dashboard: {unused:?}");

    // A live proxy: the pre-registered series exist before any traffic, all of them at zero.
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&upstream.url(), &dir.path().join("data")).start();
    let samples = parse_exposition(&proxy.metrics().await);
    for name in PRE_REGISTERED {
        assert!(samples.iter().any(|s| s.name == name), "{name} is not on /metrics at startup: alerts on increase() miss the first event");
    }
    for kind in FindingKind::ALL {
        for severity in Severity::ALL {
            let (kind, severity) = (kind.as_str(), severity.as_str());
            let series = samples
                .iter()
                .find(|s| s.name == m::FINDINGS_TOTAL && s.label("kind") == Some(kind) && s.label("severity") == Some(severity));
            assert_eq!(
                series.map(|s| s.value),
                Some(0.0),
                "{}{{kind={kind:?},severity={severity:?}}} is not 0 at startup",
                m::FINDINGS_TOTAL
            );
        }
    }

    // After one captured exchange, the request path's metrics are there, and every ctxscope_ series
    // on /metrics is one the catalogue names.
    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4});
    let reply = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    proxy.wait_turns(1).await;
    let samples = parse_exposition(&proxy.metrics().await);
    let exported: BTreeSet<&str> = samples.iter().map(|s| base_name(&s.name, &histograms)).collect();
    for name in [m::REQUESTS_TOTAL, m::PROXY_OVERHEAD_SECONDS, m::CAPTURE_SECONDS, m::TURNS_CAPTURED_TOTAL, m::FINDINGS_TOTAL] {
        assert!(exported.contains(name), "{name} is not on /metrics after a captured exchange: {exported:?}");
    }
    let uncatalogued: Vec<_> = samples.iter().map(|s| s.name.as_str()).filter(|n| n.starts_with("ctxscope_") && !known(n)).collect();
    assert!(uncatalogued.is_empty(), "/metrics exports metrics missing from ctxscope_proxy::metrics::ALL: {uncatalogued:?}");
    proxy.stop();
}

// ---------------------------------------------------------------------------------------------------
// 3. A real Prometheus, a real `ctxscope serve`, a real truncation
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_fires_on_a_real_engine_truncation() {
    let Some(prometheus) = prometheus_tool("prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let prom_port = free_port();
    let serve = Serve::start(&model_path(), &dir.path().join("data"), &[]).await;
    let (proxy, admin) = (serve.proxy_url.clone(), serve.admin_url.clone());
    let admin_addr = admin.trim_start_matches("http://").to_string();

    // Prometheus scraping the admin port every second, with the repository's rules.
    let config = dir.path().join("prometheus.yml");
    let rules = serde_json::to_string(&repo().join("deploy/prometheus/alerts.yml").display().to_string()).unwrap();
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{rules}]\n\
             scrape_configs:\n  - job_name: ctxscope\n    static_configs:\n      - targets: ['{admin_addr}']\n",
        ),
    )
    .unwrap();
    let server = Process::spawn(
        "prometheus",
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn"),
    );
    let api = format!("http://127.0.0.1:{prom_port}");
    wait_http_ok(&format!("{api}/-/ready"), Duration::from_secs(30)).await;
    let rule_count = poll("Prometheus to load the rules", 10, || async {
        let groups = get_json(&format!("{api}/api/v1/rules")).await["data"]["groups"].clone();
        let count: usize = groups.as_array()?.iter().map(|g| g["rules"].as_array().map_or(0, |r| r.len())).sum();
        (count > 0).then_some(count)
    })
    .await;
    eprintln!("prometheus loaded {rule_count} rules");
    poll("the ctxscope target to be up", 30, || async {
        let targets = get_json(&format!("{api}/api/v1/targets")).await;
        let up = targets["data"]["activeTargets"].as_array()?.iter().any(|t| t["health"] == "up");
        up.then_some(())
    })
    .await;
    let series = FindingKind::ALL.len() * Severity::ALL.len();
    poll("Prometheus to hold every pre-registered findings series (is register_findings() called at startup?)", 15, || async {
        let found = query(&api, m::FINDINGS_TOTAL).await.len();
        (found == series).then_some(())
    })
    .await;

    // Healthy traffic first: captured, scraped, evaluated, and nothing fires.
    let chat = |body: Value, headers: &'static [(&'static str, &'static str)]| {
        let url = format!("{proxy}/v1/chat/completions");
        async move { post_json(&url, headers, &body).await }
    };
    let healthy =
        chat(json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 4, "temperature": 0}), &[])
            .await;
    assert_eq!(healthy.status, 200, "{}", String::from_utf8_lossy(&healthy.body));
    wait_captured_turns(&admin, 1, Duration::from_secs(20)).await;
    poll("Prometheus to scrape the healthy request", 15, || async { (!query(&api, m::REQUESTS_TOTAL).await.is_empty()).then_some(()) })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // three rule evaluations on the scraped data
    let firing = firing_alerts(&api).await;
    assert!(firing.is_empty(), "alerts fire on healthy traffic: {}", Value::Array(firing));

    // The injection: SGLang-style auto-truncate keeps the first 57 tokens of a much longer prompt.
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a careful assistant. Read the whole report before you answer, and answer in one word."},
            {"role": "user", "content": format!("{}\n\nWhat colour was the last door in the report?", report_words(400))},
        ],
        "max_tokens": 4,
        "temperature": 0,
    });
    let cut = chat(body, &[("x-ctxscope-patches", "auto_truncate=64")]).await;
    assert_eq!(cut.status, 200, "{}", String::from_utf8_lossy(&cut.body));
    assert_eq!(
        cut.headers.get("x-ctxscope-patches").map(|v| v.to_str().unwrap()),
        Some("auto_truncate=64"),
        "the patch header did not reach the engine"
    );
    let usage = cut.json()["usage"].clone();
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(57), "the engine did not truncate: {usage}");
    wait_captured_turns(&admin, 2, Duration::from_secs(20)).await;

    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let alert = loop {
        let firing = firing_alerts(&api).await;
        if let Some(alert) = firing.iter().find(|a| names_truncation(a)) {
            break alert.clone();
        }
        if Instant::now() > deadline {
            let proxy_findings: Vec<String> =
                parse_exposition(&String::from_utf8_lossy(&send("GET", &format!("{admin}/metrics"), &[], Vec::new()).await.body))
                    .into_iter()
                    .filter(|s| s.name == m::FINDINGS_TOTAL && s.value > 0.0)
                    .map(|s| format!("{:?} = {}", s.labels, s.value))
                    .collect();
            let all = get_json(&format!("{api}/api/v1/alerts")).await;
            panic!(
                "no engine_truncation alert fired within 60 s of a truncated request (usage {usage}).\n\
                 findings counted by the proxy: {proxy_findings:?}\nPrometheus alerts: {all}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!(
        "{} fired {:?} after the truncation: {} {}",
        alert["labels"]["alertname"],
        started.elapsed(),
        alert["labels"],
        alert["annotations"]
    );
    server.stop();
    serve.stop();
}

/// An alert about engine truncation: its kind label, or its name.
fn names_truncation(alert: &Value) -> bool {
    let labels = &alert["labels"];
    labels["kind"] == "engine_truncation"
        || labels["alertname"].as_str().is_some_and(|n| n.to_lowercase().replace('_', "").contains("enginetruncation"))
}

// ---------------------------------------------------------------------------------------------------
// Helpers: processes, the Prometheus API, the artefacts' text
// ---------------------------------------------------------------------------------------------------

/// `name` from Debian's prometheus package, or None to skip (only outside CI, only when asked).
fn prometheus_tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file()));
    if found.is_some() {
        return found;
    }
    let install = "apt-get install -y --no-install-recommends prometheus";
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("`{name}` is not on PATH and CI is set: scripts/test.sh installs it ({install}); run the suite through scripts/test.sh");
    }
    if std::env::var("CTXSCOPE_SKIP_PROMETHEUS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: `{name}` is not on PATH and CTXSCOPE_SKIP_PROMETHEUS=1");
        return None;
    }
    panic!("`{name}` is not on PATH: install Debian's prometheus package ({install}), or set CTXSCOPE_SKIP_PROMETHEUS=1 to skip this test");
}

/// Runs a command to success; returns its stdout and stderr.
fn run_ok(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{command:?} failed ({}):\n{text}", output.status);
    text
}

fn model_path() -> PathBuf {
    ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// A child process, SIGTERMed by `stop` and killed if the test fails first.
struct Process {
    child: Child,
    what: &'static str,
}

impl Process {
    fn spawn(what: &'static str, command: &mut Command) -> Process {
        let child = command.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Process { child, what }
    }

    fn stop(mut self) {
        terminate(&mut self.child, self.what);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 100 ms until it yields a value, for at most `seconds`.
async fn poll<T, F: std::future::Future<Output = Option<T>>>(what: &str, seconds: u64, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {seconds} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An instant query for a bare metric name; the result vector.
async fn query(api: &str, metric: &str) -> Vec<Value> {
    let reply = get_json(&format!("{api}/api/v1/query?query={metric}")).await;
    reply["data"]["result"].as_array().cloned().unwrap_or_default()
}

async fn firing_alerts(api: &str) -> Vec<Value> {
    let alerts = get_json(&format!("{api}/api/v1/alerts")).await;
    alerts["data"]["alerts"].as_array().map(|a| a.iter().filter(|a| a["state"] == "firing").cloned().collect()).unwrap_or_default()
}

/// (panel title, query) for every target of every panel; asserts the JSON parses and each panel queries.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = read("deploy/grafana/ctxscope.json");
    let dashboard: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("deploy/grafana/ctxscope.json is not JSON: {e}"));
    let mut panels: Vec<&Value> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("dashboard has panels") {
        match panel["type"].as_str() {
            Some("row") => panels.extend(panel["panels"].as_array().into_iter().flatten()),
            _ => panels.push(panel),
        }
    }
    assert!(!panels.is_empty(), "the dashboard has no panels");
    let mut out = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)").to_string();
        let targets =
            panel["targets"].as_array().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("dashboard panel {title:?} has no targets"));
        for (i, target) in targets.iter().enumerate() {
            let expr = target["expr"]
                .as_str()
                .filter(|e| !e.trim().is_empty())
                .unwrap_or_else(|| panic!("dashboard panel {title:?} target {i} has no expr"));
            out.push((format!("{title} {i}"), expr.to_string()));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(definition) = variable["definition"].as_str() {
            let promql = definition.trim_start_matches("label_values(").rsplit_once(',').map_or(definition, |(selector, _)| selector);
            out.push((format!("variable {}", variable["name"]), promql.to_string()));
        }
    }
    out
}
