//! `ctxscope store check` on a store the real proxy wrote: a byte flipped inside a turn record and
//! inside a conversation record (as bit rot or a bad write leaves them) is named, tree and key, with
//! exit status 1 and the directory untouched; `--repair` cuts the damaged conversation back to the
//! turns that still resolve, rebuilds the damaged record from its turns, and leaves a store that
//! checks clean, with every undamaged conversation as it was and the proxy healthy on it again. A
//! byte flipped in sled's own log file (which sled's checksums catch, cutting the log short on open)
//! is reported as the ids lost since the last checkpoint.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

const CONVERSATIONS: usize = 6;
const TURNS: usize = 3;

fn check(data: &Path, repair: bool) -> (bool, String) {
    let data = data.to_str().unwrap();
    let mut args = vec!["store", "check", "--data", data];
    if repair {
        args.push("--repair");
    }
    // This process's sled handle (see `open_sled`) may hold the lock a moment after it is dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = cli(&args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !text.contains("in use by a running ctxscope process") || Instant::now() > deadline {
            return (out.status.success(), text);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// sled opened in this process, once the last handle's lock is let go (`ctxscope_testkit::sled_lock`).
fn open_sled(data: &Path) -> sled::Db {
    ctxscope_testkit::sled_lock::when_unlocked(|| sled::open(data))
        .unwrap_or_else(|error| panic!("cannot open {}: {error}", data.display()))
}

/// Whether one line of `text` holds every one of `parts`.
fn has_line(text: &str, parts: &[&str]) -> bool {
    text.lines().any(|line| parts.iter().all(|p| line.contains(p)))
}

fn conversations(data: &Path) -> Vec<Value> {
    let value = cli_json(&["conversations", "--json", "--data", data.to_str().unwrap()]);
    let mut list = value.as_array().unwrap().clone();
    list.sort_by_key(|c| c["id"].as_u64());
    list
}

/// Flips one byte inside the payload of a stored value (past its 5-byte frame header).
fn flip_inside(db: &sled::Db, tree: &str, key: &[u8]) {
    let tree = db.open_tree(tree).unwrap();
    let mut value = tree.get(key).unwrap().expect("record to damage").to_vec();
    assert!(matches!(value[0], 0x01..=0x04), "a framed record (JSON, a turn's binary layouts, a compressed pack)");
    let at = value.len() / 2;
    value[at] ^= 0x01;
    tree.insert(key, value).unwrap();
}

fn turn_ids(db: &sled::Db, conversation: u64) -> Vec<u64> {
    let list = db.open_tree("conversation_turns").unwrap();
    list.scan_prefix(conversation.to_be_bytes()).keys().map(|k| u64::from_be_bytes(k.unwrap()[8..16].try_into().unwrap())).collect()
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.path().display().to_string(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_check_names_the_damage_and_repair_keeps_the_rest() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    for c in 0..CONVERSATIONS {
        let mut messages = vec![json!({"role": "user", "content": format!("conversation {c}, question 0")})];
        for t in 0..TURNS {
            let raw = post_json(&url, &[], &json!({"model": "m", "messages": messages})).await;
            assert_eq!(raw.status, 200);
            messages.push(raw.json()["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": format!("conversation {c}, question {}", t + 1)}));
        }
    }
    proxy.wait_turns((CONVERSATIONS * TURNS) as u32).await;
    proxy.stop();

    let (ok, text) = check(&data, false);
    assert!(ok && text.contains("no damage"), "{text}");
    let before = conversations(&data);
    assert_eq!(before.len(), CONVERSATIONS);
    assert!(before.iter().all(|c| c["turns"] == TURNS as u64), "{before:?}");

    // Damage conversation 3's middle turn and conversation 5's record.
    let db = open_sled(&data);
    let cut = turn_ids(&db, 3);
    assert_eq!(cut.len(), TURNS);
    flip_inside(&db, "turns", &cut[1].to_be_bytes());
    flip_inside(&db, "conversations", &5u64.to_be_bytes());
    db.flush().unwrap();
    drop(db);

    let damaged = snapshot(&data);
    let (ok, text) = check(&data, false);
    assert!(!ok, "damage found, yet exit 0: {text}");
    assert!(has_line(&text, &["damaged", &format!("turns/{}: checksum mismatch", cut[1])]), "{text}");
    assert!(has_line(&text, &["damaged", "conversations/5: checksum mismatch"]), "{text}");
    assert!(has_line(&text, &["unresolvable", &format!("turns/{}:", cut[2])]), "the turn standing on the damaged one: {text}");
    assert!(text.contains("conversation 3: cut back: 1 turn(s) kept, 2 removed"), "{text}");
    assert!(text.contains("conversation 5: record rebuilt from its 3 turn(s)"), "{text}");
    assert!(text.contains("--repair"), "{text}");
    assert!(damaged == snapshot(&data), "store check without --repair changed the store's files");

    let (ok, text) = check(&data, true);
    assert!(ok, "{text}");
    assert!(text.contains("repaired:") && text.contains("checked again after the repair: no damage"), "{text}");
    let (ok, text) = check(&data, false);
    assert!(ok && text.contains("no damage"), "a second check: {text}");

    let after = conversations(&data);
    assert_eq!(after.len(), CONVERSATIONS, "{after:?}");
    for (old, new) in before.iter().zip(&after) {
        match old["id"].as_u64() {
            Some(3) => assert_eq!((new["turns"].as_u64(), &new["last_turn"]), (Some(1), &json!(cut[0]))),
            Some(5) => {
                assert_eq!((&new["turns"], &new["last_turn"], &new["last_head"]), (&old["turns"], &old["last_turn"], &old["last_head"]))
            }
            _ => assert_eq!(old, new, "an undamaged conversation changed"),
        }
    }
    let shown = cli_json(&["show", "3", "--json", "--data", data.to_str().unwrap()]);
    let notes = shown["turns"][0]["notes"].to_string();
    assert!(notes.contains("cut this conversation"), "{notes}");

    // The proxy runs on the repaired store, healthy, and captures into it.
    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "after the repair"}]});
    assert_eq!(post_json(&url_of(&proxy), &[], &body).await.status, 200);
    proxy.wait_turns((CONVERSATIONS * TURNS - 2 + 1) as u32).await;
    proxy.stop();
    let (ok, text) = check(&data, false);
    assert!(ok, "{text}");
}

fn url_of(proxy: &Proxy) -> String {
    format!("{}/v1/chat/completions", proxy.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_flipped_in_the_log_file_is_reported_as_lost_records() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = url_of(&proxy);
    for c in 0..20 {
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": format!("MARK{c:02} conversation {c} {}", "x".repeat(2000))}]});
        assert_eq!(post_json(&url, &[], &body).await.status, 200);
    }
    proxy.wait_turns(20).await;
    proxy.stop();
    // Inside the request message of the eighth conversation, as sled laid it down in its log.
    let db = data.join("db");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes.windows(6).position(|w| w == b"MARK07").expect("the message in the log");
    bytes[at + 40] ^= 0x01;
    std::fs::write(&db, &bytes).unwrap();

    let (ok, text) = check(&data, false);
    assert!(!ok, "{text}");
    assert!(has_line(&text, &["lost", "log:", "records written before its last checkpoint are missing"]), "{text}");
    let (ok, text) = check(&data, true);
    assert!(ok && text.contains("id counters raised"), "{text}");
    let (ok, text) = check(&data, false);
    assert!(ok && text.contains("no damage"), "{text}");
    let kept = conversations(&data);
    assert!(!kept.is_empty() && kept.len() < 20, "{} conversations", kept.len());
    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
}
