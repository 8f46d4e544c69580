//! The engine fingerprint end to end: the real proxy in front of llama.cpp's real `llama-server` on a
//! loopback port, so that the fingerprint holds what the server says over HTTP and what its process
//! runs (`/proc`). A conversation, then llama-server restarted on the same port with another
//! `--ctx-size`: every turn names the fingerprint that served it, and the turn after the restart
//! raises `engine_changed` naming the context size field, old -> new, and the `--ctx-size` flag of the
//! command line. Then restarts that change one environment variable, and one flag, alone: each is
//! named by the next turn's finding, and a restart itself (new pid, new start time) is not.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const CONVERSATION: &str = "fingerprint-e2e";

/// A variable llama.cpp reads (`--log-colors`) that changes nothing it says over HTTP; with stderr
/// not a terminal, `off` is also what it does without it.
const ENV_VAR: &str = "LLAMA_ARG_LOG_COLORS";

fn llama_server(server: &Path, model: &Path, port: u16, ctx: &str) -> KillOnDrop {
    llama_server_with(server, model, port, ctx, &[], &[])
}

fn llama_server_with(server: &Path, model: &Path, port: u16, ctx: &str, extra: &[&str], env: &[(&str, &str)]) -> KillOnDrop {
    let child = Command::new(server)
        .arg("-m")
        .arg(model)
        .args(["--port", &port.to_string(), "--ctx-size", ctx, "-np", "1"])
        .args(extra)
        .env_remove(ENV_VAR)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", server.display()));
    KillOnDrop(child)
}

async fn turn(proxy: &Proxy, messages: &mut Vec<Value>, question: &str) {
    turn_in(proxy, CONVERSATION, messages, question).await
}

async fn turn_in(proxy: &Proxy, conversation: &str, messages: &mut Vec<Value>, question: &str) {
    messages.push(json!({"role": "user", "content": question}));
    let body = json!({"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0});
    let headers = [("content-type", "application/json"), ("x-ctxscope-conversation", conversation)];
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
    let summary = finding["summary"].as_str().unwrap();
    assert!(summary.contains("n_ctx") && summary.contains("argv (--ctx-size)"), "{finding}");
    // The live process: its command line changed in that one flag.
    let argv = changes.iter().find(|c| c["field"] == "argv").unwrap_or_else(|| panic!("no argv among the changes: {changes:#?}"));
    assert_eq!(argv["flags"], json!(["--ctx-size"]), "{argv}");
    assert!(argv["old"].as_str().unwrap().ends_with("--ctx-size 1024 -np 1"), "{argv}");
    // Nothing but the context size (as /props and /v1/models report it, and the flag) changed; the
    // new pid and start time are no change.
    assert!(changes.iter().all(|c| c["field"] == "argv" || c["field"].as_str().unwrap().ends_with("n_ctx")), "{changes:#?}");
    let (old_hash, new_hash) = (prints[1].to_string(), prints[2].to_string());
    proxy.stop();

    // The stored fingerprint, read from the store once the proxy is gone (the admin API has no route).
    let store = ctxscope_store::Store::open(data.path(), &ctxscope_store::StoreOptions::default()).unwrap();
    let print = store.fingerprint(&new_hash).unwrap().unwrap();
    let pid = print.fields["process.pid"].as_str().unwrap().to_string();
    assert!(print.sources.contains(&format!("/proc/{pid}")) && print.sources.contains(&"GET /props".to_string()), "{:?}", print.sources);
    assert!(print.fields["exe"].as_str().unwrap().ends_with("/llama-server"), "{:?}", print.fields["exe"]);
    let hex40 = |v: &Value| v.as_str().is_some_and(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(id) = print.fields.get("exe.build_id") {
        assert!(hex40(id), "{id}");
    }
    let libc = print.fields.iter().find(|(k, _)| k.starts_with("lib.libc.so")).map(|(_, v)| v);
    assert!(libc.is_some_and(hex40), "libc's build id: {libc:?}");
    for lib in ["lib.libllama", "lib.libggml-base", "lib.libggml-cpu", "lib.libc.so"] {
        assert!(print.fields.keys().any(|k| k.starts_with(lib)), "no {lib}*: {:?}", print.fields.keys().collect::<Vec<_>>());
    }
    let old = store.fingerprint(&old_hash).unwrap().unwrap();
    assert_ne!(old.fields["process.pid"], print.fields["process.pid"]);
    assert_ne!(old.fields["process.started_unix_ms"], print.fields["process.started_unix_ms"]);
}

/// The one `engine_changed` finding raised on turn `index`.
fn changed_on(findings: &[Value], index: u64) -> &Value {
    let on: Vec<&Value> = findings.iter().filter(|f| f["kind"] == "engine_changed" && f["turn_index"] == index).collect();
    assert_eq!(on.len(), 1, "engine_changed on turn {index}: {findings:#?}");
    on[0]
}

#[tokio::test]
async fn a_changed_environment_variable_or_flag_is_named_by_engine_changed() {
    const NAME: &str = "fingerprint-e2e-process";
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
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    turn_in(&proxy, NAME, &mut messages, "Name a colour.").await;

    // One environment variable more, nothing else.
    drop(first);
    let second = llama_server_with(&server, &model, port, "1024", &[], &[(ENV_VAR, "off")]);
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    turn_in(&proxy, NAME, &mut messages, "Name another.").await;

    // The same variable, and one flag more.
    drop(second);
    let _third = llama_server_with(&server, &model, port, "1024", &["--rope-freq-base", "10000"], &[(ENV_VAR, "off")]);
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    turn_in(&proxy, NAME, &mut messages, "And a third?").await;

    let list = proxy.wait_turns(3).await;
    let id = list.as_array().and_then(|l| l.iter().find(|c| c["name"] == NAME)).map(|c| c["id"].clone());
    let id = id.unwrap_or_else(|| panic!("conversation {NAME} not captured: {list}"));
    let two = |d: &Value| d["findings"].as_array().is_some_and(|f| f.iter().filter(|f| f["kind"] == "engine_changed").count() >= 2);
    let detail = wait_json(&format!("{}/api/conversations/{id}", proxy.admin_url()), Duration::from_secs(10), two).await;
    let prints: Vec<&str> = detail["turns"].as_array().unwrap().iter().map(|t| t["fingerprint"].as_str().unwrap_or("")).collect();
    assert_eq!(prints.len(), 3, "{detail}");
    assert!(prints.iter().all(|p| !p.is_empty()) && prints[0] != prints[1] && prints[1] != prints[2], "{prints:?}");
    let findings = detail["findings"].as_array().unwrap();

    let env = changed_on(findings, 1);
    let fields: Vec<&str> = env["evidence"]["changes"].as_array().unwrap().iter().map(|c| c["field"].as_str().unwrap()).collect();
    assert_eq!(fields, [format!("env.{ENV_VAR}")], "{env:#}");
    let change = &env["evidence"]["changes"][0];
    assert_eq!((change["old"].clone(), change["new"].clone()), (Value::Null, json!("off")));
    assert!(env["summary"].as_str().unwrap().ends_with(&format!(": env.{ENV_VAR}")), "{env}");

    let flag = changed_on(findings, 2);
    let changes = flag["evidence"]["changes"].as_array().unwrap();
    let argv = changes.iter().find(|c| c["field"] == "argv").unwrap_or_else(|| panic!("no argv among the changes: {changes:#?}"));
    assert_eq!(argv["flags"], json!(["--rope-freq-base"]), "{argv}");
    assert!(argv["new"].as_str().unwrap().ends_with("--rope-freq-base 10000"), "{argv}");
    assert!(flag["summary"].as_str().unwrap().contains("argv (--rope-freq-base)"), "{flag}");
    let fields: Vec<&str> = changes.iter().map(|c| c["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["argv"], "{flag:#}");
    proxy.stop();
}
