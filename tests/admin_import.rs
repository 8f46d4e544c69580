//! The admin port's writes: `POST /api/import` refuses an oversized Content-Length before reading a
//! byte, rejects files export could not have written, marks imported turns; `POST /api/replays` never
//! replaces another run's id.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_are_checked_and_replays_are_not_overwritten() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let admin = proxy.admin_url();

    // 600 MB announced, 10 bytes sent: refused at once (it used to wait to read up to 512 MiB).
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(proxy.admin).await.unwrap();
    let head =
        "POST /api/import HTTP/1.1\r\nhost: x\r\ncontent-length: 600000000\r\n\r\n{\"kind\":";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut answer))
        .await
        .expect("no answer to an oversized import within 3 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // A real conversation, exported and imported back through the admin API.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "remember 42"}]});
    assert_eq!(
        post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body)
            .await
            .status,
        200
    );
    let listed = proxy.wait_turns(1).await;
    let id = listed[0]["id"].as_u64().unwrap();
    let export = send(
        "GET",
        &format!("{admin}/api/conversations/{id}/export"),
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(export.status, 200);
    let lines: Vec<String> = String::from_utf8_lossy(&export.body)
        .lines()
        .map(str::to_string)
        .collect();
    let import = |lines: Vec<String>| {
        let admin = admin.clone();
        async move {
            send(
                "POST",
                &format!("{admin}/api/import"),
                &[],
                lines.join("\n").into_bytes(),
            )
            .await
        }
    };
    let imported = import(lines.clone()).await;
    assert_eq!(
        imported.status,
        200,
        "{}",
        String::from_utf8_lossy(&imported.body)
    );
    let new_id = imported.json()["conversation"].as_u64().unwrap();
    let detail = get_json(&format!("{admin}/api/conversations/{new_id}")).await;
    let notes = detail["turns"][0]["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .unwrap()
            .starts_with("imported from an export file")),
        "{notes:?}"
    );

    // Header only; a turn before its messages.
    let header_only = import(lines[..1].to_vec()).await;
    assert_eq!(
        header_only.status,
        400,
        "{}",
        String::from_utf8_lossy(&header_only.body)
    );
    let turn_line = lines
        .iter()
        .position(|l| l.contains("\"kind\":\"turn\""))
        .unwrap();
    let mut reordered = lines.clone();
    let turn = reordered.remove(turn_line);
    reordered.insert(1, turn);
    let early = import(reordered).await;
    assert_eq!(early.status, 400);
    assert!(String::from_utf8_lossy(&early.body).contains("no line before it holds"));

    // Replays: a new id is stored, another run under it is refused, the original kept.
    let run = |conversation: u64, summary: &str| {
        json!({"id": 77, "conversation": conversation, "started_unix_ms": 1, "finished_unix_ms": 2,
               "targets": [], "summary": summary, "report": null})
    };
    assert_eq!(
        post_json(&format!("{admin}/api/replays"), &[], &run(id, "first"))
            .await
            .status,
        200
    );
    let clash = post_json(
        &format!("{admin}/api/replays"),
        &[],
        &run(id + 1, "intruder"),
    )
    .await;
    assert_eq!(
        clash.status,
        409,
        "{}",
        String::from_utf8_lossy(&clash.body)
    );
    assert_eq!(
        get_json(&format!("{admin}/api/replays/77")).await["summary"],
        "first"
    );
    proxy.stop();
}
