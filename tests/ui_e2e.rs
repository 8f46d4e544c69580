//! The web UI end to end: the real `ctxscope serve` on the default model captures a conversation the
//! engine truncates (`auto_truncate=96`) and one a harness compacts (earlier turns replaced by a
//! summary); headless Debian Chromium then renders the conversation page (the chart marks each
//! finding on its turn) and the diff page (the dropped messages struck through, the summary), and
//! writes screenshots to the target directory, checked for non-blank content. Also: a replay started
//! as the conversation page's form starts it (progress, stored report), the live event stream, and
//! `--admin-token` (on the admin port and from the CLI). And an agent whose harness prunes old tool
//! results and cuts the latest: the diff page names the causes, strikes the removed results through
//! and shows the exact characters the cut changed; the conversation page's context chart shows the
//! turn no longer sees all that was said, and its budget chart stacks each turn's prompt tokens by part
//! under the engine's context limit. Needs `chromium` (scripts/test.sh installs it); skips
//! without it unless `CI` is set.

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
    chat(serve, &headers, messages).await
}

/// One chat request through the proxy with `headers` (none: the proxy threads it by its messages).
async fn chat(serve: &Serve, headers: &[(&str, &str)], messages: &[Value]) -> String {
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0});
    let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), headers, &body).await;
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

    // Diff page: a compaction, the four dropped messages struck through, the summary marked.
    let url = format!("{ui}#/t/{compaction_turn}/diff");
    let dom = run_chromium(&bin, &dir.path().join("p3"), &["--dump-dom".into()], &url);
    assert!(dom.contains("data-verdict=\"dropped\" data-cause=\"compaction\""), "{dom}");
    assert!(dom.contains("History dropped (compaction)"), "{dom}");
    assert_eq!(dom.matches("data-status=\"dropped\"").count(), 4, "dropped messages: {dom}");
    for message in &dropped {
        let text = message["content"].as_str().unwrap();
        let escaped = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        assert!(dom.contains(&format!("<del>{escaped}</del>")), "dropped message {text:?} not shown struck through");
    }
    // The summary stands in for them (no harness marker: recognised by structure), not diffed
    // against what it replaced.
    let summary = "data-status=\"summary\" data-index=\"1\"><span class=\"role\">1 · user</span>";
    assert!(dom.contains(&format!("{summary}<span class=\"status summary\">summary</span><pre>{SUMMARY}</pre>")), "{dom}");
    assert!(dom.contains("<div id=\"changes\"></div>"), "{dom}");
    screenshot(&bin, dir.path(), &url, "diff");

    // The replay started above opens from the replays page.
    let url = format!("{ui}#/replays?open={replay_id}");
    let dom = run_chromium(&bin, &dir.path().join("p4"), &["--dump-dom".into()], &url);
    assert!(dom.contains(&format!("src=\"/ui/replays/{replay_id}/report\"")), "{dom}");
    serve.stop();
}

/// An assistant message that calls a tool, and the tool's result (OpenAI chat shape).
fn tool_call(id: &str) -> Value {
    let call = json!({"id": id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}});
    json!({"role": "assistant", "content": "", "tool_calls": [call]})
}

fn tool_result(id: &str, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": text})
}

/// `value="..."` of the first `attr` after `from` in `dom`.
fn attr_after<'a>(dom: &'a str, from: usize, attr: &str) -> &'a str {
    let key = format!("{attr}=\"");
    let at = dom[from..].find(&key).unwrap_or_else(|| panic!("no {attr} after {from}")) + from + key.len();
    &dom[at..at + dom[at..].find('"').unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruned_tool_results_in_the_diff_and_context_pages() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(&model, &dir.path().join("data"), &[]).await;

    // An agent loop of three turns, each a tool call, its result and the user's next question; no
    // conversation header, so the proxy threads every request by its messages alone.
    let mut history = vec![m("system", SYSTEM), m("user", "Look at the project and tell me what it does.")];
    let mut results = Vec::new();
    for i in 0..3 {
        let id = format!("call_{i}");
        let output = format!("file src/part{i}.rs: {}", "fn main() { let boat = 1; } ".repeat(8));
        history.extend([tool_call(&id), tool_result(&id, &output), m("user", &format!("And what does part {i} do?"))]);
        results.push(output);
        let reply = chat(&serve, &[], &history).await;
        history.push(m("assistant", &reply));
    }
    // The harness prunes: every tool result but the latest leaves the history, every user and
    // assistant message (the tool calls too) stays; the latest is cut to its head.
    let last = history.iter().rposition(|v| v["role"] == "tool").unwrap();
    let head: String = results[2].chars().take(40).collect();
    let cut = format!("{head} [CUT]");
    let mut pruned: Vec<Value> =
        history.iter().enumerate().filter(|(i, v)| v["role"] != "tool" || *i == last).map(|(_, v)| v.clone()).collect();
    let kept = pruned.iter().position(|v| v["role"] == "tool").unwrap();
    pruned[kept] = tool_result("call_2", &cut);
    pruned.push(m("user", "Summarise what you found."));
    chat(&serve, &[], &pruned).await;
    serve.wait_turns(4).await;

    // One conversation: the pruned request continues the agent's.
    let page = get_json(&format!("{}/ui/api/conversations?limit=10", serve.admin_url)).await;
    let ids: Vec<u64> = page["conversations"].as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 1, "the pruned request starts no conversation of its own: {page}");
    let detail = get_json(&format!("{}/api/conversations/{}", serve.admin_url, ids[0])).await;
    let turns = detail["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 4, "{detail}");
    let (first_turn, pruned_turn) = (turns[0]["id"].as_u64().unwrap(), turns[3]["id"].as_u64().unwrap());
    let diff = get_json(&format!("{}/ui/api/turns/{pruned_turn}/diff", serve.admin_url)).await;
    assert_eq!((diff["verdict"].as_str(), diff["detail"]["cause"].as_str()), (Some("dropped"), Some("pruned")), "{diff}");

    let Some(bin) = chromium() else { return };
    let ui = format!("{}/ui/?static", serve.admin_url);

    // Diff page: the verdict names the cause, the removed tool results are struck through.
    let url = format!("{ui}#/t/{pruned_turn}/diff");
    let dom = run_chromium(&bin, &dir.path().join("p1"), &["--dump-dom".into()], &url);
    assert!(dom.contains("data-verdict=\"dropped\" data-cause=\"pruned\""), "{dom}");
    assert!(dom.contains("History dropped (pruned): the harness removed messages from the middle of the history"), "{dom}");
    assert_eq!(dom.matches("data-status=\"dropped\"").count(), 2, "two tool results removed: {dom}");
    for output in &results[..2] {
        let at = dom.find(&format!("<del>{output}</del>")).unwrap_or_else(|| panic!("{output:?} not struck through: {dom}"));
        let block = dom[..at].rfind("<div class=\"msg").unwrap();
        assert!(dom[block..at].contains("data-status=\"dropped\"") && dom[block..at].contains("tool"), "{}", &dom[block..at]);
        assert!(dom[block..at].contains("<span class=\"status dropped\">dropped"), "a visible label: {}", &dom[block..at]);
    }
    // The latest result, cut in place: labelled, and its exact changed characters shown.
    assert!(!dom.contains(&format!("<del>{}</del>", results[2])), "the latest tool result is not struck through whole");
    assert!(dom.contains("Also truncated in place"), "{dom}");
    assert_eq!(dom.matches("data-status=\"truncated\"").count(), 1, "{dom}");
    let before = results[2].chars().count();
    let label = format!("<span class=\"status truncated\">truncated ({before} → {} characters)", cut.chars().count());
    assert!(dom.contains(&label), "{label}: {dom}");
    let at = results[2].chars().zip(cut.chars()).take_while(|(a, b)| a == b).count();
    assert!(dom.contains(&format!("<div class=\"diff\" data-at=\"{at}\">")), "first differing character {at}: {dom}");
    assert!(dom.contains("<ins>[CUT]</ins>"), "inserted characters: {dom}");
    let of = dom.find("id=\"turn-of\"").expect("the title line");
    assert_eq!(attr_after(&dom, of, "data-conversation"), ids[0].to_string());
    assert_eq!(attr_after(&dom, of, "data-previous-conversation"), ids[0].to_string());
    let title = format!("conversation {}, turn {}</a>", ids[0], turns[3]["index"]);
    assert!(dom.contains(&title) && dom.contains("continues the same conversation"), "{title}: {dom}");
    screenshot(&bin, dir.path(), &url, "diff-pruned");

    // Conversation page: one context bar per turn; the pruned turn no longer shows all that was said.
    let url = format!("{ui}#/c/{}", ids[0]);
    let dom = run_chromium(&bin, &dir.path().join("p2"), &["--dump-dom".into()], &url);
    assert!(dom.contains("<svg id=\"context-chart\""), "no context chart: {dom}");
    let bars: Vec<(u64, f64)> = dom
        .match_indices("<g class=\"ctx-bar")
        .map(|(at, _)| (attr_after(&dom, at, "data-turn").parse().unwrap(), attr_after(&dom, at, "data-share").parse().unwrap()))
        .collect();
    let ids_in_order: Vec<u64> = turns.iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(bars.iter().map(|b| b.0).collect::<Vec<_>>(), ids_in_order, "one bar per turn: {dom}");
    let share = |turn: u64| bars.iter().find(|b| b.0 == turn).unwrap().1;
    assert_eq!(share(first_turn), 1.0, "nothing lost on the first turn");
    let lost = share(pruned_turn);
    assert!(lost > 0.0 && lost < 1.0, "the pruned turn's visible share: {lost}");

    // The budget card: one stacked bar per turn of its prompt tokens by part, as stored, and the
    // engine's context limit (its /props n_ctx, from the fingerprint) as a line with a warning band.
    assert!(dom.contains("<svg id=\"composition-chart\""), "no composition chart: {dom}");
    let comp: Vec<(u64, u64)> = dom
        .match_indices("<g class=\"comp-bar")
        .map(|(at, _)| (attr_after(&dom, at, "data-turn").parse().unwrap(), attr_after(&dom, at, "data-total").parse().unwrap()))
        .collect();
    let stored: Vec<(u64, u64)> = turns.iter().map(|t| (t["id"].as_u64().unwrap(), t["composition"]["total"].as_u64().unwrap())).collect();
    assert_eq!(comp, stored, "one bar per turn, its stored total: {dom}");
    let last = &turns[3]["composition"];
    assert_eq!(last["method"], "tokenizer", "serve counts with the model's own tokenizer: {last}");
    assert!(last["parts"]["tool_results"].as_u64().unwrap() > 0, "{last}");
    let limit = last["limit"]["tokens"].as_u64().unwrap_or_else(|| panic!("the engine's limit is known by the last turn: {last}"));
    assert_eq!(last["limit"]["source"], "props.n_ctx", "{last}");
    let chart = dom.find("<svg id=\"composition-chart\"").unwrap();
    assert_eq!(attr_after(&dom, chart, "data-limit"), limit.to_string());
    let with_limit = turns.iter().filter(|t| t["composition"]["limit"].is_object()).count();
    assert_eq!(dom.matches("class=\"limit-line\"").count(), with_limit, "a limit line over each turn that has one: {dom}");
    assert_eq!(dom.matches("class=\"warn-band\"").count(), with_limit, "{dom}");
    let last_bar =
        dom.find(&format!("<g class=\"comp-bar\" data-turn=\"{pruned_turn}\"")).expect("the pruned turn's bar, not near the limit");
    assert_eq!(attr_after(&dom, last_bar, "data-limit"), limit.to_string());
    assert_eq!(attr_after(&dom, last_bar, "data-near"), "false");
    let rects = dom[last_bar..].split("</g>").next().unwrap().matches("<rect data-part=").count();
    let nonzero = last["parts"].as_object().unwrap().values().filter(|v| v.as_u64() > Some(0)).count();
    assert_eq!(rects, nonzero, "one segment per part of the prompt: {last}");
    screenshot(&bin, dir.path(), &url, "context");
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
