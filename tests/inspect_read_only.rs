//! Inspection with `--data DIR` only reads: sled rewrites its files when it opens (recovery, even of a
//! damaged log), so `conversations`, `show`, `findings`, `export` and `replays` open a private copy and
//! leave every byte of the directory as it was, for a healthy store and for a damaged one. Damage is
//! never silent: the CLI warns (or fails), a proxy on it reports `degraded` and counts it.

mod support;

use std::path::Path;

use serde_json::json;
use support::upstream::Upstream;
use support::*;

fn inspect_all(data: &Path) {
    let data = data.to_str().unwrap();
    for args in [
        vec!["conversations", "--json", "--data", data],
        vec!["conversations", "--data", data],
        vec!["show", "1", "--json", "--data", data],
        vec!["findings", "--json", "--data", data],
        vec!["export", "1", "--data", data],
        vec!["replays", "--json", "--data", data],
    ] {
        let _ = cli(&args);
    }
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                stack.push(entry);
            } else {
                files.push((entry.display().to_string(), std::fs::read(&entry).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_leaves_the_store_untouched() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    for i in 0..20 {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("conversation {i} {}", "x".repeat(2000))}]});
        assert_eq!(post_json(&url, &[], &body).await.status, 200);
    }
    proxy.wait_turns(20).await;
    // While the proxy holds it: refused with a pointer to the admin API.
    let held = cli(&["conversations", "--data", data.to_str().unwrap()]);
    assert!(!held.status.success());
    assert!(String::from_utf8_lossy(&held.stderr).contains("--admin URL"), "{}", String::from_utf8_lossy(&held.stderr));
    proxy.stop();

    let before = snapshot(&data);
    let listed = cli(&["conversations", "--json", "--data", data.to_str().unwrap()]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let conversations: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(conversations.as_array().unwrap().len(), 20);
    inspect_all(&data);
    assert!(before == snapshot(&data), "inspecting a healthy store changed its files");

    // Damage the log a third of the way in: inspection may fail or warn, but changes nothing.
    let db = data.join("db");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes.len() / 3;
    let end = (at + 4096).min(bytes.len());
    for (i, b) in bytes[at..end].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    std::fs::write(&db, &bytes).unwrap();
    let damaged = snapshot(&data);
    inspect_all(&data);
    assert!(damaged == snapshot(&data), "inspecting a damaged store changed its files");

    // Never silent: the CLI warns that sled was damaged and shows what the journal holds (all of
    // it); a proxy on it puts it back and says so.
    let listed = cli(&["conversations", "--json", "--data", data.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(listed.status.success() && stderr.contains("damaged") && stderr.contains("journal"), "silent on a damaged store: {stderr}");
    let shown: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(shown.as_array().unwrap().len(), 20, "{stderr}");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    assert!(health["store_restored"]["turns"].as_u64().is_some_and(|n| n > 0), "{health}");
    let listed = get_json(&format!("{}/api/conversations", proxy.admin_url())).await;
    assert_eq!(listed.as_array().unwrap().len(), 20);
    proxy.stop();
}
