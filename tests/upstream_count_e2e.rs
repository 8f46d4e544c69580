//! `--count-with upstream` end to end: the real proxy binary, with no tokenizer file, in front of the
//! real llama.cpp `llama-server` and the real `ctxscope engine` on the default model. Every turn of a
//! multi-turn chat is counted through the engine's own template and tokenize endpoints, and the count
//! equals the `prompt_tokens` the engine reports for that turn.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const CTX: &str = "2048";
const KEY: &str = "Bearer sk-count-e2e-5f1c";

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Four turns through `proxy`, each extending the last; returns the engine's `prompt_tokens` per turn.
async fn chat(proxy: &Proxy) -> Vec<u64> {
    let questions = ["What is the capital of France?", "And of Spain?", "Which of the two is larger?", "Name a river in each."];
    let mut messages = vec![json!({"role": "system", "content": "You are a terse geography tutor."})];
    let mut engine_counts = Vec::new();
    for question in questions {
        messages.push(user(question));
        let body = json!({"model": "m", "messages": messages, "max_tokens": 12, "temperature": 0});
        let raw = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[("authorization", KEY)], &body).await;
        let reply = raw.json();
        engine_counts.push(reply["usage"]["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("no usage.prompt_tokens: {reply}")));
        messages.push(json!({"role": "assistant", "content": reply["choices"][0]["message"]["content"]}));
    }
    engine_counts
}

/// The proxy's stored counts equal the engine's, turn by turn, and name the method; the key was used
/// for the count calls but is nowhere in the store.
async fn check(proxy: Proxy, engine_counts: &[u64], method: &str) {
    let list = proxy.wait_turns(engine_counts.len() as u32).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "one conversation: {list}");
    let shown = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), list[0]["id"])).await;
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), engine_counts.len(), "{shown}");
    for (turn, engine) in turns.iter().zip(engine_counts) {
        assert_eq!(turn["local_tokens"]["tokenizer"], method, "{turn}");
        assert_eq!(turn["local_tokens"]["prompt"].as_u64(), Some(*engine), "turn {}: {turn}", turn["index"]);
        assert_eq!(turn["usage"]["prompt_tokens"].as_u64(), Some(*engine), "{turn}");
    }
    // Clean traffic counted by the engine itself raises none of the count-based findings.
    let findings = get_json(&format!("{}/api/findings", proxy.admin_url())).await;
    let count_based = ["engine_truncation", "token_count_drift", "phantom_cache_reuse"];
    let raised: Vec<&Value> = findings.as_array().unwrap().iter().filter(|f| count_based.iter().any(|k| f["kind"] == *k)).collect();
    assert!(raised.is_empty(), "{raised:?}");
    let metrics = proxy.metrics().await;
    let failures: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("ctxscope_upstream_count_failures_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(failures, 0.0, "{metrics}");
    let (sum, count) = (
        metric_value(&proxy.admin_url(), "ctxscope_upstream_count_seconds_sum").await,
        metric_value(&proxy.admin_url(), "ctxscope_upstream_count_seconds_count").await,
    );
    let (sum, count) = (sum.expect("count latency histogram"), count.expect("count latency histogram"));
    assert_eq!(count as usize, engine_counts.len(), "one upstream count per new prompt");
    eprintln!("{method}: {count} counts, mean {:.2} ms per counted turn", sum / count * 1000.0);
    let data = proxy.data.clone();
    proxy.stop();
    let stored = all_bytes(&data);
    assert!(!stored.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "the Authorization header reached the store");
}

#[tokio::test]
async fn upstream_counts_through_ctxscope_engine_equal_its_prompt_tokens() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let engine = Command::new(bin())
        .args(["engine", "--model"])
        .arg(&model)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--ctx", CTX])
        .env("CTXSCOPE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ctxscope engine");
    let _engine = KillOnDrop(engine);
    let upstream = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&upstream, &dir.path().join("data")).arg("--count-with").arg("upstream").start();
    let counts = chat(&proxy).await;
    check(proxy, &counts, "upstream:ctxscope").await;
}

#[tokio::test]
async fn upstream_counts_through_llama_server_equal_its_prompt_tokens() {
    let Some(server) = llama_server_bin() else {
        return optional_missing("llama.cpp's llama-server", "set LLAMA_SERVER or run scripts/llama_cpp/install.sh");
    };
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let child = Command::new(&server)
        .arg("-m")
        .arg(&model)
        .args(["--port", &port.to_string(), "--ctx-size", CTX, "-np", "1"])
        // The count calls get through only with the client's key.
        .args(["--api-key", KEY.trim_start_matches("Bearer ")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", server.display()));
    let _server = KillOnDrop(child);
    let upstream = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{upstream}/health"), Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().unwrap();
    // The default, auto: no --tokenizer, so the proxy finds llama.cpp's endpoints itself.
    let proxy = Proxy::builder(&upstream, &dir.path().join("data")).start();
    let counts = chat(&proxy).await;
    check(proxy, &counts, "upstream:llama.cpp").await;
}
