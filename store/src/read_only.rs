//! Read-only opening for inspection (`ctxscope conversations --data DIR` and the like). sled rewrites
//! its files when it opens a directory (log recovery, truncating a damaged tail), so inspection opens
//! a private copy and leaves every byte of the original as it was. A directory that a running process
//! holds is refused: its admin API is the way in.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::{Store, StoreError, StoreOptions};

/// A store opened from a private copy of a data directory; the copy is removed when this is dropped.
pub struct ReadOnlyStore {
    store: Option<Store>,
    copy: PathBuf,
}

impl Deref for ReadOnlyStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        self.store.as_ref().expect("the store lives until drop")
    }
}

impl Drop for ReadOnlyStore {
    fn drop(&mut self) {
        drop(self.store.take());
        let _ = std::fs::remove_dir_all(&self.copy);
    }
}

impl Store {
    /// Opens `path` for reading without modifying it: copies the directory (while holding sled's
    /// lock file shared, so no writer starts meanwhile) and opens the copy, putting back into it what
    /// sled lost from the journal, as the next open for writing will.
    pub fn open_read_only(path: &Path, options: &StoreOptions) -> Result<ReadOnlyStore, StoreError> {
        Store::open_copy(path, options, true)
    }

    /// [`Store::open_read_only`] without putting back what sled lost from the journal: the store as
    /// a check finds it.
    pub fn open_read_only_unrecovered(path: &Path, options: &StoreOptions) -> Result<ReadOnlyStore, StoreError> {
        Store::open_copy(path, options, false)
    }

    fn open_copy(path: &Path, options: &StoreOptions, recover: bool) -> Result<ReadOnlyStore, StoreError> {
        let copy_error = |source: std::io::Error| StoreError::Copy { path: path.to_path_buf(), source };
        let lock = File::open(path.join("db")).map_err(copy_error)?;
        if !lock_shared(&lock) {
            return Err(StoreError::Locked { path: path.to_path_buf() });
        }
        let copy = std::env::temp_dir().join(format!(
            "ctxscope-inspect-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        ));
        let copied = copy_dir(path, &copy).map_err(copy_error);
        drop(lock);
        if let Err(error) = copied {
            let _ = std::fs::remove_dir_all(&copy);
            return Err(error);
        }
        match Store::open_with(&copy, options, false, recover) {
            Ok(store) => Ok(ReadOnlyStore { store: Some(store), copy }),
            Err(error) => {
                let _ = std::fs::remove_dir_all(&copy);
                Err(error)
            }
        }
    }
}

/// A shared, non-blocking flock: fails while sled's writer holds its exclusive one.
#[cfg(unix)]
fn lock_shared(file: &File) -> bool {
    use std::os::unix::io::AsRawFd;
    extern "C" {
        fn flock(fd: i32, operation: i32) -> i32;
    }
    const LOCK_SH: i32 = 1;
    const LOCK_NB: i32 = 4;
    // SAFETY: flock only takes a descriptor this function borrows for the call.
    unsafe { flock(file.as_raw_fd(), LOCK_SH | LOCK_NB) == 0 }
}

#[cfg(not(unix))]
fn lock_shared(_file: &File) -> bool {
    true
}

/// Copies a store directory. Spilled values (`spill/`) are linked where the filesystem allows: they
/// are never modified in place (written under another name and renamed, later unlinked), so a link
/// reads the same bytes as a copy without copying large files. Journal segments (`journal/`) are
/// linked too: the copy only reads them (and no writer runs while the copy is made).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    copy_tree(from, to, false)
}

fn copy_tree(from: &Path, to: &Path, immutable: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            let linked = entry.file_name() == "spill" || entry.file_name() == crate::journal::JOURNAL_DIR;
            copy_tree(&entry.path(), &target, immutable || linked)?;
        } else if !(immutable && std::fs::hard_link(entry.path(), &target).is_ok()) {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
