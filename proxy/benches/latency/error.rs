//! The one error type of the latency bench: what failed (connecting, a request, starting the proxy)
//! with enough context to act on, so `main` can print it and exit non-zero.

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("{context}: {source}")]
    Http { context: String, source: hyper::Error },
    #[error("{0}")]
    Setup(String),
}

impl BenchError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Io { context: context.into(), source }
    }

    pub fn http(context: impl Into<String>, source: hyper::Error) -> BenchError {
        BenchError::Http { context: context.into(), source }
    }
}
