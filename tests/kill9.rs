//! A crash under load loses at most what the store had not flushed: the real proxy (`--flush-ms 50`)
//! in front of the scripted upstream takes requests from four clients at once, each in its own
//! conversation (`x-ctxscope-conversation`), and is killed with SIGKILL mid-traffic. `ctxscope store
//! check` then finds the store whole (no record damaged, no index naming what is not there).
//! Restarted on the same directory, it opens the store cleanly, reports healthy, and holds every
//! request answered more than one flush interval (plus the capture queue's drain allowance) before
//! the kill, each with its turn readable. And SIGTERM during start-up stops it cleanly.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;

/// The flush interval tests/support's proxy builder sets (`--flush-ms 50`).
const FLUSH_MS: u64 = 50;
/// Time a captured exchange may take to reach the store after its response ended (the capture
/// worker's queue), on top of the flush interval.
const CAPTURE_ALLOWANCE: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_at_most_the_last_flush_interval() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&upstream.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());

    // Four clients, each sending conversation after conversation until told to stop (or until the
    // proxy dies under them: the support client panics on the reset, which ends that task).
    let answered: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..4 {
        let (url, answered, stop) = (url.clone(), answered.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("c{client}-{n}");
                let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("request {name}")}]});
                let raw = post_json(&url, &[("x-ctxscope-conversation", name.as_str())], &body).await;
                if raw.status == 200 {
                    answered.lock().unwrap().push((name, Instant::now()));
                }
                n += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let killed_at = Instant::now();
    proxy.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    let answered = answered.lock().unwrap().clone();
    assert!(answered.len() >= 20, "too little traffic to judge: {} requests answered", answered.len());

    // Each turn was one transaction: whatever the kill cut, the store is whole, every index agreeing
    // with its records (`ctxscope store check` exits 0 only then).
    let checked = cli(&["store", "check", "--data", data.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "store damaged by kill -9:\n{report}{}", String::from_utf8_lossy(&checked.stderr));

    // Restart on the same directory: the store opens, health is not degraded.
    let proxy = Proxy::builder(&upstream.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    let list = get_json(&format!("{}/api/conversations", proxy.admin_url())).await;
    let names: BTreeSet<String> = list.as_array().unwrap().iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect();
    let safe_before = killed_at - Duration::from_millis(FLUSH_MS) - CAPTURE_ALLOWANCE;
    let must_have: Vec<&String> = answered.iter().filter(|(_, at)| *at < safe_before).map(|(name, _)| name).collect();
    let lost: Vec<&&String> = must_have.iter().filter(|name| !names.contains(**name)).collect();
    assert!(lost.is_empty(), "{} of {} requests answered before the last flush interval were lost: {lost:?}", lost.len(), must_have.len());
    let later = answered.len() - must_have.len();
    let lost_late = answered.iter().filter(|(name, _)| !names.contains(name)).count();
    eprintln!(
        "{lost_late} lost; {} answered, {} captured after restart; all {} answered before the last {} ms kept ({later} answered later, {} of those kept)",
        answered.len(),
        names.len(),
        must_have.len(),
        FLUSH_MS + CAPTURE_ALLOWANCE.as_millis() as u64,
        names.len().saturating_sub(must_have.len())
    );
    // Every stored conversation reads back whole: its turns and their messages.
    for c in list.as_array().unwrap() {
        let id = c["id"].as_u64().unwrap();
        let detail = get_json(&format!("{}/api/conversations/{id}", proxy.admin_url())).await;
        let turns = detail["turns"].as_array().unwrap_or_else(|| panic!("conversation {id} unreadable: {detail}"));
        assert_eq!(turns.len() as u64, c["turns"].as_u64().unwrap(), "conversation {id}: {detail}");
    }
    proxy.stop();
}

/// SIGTERM during start-up (here while the tokenizer loads, before any port serves) stops the proxy
/// cleanly: the handler is installed first, so the signal is not the default action that kills it.
#[test]
fn sigterm_during_start_up_exits_cleanly() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    for delay_ms in [40u64, 150] {
        let mut child = std::process::Command::new(bin())
            .args(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--data")
            .arg(dir.path().join(format!("data-{delay_ms}")))
            .arg("--tokenizer")
            .arg(&model)
            .env("CTXSCOPE_LOG", "warn")
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the proxy");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the proxy did not exit within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "SIGTERM {delay_ms} ms after start: {status}");
    }
}
