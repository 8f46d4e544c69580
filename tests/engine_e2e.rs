//! The engine end to end: the real `ctxscope engine` (and `ctxscope serve`) process on the real default
//! model, driven over loopback. Chat and text completions streaming and not, usage and prefix reuse,
//! stop strings, logprobs, tokenize, models, every bad input answered with a clear 400 (and the server
//! still serving), a thousand concurrent requests, and `serve` capturing through its proxy.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn model_path() -> PathBuf {
    ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// A running `ctxscope engine` or `ctxscope serve` process.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(command: &str, port: u16, extra: &[&str]) -> Server {
        let child = Command::new(bin())
            .arg(command)
            .arg("--model")
            .arg(model_path())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("CTXSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ctxscope");
        Server { child, url: format!("http://127.0.0.1:{port}") }
    }

    fn engine(extra: &[&str]) -> Server {
        Server::start("engine", free_port(), extra)
    }

    async fn ready(self) -> Server {
        wait_http_ok(&format!("{}/health", self.url), Duration::from_secs(60)).await;
        self
    }

    fn stop(mut self) {
        terminate(&mut self.child, "ctxscope");
    }

    async fn chat(&self, body: Value) -> Raw {
        post_json(&format!("{}/v1/chat/completions", self.url), &[], &body).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn ok_json(raw: &Raw) -> Value {
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    raw.json()
}

/// The `data:` payloads of an SSE body, `[DONE]` excluded (it must be last).
fn sse_events(raw: &Raw) -> Vec<Value> {
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    assert_eq!(raw.headers.get("content-type").map(|v| v.to_str().unwrap()), Some("text/event-stream"));
    let text = String::from_utf8(raw.body.to_vec()).expect("SSE is UTF-8");
    let data: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").expect("data line")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("chunk JSON")).collect()
}

fn content(reply: &Value) -> String {
    reply["choices"][0]["message"]["content"].as_str().expect("content").to_string()
}

fn streamed_text(events: &[Value]) -> String {
    events.iter().filter_map(|e| e["choices"].get(0).and_then(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_usage_and_prefix_reuse() {
    let engine = Server::engine(&[]).ready().await;
    let messages = json!([user("What is the capital of France?")]);
    let raw = engine.chat(json!({"model": "any", "messages": messages, "temperature": 0, "max_tokens": 16})).await;
    assert_eq!(raw.headers.get("x-ctxscope-path").unwrap(), "golden");
    let reply = ok_json(&raw);
    let answer = content(&reply);
    assert!(answer.contains("Paris"), "{answer:?}");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
    let usage = &reply["usage"];
    let (prompt, completion) = (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
    assert!(prompt > 10 && completion > 0 && completion <= 16, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64(), "{usage}");

    // Streamed at temperature 0: the same text, a role chunk first, a usage chunk last.
    let body = json!({"messages": messages, "temperature": 0, "max_tokens": 16, "stream": true, "stream_options": {"include_usage": true}});
    let events = sse_events(&engine.chat(body).await);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(events.iter().all(|e| e["object"] == "chat.completion.chunk" && e["id"] == events[0]["id"]));
    assert_eq!(streamed_text(&events), answer);
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"].as_u64(), Some(prompt));
    assert_eq!(last["usage"]["completion_tokens"].as_u64(), Some(completion));
    assert_eq!(last["usage"]["total_tokens"].as_u64(), Some(prompt + completion));
    // The identical prompt again: all but its last token came from the prefix cache.
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt - 1));
    let finish = &events[events.len() - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], reply["choices"][0]["finish_reason"]);
    assert!(events[..events.len() - 1].iter().all(|e| e["usage"].is_null()), "usage: null on every other chunk");

    // A second turn reuses the first turn's KV.
    let second = json!([user("What is the capital of France?"), {"role": "assistant", "content": answer}, user("And of Italy?")]);
    let turn2 = ok_json(&engine.chat(json!({"messages": second, "temperature": 0, "max_tokens": 8})).await);
    let cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= prompt, "second turn cached {cached} of {}: prefix not reused", turn2["usage"]["prompt_tokens"]);

    // Text completions, streamed or not, agree too.
    let url = format!("{}/v1/completions", engine.url);
    let plain = ok_json(&post_json(&url, &[], &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0})).await);
    assert_eq!(plain["object"], "text_completion");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text:?}");
    let events = sse_events(
        &post_json(&url, &[], &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "stream": true})).await,
    );
    assert_eq!(streamed_text(&events), text);
    assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"]);

    // max_completion_tokens is honoured; a request may pick the fast path and hears it back.
    let raw = post_json(
        &format!("{}/v1/chat/completions", engine.url),
        &[("x-ctxscope-path", "fast")],
        &json!({"messages": messages, "temperature": 0, "max_completion_tokens": 3}),
    )
    .await;
    assert_eq!(raw.headers.get("x-ctxscope-path").unwrap(), "fast");
    let fast = ok_json(&raw);
    assert_eq!((fast["usage"]["completion_tokens"].as_u64(), fast["choices"][0]["finish_reason"].as_str()), (Some(3), Some("length")));
    engine.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_logprobs_tokenize_and_models() {
    let engine = Server::engine(&[]).ready().await;
    let messages = json!([user("What is the capital of France?")]);
    let base = json!({"messages": messages, "temperature": 0, "max_tokens": 16});
    let full = content(&ok_json(&engine.chat(base.clone()).await));
    let cut = full.find("Paris").expect("the answer names Paris");
    for stream in [false, true] {
        // A stop string is matched on text; neither it nor anything after it is returned.
        let mut body = base.clone();
        body["stop"] = json!(["Paris", "never-generated"]);
        body["stream"] = json!(stream);
        let raw = engine.chat(body).await;
        let (text, finish) = if stream {
            let events = sse_events(&raw);
            (streamed_text(&events), events.last().unwrap()["choices"][0]["finish_reason"].clone())
        } else {
            let reply = ok_json(&raw);
            (content(&reply), reply["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, full[..cut], "stream={stream}");
        assert_eq!(finish, "stop");
    }
    // A stop string spanning several tokens, given as a plain string.
    let tail = &full[cut.saturating_sub(4)..];
    let stop: String = tail.chars().take(8).collect();
    let mut body = base.clone();
    body["stop"] = json!(stop);
    body["stream"] = json!(true);
    let text = streamed_text(&sse_events(&engine.chat(body).await));
    assert_eq!(text, full[..full.find(&stop).unwrap()]);

    // Multi-byte characters: no chunk carries half of one (each delta is whole UTF-8, no U+FFFD).
    let body = json!({"messages": [user("Write the Japanese word for cat in kanji, and an emoji of a cat.")], "temperature": 0, "max_tokens": 12, "stream": true});
    let events = sse_events(&engine.chat(body).await);
    let text = streamed_text(&events);
    assert!(!text.is_ascii(), "{text:?}");
    assert!(!text.contains('\u{fffd}'), "a character was split across chunks: {text:?}");

    // Chat logprobs in OpenAI's shape.
    let mut body = base.clone();
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let reply = ok_json(&engine.chat(body).await);
    let entries = reply["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(entries.len() as u64, reply["usage"]["completion_tokens"].as_u64().unwrap());
    let mut bytes = Vec::new();
    for entry in entries {
        let logprob = entry["logprob"].as_f64().unwrap();
        assert!(logprob <= 0.0, "{entry}");
        assert!(entry["token"].is_string(), "{entry}");
        let own: Vec<u8> = entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        bytes.extend_from_slice(&own);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(top.windows(2).all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()), "{entry}");
        assert!(top.iter().all(|t| t["token"].is_string() && t["bytes"].is_array()));
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - logprob).abs() < 1e-6);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), content(&reply));
    assert!(ok_json(&engine.chat(base.clone()).await)["choices"][0]["logprobs"].is_null());

    // Legacy completions logprobs.
    let url = format!("{}/v1/completions", engine.url);
    let reply = ok_json(
        &post_json(&url, &[], &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 2})).await,
    );
    let lp = &reply["choices"][0]["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert_eq!(n, 4);
    for key in ["token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), n, "{key}: {lp}");
    }
    assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|m| m.as_object().unwrap().len() == 2));
    assert_eq!(lp["text_offset"][0], 0);
    let joined: String = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, reply["choices"][0]["text"]);

    // /tokenize (llama.cpp's shape) and back.
    let tokenize = |body: Value| {
        let url = format!("{}/tokenize", engine.url);
        async move {
            ok_json(&post_json(&url, &[], &body).await)["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect::<Vec<_>>()
        }
    };
    let hello = tokenize(json!({"content": "Hello world", "add_special": false})).await;
    assert!(!hello.is_empty() && hello.len() <= 3, "{hello:?}");
    assert_eq!(tokenize(json!({"content": "<|im_start|>"})).await.len(), 1, "special tokens are parsed");
    let back = ok_json(&post_json(&format!("{}/detokenize", engine.url), &[], &json!({"tokens": hello})).await);
    assert_eq!(back["content"], "Hello world");

    // /v1/models and /health.
    let models = get_json(&format!("{}/v1/models", engine.url)).await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(models["data"][0]["max_model_len"], 8192);
    assert_eq!(get_json(&format!("{}/health", engine.url)).await["status"], "ok");
    engine.stop();
}

/// Sends a request and returns (status, error message).
async fn refused(engine: &Server, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let raw = send("POST", &format!("{}{path}", engine.url), &all, body).await;
    let json = raw.json();
    let error = &json["error"];
    assert!(error["message"].is_string() && error["type"].is_string(), "not OpenAI's error shape: {json}");
    assert!(error.as_object().unwrap().contains_key("param") && error.as_object().unwrap().contains_key("code"), "{json}");
    (raw.status, error.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_clear_errors_and_the_server_keeps_serving() {
    let engine = Server::engine(&["--ctx", "64"]).ready().await;
    let chat = |v: Value| serde_json::to_vec(&v).unwrap();
    let hi = json!([user("hi")]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("invalid JSON", b"{\"messages\": [".to_vec(), "not valid JSON"),
        ("invalid UTF-8", b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), "not valid UTF-8"),
        ("not an object", b"[1, 2]".to_vec(), "JSON object"),
        ("no messages", chat(json!({"max_tokens": 2})), "`messages` is required"),
        ("empty messages", chat(json!({"messages": []})), "at least one message"),
        ("unknown role", chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})), "unknown role \"wizard\""),
        ("no content", chat(json!({"messages": [{"role": "user"}]})), "has no `content`"),
        ("null content", chat(json!({"messages": [{"role": "user", "content": null}]})), "has no `content`"),
        ("max_tokens 0", chat(json!({"messages": hi, "max_tokens": 0})), "`max_tokens` must be at least 1, got 0"),
        ("negative max_tokens", chat(json!({"messages": hi, "max_tokens": -5})), "`max_tokens` must be at least 1, got -5"),
        (
            "negative max_completion_tokens",
            chat(json!({"messages": hi, "max_completion_tokens": -1})),
            "`max_completion_tokens` must be at least 1",
        ),
        ("string max_tokens", chat(json!({"messages": hi, "max_tokens": "ten"})), "must be a positive integer"),
        ("bad temperature", chat(json!({"messages": hi, "temperature": -1})), "`temperature` must be between 0 and 2"),
        ("bad stop", chat(json!({"messages": hi, "stop": 5})), "`stop` must be a string or a list of strings"),
    ];
    for (what, body, expected) in cases {
        let (status, error) = refused(&engine, "/v1/chat/completions", &[], body).await;
        assert_eq!(status, 400, "{what}: {error}");
        assert!(error["message"].as_str().unwrap().contains(expected), "{what}: {error}");
    }
    // A prompt longer than the context: both numbers, vLLM's words, never a silent cut.
    let long = chat(json!({"messages": [user(&"hello ".repeat(100))], "max_tokens": 5}));
    let (status, error) = refused(&engine, "/v1/chat/completions", &[], long).await;
    assert_eq!(status, 400);
    let message = error["message"].as_str().unwrap();
    assert!(message.starts_with("This model's maximum context length is 64 tokens. However, you requested "), "{message}");
    assert!(message.contains(" in the messages, 5 in the completion)"), "{message}");
    assert_eq!(error["code"], "context_length_exceeded");
    // Completions and the path header are checked too.
    let (status, error) = refused(&engine, "/v1/completions", &[], chat(json!({"max_tokens": 2}))).await;
    assert_eq!((status, error["message"].as_str().unwrap()), (400, "`prompt` is required"));
    let (status, error) = refused(&engine, "/v1/chat/completions", &[("x-ctxscope-path", "turbo")], chat(json!({"messages": hi}))).await;
    assert_eq!(status, 400);
    assert!(error["message"].as_str().unwrap().contains("golden"), "{error}");
    let missing = send("GET", &format!("{}/v2/nothing", engine.url), &[], Vec::new()).await;
    assert_eq!(missing.status, 404);

    // An absurd max_tokens is clamped to what the context leaves.
    let reply = ok_json(
        &engine
            .chat(json!({"messages": [user("Count from one to one hundred.")], "max_tokens": 1_000_000_000_000u64, "temperature": 0}))
            .await,
    );
    let usage = &reply["usage"];
    if reply["choices"][0]["finish_reason"] == "length" {
        assert_eq!(usage["total_tokens"].as_u64(), Some(64), "{usage}");
    } else {
        assert!(usage["total_tokens"].as_u64().unwrap() < 64, "{usage}");
    }

    // Still serving.
    let reply = ok_json(&engine.chat(json!({"messages": hi, "max_tokens": 2, "temperature": 0})).await);
    assert_eq!(reply["usage"]["completion_tokens"].as_u64().map(|n| n >= 1), Some(true));
    engine.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_all_get_answers() {
    let engine = Server::engine(&["--max-batch", "64"]).ready().await;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        // Mostly raw completions (tiny prompts keep the test short on two cores), every fourth a chat.
        let (route, mut body) = if i % 4 == 0 {
            ("chat/completions", json!({"messages": [user(&format!("Say {}", i % 10))]}))
        } else {
            ("completions", json!({"prompt": format!("{} +", i % 10)}))
        };
        body["max_tokens"] = json!(1 + i % 2);
        body["temperature"] = json!(0);
        body["stream"] = json!(i % 3 == 0);
        let url = format!("{}/v1/{route}", engine.url);
        tasks.spawn(async move { post_json(&url, &[], &body).await });
    }
    let (mut ok, mut refused) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let raw = done.expect("request task");
        match raw.status {
            200 => ok += 1,
            429 | 503 => {
                assert!(raw.json()["error"]["message"].as_str().unwrap().contains("busy"), "{}", String::from_utf8_lossy(&raw.body));
                refused += 1;
            }
            other => panic!("status {other}: {}", String::from_utf8_lossy(&raw.body)),
        }
    }
    eprintln!("1000 concurrent requests: {ok} ok, {refused} refused in {:?}", started.elapsed());
    assert_eq!(ok + refused, 1000);
    assert!(ok > 0);
    let reply =
        ok_json(&engine.chat(json!({"messages": [user("What is the capital of France?")], "max_tokens": 8, "temperature": 0})).await);
    assert!(content(&reply).contains("Paris"), "{reply}");
    engine.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_its_sequence() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One sequence at a time: a request can only run once the abandoned one is gone.
    let engine = Server::engine(&["--max-batch", "1"]).ready().await;
    let body =
        serde_json::to_string(&json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 4000, "temperature": 0, "stream": true})).unwrap();
    let addr = engine.url.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(6).filter(|w| w == b"data: ").count() < 3 {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(socket);
    // 4000 tokens would take minutes; the next request runs as soon as the first is cancelled.
    let started = Instant::now();
    let reply = ok_json(&engine.chat(json!({"messages": [user("Hi")], "max_tokens": 2, "temperature": 0})).await);
    assert!(reply["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert!(started.elapsed() < Duration::from_secs(20), "the abandoned sequence kept running: {:?}", started.elapsed());
    engine.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_captures_the_engine_through_its_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy_port, admin_port) = (free_port(), free_port());
    let data = dir.path().join("data");
    let serve = Server::start(
        "serve",
        free_port(),
        &[
            "--proxy",
            &format!("127.0.0.1:{proxy_port}"),
            "--admin",
            &format!("127.0.0.1:{admin_port}"),
            "--data",
            data.to_str().unwrap(),
            "--flush-ms",
            "50",
        ],
    )
    .ready()
    .await;
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    let admin = format!("http://127.0.0.1:{admin_port}");
    wait_http_ok(&format!("{admin}/healthz"), Duration::from_secs(60)).await;
    assert_eq!(get_json(&format!("{admin}/healthz")).await["capture"], "on");

    let first = json!([user("What is the capital of France?")]);
    let reply = ok_json(
        &post_json(&format!("{proxy}/v1/chat/completions"), &[], &json!({"messages": first, "max_tokens": 12, "temperature": 0})).await,
    );
    let answer = content(&reply);
    assert!(answer.contains("Paris"), "{answer:?}");
    let second = json!([user("What is the capital of France?"), {"role": "assistant", "content": answer}, user("And of Spain?")]);
    let body = json!({"messages": second, "max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let events = sse_events(&post_json(&format!("{proxy}/v1/chat/completions"), &[], &body).await);
    let usage = events.last().unwrap()["usage"].clone();
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0, "{usage}");

    // Both turns in one conversation, with the engine's usage and the proxy's own token count.
    let deadline = Instant::now() + Duration::from_secs(10);
    let conversation = loop {
        let list = get_json(&format!("{admin}/api/conversations")).await;
        if list[0]["turns"] == 2 {
            break list[0]["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "turns not captured: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let shown = get_json(&format!("{admin}/api/conversations/{conversation}")).await;
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{shown}");
    assert_eq!(turns[0]["usage"]["prompt_tokens"], reply["usage"]["prompt_tokens"]);
    let turn = &turns[1];
    assert_eq!(turn["relation"]["kind"], "extend", "{turn}");
    assert_eq!(turn["usage"]["cached_tokens"].as_u64(), Some(cached), "{turn}");
    assert_eq!(turn["usage"]["prompt_tokens"], usage["prompt_tokens"], "{turn}");
    // The proxy counted with the same model file: its count equals the engine's.
    assert_eq!(turn["local_tokens"]["prompt"], usage["prompt_tokens"], "{turn}");
    assert_eq!(turn["reply_text"], json!(streamed_text(&events)));
    serve.stop();
}

/// The recall conversation sent turn by turn through the proxy, as a harness would: the fact first,
/// the question second. Returns the second reply and the findings header on each response.
async fn recall_through(proxy: &str, patches: &str) -> (String, Vec<Option<String>>) {
    let headers: Vec<(&str, &str)> = if patches.is_empty() { vec![] } else { vec![("x-ctxscope-patches", patches)] };
    let url = format!("{proxy}/v1/chat/completions");
    let mut found = Vec::new();
    let mut messages = vec![user("The secret word is banana.")];
    let first = post_json(&url, &headers, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await;
    found.push(first.headers.get("x-ctxscope-findings").map(|v| v.to_str().unwrap().to_string()));
    ok_json(&first);
    messages.push(json!({"role": "assistant", "content": "Okay, I will remember that."}));
    messages.push(user("What is the secret word?"));
    let second = post_json(&url, &headers, &json!({"messages": messages, "max_tokens": 16, "temperature": 0})).await;
    found.push(second.headers.get("x-ctxscope-findings").map(|v| v.to_str().unwrap().to_string()));
    (content(&ok_json(&second)), found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_faults_lose_the_fact_and_the_proxy_in_front_names_the_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(&model_path(), &dir.path().join("data"), &["--findings-header"]).await;
    let (proxy, admin) = (serve.proxy_url.clone(), serve.admin_url.clone());
    let (golden, found) = recall_through(&proxy, "").await;
    assert!(golden.to_lowercase().contains("banana"), "golden lost the fact: {golden:?}");
    assert_eq!(found, vec![None, None], "golden raised findings");
    // Ollama's context shift at 32 and SGLang's auto-truncate at 30 (the engine's imitations).
    for patches in ["ctx_shift=32", "auto_truncate=30"] {
        let (reply, found) = recall_through(&proxy, patches).await;
        assert!(!reply.to_lowercase().contains("banana"), "{patches} kept the fact: {reply:?}");
        assert_eq!(found[1].as_deref(), Some("engine_truncation"), "{patches}: {found:?}");
    }
    let findings = get_json(&format!("{admin}/api/findings?kind=engine_truncation")).await;
    assert_eq!(findings.as_array().unwrap().len(), 2, "{findings}");
    // Streamed responses are never held for their findings.
    let body = json!({"messages": [user("Hi")], "max_tokens": 4, "stream": true});
    let raw = post_json(&format!("{proxy}/v1/chat/completions"), &[("x-ctxscope-patches", "auto_truncate=8")], &body).await;
    assert!(raw.headers.get("x-ctxscope-findings").is_none());
    serve.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_flag_header_and_registry_listing() {
    let listing = Command::new(bin()).arg("patches").output().expect("runs ctxscope patches");
    assert!(listing.status.success());
    let text = String::from_utf8_lossy(&listing.stdout);
    for name in [
        "rmsnorm_bf16",
        "residual_gemm_bf16",
        "rope_bf16",
        "attn_splitk_bf16",
        "kv_fp8",
        "act_q8",
        "ctx_shift=N",
        "auto_truncate=N",
        "sliding_window=N",
        "prefix_cache_weak_hash",
        "prefix_cache_off",
    ] {
        assert!(text.contains(name), "`ctxscope patches` does not list {name}:\n{text}");
    }
    let bad = Command::new(bin()).args(["engine", "--patches", "kv_fp4"]).output().expect("runs ctxscope engine");
    assert!(!bad.status.success(), "an unknown --patches value must be refused");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown patch `kv_fp4`"));

    let engine = Server::engine(&["--patches", "rope_bf16,kv_fp8"]).ready().await;
    let body = json!({"messages": [user("Hi")], "temperature": 0, "max_tokens": 2});
    let raw = engine.chat(body.clone()).await;
    assert_eq!(raw.status, 200);
    assert_eq!(raw.headers.get("x-ctxscope-patches").unwrap(), "kv_fp8,rope_bf16");
    let url = format!("{}/v1/chat/completions", engine.url);
    let raw = post_json(&url, &[("x-ctxscope-patches", "act_q8")], &body).await;
    assert_eq!(raw.headers.get("x-ctxscope-patches").unwrap(), "act_q8");
    let raw = post_json(&url, &[("x-ctxscope-patches", "bogus")], &body).await;
    assert_eq!(raw.status, 400);
    engine.stop();
}
