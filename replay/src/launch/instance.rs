//! One launched engine: started in its own process group with its output in log files, waited for
//! until its readiness check passes (or it exits, or time runs out), and stopped with the profile's
//! signal, KILL after the grace period. A dropped instance is killed; every live group is also in a
//! process-wide list so that an interrupted command can kill them all before it exits.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::profile::{Configuration, Profile};

/// Log lines quoted when a launch fails.
pub const TAIL_LINES: usize = 20;
/// Between readiness checks.
const POLL: Duration = Duration::from_millis(200);

/// Process groups started and not yet stopped, for [`kill_all`]; `stopping` once it ran (no engine
/// starts after that). Held across a spawn, so that an engine started as an interrupt arrives is
/// either in the list when [`kill_all`] reads it or never started.
static LIVE: Mutex<Live> = Mutex::new(Live { groups: BTreeSet::new(), stopping: false });

struct Live {
    groups: BTreeSet<i32>,
    stopping: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("cannot start `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("port {port} is already taken{}; stop it or let the profile pass {{port}}", by.as_ref().map(|b| format!(" by {b}")).unwrap_or_default())]
    PortTaken { port: u16, by: Option<String> },
    #[error("`{program}` exited ({status}) before it was ready{}", tail_text(tail))]
    Exited { program: String, status: String, tail: Vec<String> },
    #[error("`{program}` was not ready within {after:?} (GET {url} never answered 200; last: {last}); stopped it{}", tail_text(tail))]
    NotReady { program: String, after: Duration, url: String, last: String, tail: Vec<String> },
    #[error("port {port} answers, but from pid {pid}, not the launched `{program}` (pid {child}); stopped it")]
    WrongListener { port: u16, pid: u32, child: u32, program: String },
    #[error("interrupted while `{program}` was starting; stopped it")]
    Cancelled { program: String },
}

impl LaunchError {
    /// The engine's last log lines, when the error carries them.
    pub fn tail(&self) -> &[String] {
        match self {
            LaunchError::Exited { tail, .. } | LaunchError::NotReady { tail, .. } => tail,
            _ => &[],
        }
    }
}

fn tail_text(tail: &[String]) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its last log lines:\n  {}", tail.join("\n  "))
    }
}

/// A running engine.
pub struct Instance {
    child: Option<Child>,
    pgid: i32,
    pub pid: u32,
    pub url: String,
    pub port: u16,
    pub startup: Duration,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    program: String,
    signal: i32,
    grace: Duration,
}

/// Starts `configuration` of `profile` with logs `<log_dir>/<stem>.stdout.log` / `.stderr.log`, and
/// waits until it is ready. Whatever fails, nothing it started is left running.
pub async fn start(
    profile: &Profile,
    configuration: &Configuration,
    log_dir: &Path,
    stem: &str,
    cancel: &watch::Receiver<bool>,
) -> Result<Instance, LaunchError> {
    let program = configuration.argv[0].clone();
    if profile.port.is_some() {
        check_port_free(configuration.port)?;
    }
    std::fs::create_dir_all(log_dir).map_err(|source| LaunchError::Io { what: "create", path: log_dir.to_path_buf(), source })?;
    let stdout = log_dir.join(format!("{stem}.stdout.log"));
    let stderr = log_dir.join(format!("{stem}.stderr.log"));
    let create = |path: &Path| File::create(path).map_err(|source| LaunchError::Io { what: "create", path: path.to_path_buf(), source });
    let mut command = Command::new(&program);
    command
        .args(&configuration.argv[1..])
        .envs(&configuration.env)
        .stdin(Stdio::null())
        .stdout(create(&stdout)?)
        .stderr(create(&stderr)?)
        .process_group(0);
    if let Some(dir) = &configuration.cwd {
        command.current_dir(dir);
    }
    let started = Instant::now();
    let child = {
        let mut live = LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.stopping {
            let source = std::io::Error::new(std::io::ErrorKind::Interrupted, "interrupted: launched engines are being stopped");
            return Err(LaunchError::Spawn { program, source });
        }
        let child = command.spawn().map_err(|source| LaunchError::Spawn { program: program.clone(), source })?;
        live.groups.insert(child.id() as i32);
        child
    };
    let pid = child.id();
    let pgid = pid as i32;
    let mut instance = Instance {
        child: Some(child),
        pgid,
        pid,
        url: format!("http://{}:{}", configuration.host, configuration.port),
        port: configuration.port,
        startup: Duration::ZERO,
        stdout,
        stderr,
        program,
        signal: profile.stop_signal(),
        grace: profile.stop_grace(),
    };
    match instance.wait_ready(&profile.ready.path, profile.ready_timeout(), started, cancel).await {
        Ok(()) => {
            instance.startup = started.elapsed();
            Ok(instance)
        }
        Err(error) => {
            instance.stop().await;
            Err(error)
        }
    }
}

impl Instance {
    async fn wait_ready(
        &mut self,
        path: &str,
        timeout: Duration,
        started: Instant,
        cancel: &watch::Receiver<bool>,
    ) -> Result<(), LaunchError> {
        let url = format!("{}{path}", self.url);
        let mut last;
        loop {
            if *cancel.borrow() {
                return Err(LaunchError::Cancelled { program: self.program.clone() });
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(LaunchError::Exited { program: self.program.clone(), status: status.to_string(), tail: self.tail() });
            }
            match get_status(self.port, path).await {
                Ok(200) => return self.check_listener(),
                Ok(status) => last = format!("HTTP {status}"),
                Err(error) => last = error,
            }
            if started.elapsed() >= timeout {
                return Err(LaunchError::NotReady { program: self.program.clone(), after: timeout, url, last, tail: self.tail() });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The process answering on the port must be ours (a leftover server on a fixed port would pass
    /// the readiness check). Unknowable without /proc access: then trusted.
    fn check_listener(&self) -> Result<(), LaunchError> {
        let Ok(Some(pid)) = ctxscope_common::process::listening_pid(self.port) else { return Ok(()) };
        let group = unsafe { libc::getpgid(pid as i32) };
        if pid == self.pid || group == self.pgid {
            return Ok(());
        }
        Err(LaunchError::WrongListener { port: self.port, pid, child: self.pid, program: self.program.clone() })
    }

    /// The last lines of stderr, then stdout when stderr is empty.
    pub fn tail(&self) -> Vec<String> {
        let lines = tail_lines(&self.stderr, TAIL_LINES);
        if lines.is_empty() {
            tail_lines(&self.stdout, TAIL_LINES)
        } else {
            lines
        }
    }

    /// The stop signal to the group, KILL after the grace period (or at once when the leader has
    /// exited but others of its group remain). Returns once no process of the group is left.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        signal_group(self.pgid, self.signal);
        let deadline = Instant::now() + self.grace;
        let mut killed = false;
        loop {
            let leader_gone = child.try_wait().ok().flatten().is_some();
            if leader_gone && !group_alive(self.pgid) {
                break;
            }
            if !killed && (Instant::now() >= deadline || leader_gone && Instant::now() + self.grace / 2 >= deadline) {
                signal_group(self.pgid, libc::SIGKILL);
                killed = true;
            }
            if killed && Instant::now() >= deadline + Duration::from_secs(5) {
                tracing::warn!(pgid = self.pgid, "launched process group still present 5 s after KILL");
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        forget(self.pgid);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(self.pgid, libc::SIGKILL);
            let _ = child.wait();
            forget(self.pgid);
        }
    }
}

/// KILLs every launched group still running and waits (at most 2 s) until each leader is gone, so
/// that none outlives the command (an interrupted command's last act; no engine starts after it).
pub fn kill_all() {
    let mut live = LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    live.stopping = true;
    for &pgid in &live.groups {
        signal_group(pgid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    for &pgid in &live.groups {
        // The leader is this process's child: reaped here, it is gone before the command exits.
        // SAFETY: waitpid on our own child's pid with WNOHANG; the status is a local.
        while unsafe { libc::waitpid(pgid, std::ptr::null_mut(), libc::WNOHANG) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn forget(pgid: i32) {
    if let Ok(mut live) = LIVE.lock() {
        live.groups.remove(&pgid);
    }
}

fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is involved.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// Whether any process of the group is left (zombies of other parents count until reaped).
fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn check_port_free(port: u16) -> Result<(), LaunchError> {
    if std::net::TcpListener::bind((super::profile::HOST, port)).is_ok() {
        return Ok(());
    }
    let by = ctxscope_common::process::listening_pid(port).ok().flatten().map(|pid| {
        let argv =
            std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        format!("pid {pid} ({})", argv.trim())
    });
    Err(LaunchError::PortTaken { port, by })
}

/// `GET path` on the loopback port: the status code, or why there was none.
async fn get_status(port: u16, path: &str) -> Result<u16, String> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((super::profile::HOST, port)).await.map_err(|e| e.to_string())?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}:{port}\r\nConnection: close\r\n\r\n", super::profile::HOST);
        stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut head = [0u8; 64];
        let mut read = 0;
        while read < 12 {
            let n = stream.read(&mut head[read..]).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            read += n;
        }
        let line = String::from_utf8_lossy(&head[..read]).to_string();
        line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("not an HTTP answer: {line:?}"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt).await.unwrap_or_else(|_| Err("no answer within 2 s".into()))
}

/// The last `n` non-empty lines of a file (reads at most its last 64 KiB).
pub fn tail_lines(path: &Path, n: usize) -> Vec<String> {
    let Ok(mut file) = File::open(path) else { return Vec::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(64 << 10);
    if file.seek(SeekFrom::Start(from)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<String> = text.lines().map(str::trim_end).filter(|l| !l.is_empty()).map(str::to_string).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(text: &str) -> Profile {
        Profile::parse(Path::new("/t/test.toml"), text, &|_| None).unwrap()
    }

    fn cancel() -> watch::Receiver<bool> {
        watch::channel(false).1
    }

    /// A tiny HTTP server in Python answering 200 on every path, on {port}.
    const SERVER: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

    fn python() -> Option<&'static str> {
        ["python3", "python"].into_iter().find(|p| Command::new(p).arg("-c").arg("pass").status().is_ok_and(|s| s.success()))
    }

    #[tokio::test]
    async fn a_server_starts_is_ready_and_is_stopped_with_its_group() {
        let Some(py) = python() else { return eprintln!("skipped: no python") };
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "command = [{py:?}, \"-c\", {SERVER:?}, \"{{port}}\"]\n[ready]\npath = \"/health\"\ntimeout_s = 20\n[stop]\ngrace_s = 5"
        );
        let p = profile(&text);
        let port = super::super::free_port().unwrap();
        let config = p.configuration(&[], port).unwrap();
        let mut instance = start(&p, &config, dir.path(), "golden", &cancel()).await.unwrap();
        assert_eq!(get_status(port, "/anything").await, Ok(200));
        assert!(group_alive(instance.pgid));
        instance.stop().await;
        assert!(!group_alive(instance.pgid));
        assert!(get_status(port, "/").await.is_err());
        assert_eq!(tail_lines(&instance.stdout, 5), ["serving"]);
    }

    #[tokio::test]
    async fn an_early_exit_is_reported_with_its_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = profile("command = [\"sh\", \"-c\", \"echo loading; echo 'error: bad flag {port}' >&2; exit 3\"]");
        let config = p.configuration(&[], 1).unwrap();
        let e = start(&p, &config, dir.path(), "bad", &cancel()).await.err().unwrap();
        assert!(matches!(&e, LaunchError::Exited { .. }), "{e}");
        assert!(e.to_string().contains("error: bad flag 1"), "{e}");
        assert!(e.to_string().contains("exit status: 3"), "{e}");
    }

    #[tokio::test]
    async fn a_process_that_ignores_term_is_killed_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let text =
            "command = [\"sh\", \"-c\", \"trap '' TERM; sleep 60 & wait; echo {port}\"]\n[ready]\ntimeout_s = 0.5\n[stop]\ngrace_s = 0.5";
        let p = profile(text);
        let config = p.configuration(&[], super::super::free_port().unwrap()).unwrap();
        let started = Instant::now();
        let e = start(&p, &config, dir.path(), "stubborn", &cancel()).await.err().unwrap();
        assert!(matches!(&e, LaunchError::NotReady { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(!LIVE.lock().unwrap().groups.iter().any(|g| group_alive(*g)));
    }

    #[tokio::test]
    async fn a_fixed_port_already_taken_is_refused_before_launch() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let p = profile(&format!("command = [\"sh\", \"-c\", \"sleep 30\"]\nport = {port}"));
        let config = p.configuration(&[], 0).unwrap();
        let e = start(&p, &config, dir.path(), "fixed", &cancel()).await.err().unwrap();
        assert!(matches!(&e, LaunchError::PortTaken { port: p, .. } if *p == port), "{e}");
        assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
    }
}
