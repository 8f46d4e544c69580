//! Where inspection commands read records from, behind one trait: [`Records`], implemented by the
//! admin API of a running proxy ([`super::admin::AdminApi`]) and by a store directory opened
//! directly ([`LocalStore`]); both yield the same records.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use ctxscope_store::{
    ConversationDetail, ConversationRecord, FindingFilter, FindingRecord, Loss, ReadOnlyStore, ReplayEntry, Store, StoreError, StoreOptions,
};

/// What an inspection command could not do.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("no capture store at {0} (pass --data DIR, or --admin URL for a running proxy)")]
    NoStore(PathBuf),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("bad --admin URL {url:?}: {reason}")]
    AdminUrl { url: String, reason: String },
    #[error("cannot reach admin API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("admin API: {status}: {message}")]
    Status { status: http::StatusCode, message: String },
    #[error("admin API answered something unexpected: {0}")]
    Unexpected(String),
    #[error("cannot encode JSON: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("no replay {0}")]
    NoReplay(u64),
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
    /// Printed in full, but the store recorded losses no one has acknowledged yet.
    #[error("the store has lost records ({0}); `ctxscope store losses` lists them, `ctxscope store ack ID` acknowledges one")]
    Losses(String),
}

/// A boxed future, so that [`Records`] can be used as a trait object.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, InspectError>> + Send + 'a>>;

/// The records inspection and replay read and write, wherever they live.
pub trait Records: Send + Sync {
    fn conversations(&self) -> Pending<'_, Vec<ConversationRecord>>;
    /// One conversation with its turns and messages.
    fn detail(&self, id: u64) -> Pending<'_, ConversationDetail>;
    fn findings<'a>(&'a self, filter: &'a FindingFilter) -> Pending<'a, Vec<FindingRecord>>;
    /// The conversation as `ctxscope export` JSONL.
    fn export(&self, id: u64) -> Pending<'_, Vec<u8>>;
    /// Reads an export file in as a new conversation; its id.
    fn import<'a>(&'a self, file: &'a Path) -> Pending<'a, u64>;
    fn put_replay<'a>(&'a self, entry: &'a ReplayEntry) -> Pending<'a, ()>;
    fn replay(&self, id: u64) -> Pending<'_, ReplayEntry>;
    /// Stored replay runs, newest first.
    fn replays(&self) -> Pending<'_, Vec<ReplayEntry>>;
    /// Losses the store recorded and no operator has acknowledged.
    fn losses(&self) -> Pending<'_, Vec<Loss>>;
    /// Acknowledges losses (`ids` empty: all); how many changed.
    fn acknowledge_losses<'a>(&'a self, ids: &'a [u64]) -> Pending<'a, usize>;
}

/// A store directory opened directly (no proxy holds it: sled allows one process per directory).
/// Commands that only read open a private copy, so the directory is never modified.
pub struct LocalStore {
    pub dir: PathBuf,
}

impl LocalStore {
    fn open(&self) -> Result<Store, InspectError> {
        self.exists()?;
        Ok(Store::open(&self.dir, &StoreOptions::default())?)
    }

    fn read(&self) -> Result<ReadOnlyStore, InspectError> {
        self.exists()?;
        let store = Store::open_read_only(&self.dir, &StoreOptions::default())?;
        // Never silent: what is shown may be short of what was stored, or made good from the journal.
        let (turns, findings) = store.restored_on_open();
        if turns + findings > 0 {
            eprintln!(
                "ctxscope: warning: {}: sled's files are damaged and had lost {turns} turn(s) and {findings} finding(s); shown from the record journal, which the proxy's next start (or `ctxscope store check --repair`) writes back",
                self.dir.display()
            );
        }
        match store.damage() {
            Ok(Some(damage)) => eprintln!("ctxscope: warning: {}: {damage}", self.dir.display()),
            Ok(None) => {}
            Err(error) => eprintln!("ctxscope: warning: {}: cannot check the store: {error}", self.dir.display()),
        }
        Ok(store)
    }

    fn exists(&self) -> Result<(), InspectError> {
        if self.dir.exists() {
            Ok(())
        } else {
            Err(InspectError::NoStore(self.dir.clone()))
        }
    }

    fn create(dir: &Path) -> Result<(), InspectError> {
        std::fs::create_dir_all(dir).map_err(|source| InspectError::Io { what: "create", path: dir.to_path_buf(), source })
    }
}

/// A finished future of a synchronous store call.
fn done<'a, T: Send + 'a>(result: Result<T, InspectError>) -> Pending<'a, T> {
    Box::pin(std::future::ready(result))
}

impl Records for LocalStore {
    fn conversations(&self) -> Pending<'_, Vec<ConversationRecord>> {
        done(self.read().and_then(|s| Ok(s.conversations()?)))
    }

    fn detail(&self, id: u64) -> Pending<'_, ConversationDetail> {
        done(self.read().and_then(|s| Ok(s.conversation_detail(id)?)))
    }

    fn findings<'a>(&'a self, filter: &'a FindingFilter) -> Pending<'a, Vec<FindingRecord>> {
        done(self.read().and_then(|s| Ok(s.findings(filter)?)))
    }

    fn export(&self, id: u64) -> Pending<'_, Vec<u8>> {
        done(self.read().and_then(|s| {
            let mut out = Vec::new();
            s.export_conversation(id, &mut out)?;
            Ok(out)
        }))
    }

    fn import<'a>(&'a self, file: &'a Path) -> Pending<'a, u64> {
        // Read line by line as it is imported (each line bounded by the store's line limit).
        let read = || {
            let opened = std::fs::File::open(file).map_err(|source| InspectError::Io { what: "read", path: file.to_path_buf(), source })?;
            Self::create(&self.dir)?;
            Ok(self.open()?.import_conversation(&mut std::io::BufReader::new(opened))?)
        };
        done(read())
    }

    fn put_replay<'a>(&'a self, entry: &'a ReplayEntry) -> Pending<'a, ()> {
        done(self.open().and_then(|s| Ok(s.put_replay(entry)?)))
    }

    fn replay(&self, id: u64) -> Pending<'_, ReplayEntry> {
        done(self.read().and_then(|s| s.replay(id)?.ok_or(InspectError::NoReplay(id))))
    }

    fn replays(&self) -> Pending<'_, Vec<ReplayEntry>> {
        done(self.read().and_then(|s| Ok(s.replays()?)))
    }

    fn losses(&self) -> Pending<'_, Vec<Loss>> {
        done(self.read().and_then(|s| Ok(s.unacknowledged_losses()?)))
    }

    fn acknowledge_losses<'a>(&'a self, ids: &'a [u64]) -> Pending<'a, usize> {
        done(self.open().and_then(|s| Ok(s.acknowledge_losses(ids)?)))
    }
}
