//! The engine fingerprint end to end: the real proxy in front of llama.cpp's real `llama-server`; a
//! conversation, then llama-server restarted on the same port with another `--ctx-size`. Every turn
//! names the fingerprint that served it, and the turn after the restart raises `engine_changed`
//! naming the context size field, old -> new.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const CONVERSATION: &str = "fingerprint-e2e";

fn llama_server(server: &Path, model: &Path, port: u16, ctx: &str) -> KillOnDrop {
    let child = Command::new(server)
        .arg("-m")
        .arg(model)
        .args(["--port", &port.to_string(), "--ctx-size", ctx, "-np", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", server.display()));
    KillOnDrop(child)
}

async fn turn(proxy: &Proxy, messages: &mut Vec<Value>, question: &str) {
    messages.push(json!({"role": "user", "content": question}));
    let body = json!({"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0});
    let headers = [("content-type", "application/json"), ("x-ctxscope-conversation", CONVERSATION)];
    let answer = post_json(&format!("{}/v1/chat/completions", proxy.url()), &headers, &body).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let reply = answer.json()["choices"][0]["message"].clone();
    messages.push(json!({"role": "assistant", "content": reply["content"]}));
}

#[tokio::test]
async fn restarting_llama_server_with_another_context_size_raises_engine_changed() {
    let Some(server) = llama_server_bin() else {
        return optional_missing("llama.cpp's llama-server", "set LLAMA_SERVER or run scripts/llama_cpp/install.sh");
    };
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let upstream = format!("http://127.0.0.1:{port}");
    let first = llama_server(&server, &model, port, "1024");
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&upstream, data.path()).arg("--fingerprint-every").arg("1").arg("--count-with").arg("none").start();
    // The first probe goes out at start; give it a moment to land before the first turn.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    turn(&proxy, &mut messages, "Name a colour.").await;
    turn(&proxy, &mut messages, "Name another.").await;

    drop(first);
    let _second = llama_server(&server, &model, port, "2048");
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    // Probes every second (and sooner after a failure): three seconds see the new one stored.
    tokio::time::sleep(Duration::from_secs(3)).await;
    turn(&proxy, &mut messages, "And a third?").await;

    let list = proxy.wait_turns(3).await;
    let id = list.as_array().and_then(|l| l.iter().find(|c| c["name"] == CONVERSATION)).map(|c| c["id"].clone());
    let id = id.unwrap_or_else(|| panic!("conversation {CONVERSATION} not captured: {list}"));
    // The turn is listed once committed; its findings are written right after.
    let has_finding = |d: &Value| d["findings"].as_array().is_some_and(|f| f.iter().any(|f| f["kind"] == "engine_changed"));
    let detail = wait_json(&format!("{}/api/conversations/{id}", proxy.admin_url()), Duration::from_secs(10), has_finding).await;
    let prints: Vec<&str> = detail["turns"].as_array().unwrap().iter().map(|t| t["fingerprint"].as_str().unwrap_or("")).collect();
    assert_eq!(prints.len(), 3, "{detail}");
    assert!(!prints[0].is_empty(), "turn 0 carries no fingerprint: {detail}");
    assert_eq!(prints[0], prints[1], "the same llama-server gave two fingerprints");
    assert_ne!(prints[1], prints[2], "the restart with --ctx-size 2048 left the fingerprint unchanged");

    let findings = detail["findings"].as_array().unwrap();
    let changed: Vec<&Value> = findings.iter().filter(|f| f["kind"] == "engine_changed").collect();
    assert_eq!(changed.len(), 1, "{findings:#?}");
    let finding = changed[0];
    assert_eq!(finding["severity"], "warning");
    assert_eq!(finding["turn_index"], 2);
    assert_eq!(finding["evidence"]["engine"], "llama.cpp");
    let changes = finding["evidence"]["changes"].as_array().unwrap();
    let n_ctx = changes.iter().find(|c| c["field"] == "props.default_generation_settings.n_ctx");
    let n_ctx = n_ctx.unwrap_or_else(|| panic!("no context size field among the changes: {changes:#?}"));
    assert_eq!((n_ctx["old"].clone(), n_ctx["new"].clone()), (json!(1024), json!(2048)));
    assert!(finding["summary"].as_str().unwrap().contains("n_ctx"), "{finding}");
    // Nothing but the context size (as /props and /v1/models report it) changed.
    assert!(changes.iter().all(|c| c["field"].as_str().unwrap().ends_with("n_ctx")), "{changes:#?}");
    proxy.stop();
}
