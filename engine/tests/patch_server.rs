//! Patch selection through the HTTP server on a loopback socket: the `x-ctxscope-patches` header and
//! the `ctxscope.patches` body field pick a request's patch set, the response echoes the applied set
//! (canonical form), the process default applies otherwise, an unknown patch is a 400 that lists
//! the known ones, and a patch of another architecture (DeepSeek-V4's) is a 400 that names it.

mod common;

use std::sync::Arc;

use ctxscope_engine::scheduler::{self, EngineOptions};
use ctxscope_engine::{Model, PatchSet, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

async fn post(addr: std::net::SocketAddr, body: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let mut request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("reads");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
    Reply { status, head: head.to_string(), body: body.to_string() }
}

#[test]
fn patches_header_and_body_round_trip() {
    let path = common::model_path();
    let model = Arc::new(Model::load(&path).expect("model loads"));
    let (engine, _thread) = scheduler::start(model.clone(), EngineOptions::for_model(&model));
    let config = ServerConfig { default_patches: PatchSet::parse("act_q8").unwrap(), ..ServerConfig::default() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let (addr, stop, server) = common::serve(engine, config).await;
        let chat = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0}"#;

        // The process default applies and is echoed.
        let r = post(addr, chat, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ctxscope-patches").as_deref(), Some("act_q8"));

        // A header picks the set; the echo is canonical (sorted).
        let r = post(addr, chat, &[("x-ctxscope-patches", "rope_bf16, kv_fp8")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ctxscope-patches").as_deref(), Some("kv_fp8,rope_bf16"));

        // An empty header is the empty set (the reference).
        let r = post(addr, chat, &[("x-ctxscope-patches", "")]).await;
        assert_eq!(r.header("x-ctxscope-patches").as_deref(), Some(""));

        // The body field wins over the header.
        let with_body = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0,"ctxscope":{"patches":["sliding_window=64","rmsnorm_bf16"]}}"#;
        let r = post(addr, with_body, &[("x-ctxscope-patches", "kv_fp8")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ctxscope-patches").as_deref(), Some("rmsnorm_bf16,sliding_window=64"));

        // Unknown patches and bad parameters are 400s that list the known patches.
        let r = post(addr, chat, &[("x-ctxscope-patches", "kv_fp4")]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("unknown patch `kv_fp4`") && r.body.contains("rope_bf16"), "{}", r.body);
        let bad_body = r#"{"messages":[{"role":"user","content":"Hi"}],"ctxscope":{"patches":["ctx_shift=x"]}}"#;
        let r = post(addr, bad_body, &[]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("ctx_shift") && r.body.contains("known patches"), "{}", r.body);

        // A patch of another architecture (DeepSeek-V4's) is a 400 that says which it applies to.
        let r = post(addr, chat, &[("x-ctxscope-patches", "kv_fp8,mhc_bf16")]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("`mhc_bf16` applies to DeepSeek-V4 models only"), "{}", r.body);
        let wrong_body = r#"{"messages":[{"role":"user","content":"Hi"}],"ctxscope":{"patches":["moe_topk=1"]}}"#;
        let r = post(addr, wrong_body, &[]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("`moe_topk` applies to DeepSeek-V4") && r.body.contains("\"param\":\"ctxscope\""), "{}", r.body);

        // Usage reports the imitated engine's prompt count under a context fault.
        let long = r#"{"messages":[{"role":"user","content":"The secret word is banana. Please remember it well, it matters a great deal."}],"max_tokens":1,"temperature":0,"ctxscope":{"patches":["ctx_shift=16"]}}"#;
        let r = post(addr, long, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let json: serde_json::Value = serde_json::from_str(&r.body).expect("json body");
        assert_eq!(json["usage"]["prompt_tokens"], 16, "{}", r.body);

        // Past the model's context: refused on golden, shifted (and answered) under ctx_shift.
        let huge = "word ".repeat(9000);
        let over = format!(r#"{{"messages":[{{"role":"user","content":"{huge}"}}],"max_tokens":1,"temperature":0}}"#);
        let r = post(addr, &over, &[]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let r = post(addr, &over, &[("x-ctxscope-patches", "ctx_shift=64")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let json: serde_json::Value = serde_json::from_str(&r.body).expect("json body");
        assert_eq!(json["usage"]["prompt_tokens"], 64, "{}", r.body);

        let _ = stop.send(());
        let _ = server.await;
    });
}

#[test]
fn a_default_patch_of_another_architecture_refuses_only_the_requests_using_it() {
    let model = common::shared_model();
    let (engine, _thread) = scheduler::start(model.clone(), EngineOptions::for_model(&model));
    let config = ServerConfig { default_patches: PatchSet::parse("swa_window=4").unwrap(), ..ServerConfig::default() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let (addr, stop, server) = common::serve(engine, config).await;
        let chat = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"temperature":0}"#;
        let r = post(addr, chat, &[]).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("--patches default") && r.body.contains("`swa_window` applies to DeepSeek-V4"), "{}", r.body);
        // A request naming its own (applicable) patches is served.
        let r = post(addr, chat, &[("x-ctxscope-patches", "kv_fp8")]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let _ = stop.send(());
        let _ = server.await;
    });
}
