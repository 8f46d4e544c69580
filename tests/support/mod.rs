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

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("ephemeral port")
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ctxscope"))
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
            .args(["--flush-ms", "50"])
            .args(&self.extra)
            .env("CTXSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().expect("spawn ctxscope proxy");
        let proxy = Proxy {
            child,
            addr: ([127, 0, 0, 1], port).into(),
            admin: ([127, 0, 0, 1], admin_port).into(),
            data: self.data,
        };
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

    /// SIGTERM and wait: the graceful path that drains capture.
    pub fn stop(mut self) {
        terminate(&mut self.child, "proxy");
    }

    /// Waits until the admin API lists `turns` captured turns in total.
    pub async fn wait_turns(&self, turns: u32) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let list = get_json(&format!("{}/api/conversations", self.admin_url())).await;
            let total: u64 = list.as_array().map_or(0, |a| a.iter().map(|c| c["turns"].as_u64().unwrap_or(0)).sum());
            if total >= turns as u64 {
                return list;
            }
            assert!(Instant::now() < deadline, "expected {turns} captured turns, have {total}: {list}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client.request(request.body(Full::new(Bytes::from(body))).unwrap()).await.expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    Raw { status, headers, body }
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
