//! `ctxscope store check` on a store the real proxy wrote: a byte flipped inside a turn record and
//! inside a conversation record (as bit rot or a bad write leaves them) is named, tree and key, with
//! exit status 1 and the directory untouched; `--repair` puts the damaged turns back from the record
//! journal, rebuilds the damaged record from its turns, and leaves a store that checks clean, every
//! conversation as it was and the proxy healthy on it again. A byte flipped in sled's own log file
//! (which sled's checksums catch, cutting the log short on open) is reported as missing turns and
//! made good from the journal, by repair or by the proxy's next start, ids never handed out again.
//! Damage to both copies is a loss that `conversations`, `/healthz` and `store check` report (exit
//! status 1) until `store ack`.

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
            Some(5) => {
                assert_eq!((&new["turns"], &new["last_turn"], &new["last_head"]), (&old["turns"], &old["last_turn"], &old["last_head"]))
            }
            _ => assert_eq!(old, new, "a conversation changed (conversation 3's turns come back from the journal)"),
        }
    }
    let shown = cli_json(&["show", "3", "--json", "--data", data.to_str().unwrap()]);
    assert_eq!(shown["turns"].as_array().map(Vec::len), Some(TURNS));
    assert!(!shown["turns"].to_string().contains("cut this conversation"), "{shown}");

    // The proxy runs on the repaired store, healthy, and captures into it.
    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "after the repair"}]});
    assert_eq!(post_json(&url_of(&proxy), &[], &body).await.status, 200);
    proxy.wait_turns((CONVERSATIONS * TURNS + 1) as u32).await;
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
    assert!(has_line(&text, &["missing", "is in the record journal but not in the store"]), "{text}");
    // Inspection shows what the next start will: every conversation, put back from the journal.
    assert_eq!(conversations(&data).len(), 20);
    let (ok, text) = check(&data, true);
    assert!(ok && text.contains("id counters raised") && text.contains("put back from the journal"), "{text}");
    let (ok, text) = check(&data, false);
    assert!(ok && text.contains("no damage"), "{text}");
    assert_eq!(conversations(&data).len(), 20);
    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
}

/// 20 conversations of 3 turns through the proxy; the data directory.
async fn twenty_conversations(up: &Upstream, data: &Path) {
    let proxy = Proxy::builder(&up.url(), data).start();
    let url = url_of(&proxy);
    for c in 0..20 {
        let mut messages = vec![json!({"role": "user", "content": format!("conversation {c} {}", "y".repeat(500))})];
        for t in 0..3 {
            let raw = post_json(&url, &[], &json!({"model": "m", "messages": messages})).await;
            assert_eq!(raw.status, 200);
            messages.push(raw.json()["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": format!("conversation {c}, question {}", t + 1)}));
        }
    }
    proxy.wait_turns(60).await;
    proxy.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_restarts_on_a_damaged_log_with_every_conversation_and_no_id_reused() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    twenty_conversations(&up, &data).await;
    // 16 bytes flipped at 10% of sled's log, as the hostile probe did.
    let db = data.join("db");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes.len() / 10;
    for b in &mut bytes[at..at + 16] {
        *b ^= 0xA5;
    }
    std::fs::write(&db, &bytes).unwrap();

    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    assert!(health.get("losses").is_none(), "nothing was lost: {health}");
    let listed = get_json(&format!("{}/api/conversations", proxy.admin_url())).await;
    assert_eq!(listed.as_array().unwrap().len(), 20, "{listed}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "a new conversation after the damage"}]});
    assert_eq!(post_json(&url_of(&proxy), &[], &body).await.status, 200);
    proxy.wait_turns(61).await;
    proxy.stop();
    let list = conversations(&data);
    assert_eq!(list.len(), 21);
    assert_eq!(list.last().unwrap()["id"], 21, "the new conversation's id is new");
    let (ok, text) = check(&data, false);
    assert!(ok && text.contains("no damage"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_of_both_copies_is_reported_until_acknowledged() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    twenty_conversations(&up, &data).await;
    // Conversation 20's last turn: gone from sled, and its journal record damaged.
    let db = open_sled(&data);
    let last = *turn_ids(&db, 20).last().unwrap_or_else(|| panic!("conversation 20's turns: {:?}", conversations(&data)));
    db.open_tree("turns").unwrap().remove(last.to_be_bytes()).unwrap();
    db.flush().unwrap();
    drop(db);
    let segment = data.join("journal").join("0000000000000000.seg");
    let mut bytes = std::fs::read(&segment).unwrap();
    let end = bytes.len();
    bytes[end - 10] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    let losses = health["losses"].as_array().unwrap_or_else(|| panic!("no losses in {health}"));
    assert_eq!(losses.len(), 1, "{health}");
    assert!(losses[0]["detail"].as_str().unwrap().contains(&last.to_string()), "{health}");
    proxy.stop();
    // Remembered across restarts, shown by `conversations` with a non-zero exit, and by check.
    let listed = cli(&["conversations", "--data", data.to_str().unwrap()]);
    assert!(!listed.status.success(), "a store with an unacknowledged loss listed with exit 0");
    assert!(String::from_utf8_lossy(&listed.stderr).contains("lost records"), "{}", String::from_utf8_lossy(&listed.stderr));
    let (ok, text) = check(&data, true);
    assert!(!ok && has_line(&text, &["lost", "losses/1"]), "{text}");
    let acked = cli(&["store", "ack", "--data", data.to_str().unwrap()]);
    assert!(acked.status.success(), "{}", String::from_utf8_lossy(&acked.stderr));
    let listed = cli(&["conversations", "--data", data.to_str().unwrap()]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let (ok, text) = check(&data, false);
    assert!(ok, "{text}");
    // The lost turn's id is never handed out again.
    let proxy = Proxy::builder(&up.url(), &data).start();
    assert!(get_json(&format!("{}/healthz", proxy.admin_url())).await.get("losses").is_none());
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "after the loss"}]});
    assert_eq!(post_json(&url_of(&proxy), &[], &body).await.status, 200);
    proxy.wait_turns(60).await;
    proxy.stop();
    let newest = cli_json(&["show", "21", "--json", "--data", data.to_str().unwrap()]);
    assert!(newest["turns"][0]["id"].as_u64().is_some_and(|id| id > last), "{newest}");
}
