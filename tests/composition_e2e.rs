//! A turn's composition and budget end to end: the real proxy in front of a scripted llama.cpp-style
//! upstream (`/v1/models` owned by `llamacpp`, `/props` with `default_generation_settings.n_ctx`,
//! `/apply-template` and `/tokenize` for counting through the upstream). A conversation with a
//! system prompt, tool definitions, a reply that reasons and calls a tool, and the tool's result:
//! the stored composition (JSON API), the limit the fingerprint gave, `ctxscope show` (the budget
//! table, the near-the-limit marker), `show --json`, and `ctxscope_context_pressure` on /metrics.
//! Then `--context-limit` in place of the engine's, and the local tokenizer's exact parts.

mod support;

use std::time::{Duration, Instant};

use ctxscope_testkit::{Body, FakeUpstream, Received};
use serde_json::{json, Value};
use support::*;

const N_CTX: u64 = 4096;
/// What the scripted upstream counts a prompt of this many messages as (its `/tokenize`).
fn tokens_for(messages: usize) -> u64 {
    match messages {
        2 => 3000,
        4 => 3900,
        n => 100 * n as u64,
    }
}

const SYSTEM: &str = "You are a careful coding assistant. Read files before you answer.";
const REASONING: &str = "The user wants to know what main.rs does; I should read it first with the tool.";
const TOOL_OUTPUT: &str = "fn main() { println!(\"hello, boat\"); }";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "read_file", "description": "Read one file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
}

async fn script(received: Received) -> http::Response<Body> {
    let body = received.json().unwrap_or(Value::Null);
    match (received.method.as_str(), received.path.as_str()) {
        ("GET", "/v1/models") => ctxscope_testkit::json(200, &json!({"object": "list", "data": [{"id": "m", "owned_by": "llamacpp"}]})),
        ("GET", "/props") => ctxscope_testkit::json(
            200,
            &json!({"default_generation_settings": {"n_ctx": N_CTX, "temperature": 0.8}, "total_slots": 1, "build_info": "b1-scripted"}),
        ),
        // Counting through the upstream: the "render" names the message count, the count follows it.
        ("POST", "/apply-template") => {
            let n = body["messages"].as_array().map_or(0, Vec::len);
            ctxscope_testkit::json(200, &json!({"prompt": format!("messages={n}")}))
        }
        ("POST", "/tokenize") => {
            let n: usize = body["content"].as_str().and_then(|c| c.strip_prefix("messages=")).and_then(|n| n.parse().ok()).unwrap_or(0);
            ctxscope_testkit::json(200, &json!({"tokens": vec![7; tokens_for(n) as usize]}))
        }
        ("POST", "/v1/chat/completions") => {
            let n = body["messages"].as_array().map_or(0, Vec::len);
            let message = if n == 2 {
                json!({"role": "assistant", "content": "", "reasoning_content": REASONING,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}"}}]})
            } else {
                json!({"role": "assistant", "content": "It prints a greeting to the boat."})
            };
            let finish = if n == 2 { "tool_calls" } else { "stop" };
            ctxscope_testkit::json(
                200,
                &json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": tokens_for(n), "completion_tokens": 9, "total_tokens": tokens_for(n) + 9}}),
            )
        }
        _ => ctxscope_testkit::json(404, &json!({"error": {"message": "not here"}})),
    }
}

/// Waits until the proxy has asked the upstream's `/props` (its fingerprint), and a moment for it to
/// be stored, so that the first turn is stamped with it.
async fn wait_fingerprint(fake: &FakeUpstream) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !fake.received().iter().any(|r| r.path == "/props") {
        assert!(Instant::now() < deadline, "the proxy never asked /props");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The two turns of the conversation: a question that the model answers by calling a tool (with
/// its reasoning), then the tool's result sent back.
async fn converse(proxy: &Proxy) -> Vec<Value> {
    let url = format!("{}/v1/chat/completions", proxy.url());
    let mut messages = vec![json!({"role": "system", "content": SYSTEM}), json!({"role": "user", "content": "What does src/main.rs do?"})];
    let first = post_json(&url, &[], &json!({"model": "m", "messages": messages, "tools": tools(), "max_tokens": 64})).await;
    assert_eq!(first.status, 200, "{}", String::from_utf8_lossy(&first.body));
    messages.push(first.json()["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": TOOL_OUTPUT}));
    let second = post_json(&url, &[], &json!({"model": "m", "messages": messages, "tools": tools(), "max_tokens": 64})).await;
    assert_eq!(second.status, 200, "{}", String::from_utf8_lossy(&second.body));
    proxy.wait_turns(2).await;
    let list = get_json(&format!("{}/api/conversations", proxy.admin_url())).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "one conversation: {list}");
    let detail = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), list[0]["id"])).await;
    detail["turns"].as_array().unwrap().clone()
}

fn parts_sum(composition: &Value) -> u64 {
    composition["parts"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum()
}

/// `ctxscope_context_pressure`'s samples on /metrics: (labels, value).
async fn pressure_samples(proxy: &Proxy) -> Vec<(String, f64)> {
    let metrics = proxy.metrics().await;
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("ctxscope_context_pressure"))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once(' ')?;
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composition_limit_show_and_pressure_from_a_llama_cpp_style_upstream() {
    let fake = FakeUpstream::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&fake.url(), &dir.path().join("data")).arg("--count-with").arg("upstream").start();
    wait_fingerprint(&fake).await;
    assert!(pressure_samples(&proxy).await.is_empty(), "no pressure before a turn with a limit");
    let turns = converse(&proxy).await;
    assert_eq!(turns.len(), 2);

    // Turn 0: system, user and the tool definitions; counted by the upstream, split by bytes.
    let first = &turns[0]["composition"];
    assert_eq!(first["total"], 3000, "{first}");
    assert_eq!((first["method"].as_str(), first["estimated"].as_bool()), (Some("upstream"), Some(true)), "{first}");
    assert_eq!(parts_sum(first), 3000, "the parts sum to the total: {first}");
    assert_eq!(first["limit"], json!({"tokens": N_CTX, "source": "props.default_generation_settings.n_ctx"}));
    let parts = &first["parts"];
    for part in ["system", "tools", "user"] {
        assert!(parts[part].as_u64().unwrap() > 0, "{part}: {first}");
    }
    for part in ["tool_results", "reasoning", "assistant", "images"] {
        assert_eq!(parts[part], 0, "{part}: {first}");
    }
    // Split by bytes: the system prompt and the tool definitions get the same tokens per byte.
    let tools_bytes = tools().to_string().len() as f64;
    let per_byte = |part: &str, bytes: f64| parts[part].as_u64().unwrap() as f64 / bytes;
    assert!((per_byte("system", SYSTEM.len() as f64) - per_byte("tools", tools_bytes)).abs() < 0.05, "{first}");

    // Turn 1: the reply's reasoning and tool call, and the tool's result, are in the request now.
    let second = &turns[1]["composition"];
    assert_eq!((second["total"].as_u64(), parts_sum(second)), (Some(3900), 3900), "{second}");
    for part in ["system", "tools", "user", "assistant", "reasoning", "tool_results"] {
        assert!(second["parts"][part].as_u64().unwrap() > 0, "{part}: {second}");
    }
    let reasoning = second["parts"]["reasoning"].as_u64().unwrap() as f64 / REASONING.len() as f64;
    let results = second["parts"]["tool_results"].as_u64().unwrap() as f64 / TOOL_OUTPUT.len() as f64;
    assert!((reasoning - results).abs() < 0.05, "reasoning and tool results by bytes alike: {second}");
    assert_eq!(second["limit"]["tokens"], N_CTX);
    assert!(turns[1]["fingerprint"].is_string(), "the turn names its fingerprint: {}", turns[1]);

    // ctxscope show: the budget table, each turn against the limit, the second one near it.
    let conversation = turns[0]["conversation"].as_u64().unwrap().to_string();
    let out = cli(&["show", &conversation, "--admin", &proxy.admin_url()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = |index: &str| {
        let budget = text.split("\nbudget (").nth(1).unwrap_or_else(|| panic!("no budget table: {text}"));
        budget
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{index} ")))
            .unwrap_or_else(|| panic!("no turn {index}: {text}"))
            .to_string()
    };
    eprintln!("{text}");
    let (zero, one) = (line("0"), line("1"));
    assert!(zero.contains("3000 of 4096 tokens (73.2%)") && !zero.contains("near the limit"), "{zero}");
    assert!(one.contains("3900 of 4096 tokens (95.2%)") && one.contains("! near the limit"), "{one}");
    assert!(one.contains("upstream ~"), "the method, marked estimated: {one}");
    assert!(text.contains("context limit 4096 tokens, from props.default_generation_settings.n_ctx"), "{text}");
    let json = cli_json(&["show", &conversation, "--json", "--admin", &proxy.admin_url()]);
    assert_eq!(json["turns"][1]["composition"], *second, "show --json carries the stored composition");

    // The gauge: the latest turn's prompt over the limit, labelled with the upstream.
    let samples = pressure_samples(&proxy).await;
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(samples[0].0, format!("{{upstream=\"{}\"}}", fake.url()));
    assert!((samples[0].1 - 3900.0 / 4096.0).abs() < 1e-9, "{samples:?}");
    proxy.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_limit_flag_and_the_local_tokenizer() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeUpstream::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&fake.url(), &dir.path().join("data"))
        .arg("--tokenizer")
        .arg(model.to_str().unwrap())
        .arg("--context-limit")
        .arg("8000")
        .start();
    wait_fingerprint(&fake).await;
    let turns = converse(&proxy).await;
    for turn in &turns {
        let c = &turn["composition"];
        // The flag wins over the engine's n_ctx.
        assert_eq!(c["limit"], json!({"tokens": 8000, "source": "--context-limit"}), "{c}");
        // The local tokenizer, part by part: exact (SmolLM2's template renders no tools: 0 of them).
        assert_eq!((c["method"].as_str(), c["estimated"].as_bool()), (Some("tokenizer"), Some(false)), "{c}");
        assert_eq!(c["total"], turn["local_tokens"]["prompt"], "{turn}");
        assert_eq!(parts_sum(c), c["total"].as_u64().unwrap(), "{c}");
        assert_eq!(c["parts"]["tools"], 0, "{c}");
        assert!(c["parts"]["system"].as_u64().unwrap() > 0 && c["parts"]["other"].as_u64().unwrap() > 0, "{c}");
    }
    let c = &turns[1]["composition"];
    assert!(c["parts"]["tool_results"].as_u64().unwrap() > 0 && c["parts"]["assistant"].as_u64().unwrap() > 0, "{c}");
    // The template drops reasoning_content: none of it reaches the prompt.
    assert_eq!(c["parts"]["reasoning"], 0, "{c}");
    let total = c["total"].as_u64().unwrap() as f64;
    let samples = pressure_samples(&proxy).await;
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert!((samples[0].1 - total / 8000.0).abs() < 1e-9, "{samples:?} for {total}");
    proxy.stop();
}
