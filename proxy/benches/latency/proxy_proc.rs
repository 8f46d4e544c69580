//! The real proxy under test: the release `ctxscope` binary started as a child process with capture
//! on into a fresh temporary store (or `--no-capture`, as a reference), pointed at the bench upstream.
//! Waits until both ports answer and capture reports as asked; stops it with SIGTERM (then SIGKILL)
//! and measures the store on disk.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::Admin;
use crate::error::BenchError;

pub struct ProxyProcess {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub data: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// `CTXSCOPE_BIN`, else the workspace's `target/release/ctxscope`.
pub fn binary() -> PathBuf {
    match std::env::var_os("CTXSCOPE_BIN") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/ctxscope"),
    }
}

/// A loopback port nothing listens on right now (bound, read, released).
fn free_port() -> Result<SocketAddr, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| BenchError::io("find a free port", e))?;
    listener.local_addr().map_err(|e| BenchError::io("find a free port", e))
}

impl ProxyProcess {
    /// Starts the binary; with `capture` false it runs with `--no-capture` (pure forwarding).
    pub async fn start(bin: &Path, upstream: SocketAddr, capture: bool) -> Result<ProxyProcess, BenchError> {
        ProxyProcess::start_with(bin, upstream, capture, &[]).await
    }

    /// As [`ProxyProcess::start`], with `extra` flags (e.g. `--otlp-endpoint URL`).
    pub async fn start_with(bin: &Path, upstream: SocketAddr, capture: bool, extra: &[String]) -> Result<ProxyProcess, BenchError> {
        if !bin.is_file() {
            return Err(BenchError::Setup(format!(
                "proxy binary {} not found: run `cargo build --release` first or set CTXSCOPE_BIN",
                bin.display()
            )));
        }
        let dir = tempfile::tempdir().map_err(|e| BenchError::io("create a temporary data directory", e))?;
        let data = dir.path().join("store");
        let log = dir.path().join("proxy.log");
        let (listen, admin) = (free_port()?, free_port()?);
        let out = File::create(&log).map_err(|e| BenchError::io(format!("create {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| BenchError::io("duplicate the log handle", e))?;
        let mut command = Command::new(bin);
        command.args(["proxy", "--upstream", &format!("http://{upstream}")]);
        command.args(["--listen", &listen.to_string(), "--admin", &admin.to_string()]).arg("--data").arg(&data);
        if !capture {
            command.arg("--no-capture");
        }
        // Extra flags for the capturing proxy, e.g. LATENCY_PROXY_ARGS=--no-detect to compare.
        if let (true, Ok(extra)) = (capture, std::env::var("LATENCY_PROXY_ARGS")) {
            command.args(extra.split_whitespace());
        }
        command.args(extra);
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| BenchError::io(format!("start {}", bin.display()), e))?;
        let mut proxy = ProxyProcess { child, listen, admin, data, log, _dir: dir };
        proxy.wait_ready(if capture { "on" } else { "off" }).await?;
        Ok(proxy)
    }

    async fn wait_ready(&mut self, capture: &str) -> Result<(), BenchError> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut admin = Admin::new(self.admin);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BenchError::Setup(format!("proxy exited at start ({status}): {}", self.log_tail())));
            }
            if let Ok((200, health)) = admin.get("/healthz").await {
                if tokio::net::TcpStream::connect(self.listen).await.is_ok() {
                    if !health.contains(&format!("\"capture\":\"{capture}\"")) {
                        return Err(BenchError::Setup(format!("proxy capture is not {capture}: {health}")));
                    }
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(BenchError::Setup(format!("proxy did not answer within 15 s: {}", self.log_tail())));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or("").to_string()
    }

    /// Bytes under the store directory: (apparent file sizes, allocated on disk).
    pub fn store_size(&self) -> (u64, u64) {
        dir_size(&self.data)
    }

    /// CPU ticks (user + system) the proxy process has used so far.
    pub fn cpu_ticks(&self) -> u64 {
        crate::machine::process_ticks(&self.child.id().to_string())
    }

    /// SIGTERM, then SIGKILL if it has not exited within five seconds.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn dir_size(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(path) else { return (0, 0) };
    let mut total = (0, 0);
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let (apparent, allocated) = if meta.is_dir() { dir_size(&entry.path()) } else { (meta.len(), meta.blocks() * 512) };
        total.0 += apparent;
        total.1 += allocated;
    }
    total
}
