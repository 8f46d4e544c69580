//! The binary's errors, typed up to `main`, which prints them (each message names its cause). Commands whose
//! libraries report in text (replay, fidelity, model download, engine start-up) still carry a
//! message.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
    #[error(transparent)]
    Proxy(Box<ctxscope_proxy::RunError>),
    #[error(transparent)]
    Upstream(#[from] ctxscope_proxy::upstream::UpstreamError),
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
    #[error("{0}")]
    Message(String),
}

impl From<ctxscope_proxy::RunError> for CliError {
    fn from(error: ctxscope_proxy::RunError) -> Self {
        CliError::Proxy(Box::new(error))
    }
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Message(message)
    }
}

/// Binds a listener, naming the address when it cannot.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|source| CliError::Listen { addr, source })
}
