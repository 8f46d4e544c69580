//! The record journal: every committed turn, stored finding and deliberate removal, appended to
//! checksummed segment files beside sled (`journal/`), from which the store is rebuilt when sled's
//! own files are damaged. sled recovers a damaged log by keeping what precedes the damage, so one
//! flipped byte can cost every record written after it; the journal frames each record on its own
//! (`segment`), so a damaged byte costs the records it sits in. sled stays the store of record for
//! queries; the journal is only read on open (`restore`) and by `store check`.
//!
//! Appends happen before sled sees a write and are undone (the segment cut back) when sled refuses
//! it, so the journal holds exactly what was committed. They reach the OS at once (a killed process
//! loses nothing) and the disk at sled's flush interval (a background thread syncs the file).

mod entry;
pub(crate) mod restore;
pub mod segment;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub(crate) use entry::{decode_turn, encode_deleted, encode_finding, encode_turn, TurnEntry};
use segment::Kind;

use crate::StoreError;

/// The journal's directory in a data directory.
pub const JOURNAL_DIR: &str = "journal";
/// A segment is closed and a new one started past this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The appending end of the journal. One per open store; appends are serialized.
pub(crate) struct Journal {
    dir: PathBuf,
    writer: Mutex<Writer>,
}

struct Writer {
    /// `None` until the first append, and after a failed one (reopened on the next).
    file: Option<File>,
    segment: u64,
    len: u64,
    dirty: bool,
}

/// Where an append started: [`Journal::undo`] cuts the segment back to it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    segment: u64,
    len: u64,
}

impl Journal {
    /// The journal in `data`, appending after the last record that checks in its newest segment
    /// (`resume`: that segment and its valid end, from the scan made on open).
    pub fn open(data: &Path, resume: Option<(u64, u64)>) -> Journal {
        let (segment, len) = resume.unwrap_or((0, 0));
        Journal { dir: data.join(JOURNAL_DIR), writer: Mutex::new(Writer { file: None, segment, len, dirty: false }) }
    }

    /// Appends one record; returns where it started, for [`Journal::undo`].
    pub fn append(&self, kind: Kind, conversation: u64, id: u64, payload: &[u8]) -> Result<Mark, StoreError> {
        let record = segment::frame(kind, conversation, id, payload);
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.len >= SEGMENT_BYTES {
            writer.file = None;
            writer.segment += 1;
            writer.len = 0;
        }
        if writer.file.is_none() {
            writer.file = Some(self.open_segment(&mut writer)?);
        }
        let mark = Mark { segment: writer.segment, len: writer.len };
        let written = writer.file.as_mut().map_or(Ok(()), |file| file.write_all(&record));
        if let Err(source) = written {
            // A partial record may be on disk: cut it off, and reopen on the next append.
            let path = self.path(mark.segment);
            writer.file = None;
            let _ = cut(&path, mark.len);
            return Err(StoreError::Spill { path, source });
        }
        writer.len += record.len() as u64;
        writer.dirty = true;
        Ok(mark)
    }

    /// Removes the record appended at `mark` (sled refused the write it journaled), so the journal
    /// never claims what the store did not take.
    pub fn undo(&self, mark: Mark) {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.segment != mark.segment {
            return;
        }
        let path = self.path(mark.segment);
        match cut(&path, mark.len) {
            Ok(()) => writer.len = mark.len,
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot remove a journal record the store refused");
                writer.file = None;
            }
        }
    }

    /// Appends from now on at `resume` (segment, length): after the segment was rewritten.
    pub fn reposition(&self, resume: (u64, u64)) {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        *writer = Writer { file: None, segment: resume.0, len: resume.1, dirty: false };
    }

    /// Forces appended records to disk.
    pub fn sync(&self) -> Result<(), StoreError> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if !writer.dirty {
            return Ok(());
        }
        if let Some(file) = &writer.file {
            file.sync_data().map_err(|source| StoreError::Spill { path: self.path(writer.segment), source })?;
        }
        writer.dirty = false;
        Ok(())
    }

    /// Opens the current segment for appending, creating it (with its magic) when new, and cutting
    /// off whatever follows the last record that checks.
    fn open_segment(&self, writer: &mut Writer) -> Result<File, StoreError> {
        let path = self.path(writer.segment);
        let error = |source| StoreError::Spill { path: path.clone(), source };
        std::fs::create_dir_all(&self.dir).map_err(error)?;
        let mut file = OpenOptions::new().create(true).append(true).open(&path).map_err(error)?;
        let on_disk = file.metadata().map_err(error)?.len();
        if writer.len == 0 {
            if on_disk > 0 {
                // A segment we did not scan (another process's, or one left half-made): start anew.
                writer.segment += 1;
                return self.open_segment(writer);
            }
            file.write_all(segment::MAGIC).map_err(error)?;
            writer.len = segment::MAGIC.len() as u64;
            sync_dir(&self.dir);
        } else if on_disk != writer.len {
            file.set_len(writer.len).map_err(error)?;
        }
        Ok(file)
    }

    pub fn path(&self, segment: u64) -> PathBuf {
        self.dir.join(segment::file_name(segment))
    }

    /// Syncs appended records every `every` until the journal is dropped.
    pub fn spawn_syncer(journal: &Arc<Journal>, every: Duration) {
        let weak: Weak<Journal> = Arc::downgrade(journal);
        let spawned = std::thread::Builder::new().name("ctxscope-journal-sync".into()).spawn(move || loop {
            std::thread::sleep(every);
            let Some(journal) = weak.upgrade() else { return };
            if let Err(error) = journal.sync() {
                tracing::warn!(%error, "cannot sync the record journal");
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the journal's sync thread; records reach the disk with each flush");
        }
    }
}

fn cut(path: &Path, len: u64) -> std::io::Result<()> {
    OpenOptions::new().write(true).open(path)?.set_len(len)
}

/// Makes a new file's name durable (best effort: not every filesystem syncs directories).
fn sync_dir(dir: &Path) {
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
}
