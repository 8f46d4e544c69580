//! The web UI end to end: the real `ctxscope serve` on the default model captures a conversation the
//! engine truncates (`auto_truncate=96`) and one a harness compacts (earlier turns replaced by a
//! summary); headless Debian Chromium then renders the conversation page (the chart marks each
//! finding on its turn) and the diff page (the dropped messages, the exact changed characters), and
//! writes screenshots to the target directory, checked for non-blank content. Also: a replay started
//! as the conversation page's form starts it (progress, stored report), the live event stream, and
//! `--admin-token` (on the admin port and from the CLI). Needs `chromium` (scripts/test.sh installs it); skips without it
//! unless `CI` is set.

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

const SYSTEM: &str = "You are an assistant who remembers what the user says.";
const FIRST: &str = "Please note: the name of my boat is MARIGOLD.";
const SUMMARY: &str = "Please note (summary): the name of my boat is MARIGOLD; asked about rivers and Hamlet.";
const QUESTIONS: [&str; 4] = [
    "What is the longest river in Africa?",
    "Who wrote the play Hamlet?",
    "How many days are in a leap year?",
    "What is the name of my boat?",
];

fn m(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// Sends one chat turn through the proxy; returns the reply text.
async fn turn(serve: &Serve, name: &str, patches: Option<&str>, messages: &[Value]) -> String {
    let mut headers = vec![("x-ctxscope-conversation", name)];
    if let Some(p) = patches {
        headers.push(("x-ctxscope-patches", p));
    }
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0});
    let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), &headers, &body).await;
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    raw.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string()
}

fn chromium() -> Option<PathBuf> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.is_file());
    if found.is_none() {
        optional_missing("chromium", "apt-get install -y --no-install-recommends chromium");
    }
    found
}

/// Headless Chromium on `url` with `extra` flags; returns stdout (the DOM with --dump-dom).
fn run_chromium(bin: &Path, profile: &Path, extra: &[String], url: &str) -> String {
    let mut cmd = Command::new(bin);
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1"])
        .args(["--window-size=1280,1500", "--virtual-time-budget=15000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("start chromium"));
    let started = Instant::now();
    while child.0.try_wait().expect("wait for chromium").is_none() {
        assert!(started.elapsed() < Duration::from_secs(120), "chromium did not finish within 120 s on {url}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    child.0.stdout.take().expect("stdout").read_to_string(&mut out).expect("read chromium output");
    out
}

/// Distinct colours of an 8-bit RGB(A) PNG, decoded by Python's zlib (no PNG crate needed).
fn png_colours(path: &Path) -> usize {
    let script = r#"
import sys, zlib, struct
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, w, h, ct = 8, b'', 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos+8]); body = data[pos+8:pos+8+n]; pos += 12 + n
    if kind == b'IHDR': w, h, depth, ct = struct.unpack('>IIBB', body[:10]); assert depth == 8
    elif kind == b'IDAT': idat += body
bpp = {2: 3, 6: 4}[ct]; raw = zlib.decompress(idat); stride = w * bpp; prev = bytearray(stride); seen = set(); i = 0
for _ in range(h):
    f = raw[i]; line = bytearray(raw[i+1:i+1+stride]); i += 1 + stride
    for x in range(stride):
        a = line[x-bpp] if x >= bpp else 0; b = prev[x]; c = prev[x-bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p-a), abs(p-b), abs(p-c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    seen.update(bytes(line[x:x+3]) for x in range(0, stride, bpp)); prev = line
print(len(seen))
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(path).output().expect("run python3");
    assert!(out.status.success(), "PNG decode failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a colour count")
}

fn screenshot(bin: &Path, dir: &Path, url: &str, name: &str) -> PathBuf {
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let path = shots.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&path);
    run_chromium(bin, &dir.join(format!("profile-{name}")), &[format!("--screenshot={}", path.display())], url);
    let colours = png_colours(&path);
    eprintln!("screenshot {}: {colours} distinct colours", path.display());
    assert!(colours > 50, "{name} screenshot looks blank: {colours} colours");
    path
}

/// Reads an SSE stream until `needle` arrives (or 20 s pass); returns the rest of its line.
fn read_until(stream: &mut std::net::TcpStream, needle: &str) -> String {
    stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let (mut seen, deadline) = (String::new(), Instant::now() + Duration::from_secs(20));
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = stream.read(&mut buf) {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some(at) = seen.find(needle) {
                return seen[at + needle.len()..].lines().next().unwrap_or_default().to_string();
            }
        }
    }
    panic!("no {needle:?} on the live stream within 20 s: {seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_and_diff_pages_in_headless_chromium() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(&model, &dir.path().join("data"), &[]).await;

    // The engine imitates SGLang's auto-truncate at 96 tokens while the conversation grows past it.
    let mut history = vec![m("system", SYSTEM)];
    for user in std::iter::once(FIRST).chain(QUESTIONS) {
        history.push(m("user", user));
        let reply = turn(&serve, "truncated", Some("auto_truncate=96"), &history).await;
        history.push(m("assistant", &reply));
    }
    // A harness that compacts: three turns, then the first two exchanges replaced by a summary.
    let mut history = vec![m("system", SYSTEM)];
    for user in [FIRST, QUESTIONS[0], QUESTIONS[1]] {
        history.push(m("user", user));
        let reply = turn(&serve, "compacted", None, &history).await;
        history.push(m("assistant", &reply));
    }
    let dropped: Vec<Value> = history[1..5].to_vec();
    let compacted = vec![m("system", SYSTEM), m("user", SUMMARY), history[5].clone(), history[6].clone(), m("user", QUESTIONS[3])];

    // The live stream sees the compacted turn arrive.
    serve.wait_turns(8).await;
    let mut live = std::net::TcpStream::connect(serve.admin_url.trim_start_matches("http://")).unwrap();
    write!(live, "GET /ui/api/live HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    read_until(&mut live, "retry: 2000");
    turn(&serve, "compacted", None, &compacted).await;
    let event: Value = serde_json::from_str(&read_until(&mut live, "event: turn\ndata: ")).expect("live turn event is JSON");
    drop(live);
    serve.wait_turns(9).await;

    let page = get_json(&format!("{}/ui/api/conversations?limit=10", serve.admin_url)).await;
    let ids: Vec<u64> = page["conversations"].as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{page}");
    let (compacted_id, truncated_id) = (ids[0], ids[1]);
    assert_eq!(event["conversation"], compacted_id, "live event: {event}");

    // The truncated turn, found independently: the first where the engine took fewer tokens than sent.
    let detail = get_json(&format!("{}/api/conversations/{truncated_id}", serve.admin_url)).await;
    let cut = detail["turns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["usage"]["prompt_tokens"].as_u64() < t["local_tokens"]["prompt"].as_u64())
        .unwrap_or_else(|| panic!("no truncated turn: {detail}"));
    let cut_turn = cut["id"].as_u64().unwrap();
    let compacted_detail = get_json(&format!("{}/api/conversations/{compacted_id}", serve.admin_url)).await;
    let compaction_turn = compacted_detail["turns"][3]["id"].as_u64().unwrap();
    let kinds = get_json(&format!("{}/ui/api/conversations?kind=history_dropped", serve.admin_url)).await;
    assert_eq!(kinds["conversations"][0]["id"], compacted_id, "{kinds}");

    // A replay started as the conversation page's form starts it, against this engine under a patch.
    let start = format!("{}/ui/api/replays/start", serve.admin_url);
    let refused = post_json(&start, &[], &json!({"conversation": truncated_id})).await;
    assert_eq!(refused.status, 400, "no target and no bisect: {}", String::from_utf8_lossy(&refused.body));
    let refused = post_json(&start, &[], &json!({"conversation": truncated_id, "targets": ["nonsense:x"]})).await;
    assert_eq!(refused.status, 400, "a bad target spec: {}", String::from_utf8_lossy(&refused.body));
    let started =
        post_json(&start, &[], &json!({"conversation": truncated_id, "targets": ["engine:patches=kv_fp8"], "max_tokens": 8})).await;
    assert_eq!(started.status, 202, "{}", String::from_utf8_lossy(&started.body));
    let replay_id = started.json()["id"].as_u64().expect("a replay id");
    let deadline = Instant::now() + Duration::from_secs(300);
    let run = loop {
        let running = get_json(&format!("{}/ui/api/replays/running", serve.admin_url)).await;
        let run = running["runs"].as_array().unwrap().iter().find(|r| r["id"] == replay_id).cloned().expect("the run is listed");
        if run["state"] != "running" {
            break run;
        }
        assert!(Instant::now() < deadline, "the replay did not finish in 300 s: {run}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(run["state"], "done", "{run}");
    assert!(run["total"].as_u64().unwrap() > 0 && run["done"] == run["total"], "progress counted every turn: {run}");
    let report = send("GET", &format!("{}/ui/replays/{replay_id}/report", serve.admin_url), &[], Vec::new()).await;
    let html = String::from_utf8_lossy(&report.body);
    assert_eq!(report.status, 200, "{html}");
    assert!(html.contains("kv_fp8"), "the report names its target: {html:.300}");
    let stored = get_json(&format!("{}/api/replays", serve.admin_url)).await;
    assert!(stored.as_array().unwrap().iter().any(|r| r["id"] == replay_id), "stored like the CLI's: {stored}");

    let Some(bin) = chromium() else { return };
    let ui = format!("{}/ui/?static", serve.admin_url);

    // Conversation page: the chart marks engine_truncation on the truncated turn.
    let dom = run_chromium(&bin, &dir.path().join("p1"), &["--dump-dom".into()], &format!("{ui}#/c/{truncated_id}"));
    assert!(dom.contains("<svg id=\"chart\""), "no chart in the conversation page: {dom}");
    assert!(dom.contains("id=\"replay-form\""), "no replay form on the conversation page");
    let marker = format!("data-kind=\"engine_truncation\" data-turn=\"{cut_turn}\"");
    assert!(dom.contains(&format!("class=\"finding-marker\" {marker}")), "no engine_truncation marker on turn {cut_turn}: {dom}");
    assert_eq!(dom.matches("class=\"finding-marker\" data-kind=\"engine_truncation\"").count(), 1, "one truncation cause, one marker");
    screenshot(&bin, dir.path(), &format!("{ui}#/c/{truncated_id}"), "conversation");

    // The compacted conversation's chart marks history_dropped on the compaction turn.
    let dom = run_chromium(&bin, &dir.path().join("p2"), &["--dump-dom".into()], &format!("{ui}#/c/{compacted_id}"));
    assert!(dom.contains(&format!("class=\"finding-marker\" data-kind=\"history_dropped\" data-turn=\"{compaction_turn}\"")), "{dom}");

    // Diff page: the four dropped messages, and the exact characters the summary changed.
    let url = format!("{ui}#/t/{compaction_turn}/diff");
    let dom = run_chromium(&bin, &dir.path().join("p3"), &["--dump-dom".into()], &url);
    assert!(dom.contains("data-verdict=\"dropped\""), "{dom}");
    assert_eq!(dom.matches("data-status=\"dropped\"").count(), 4, "dropped messages: {dom}");
    for message in &dropped {
        let text = message["content"].as_str().unwrap();
        let escaped = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        assert!(dom.contains(&escaped), "dropped message {text:?} not shown");
    }
    // "Please note" is shared: the change starts at character 11, " (summary)" inserted (its space
    // made visible), the rest of the first message kept.
    assert!(dom.contains("data-at=\"11\""), "first differing character: {dom}");
    assert!(dom.contains("<ins><span class=\"ws\">·</span>(summary)</ins>"), "inserted characters: {dom}");
    screenshot(&bin, dir.path(), &url, "diff");

    // The replay started above opens from the replays page.
    let url = format!("{ui}#/replays?open={replay_id}");
    let dom = run_chromium(&bin, &dir.path().join("p4"), &["--dump-dom".into()], &url);
    assert!(dom.contains(&format!("src=\"/ui/replays/{replay_id}/report\"")), "{dom}");
    serve.stop();
}

#[tokio::test]
async fn the_admin_token_guards_the_admin_port() {
    let dir = tempfile::tempdir().unwrap();
    let exposed =
        cli(&["proxy", "--upstream", "http://127.0.0.1:9", "--admin", "0.0.0.0:0", "--data", dir.path().join("a").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&exposed.stderr);
    assert!(!exposed.status.success() && stderr.contains("without --admin-token"), "{stderr}");

    let token = "0123456789abcdef-token";
    let proxy = Proxy::builder("http://127.0.0.1:9", &dir.path().join("b")).arg("--admin-token").arg(token).start();
    let admin = proxy.admin_url();
    // Health and Prometheus' scrape stay open without the token.
    for path in ["/healthz", "/metrics"] {
        assert_eq!(send("GET", &format!("{admin}{path}"), &[], Vec::new()).await.status, 200, "{path} without the token");
    }
    for path in ["/api/conversations", "/api/replays", "/ui/api/conversations"] {
        assert_eq!(send("GET", &format!("{admin}{path}"), &[], Vec::new()).await.status, 401, "{path} without the token");
        let bearer = format!("Bearer {token}");
        assert_eq!(send("GET", &format!("{admin}{path}"), &[("authorization", &bearer)], Vec::new()).await.status, 200, "{path} with it");
    }
    let page = send("GET", &format!("{admin}/ui/"), &[], Vec::new()).await;
    assert_eq!((page.status, page.headers.get("location").map(|v| v.to_str().unwrap())), (303, Some("/ui/login")));
    let form = format!("token={token}");
    let login =
        send("POST", &format!("{admin}/ui/login"), &[("content-type", "application/x-www-form-urlencoded")], form.into_bytes()).await;
    let cookie = login.headers.get("set-cookie").expect("a cookie").to_str().unwrap().split(';').next().unwrap().to_string();
    assert_eq!(send("GET", &format!("{admin}/ui/"), &[("cookie", &cookie)], Vec::new()).await.status, 200);
    let wrong = send("POST", &format!("{admin}/ui/login"), &[], b"token=nope".to_vec()).await;
    assert_eq!(wrong.status, 401);
    // The inspection commands send the token as the UI does.
    let refused = cli(&["conversations", "--json", "--admin", &admin]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("401") && stderr.contains("pass --admin-token"), "{stderr}");
    assert_eq!(cli_json(&["conversations", "--json", "--admin", &admin, "--admin-token", token]), json!([]));
    assert_eq!(cli_json(&["findings", "--json", "--kind", "engine_truncation", "--admin", &admin, "--admin-token", token]), json!([]));
    proxy.stop();
}
