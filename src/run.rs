//! `ctxscope run -- CMD ARGS...`: a capture proxy around one harness. The proxy (and its admin
//! port) starts on free loopback ports in front of the upstream the child would have called, the
//! child runs with its base-URL variables pointed at the proxy, signals sent to `ctxscope` reach the
//! child, and when the child exits the capture queue is drained and its exit code returned.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};

/// The variables a harness reads its endpoint from, in the order the upstream is looked up.
pub const VARIABLES: [Api; 3] = [Api::OpenAi, Api::Anthropic, Api::Ollama];

/// The API whose client variable is pointed at the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `OPENAI_BASE_URL`: the OpenAI SDKs and most OpenAI-compatible harnesses (Codex, opencode).
    OpenAi,
    /// `ANTHROPIC_BASE_URL`: the Anthropic SDKs and Claude Code.
    Anthropic,
    /// `OLLAMA_HOST`: Ollama's clients.
    Ollama,
}

impl Api {
    pub fn variable(self) -> &'static str {
        match self {
            Api::OpenAi => "OPENAI_BASE_URL",
            Api::Anthropic => "ANTHROPIC_BASE_URL",
            Api::Ollama => "OLLAMA_HOST",
        }
    }

    /// The variable's value for a proxy at `proxy`: the OpenAI SDKs expect the `/v1` in the base
    /// URL, the Anthropic SDKs add it themselves, Ollama's clients want the origin.
    fn value_for(self, proxy: SocketAddr) -> String {
        match self {
            Api::OpenAi => format!("http://{proxy}/v1"),
            Api::Anthropic | Api::Ollama => format!("http://{proxy}"),
        }
    }

    /// The variable's value as a URL: `OLLAMA_HOST` may be `host`, `host:port` or a URL, with
    /// Ollama's default port 11434 and `0.0.0.0` meaning this host.
    fn url_of(self, value: &str) -> String {
        let value = value.trim();
        if self != Api::Ollama {
            return value.to_string();
        }
        let url = if value.contains("://") { value.to_string() } else { format!("http://{value}") };
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url.as_str()));
        let (host, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let host = match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => format!("{name}:{port}"),
            _ => format!("{host}:11434"),
        };
        let host = host.replacen("0.0.0.0:", "127.0.0.1:", 1);
        format!("{scheme}://{host}{path}")
    }
}

/// What `run` will do, decided from `--upstream` and the child's environment before anything
/// starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The proxy's `--upstream`: the base URL without a trailing `/v1` (the proxy forwards request
    /// paths as the client sent them, `/v1/...` included).
    pub upstream: String,
    /// Where the upstream came from (`--upstream` or a variable's name).
    pub source: &'static str,
    /// The variables pointed at the proxy.
    pub redirect: Vec<Api>,
    /// Variables left alone because they name another server (its traffic is not captured).
    pub bypass: Vec<(Api, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "no upstream: pass --upstream URL, or set OPENAI_BASE_URL, ANTHROPIC_BASE_URL or OLLAMA_HOST to where the harness should send \
         its requests"
    )]
    NoUpstream,
    #[error("{from}={value:?}: {why}")]
    Upstream { from: &'static str, value: String, why: String },
    #[error("the proxy did not come up within {0:?}: {1}")]
    NotReady(Duration, String),
    #[error("the proxy stopped before the child started: {0}")]
    ProxyStopped(String),
    #[error("cannot run {program:?}: {source}")]
    Spawn { program: OsString, source: std::io::Error },
    #[error("cannot wait for the child: {0}")]
    Wait(std::io::Error),
}

impl RunError {
    /// The exit code a shell would give: 127 when the program is not found, 126 when it cannot run.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => 127,
            RunError::Spawn { .. } => 126,
            _ => 1,
        }
    }
}

/// Decides the upstream and which variables to point at the proxy. With `--upstream` every variable
/// is pointed at the proxy (the user said where the traffic goes); without it the upstream is the
/// first variable set, and a variable naming another server is left alone.
pub fn plan(upstream: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<Plan, RunError> {
    let set: Vec<(Api, String)> =
        VARIABLES.iter().filter_map(|&api| env(api.variable()).filter(|v| !v.trim().is_empty()).map(|v| (api, api.url_of(&v)))).collect();
    let (source, url) = match upstream {
        Some(url) => ("--upstream", url.to_string()),
        None => match set.first() {
            Some((api, url)) => (api.variable(), url.clone()),
            None => return Err(RunError::NoUpstream),
        },
    };
    let base = base_of(source, &url)?;
    let mut redirect = Vec::new();
    let mut bypass = Vec::new();
    for api in VARIABLES {
        match set.iter().find(|(a, _)| *a == api) {
            Some((_, value)) if upstream.is_none() && base_of(api.variable(), value).ok().as_deref() != Some(base.as_str()) => {
                bypass.push((api, value.clone()))
            }
            _ => redirect.push(api),
        }
    }
    Ok(Plan { upstream: base, source, redirect, bypass })
}

/// A base URL without its trailing `/` and `/v1`, checked to be one the proxy can forward to.
fn base_of(source: &'static str, url: &str) -> Result<String, RunError> {
    let trimmed = url.trim().trim_end_matches('/');
    let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed);
    let fail = |why: String| RunError::Upstream { from: source, value: ctxscope_proxy::credentials::redact_url(url), why };
    match ctxscope_proxy::upstream::Upstream::parse(base) {
        Ok(_) => Ok(base.to_string()),
        Err(ctxscope_proxy::upstream::UpstreamError::Scheme(_)) => Err(fail(
            "the proxy forwards plain http:// only; run it in front of an engine you serve, or put a TLS-terminating relay in front".into(),
        )),
        Err(error) => Err(fail(error.to_string())),
    }
}

/// The child to run and how.
pub struct Child {
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// Runs the proxy task until the child exits, then stops it (draining capture) and returns the
/// child's exit code (128 + the signal's number when a signal ended it).
pub async fn run(
    plan: &Plan,
    proxy: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    data: Option<&std::path::Path>,
    serve: impl FnOnce(tokio::net::TcpListener, tokio::net::TcpListener, tokio::sync::oneshot::Receiver<()>) -> ProxyTask,
    child: Child,
) -> Result<u8, RunError> {
    let proxy_addr = proxy.local_addr().map_err(|e| RunError::NotReady(Duration::ZERO, e.to_string()))?;
    let admin_addr = admin.local_addr().map_err(|e| RunError::NotReady(Duration::ZERO, e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let mut task = serve(proxy, admin, stopped);
    let capture = wait_ready(admin_addr, &mut task).await?;
    announce(plan, proxy_addr, admin_addr, data, &capture);
    let mut command = tokio::process::Command::new(&child.program);
    command.args(&child.args);
    for api in &plan.redirect {
        command.env(api.variable(), api.value_for(proxy_addr));
    }
    die_with_parent(&mut command);
    // Caught before the child starts, so that none is lost (or kills this process) in between.
    let signals = catch_signals();
    let mut process = command.spawn().map_err(|source| RunError::Spawn { program: child.program.clone(), source })?;
    let forwarding = match (signals, process.id()) {
        (Ok(signals), Some(pid)) => {
            forward_signals(signals, pid).map_err(|e| eprintln!("ctxscope run: signals are not passed on: {e}")).ok()
        }
        (Err(e), _) => {
            eprintln!("ctxscope run: signals are not passed on: {e}");
            None
        }
        (Ok(_), None) => None,
    };
    let status = process.wait().await;
    if let Some(handle) = forwarding {
        handle.close();
    }
    let status = status.map_err(RunError::Wait)?;
    let _ = stop.send(());
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => eprintln!("ctxscope run: the proxy stopped with an error: {error}"),
        Err(error) => eprintln!("ctxscope run: the proxy task failed: {error}"),
    }
    Ok(exit_code(status))
}

/// The proxy, running: resolves when it stopped (after draining capture).
pub type ProxyTask = tokio::task::JoinHandle<Result<(), ctxscope_proxy::RunError>>;

/// How long the proxy may take to open its store and answer `/healthz` (a large store's journal is
/// read on open).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Waits until the admin port answers `/healthz`; returns its `capture` field.
async fn wait_ready(admin: SocketAddr, task: &mut ProxyTask) -> Result<String, RunError> {
    let client = ctxscope_http::client::client::<Empty<Bytes>>(Duration::from_secs(2));
    let uri: http::Uri = format!("http://{admin}/healthz").parse().expect("a socket address makes a URI");
    let started = Instant::now();
    loop {
        if task.is_finished() {
            let why = match task.await {
                Ok(Ok(())) => "it returned".to_string(),
                Ok(Err(error)) => error.to_string(),
                Err(error) => error.to_string(),
            };
            return Err(RunError::ProxyStopped(why));
        }
        match client.get(uri.clone()).await {
            Ok(response) => {
                let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let health: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                return Ok(health["capture"].as_str().unwrap_or("unknown").to_string());
            }
            Err(error) if started.elapsed() > READY_WITHIN => return Err(RunError::NotReady(READY_WITHIN, error.to_string())),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn announce(plan: &Plan, proxy: SocketAddr, admin: SocketAddr, data: Option<&std::path::Path>, capture: &str) {
    let store = data.map_or_else(|| "nowhere (--no-capture)".to_string(), |d| d.display().to_string());
    eprintln!("ctxscope run: proxy http://{proxy} -> {} (from {}), capture {capture} into {store}", redacted(&plan.upstream), plan.source);
    eprintln!("ctxscope run: UI http://{admin}/");
    let names: Vec<&str> = plan.redirect.iter().map(|api| api.variable()).collect();
    eprintln!("ctxscope run: the child gets {} pointed at the proxy", names.join(", "));
    for (api, value) in &plan.bypass {
        eprintln!("ctxscope run: {} stays {} (another server): its traffic is not captured", api.variable(), redacted(value));
    }
}

fn redacted(url: &str) -> String {
    ctxscope_proxy::credentials::redact_url(url)
}

/// A child's status as a shell reports it.
fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(signal) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        None => 1,
    }
}

/// The signals passed on to the child.
const FORWARDED: [i32; 6] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];

/// The forwarded signals, caught (with who sent them) instead of acted on: `ctxscope` itself keeps
/// running until the child exits, whatever the signal.
type Caught = signal_hook::iterator::SignalsInfo<signal_hook::iterator::exfiltrator::WithOrigin>;

fn catch_signals() -> std::io::Result<Caught> {
    Caught::new(FORWARDED)
}

/// Passes each signal sent to this process on to the child, except those the terminal sent (Ctrl-C,
/// Ctrl-\, a hang-up): the terminal sends them to the whole foreground process group, the child
/// included, so passing them on would deliver them twice.
fn forward_signals(mut signals: Caught, child: u32) -> std::io::Result<signal_hook::iterator::Handle> {
    let handle = signals.handle();
    let pid = libc::pid_t::try_from(child).map_err(|_| std::io::Error::other("child pid out of range"))?;
    std::thread::Builder::new().name("ctxscope-run-signals".into()).spawn(move || {
        for origin in &mut signals {
            if from_terminal(origin.cause) {
                continue;
            }
            // SAFETY: kill has no memory preconditions; the pid is our child's, which we have not
            // reaped while this thread runs (the handle is closed after the wait returns).
            unsafe { libc::kill(pid, origin.signal) };
        }
    })?;
    Ok(handle)
}

/// A signal the kernel generated (a terminal's Ctrl-C or hang-up), not one a process sent.
fn from_terminal(cause: signal_hook::low_level::siginfo::Cause) -> bool {
    matches!(cause, signal_hook::low_level::siginfo::Cause::Kernel)
}

/// On Linux, the child gets SIGTERM if `ctxscope` dies first (even by SIGKILL), so no harness is
/// left running against a proxy that is gone.
fn die_with_parent(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid before the fork; between fork and exec the closure calls only prctl,
        // getppid and _exit, which are async-signal-safe.
        let parent = unsafe { libc::getpid() };
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_upstream_is_the_first_variable_set_and_others_elsewhere_are_left_alone() {
        let plan =
            plan(None, env(&[("OPENAI_BASE_URL", "http://gpu:8000/v1/"), ("ANTHROPIC_BASE_URL", "https://api.anthropic.com")])).unwrap();
        assert_eq!(plan.upstream, "http://gpu:8000");
        assert_eq!(plan.source, "OPENAI_BASE_URL");
        assert_eq!(plan.redirect, vec![Api::OpenAi, Api::Ollama]);
        assert_eq!(plan.bypass, vec![(Api::Anthropic, "https://api.anthropic.com".to_string())]);
    }

    #[test]
    fn an_explicit_upstream_takes_every_variable() {
        let plan = plan(Some("http://127.0.0.1:30000"), env(&[("OPENAI_BASE_URL", "https://api.openai.com/v1")])).unwrap();
        assert_eq!(plan.upstream, "http://127.0.0.1:30000");
        assert_eq!(plan.redirect, VARIABLES.to_vec());
        assert!(plan.bypass.is_empty());
    }

    #[test]
    fn ollama_host_forms_and_same_server_variables() {
        let plan = plan(None, env(&[("OLLAMA_HOST", "0.0.0.0"), ("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")])).unwrap();
        // OPENAI_BASE_URL comes first and names the same server as OLLAMA_HOST's default port.
        assert_eq!(plan.upstream, "http://127.0.0.1:11434");
        assert_eq!(plan.redirect, VARIABLES.to_vec());
        assert_eq!(Api::Ollama.url_of("gpu:1234"), "http://gpu:1234");
        assert_eq!(Api::Ollama.url_of("http://gpu"), "http://gpu:11434");
        let proxy: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(Api::OpenAi.value_for(proxy), "http://127.0.0.1:5000/v1");
        assert_eq!(Api::Anthropic.value_for(proxy), "http://127.0.0.1:5000");
    }

    #[test]
    fn no_upstream_and_https_are_clear_errors() {
        assert!(matches!(plan(None, env(&[])), Err(RunError::NoUpstream)));
        let https = plan(None, env(&[("OPENAI_BASE_URL", "https://api.openai.com/v1")])).unwrap_err();
        let text = https.to_string();
        assert!(text.contains("OPENAI_BASE_URL") && text.contains("http:// only"), "{text}");
        let secret = plan(Some("http://user:hunter2@x:1/v1 x"), env(&[])).unwrap_err().to_string();
        assert!(!secret.contains("hunter2"), "{secret}");
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 128 + 15);
        let missing = RunError::Spawn { program: "x".into(), source: std::io::ErrorKind::NotFound.into() };
        assert_eq!(missing.exit_code(), 127);
    }
}
