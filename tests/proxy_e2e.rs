//! The proxy end to end: the real `ctxscope` binary between a real client socket and a scripted
//! upstream on loopback. Transparency (bytes, statuses, headers, streaming without buffering,
//! cancellation, 502), capture (threading, usage, no secrets), and bad input (malformed JSON,
//! oversized bodies, upstream resets, an unusable data directory), with the proxy still serving after.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

fn chat(messages: Value, stream: bool) -> Value {
    json!({"model": "scripted", "messages": messages, "stream": stream, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_pass_through_byte_for_byte() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    for stream in [false, true] {
        let body = chat(json!([{"role": "user", "content": "hello there"}]), stream);
        let direct = post_json(&format!("{}/v1/chat/completions", up.url()), &[], &body).await;
        let via = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &body).await;
        assert_eq!(via.status, direct.status);
        assert_eq!(via.body, direct.body, "stream={stream}: body changed by the proxy");
        assert_eq!(via.headers.get("content-type"), direct.headers.get("content-type"));
        assert_eq!(via.headers.get("x-upstream-id").map(|v| v.to_str().unwrap()), Some("scripted"));
    }
    // Non-LLM paths and methods are forwarded too.
    let models = send("GET", &format!("{}/v1/models", proxy.url()), &[], Vec::new()).await;
    assert_eq!(models.json()["data"][0]["id"], "scripted");
    // The upstream saw the client's headers (minus hop-by-hop), including Authorization.
    let auth = [("authorization", "Bearer sk-secret-test-key-123")];
    post_json(&format!("{}/v1/chat/completions", proxy.url()), &auth, &chat(json!([{"role": "user", "content": "x"}]), false)).await;
    let seen = up.state.headers.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen.get("authorization").unwrap(), "Bearer sk-secret-test-key-123");
    assert_eq!(seen.get("host").unwrap().to_str().unwrap(), up.addr.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_pass_verbatim_and_dead_upstream_is_a_clear_502() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let body = chat(json!([{"role": "user", "content": "too long"}]), false);
    let direct = post_json(&format!("{}/v1/chat/completions", up.url()), &[("x-script", "status400")], &body).await;
    let via = post_json(&format!("{}/v1/chat/completions", proxy.url()), &[("x-script", "status400")], &body).await;
    assert_eq!((via.status, &via.body), (400, &direct.body));

    let dead = format!("http://127.0.0.1:{}", free_port());
    let dir2 = tempfile::tempdir().unwrap();
    let lonely = Proxy::builder(&dead, dir2.path()).start();
    let raw = post_json(&format!("{}/v1/chat/completions", lonely.url()), &[], &body).await;
    assert_eq!(raw.status, 502);
    let error = &raw.json()["error"];
    assert_eq!(error["upstream"], dead);
    assert!(error["message"].as_str().unwrap().contains(&dead), "{error}");
    // And it keeps serving.
    let again = post_json(&format!("{}/v1/chat/completions", lonely.url()), &[], &body).await;
    assert_eq!(again.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_chunks_reach_the_client_as_the_upstream_sends_them() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let body = serde_json::to_vec(&chat(json!([{"role": "user", "content": "go"}]), true)).unwrap();
    let request = http::Request::post(format!("{}/v1/chat/completions", proxy.url()))
        .header("x-script-chunks", "4")
        .header("x-script-delay-ms", "400")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let started = Instant::now();
    let mut response = client.request(request).await.unwrap().into_body();
    let mut arrivals = Vec::new();
    while let Some(frame) = response.frame().await {
        if frame.unwrap().data_ref().is_some() {
            arrivals.push(started.elapsed());
        }
    }
    // Upstream writes an event every 400 ms; a buffering proxy would deliver them all at the end.
    assert!(arrivals.len() >= 4, "{arrivals:?}");
    assert!(arrivals[0] < Duration::from_millis(350), "first chunk late: {arrivals:?}");
    assert!(*arrivals.last().unwrap() >= Duration::from_millis(1600), "{arrivals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_upstream_request() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let body = serde_json::to_vec(&chat(json!([{"role": "user", "content": "wait"}]), true)).unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("{}/v1/chat/completions", proxy.url()))
        .header("x-script", "hang")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let mut response = client.request(request).await.unwrap().into_body();
    let first = response.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    drop(response);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !up.state.cancelled.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "upstream never saw the cancellation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let list = proxy.wait_turns(1).await;
    let id = list[0]["id"].as_u64().unwrap();
    let detail = get_json(&format!("{}/api/conversations/{id}", proxy.admin_url())).await;
    assert!(detail["turns"][0]["error"].as_str().unwrap().contains("client disconnected"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_conversation_is_threaded_and_readable_after_shutdown() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    let key = [("authorization", "Bearer sk-never-store-me-42")];
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for (i, question) in ["What is 2+2?", "And times 3?", "Say it in French."].iter().enumerate() {
        messages.push(json!({"role": "user", "content": question}));
        let raw = post_json(&url, &key, &chat(Value::Array(messages.clone()), i % 2 == 1)).await;
        assert_eq!(raw.status, 200);
        messages.push(json!({"role": "assistant", "content": format!("You said: {question}")}));
    }
    // A branch: same first exchange, different second question.
    let branch =
        vec![messages[0].clone(), messages[1].clone(), messages[2].clone(), json!({"role": "user", "content": "Actually, minus 1?"})];
    post_json(&url, &key, &chat(Value::Array(branch), false)).await;
    // An unrelated conversation sharing only the system prompt.
    post_json(&url, &key, &chat(json!([messages[0].clone(), {"role": "user", "content": "Unrelated."}]), false)).await;

    let list = proxy.wait_turns(5).await;
    let convs = list.as_array().unwrap();
    assert_eq!(convs.len(), 3, "{list}");
    let main = convs.iter().find(|c| c["turns"] == 3).expect("3-turn conversation");
    let branch = convs.iter().find(|c| !c["branch_of"].is_null()).expect("branch recorded");
    assert_eq!(branch["branch_of"]["conversation"], main["id"]);
    assert_eq!(branch["branch_of"]["shared_messages"], 3);
    let id = main["id"].as_u64().unwrap();
    let detail = get_json(&format!("{}/api/conversations/{id}", proxy.admin_url())).await;
    let turns = detail["turns"].as_array().unwrap();
    assert_eq!(turns[0]["relation"]["kind"], "new");
    assert_eq!(turns[1]["relation"]["kind"], "extend");
    assert_eq!(turns[2]["messages"].as_array().unwrap().len(), 6);
    assert_eq!(turns[1]["stream"], true);
    assert_eq!(turns[1]["reply_text"], "You said: And times 3?");
    assert!(turns[0]["usage"]["prompt_tokens"].as_u64().is_some());
    assert_eq!(turns[0]["params"]["temperature"], 0);
    assert!(turns[1]["chunks"].as_u64().unwrap() >= 4);
    // Each message stored once: 1 system + 3 user + 3 replies + branch question + unrelated + the branch reply + unrelated reply.
    assert_eq!(detail["messages"].as_object().unwrap().len(), 7);

    let admin_text = cli(&["show", &id.to_string(), "--admin", &proxy.admin_url()]);
    assert!(admin_text.status.success(), "{}", String::from_utf8_lossy(&admin_text.stderr));
    let admin_json = cli(&["show", &id.to_string(), "--json", "--admin", &proxy.admin_url()]);
    proxy.stop();
    // After shutdown the directory opens directly and says the same.
    let direct_json = cli(&["show", &id.to_string(), "--json", "--data", data.to_str().unwrap()]);
    assert!(direct_json.status.success(), "{}", String::from_utf8_lossy(&direct_json.stderr));
    assert_eq!(direct_json.stdout, admin_json.stdout);
    let text = String::from_utf8_lossy(&admin_text.stdout);
    assert!(text.contains("extend") && text.contains("You said: Say it in French."), "{text}");
    assert!(!contains(&all_bytes(&data), b"sk-never-store-me-42"), "API key found in the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_conversation_header_overrides_inference() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).arg("--session-header").arg("x-session-id").start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    post_json(&url, &[("x-session-id", "s-1")], &chat(json!([{"role": "user", "content": "one"}]), false)).await;
    // Unrelated content, same session: one conversation, marked diverged.
    post_json(&url, &[("x-session-id", "s-1")], &chat(json!([{"role": "user", "content": "two"}]), false)).await;
    post_json(&url, &[("x-ctxscope-conversation", "named")], &chat(json!([{"role": "user", "content": "one"}]), false)).await;
    let list = proxy.wait_turns(3).await;
    let session = list.as_array().unwrap().iter().find(|c| c["name"] == "s-1").expect("session conversation");
    assert_eq!(session["turns"], 2);
    let detail = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), session["id"])).await;
    assert_eq!(detail["turns"][1]["relation"]["kind"], "diverged");
    assert!(list.as_array().unwrap().iter().any(|c| c["name"] == "named"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_are_captured_streamed_and_not() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let url = format!("{}/v1/messages", proxy.url());
    let first = json!({"model": "claude-x", "max_tokens": 50, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]});
    let direct = post_json(&format!("{}/v1/messages", up.url()), &[], &first).await;
    let via = post_json(&url, &[], &first).await;
    assert_eq!(via.body, direct.body);
    let second = json!({"model": "claude-x", "max_tokens": 50, "stream": true, "system": "Be brief.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "You said: Hi"}]},
        {"role": "user", "content": "Again"}]});
    let via = post_json(&url, &[], &second).await;
    assert!(String::from_utf8_lossy(&via.body).contains("message_stop"));
    let list = proxy.wait_turns(2).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "anthropic turns not threaded: {list}");
    let detail = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), list[0]["id"])).await;
    let turn = &detail["turns"][1];
    assert_eq!(turn["endpoint"], "anthropic_messages");
    assert_eq!(turn["reply_text"], "You said: Again");
    assert_eq!(turn["finish_reason"], "end_turn");
    assert!(turn["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_upstream_answer_or_a_clear_error_and_the_proxy_keeps_serving() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).arg("--max-request-bytes").arg("100000").start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    // Malformed JSON: the upstream's own 400, verbatim.
    let direct =
        send("POST", &format!("{}/v1/chat/completions", up.url()), &[("content-type", "application/json")], b"{\"messages\": [".to_vec())
            .await;
    let via = send("POST", &url, &[("content-type", "application/json")], b"{\"messages\": [".to_vec()).await;
    assert_eq!((via.status, &via.body), (direct.status, &direct.body));
    // Far over the limit: 413 from the proxy, naming the limit.
    let huge = chat(json!([{"role": "user", "content": "x".repeat(1_000_000)}]), false);
    let raw = post_json(&url, &[], &huge).await;
    assert_eq!(raw.status, 413);
    assert!(raw.json()["error"]["message"].as_str().unwrap().contains("100000"));
    // Upstream resets mid-stream: the client sees a cut stream, the turn records the failure.
    let body = serde_json::to_vec(&chat(json!([{"role": "user", "content": "reset me"}]), true)).unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(&url).header("x-script", "reset").body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap();
    // The client sees the cut: the body ends in an error, or (seen on a loaded machine, the upstream's
    // head, first events and reset reaching the proxy together) the connection closes before the head
    // arrives. Neither can be taken for a complete stream; any other failure is one.
    match client.request(request).await {
        Ok(response) => {
            assert_eq!(response.status(), 200);
            assert!(response.into_body().collect().await.is_err(), "a reset upstream stream must not look complete");
        }
        Err(e) => {
            let cut = std::error::Error::source(&e)
                .and_then(|cause| cause.downcast_ref::<hyper::Error>())
                .is_some_and(hyper::Error::is_incomplete_message);
            assert!(cut, "the request failed otherwise than by a cut connection: {e:?}");
        }
    }
    // Still serving, and the damage is on record.
    let ok = post_json(&url, &[], &chat(json!([{"role": "user", "content": "still there?"}]), false)).await;
    assert_eq!(ok.status, 200);
    let list = proxy.wait_turns(2).await;
    let mut errors = Vec::new();
    for c in list.as_array().unwrap() {
        let detail = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), c["id"])).await;
        for t in detail["turns"].as_array().unwrap() {
            errors.push(t["error"].as_str().unwrap_or("").to_string());
        }
    }
    assert!(errors.iter().any(|e| e.contains("mid-stream")), "{errors:?}");
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("ctxscope_capture_dropped_total{reason=\"parse\"} 1"), "{metrics}");
    assert!(metrics.contains("ctxscope_requests_total{endpoint=\"chat_completions\",status=\"413\"} 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_data_directory_still_serves_and_says_why() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A file where the data directory should be: the store cannot open.
    let blocked = dir.path().join("not-a-dir");
    std::fs::write(&blocked, "x").unwrap();
    let proxy = Proxy::builder(&up.url(), &blocked).start();
    let raw =
        post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &chat(json!([{"role": "user", "content": "hi"}]), false)).await;
    assert_eq!(raw.status, 200);
    assert_eq!(raw.json()["choices"][0]["message"]["content"], "You said: hi");
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert!(health["capture"].as_str().unwrap().starts_with("unavailable"), "{health}");
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("ctxscope_capture_dropped_total{reason=\"store_unavailable\"} 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_reproduces_the_conversation() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    let m1 = json!([{"role": "user", "content": "alpha"}]);
    post_json(&url, &[], &chat(m1, false)).await;
    let m2 = json!([{"role": "user", "content": "alpha"}, {"role": "assistant", "content": "You said: alpha"}, {"role": "user", "content": "beta"}]);
    post_json(&url, &[], &chat(m2, false)).await;
    let list = proxy.wait_turns(2).await;
    let id = list[0]["id"].as_u64().unwrap().to_string();
    let export = cli(&["export", &id, "--admin", &proxy.admin_url()]);
    assert!(export.status.success());
    let file = dir.path().join("conv.jsonl");
    std::fs::write(&file, &export.stdout).unwrap();
    let other = dir.path().join("b");
    let import = cli(&["import", file.to_str().unwrap(), "--data", other.to_str().unwrap()]);
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));
    let listed = cli(&["conversations", "--json", "--data", other.to_str().unwrap()]);
    let convs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let new_id = convs[0]["id"].as_u64().unwrap().to_string();
    let again = cli(&["export", &new_id, "--data", other.to_str().unwrap()]);
    let strip = |bytes: &[u8]| -> Vec<Value> {
        String::from_utf8_lossy(bytes)
            .lines()
            .filter(|l| l.contains("\"kind\":\"message\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(strip(&again.stdout), strip(&export.stdout));
    // Bad input to import is a clear error.
    std::fs::write(&file, "{\"kind\": \"nonsense\"}\n").unwrap();
    let bad = cli(&["import", file.to_str().unwrap(), "--data", other.to_str().unwrap()]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad import line 1"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_catalogue_is_served() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    post_json(&format!("{}/v1/chat/completions", proxy.url()), &[], &chat(json!([{"role": "user", "content": "m"}]), false)).await;
    proxy.wait_turns(1).await;
    let metrics = proxy.metrics().await;
    for name in [
        "ctxscope_requests_total",
        "ctxscope_prompt_tokens_bucket",
        "ctxscope_proxy_overhead_seconds_bucket",
        "ctxscope_turns_captured_total",
    ] {
        assert!(metrics.contains(name), "missing {name}:\n{metrics}");
    }
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_capture_queue() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let proxy = Proxy::builder(&up.url(), &data).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    for i in 0..25 {
        let raw = post_json(&url, &[], &chat(json!([{"role": "user", "content": format!("q{i}")}]), i % 2 == 0)).await;
        assert_eq!(raw.status, 200);
    }
    // Stop at once: whatever is still queued must be written before the process exits.
    proxy.stop();
    let listed = cli(&["conversations", "--json", "--data", data.to_str().unwrap()]);
    let convs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let turns: u64 = convs.as_array().unwrap().iter().map(|c| c["turns"].as_u64().unwrap()).sum();
    assert_eq!(turns, 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_token_counts_use_the_model_tokenizer_and_chat_template() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let counter = ctxscope_formats::TokenCounter::open(&model).unwrap();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).arg("--tokenizer").arg(model.to_str().unwrap()).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    let first = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The secret word is banana."}]);
    post_json(&url, &[], &chat(first.clone(), false)).await;
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": "You said: The secret word is banana."}));
    second.push(json!({"role": "user", "content": "What is the secret word?"}));
    post_json(&url, &[], &chat(Value::Array(second.clone()), true)).await;
    let list = proxy.wait_turns(2).await;
    let detail = get_json(&format!("{}/api/conversations/{}", proxy.admin_url(), list[0]["id"])).await;
    let turns = detail["turns"].as_array().unwrap();
    assert_eq!(turns[0]["local_tokens"]["prompt"].as_u64().unwrap() as usize, counter.count_prompt(first.as_array().unwrap()).unwrap());
    assert_eq!(turns[1]["local_tokens"]["prompt"].as_u64().unwrap() as usize, counter.count_prompt(&second).unwrap());
    assert_eq!(turns[1]["local_tokens"]["new_messages"].as_array().unwrap().len(), 1);
}
