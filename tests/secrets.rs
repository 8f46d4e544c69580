//! Planted secrets never leave the process except where they are meant to go: the password of
//! `--upstream http://user:SECRET@host` reaches the upstream as Basic auth only; a client's API key is
//! forwarded only; a replay target's `header=Authorization:...` value and URL password are used but
//! stored and shown redacted. Every file the proxy and the replay write (the data directory, the
//! proxy's debug log, `--json` output, the HTML report) and every admin answer is searched for each.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;

const UPSTREAM_PASSWORD: &str = "UPSTREAM-SECRET-1x";
const CLIENT_KEY: &str = "CLIENT-KEY-2x";
const REPLAY_HEADER: &str = "REPLAY-SECRET-3x";
const REPLAY_URL_PASSWORD: &str = "URLPASS-4x";
/// base64("bob:URLPASS-4x"), the replay URL target's Basic credentials.
const REPLAY_BASIC: &str = "Ym9iOlVSTFBBU1MtNHg=";
/// base64("ctxuser:UPSTREAM-SECRET-1x"), the Basic credentials as sent.
const BASIC: &str = "Y3R4dXNlcjpVUFNUUkVBTS1TRUNSRVQtMXg=";

fn assert_clean(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for secret in [UPSTREAM_PASSWORD, CLIENT_KEY, REPLAY_HEADER, REPLAY_URL_PASSWORD, BASIC, REPLAY_BASIC] {
        if let Some(at) = text.find(secret) {
            let context: String = text[at.saturating_sub(200)..].chars().take(400).collect();
            panic!("{secret} found in {what}: ...{context}...");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secrets_are_sent_where_meant_and_found_nowhere_else() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log_path = dir.path().join("proxy.log");
    let (port, admin_port) = (free_port(), free_port());
    let upstream = format!("http://ctxuser:{UPSTREAM_PASSWORD}@{}", up.addr);
    let child = Command::new(bin())
        .args(["proxy", "--upstream", &upstream, "--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin", &format!("127.0.0.1:{admin_port}"), "--flush-ms", "50"])
        .arg("--data")
        .arg(&data)
        .env("CTXSCOPE_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("spawn ctxscope proxy");
    let mut child = KillOnDrop(child);
    let (proxy, admin) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{admin_port}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", admin_port)).is_err() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "proxy did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
    let bearer = format!("Bearer {CLIENT_KEY}");
    let answered = post_json(&format!("{proxy}/v1/chat/completions"), &[("authorization", &bearer)], &body).await;
    assert_eq!(answered.status, 200);
    // The upstream got the URL's credentials as Basic auth (they replace the client's key).
    let sent = up.state.headers.lock().unwrap().last().cloned().unwrap();
    assert_eq!(sent["authorization"], format!("Basic {BASIC}"));
    assert!(!sent.contains_key("host") || !sent["host"].to_str().unwrap().contains('@'));
    let conversations = wait_captured_turns(&admin, 1, Duration::from_secs(10)).await;
    let id = conversations[0]["id"].as_u64().unwrap();
    assert_eq!(conversations[0]["upstream"], format!("http://***@{}", up.addr));

    // A replay whose target carries an API key header and a URL password, stored through the admin API.
    let html = dir.path().join("replay.html");
    let target = format!("url=http://{},model=m,header=Authorization:Bearer {REPLAY_HEADER},name=secured", up.addr);
    let with_password = format!("url=http://bob:{REPLAY_URL_PASSWORD}@{},model=m,name=basic", up.addr);
    let replay = Command::new(bin())
        .args(["replay", &id.to_string(), "--admin", &admin, "--golden", &format!("url=http://{},model=m", up.addr)])
        .args(["--target", &target, "--target", &with_password])
        .args(["--json", "--max-tokens", "4", "--html"])
        .arg(&html)
        .env("CTXSCOPE_LOG", "debug")
        .output()
        .unwrap();
    assert!(replay.status.success(), "replay failed: {}", String::from_utf8_lossy(&replay.stderr));
    let used = up
        .state
        .headers
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.get("authorization").is_some_and(|v| v.to_str().unwrap().contains(REPLAY_HEADER)));
    assert!(used, "the replay target's header was not sent");
    // The URL target's credentials went as Basic auth.
    let basic = up
        .state
        .headers
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.get("authorization").is_some_and(|v| v.to_str().unwrap() == format!("Basic {REPLAY_BASIC}")));
    assert!(basic, "the replay URL target's credentials were not sent as Basic auth");
    assert_clean("replay --json output", &replay.stdout);
    assert_clean("replay stderr", &replay.stderr);
    assert_clean("the HTML report", &std::fs::read(&html).unwrap());
    let shown = String::from_utf8_lossy(&replay.stdout);
    assert!(shown.contains("<redacted>"), "no redacted marker in --json output");

    let replays = get_json(&format!("{admin}/api/replays")).await;
    let replay_id = replays[0]["id"].as_u64().expect("replay stored");
    let mut answers = Vec::new();
    for path in [
        "/healthz".to_string(),
        "/metrics".to_string(),
        "/api/conversations".to_string(),
        format!("/api/conversations/{id}"),
        format!("/api/conversations/{id}/export"),
        "/api/replays".to_string(),
        format!("/api/replays/{replay_id}"),
        format!("/ui/replays/{replay_id}/report"),
    ] {
        let raw = send("GET", &format!("{admin}{path}"), &[], Vec::new()).await;
        assert_eq!(raw.status, 200, "GET {path}");
        assert_clean(&format!("GET {path}"), &raw.body);
        answers.push(String::from_utf8_lossy(&raw.body).to_string());
    }
    assert!(answers[0].contains("***@"), "/healthz does not show the redacted upstream: {}", answers[0]);
    if answers[1].contains("upstream=\"") {
        assert!(answers[1].contains("upstream=\"http://***@"), "metrics label not redacted");
    }
    let inspected = cli(&["replays", &replay_id.to_string(), "--json", "--admin", &admin]);
    assert_clean("replays --json", &inspected.stdout);

    terminate(&mut child.0, "proxy");
    assert_clean("the data directory", &all_bytes(&data));
    let log = std::fs::read(&log_path).unwrap();
    assert!(!log.is_empty(), "the proxy wrote no log");
    assert_clean("the proxy's log", &log);
}
