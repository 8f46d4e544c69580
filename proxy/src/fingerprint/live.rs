//! The live engine process behind the upstream. When the upstream's host is this one (a loopback
//! address, `localhost`, or an address of this host) or `--engine-pid` names the process, each probe
//! also reads what the process runs from `/proc` (the process listening on the upstream's port, else
//! the given pid): its command line, engine environment variables, executable and shared objects with
//! their build ids, pid and start time, merged into the fingerprint's fields with `/proc/PID` among
//! its sources. A process that cannot be read is said once at warn (again only after a success), and
//! the HTTP fingerprint goes on without it. A library file replaced on disk while the same process
//! runs it keeps what was read of it before (the process still runs the old one).

use std::net::{IpAddr, TcpListener, ToSocketAddrs};

use ctxscope_common::process::{self, Library, ProcessError, ProcessInfo};
use ctxscope_store::Fingerprint;
use serde_json::Value;

use super::probe::ProbeError;
use crate::upstream::Upstream;

/// Where the engine process is looked for.
#[derive(Debug, Clone)]
struct Target {
    /// The upstream URL's host (brackets of an IPv6 literal removed).
    host: String,
    port: u16,
    /// `--engine-pid`.
    engine_pid: Option<u32>,
}

/// Why the engine process was not read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no process listens on TCP port {port} of this host (pass --engine-pid to name the engine process)")]
    NotListening { port: u16 },
    /// The process listening on the port went away between being found and being read (a restart).
    #[error("process {pid}, listening on TCP port {port}, exited while it was read")]
    Exited { pid: u32, port: u16 },
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// The process half of the fingerprint probe.
pub struct Live {
    target: Target,
    /// A failure to read the process was logged at warn since the last success.
    warned: bool,
    /// The upstream has described itself over HTTP at least once.
    described: bool,
    /// The process as last read.
    last: Option<ProcessInfo>,
}

impl Live {
    pub fn new(upstream: &Upstream, engine_pid: Option<u32>) -> Live {
        let host = upstream.authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        let port = upstream.authority.port_u16().unwrap_or(80);
        Live { target: Target { host, port, engine_pid }, warned: false, described: false, last: None }
    }

    /// Completes one probe's HTTP answer with the process. An HTTP fingerprint gains the process's
    /// fields when it can be read (and is kept as it is when it cannot; the probe is asked again soon
    /// when the process exited meanwhile). An upstream that answers but has never described itself
    /// (404s, not JSON) gets a fingerprint of the process alone, engine `unknown`; one that did
    /// describe itself before and now does not answer keeps its last fingerprint, as does one that
    /// does not answer at all (down, loading).
    pub async fn complete(&mut self, http: Result<Fingerprint, ProbeError>) -> Result<Fingerprint, ProbeError> {
        match http {
            Ok(mut print) => {
                self.described = true;
                match self.look().await {
                    Some(Ok(info)) => merge(&mut print, &info),
                    Some(Err(LiveError::Exited { pid, .. })) => return Err(ProbeError::Exited { pid }),
                    Some(Err(_)) | None => {}
                }
                Ok(print)
            }
            Err(error) if error.undescribed() && !self.described => match self.look().await {
                Some(Ok(info)) => {
                    let mut print = Fingerprint { engine: "unknown".into(), ..Fingerprint::default() };
                    merge(&mut print, &info);
                    Ok(print)
                }
                _ => Err(error),
            },
            Err(error) => Err(error),
        }
    }

    /// Reads the engine process (`None`: nothing says where it is: a remote upstream and no
    /// `--engine-pid`), logging a failure at warn once.
    async fn look(&mut self) -> Option<Result<ProcessInfo, LiveError>> {
        let target = self.target.clone();
        let found = match tokio::task::spawn_blocking(move || target.find()).await {
            Ok(found) => found?.map(|info| carry_over(info, self.last.as_ref())),
            Err(error) => {
                tracing::debug!(%error, "engine process read task failed");
                return None;
            }
        };
        match &found {
            Ok(info) => {
                self.warned = false;
                self.last = Some(info.clone());
            }
            Err(error @ LiveError::Exited { .. }) => tracing::debug!(%error, "engine process not read"),
            Err(error) if !self.warned => {
                self.warned = true;
                tracing::warn!(%error, "cannot read the engine process; the fingerprint keeps what the engine says over HTTP");
            }
            Err(error) => tracing::debug!(%error, "engine process still not read"),
        }
        Some(found)
    }
}

impl Target {
    fn find(&self) -> Option<Result<ProcessInfo, LiveError>> {
        let local = is_local(&self.host, self.port);
        if !local && self.engine_pid.is_none() {
            return None;
        }
        let listening = if local { process::listening_pid(self.port) } else { Ok(None) };
        let (pid, from_port) = match (listening, self.engine_pid) {
            (Ok(Some(pid)), _) => (pid, true),
            (_, Some(pid)) => (pid, false),
            (Ok(None), None) => return Some(Err(LiveError::NotListening { port: self.port })),
            (Err(error), None) => return Some(Err(error.into())),
        };
        Some(process::inspect(pid).map_err(|error| match error {
            ProcessError::Gone { pid } if from_port => LiveError::Exited { pid, port: self.port },
            other => LiveError::Process(other),
        }))
    }
}

/// `info` with each library whose file was replaced since it was mapped (` (deleted)`) as the same
/// process's previous read found it under the same path: the process runs what it mapped then.
fn carry_over(mut info: ProcessInfo, last: Option<&ProcessInfo>) -> ProcessInfo {
    let Some(last) = last.filter(|l| l.pid == info.pid && l.started_unix_ms == info.started_unix_ms) else { return info };
    let bare = |lib: &Library| lib.path.trim_end_matches(" (deleted)").to_string();
    for (name, lib) in info.libs.iter_mut() {
        if lib.path.ends_with(" (deleted)") {
            if let Some(before) = last.libs.get(name).filter(|before| bare(before) == bare(lib)) {
                *lib = before.clone();
            }
        }
    }
    info
}

/// Adds the process's fields and `/proc/PID` to `print`.
fn merge(print: &mut Fingerprint, info: &ProcessInfo) {
    print.fields.extend(info.fields().into_iter().map(|(field, value)| (field, Value::from(value))));
    print.sources.push(format!("/proc/{}", info.pid));
}

/// Whether `host` is this host: `localhost`, a loopback or unspecified address, or one a socket can
/// be bound to here (an address of one of this host's interfaces). Names are resolved.
fn is_local(host: &str, port: u16) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (host, port).to_socket_addrs().map(|found| found.map(|a| a.ip()).collect()).unwrap_or_default(),
    };
    addresses
        .into_iter()
        .map(|ip| ip.to_canonical())
        .any(|ip| ip.is_loopback() || ip.is_unspecified() || (!ip.is_multicast() && TcpListener::bind((ip, 0)).is_ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use serde_json::json;

    fn http_print() -> Fingerprint {
        let mut print = Fingerprint { engine: "llama.cpp".into(), sources: vec!["GET /props".into()], ..Fingerprint::default() };
        print.fields.insert("props.n_ctx".into(), json!(1024));
        print
    }

    fn answered_404() -> ProbeError {
        ProbeError::Nothing(Box::new(ProbeError::Status { method: Method::GET, path: "/version", status: 404 }))
    }

    fn refused() -> ProbeError {
        ProbeError::Nothing(Box::new(ProbeError::Transport { method: Method::GET, path: "/version", detail: "refused".into() }))
    }

    #[test]
    fn a_library_replaced_on_disk_keeps_what_the_same_process_read_of_it() {
        let lib = |path: &str, id: Option<&str>| Library { path: path.into(), build_id: id.map(str::to_string) };
        let info = |pid: u32, started: u64, libs: Vec<(&str, Library)>| ProcessInfo {
            pid,
            argv: vec!["engine".into()],
            env: Default::default(),
            exe: None,
            exe_build_id: None,
            libs: libs.into_iter().map(|(n, l)| (n.to_string(), l)).collect(),
            started_unix_ms: Some(started),
        };
        let before = info(7, 1000, vec![("libx.so", lib("/opt/libx.so", Some("aa"))), ("liby.so", lib("/opt/liby.so", None))]);
        let replaced = || {
            info(
                7,
                1000,
                vec![
                    ("libx.so", lib("/opt/libx.so (deleted)", None)),
                    ("liby.so", lib("/opt/liby.so (deleted)", None)),
                    ("libz.so", lib("/z.so (deleted)", None)),
                ],
            )
        };
        let kept = carry_over(replaced(), Some(&before));
        assert_eq!(kept.libs["libx.so"], lib("/opt/libx.so", Some("aa")));
        assert_eq!(kept.libs["liby.so"], lib("/opt/liby.so", None));
        assert_eq!(kept.libs["libz.so"], lib("/z.so (deleted)", None), "nothing read of it before");
        assert_eq!(kept.fields()["lib.libx.so"], before.fields()["lib.libx.so"]);
        // Another process (a restart) maps the new file: nothing carries over.
        let restarted = ProcessInfo { pid: 8, started_unix_ms: Some(2000), ..replaced() };
        assert_eq!(carry_over(restarted.clone(), Some(&before)), restarted);
        assert_eq!(carry_over(replaced(), None), replaced());
    }

    #[test]
    fn local_hosts() {
        for host in ["127.0.0.1", "127.3.2.1", "::1", "localhost", "LocalHost", "0.0.0.0", "::ffff:127.0.0.1"] {
            assert!(is_local(host, 80), "{host}");
        }
        // Documentation addresses (RFC 5737, RFC 3849): never this host's.
        for host in ["203.0.113.7", "2001:db8::1", "no-such-host.invalid"] {
            assert!(!is_local(host, 80), "{host}");
        }
        let upstream = Upstream::parse("http://[::1]:8123/v1").unwrap();
        let live = Live::new(&upstream, None);
        assert_eq!((live.target.host.as_str(), live.target.port), ("::1", 8123));
        assert_eq!(Live::new(&Upstream::parse("http://localhost").unwrap(), None).target.port, 80);
    }

    #[tokio::test]
    async fn a_loopback_upstream_adds_the_process_listening_on_its_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = Upstream::parse(&format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())).unwrap();
        let me = std::process::id();
        let mut live = Live::new(&upstream, None);
        let print = live.complete(Ok(http_print())).await.unwrap();
        assert_eq!(print.engine, "llama.cpp");
        assert_eq!(print.sources, ["GET /props".to_string(), format!("/proc/{me}")]);
        assert_eq!(print.fields["props.n_ctx"], json!(1024));
        assert_eq!(print.fields["process.pid"], json!(me.to_string()));
        let argv: Vec<String> = std::env::args().collect();
        assert_eq!(print.fields["argv"].as_str().unwrap().split(' ').next(), argv.first().map(String::as_str));
        assert!(print.fields.keys().any(|k| k.starts_with("lib.libc.so")), "{:?}", print.fields.keys());
        // Described once over HTTP: a later probe that gets 404s keeps the last fingerprint.
        assert!(matches!(live.complete(Err(answered_404())).await, Err(ProbeError::Nothing(_))));
    }

    #[tokio::test]
    async fn an_upstream_without_self_description_is_fingerprinted_by_its_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = Upstream::parse(&format!("http://localhost:{}", listener.local_addr().unwrap().port())).unwrap();
        let mut live = Live::new(&upstream, None);
        let print = live.complete(Err(answered_404())).await.unwrap();
        assert_eq!(print.engine, "unknown");
        assert_eq!(print.sources, [format!("/proc/{}", std::process::id())]);
        assert!(print.fields.contains_key("argv") && print.fields.contains_key("process.started_unix_ms"));
        // An upstream that does not answer at all (down, loading) gives no fingerprint.
        assert!(matches!(live.complete(Err(refused())).await, Err(ProbeError::Nothing(_))));
        // Nothing listening on the port: the 404s came from elsewhere; nothing to fingerprint.
        drop(listener);
        assert!(matches!(live.complete(Err(answered_404())).await, Err(ProbeError::Nothing(_))));
        assert!(live.warned);
    }

    #[tokio::test]
    async fn a_remote_upstream_uses_engine_pid_only_and_an_unreadable_one_is_said_once() {
        let remote = Upstream::parse("http://203.0.113.7:8000").unwrap();
        let mut live = Live::new(&remote, None);
        assert_eq!(live.complete(Ok(http_print())).await.unwrap(), http_print());
        assert!(!live.warned);

        let me = std::process::id();
        let mut live = Live::new(&remote, Some(me));
        let print = live.complete(Ok(http_print())).await.unwrap();
        assert_eq!(print.fields["process.pid"], json!(me.to_string()));

        // A pid that names no process: the HTTP fingerprint goes on, and the warning is given once.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let mut live = Live::new(&remote, Some(gone));
        for _ in 0..3 {
            assert_eq!(live.complete(Ok(http_print())).await.unwrap(), http_print());
            assert!(live.warned);
        }
        assert!(matches!(live.look().await, Some(Err(LiveError::Process(ProcessError::Gone { pid }))) if pid == gone));
        live.target.engine_pid = Some(me);
        assert!(live.complete(Ok(http_print())).await.unwrap().fields.contains_key("argv"));
        assert!(!live.warned, "a success clears the warning, so that a new failure is said again");
    }
}
