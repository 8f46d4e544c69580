//! Typed errors for the store boundary: every variant says which directory or record was involved
//! and, where the user can act, what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open capture store at {path}: {source}. If another ctxscope process is running on this directory, query it through its admin API (--admin URL) instead")]
    Open { path: PathBuf, source: sled::Error },
    #[error("cannot open capture store at {path}: the disk is full. Nothing stored is lost: free some space and retry")]
    DiskFull { path: PathBuf },
    #[error("{path} is not a ctxscope data directory (it holds other files); choose an empty or new --data directory")]
    Foreign { path: PathBuf },
    #[error("capture store at {path} has schema version {found}, this ctxscope understands version {expected}; use a matching ctxscope release or a new --data directory")]
    Schema { path: PathBuf, found: u32, expected: u32 },
    #[error("capture store at {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("store I/O failed: {0}")]
    Sled(#[from] sled::Error),
    /// A record whose checksum does not match its bytes (or whose frame is cut short or unknown).
    #[error("capture store record {tree}/{key} is damaged: {detail}; `ctxscope store check --data DIR` lists the damage and `--repair` removes it")]
    Damaged { tree: &'static str, key: String, detail: String },
    #[error("cannot decode {kind} record {key}: {source}; `ctxscope store check --data DIR` lists the damage and `--repair` removes it")]
    Decode { kind: &'static str, key: String, source: serde_json::Error },
    #[error("cannot encode {kind} record: {source}")]
    Encode { kind: &'static str, source: serde_json::Error },
    #[error("capture store at {path} is in use by a running ctxscope process; inspect it through that process's admin API (--admin URL)")]
    Locked { path: PathBuf },
    #[error("cannot copy capture store at {path} to inspect it without modifying it: {source}")]
    Copy { path: PathBuf, source: std::io::Error },
    /// Between closing sled and opening it again (`Store::reopen`), or after a reopen that failed.
    #[error("capture store at {path} is being reopened after a write error (it is retried until it opens)")]
    Reopening { path: PathBuf },
    #[error("{0} not found")]
    NotFound(String),
    /// Refused before sled saw it: a write sled fails with ENOSPC in its background flusher poisons
    /// the database until it is reopened, so writes stop while the disk is nearly full instead.
    #[error("disk nearly full at {path}: {free} bytes free, a turn of {needed} bytes is not written (free some space: capture resumes by itself)")]
    NoRoom { path: PathBuf, free: u64, needed: u64 },
    /// A large value's own file (`spill`) could not be written or listed.
    #[error("cannot write capture store file {path}: {source}")]
    Spill { path: PathBuf, source: std::io::Error },
    #[error("bad import line {line}: {detail}")]
    Import { line: usize, detail: String },
    #[error("import line {line} is longer than the limit of {limit} bytes (one line is one message, turn or finding)")]
    ImportLineTooLong { line: usize, limit: usize },
}

impl StoreError {
    /// Whether sled itself failed to write (it then fails every later call until reopened), or is
    /// closed by a reopen that has not opened it again: [`crate::Store::reopen`] is the cure.
    pub fn needs_reopen(&self) -> bool {
        matches!(self, StoreError::Sled(sled::Error::Io(_) | sled::Error::ReportableBug(_)) | StoreError::Reopening { .. })
    }
}

/// Whether a sled error is the disk being full (ENOSPC).
pub fn is_disk_full(error: &sled::Error) -> bool {
    matches!(error, sled::Error::Io(io) if io.raw_os_error() == Some(28) || io.kind() == std::io::ErrorKind::StorageFull)
}
