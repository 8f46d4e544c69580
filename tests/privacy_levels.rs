//! `--capture full|redacted|hashes` end to end, through the real binary and the scripted upstream: a
//! three-turn conversation whose messages (and so the upstream's echoing replies) carry an OpenAI
//! key, an e-mail address, a Luhn-valid card number and a phone number, and whose third turn drops
//! the first exchange. Below full none of those strings is in any byte under the data directory, nor
//! in the record journal's decompressed payloads, nor in what `show --json` reads back; at full the
//! same search finds every one (so the search can fail). `history_dropped` is raised at every level
//! (hashes are of the messages as sent), `show`, the JSON API and `export` name the level, and
//! `replay` refuses a conversation captured without text and warns on a masked one.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

const KEY: &str = "sk-proj-N8fQ2xLr7TbVw3Kc9YzHd4Mp6Ej1Ua5Gs0Ro";
const EMAIL: &str = "jane.roe@example.org";
const CARD: &str = "4111 1111 1111 1111";
const PHONE: &str = "+44 20 7946 0958";
const SECRETS: [&str; 4] = [KEY, EMAIL, CARD, PHONE];

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Sends one chat request; returns the assistant message the upstream answered with.
async fn ask(proxy: &Proxy, messages: &[Value]) -> Value {
    let body = json!({"model": "m", "messages": messages});
    let raw = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body).await;
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    raw.json()["choices"][0]["message"].clone()
}

/// The conversation: two turns that extend each other, then a third that keeps the system prompt
/// and the second exchange only (a window that drops the first). Returns its id.
async fn converse(proxy: &Proxy) -> u64 {
    let system = json!({"role": "system", "content": "You are a billing assistant."});
    let u1 = user(&format!("My key is {KEY} and my e-mail is {EMAIL}."));
    let a1 = ask(proxy, &[system.clone(), u1.clone()]).await;
    let u2 = user(&format!("Charge card {CARD} and text me on {PHONE}."));
    let a2 = ask(proxy, &[system.clone(), u1, a1, u2.clone()]).await;
    ask(proxy, &[system, u2, a2, user("What did I ask you to do?")]).await;
    let list = proxy.wait_turns(3).await;
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "one conversation, threaded by hashes at every level: {list:?}");
    list[0]["id"].as_u64().unwrap()
}

/// Which of the secrets `haystack` holds.
fn found(haystack: &[u8]) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| haystack.windows(s.len()).any(|w| w == s.as_bytes())).collect()
}

/// Every byte under the data directory, and every journal record's payload decompressed.
fn stored_bytes(data: &Path) -> Vec<u8> {
    let mut bytes = all_bytes(data);
    let records = ctxscope_store::journal::read_all(data).expect("read the record journal");
    assert!(records.len() >= 4, "three turns and a finding journaled: {}", records.len());
    for (_, payload) in records {
        bytes.extend(payload);
    }
    bytes
}

async fn run_level(upstream: &Upstream, level: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&upstream.url(), &data).arg("--capture").arg(level).start();
    let id = converse(&proxy).await;
    let admin = proxy.admin_url();

    // history_dropped is raised whatever the level: the comparison is by the hashes of the
    // messages as sent, and removed messages are a loss whether or not their text was stored.
    let findings = wait_json(&format!("{admin}/api/findings"), Duration::from_secs(10), |v| {
        v.as_array().is_some_and(|a| a.iter().any(|f| f["kind"] == "history_dropped"))
    })
    .await;
    let dropped = findings.as_array().unwrap().iter().find(|f| f["kind"] == "history_dropped").cloned();
    let dropped = dropped.unwrap_or_else(|| panic!("{level}: no history_dropped finding: {findings}"));
    assert_eq!(dropped["evidence"]["cause"], "windowed", "{level}: {dropped}");
    assert_eq!(dropped["evidence"]["removed_messages"], json!([1, 2]), "{level}: {dropped}");
    if level == "hashes" {
        assert!(dropped["evidence"].get("first_before").is_none(), "no excerpt without text: {dropped}");
        assert_eq!(dropped["evidence"]["edits"][0]["text_withheld"], true, "{dropped}");
    }

    // The JSON API names the level on the conversation and on every turn.
    let detail = get_json(&format!("{admin}/api/conversations/{id}")).await;
    assert_eq!(detail["conversation"]["capture"], level, "{detail}");
    assert!(detail["turns"].as_array().unwrap().iter().all(|t| t["capture"] == level), "{detail}");
    proxy.stop();

    // (1) What the data directory holds, journal decompressed, and what the store reads back.
    let data_arg = data.to_str().unwrap();
    let shown_json = cli(&["show", &id.to_string(), "--json", "--data", data_arg]);
    assert!(shown_json.status.success(), "{}", String::from_utf8_lossy(&shown_json.stderr));
    let mut everything = stored_bytes(&data);
    everything.extend(&shown_json.stdout);
    let leaked = found(&everything);
    if level == "full" {
        assert_eq!(leaked, SECRETS.to_vec(), "at full the search finds every one (the check can fail)");
    } else {
        assert!(leaked.is_empty(), "--capture {level} stored {leaked:?}");
    }
    if level == "redacted" {
        let text = String::from_utf8_lossy(&shown_json.stdout);
        for marker in ["[redacted:openai_key]", "[redacted:email]", "[redacted:card]", "[redacted:phone]"] {
            assert!(text.contains(marker), "masked text keeps a typed marker, {marker}: {text}");
        }
    }

    // The store, read whole, checks clean: masked packs are not taken for damage, nor are the
    // messages a hashes-only turn never stored.
    let checked = cli(&["store", "check", "--data", data_arg]);
    assert!(checked.status.success(), "{level}: {}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));

    // (3) show and export name the level.
    let shown = cli(&["show", &id.to_string(), "--data", data_arg]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(shown.contains(&format!("capture {level}")), "{shown}");
    let export = cli(&["export", &id.to_string(), "--data", data_arg]);
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    let header: Value = serde_json::from_slice(export.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(header["capture"], level, "{header}");
    assert!(found(&export.stdout).is_empty() || level == "full", "export of {level} leaks");
    let export_stderr = String::from_utf8_lossy(&export.stderr);
    match level {
        "full" => assert!(!export_stderr.contains("--capture"), "{export_stderr}"),
        _ => assert!(export_stderr.contains(&format!("--capture {level}")), "{export_stderr}"),
    }

    // Replay: refused without text (before any engine starts), warned about when masked.
    if level == "hashes" {
        let replay = cli(&["replay", &id.to_string(), "--data", data_arg, "--target", "engine"]);
        let stderr = String::from_utf8_lossy(&replay.stderr);
        assert!(!replay.status.success(), "a replay of a conversation without text must fail: {stderr}");
        assert!(stderr.contains("captured with --capture hashes") && stderr.contains("cannot be replayed"), "{stderr}");
    }
    if level == "redacted" {
        let golden = format!("url={},model=m", upstream.url());
        let target = format!("url={},model=m,name=again", upstream.url());
        let args = ["replay", &id.to_string(), "--data", data_arg, "--golden", &golden, "--target", &target];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        // The upstream answers on this process's runtime: the CLI waits off it.
        let replay = tokio::task::spawn_blocking(move || cli(&args.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap();
        let stderr = String::from_utf8_lossy(&replay.stderr);
        assert!(stderr.contains("warning: conversation") && stderr.contains("captured with --capture redacted"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_store_below_full_and_detection_is_the_same() {
    let upstream = Upstream::start().await;
    for level in ["full", "redacted", "hashes"] {
        run_level(&upstream, level).await;
    }
}

#[test]
fn responses_state_is_refused_below_full() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cli(&[
        "proxy",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--capture",
        "redacted",
        "--responses-state",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--responses-state") && stderr.contains("--capture redacted"), "{stderr}");
}
