//! The binary's errors, typed up to `main`, which prints them (each message names its cause).

use std::net::SocketAddr;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
    #[error("{0}")]
    Launch(String),
    #[error(transparent)]
    Job(#[from] ctxscope_replay::job::JobError),
    #[error(transparent)]
    Proxy(Box<ctxscope_proxy::RunError>),
    #[error(transparent)]
    Upstream(#[from] ctxscope_proxy::upstream::UpstreamError),
    /// `ctxscope run` could not start or watch its child.
    #[error(transparent)]
    Run(crate::run::RunError),
    #[error(transparent)]
    AdminBind(#[from] ctxscope_proxy::admin::ui::auth::BindError),
    #[error(transparent)]
    Phrases(#[from] ctxscope_proxy::detect::config::PhraseFileError),
    #[error(transparent)]
    Store(#[from] ctxscope_store::StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    /// A flag whose value parsed but is out of range.
    #[error("{flag} {value} must be {expected}")]
    Flag { flag: &'static str, value: String, expected: &'static str },
    #[error(transparent)]
    Engine(#[from] ctxscope_engine::StartError),
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    #[error("cannot load {path}: {source}")]
    Model { path: std::path::PathBuf, source: ctxscope_engine::ModelError },
    /// `--patches` names a patch the loaded model's architecture never consults.
    #[error("--patches: {0}")]
    Patches(ctxscope_engine::patch::PatchError),
    /// A blocking task that panicked or was cancelled.
    #[error("{what}: {detail}")]
    Task { what: &'static str, detail: String },
    /// A replay target that does not parse (`flag` names where it came from).
    #[error("{flag}: {source}")]
    Target { flag: &'static str, source: ctxscope_replay::TargetError },
    #[error(transparent)]
    Replay(#[from] ctxscope_replay::PlanError),
    #[error(transparent)]
    Bisect(#[from] ctxscope_replay::BisectError),
    #[error(transparent)]
    Sweep(#[from] ctxscope_replay::fidelity::SweepError),
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: std::path::PathBuf, source: std::io::Error },
    #[error("--probes {path}: {source} (expected a JSON list of {{\"after_turn\": N, \"question\": \"...\", \"expected\": \"...\"}})")]
    Probes { path: std::path::PathBuf, source: serde_json::Error },
    #[error("replay {id} is not a report this version reads: {source}")]
    StoredReport { id: u64, source: serde_json::Error },
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Lengths(#[from] LengthsError),
    /// clap could not build a command's defaults (a bug: the defaults are in this binary).
    #[error("internal: {0}")]
    Defaults(String),
    /// Flags that do not go together, or a command without what it needs.
    #[error("{0}")]
    Usage(&'static str),
    #[error(transparent)]
    Check(#[from] crate::store_check::CheckError),
}

impl CliError {
    /// The process's exit code for this error: a shell's 127/126 when `run` cannot start its child,
    /// else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Run(error) => error.exit_code(),
            _ => 1,
        }
    }
}

impl From<ctxscope_proxy::RunError> for CliError {
    fn from(error: ctxscope_proxy::RunError) -> Self {
        CliError::Proxy(Box::new(error))
    }
}

/// A `--lengths` item that is not a token count.
#[derive(Debug, thiserror::Error)]
#[error("--lengths: `{0}` is not a token count (write e.g. 512,1k,2k)")]
pub struct LengthsError(pub String);

/// Binds a listener, naming the address when it cannot.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|source| CliError::Listen { addr, source })
}
/// Writes a file the user asked for (`--html`, `--save`), naming it when it cannot.
pub fn write_file(path: &Path, text: String) -> Result<(), CliError> {
    std::fs::write(path, text).map_err(|source| CliError::Io { what: "write", path: path.to_path_buf(), source })
}
