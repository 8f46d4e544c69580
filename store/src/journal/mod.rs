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

pub(crate) use entry::{decode_finding, decode_turn, encode_deleted, encode_finding, encode_turn, TurnEntry};
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
    /// A segment is closed past this size ([`SEGMENT_BYTES`]; smaller in tests).
    segment_bytes: std::sync::atomic::AtomicU64,
    /// Which conversations each segment holds, and which were removed on purpose: the oldest
    /// segments go once all theirs are removed ([`Journal::reclaim`]).
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    segments: std::collections::BTreeMap<u64, std::collections::HashSet<u64>>,
    deleted: std::collections::HashSet<u64>,
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
    pub fn open(data: &Path, scan: &restore::JournalScan) -> Journal {
        let (segment, len) = scan.resume.unwrap_or((0, 0));
        let mut held = Held { deleted: scan.deleted.clone(), ..Held::default() };
        for (number, _) in &scan.segments {
            held.segments.entry(*number).or_default();
        }
        for record in &scan.records {
            held.segments.entry(record.segment).or_default().insert(record.conversation);
        }
        Journal {
            dir: data.join(JOURNAL_DIR),
            writer: Mutex::new(Writer { file: None, segment, len, dirty: false }),
            held: Mutex::new(held),
            segment_bytes: std::sync::atomic::AtomicU64::new(SEGMENT_BYTES),
        }
    }

    #[cfg(test)]
    pub fn set_segment_bytes(&self, bytes: u64) {
        self.segment_bytes.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Removes the oldest closed segments whose every conversation was removed on purpose; returns
    /// how many went. (A removal's record always follows its conversation's turns, so the segments
    /// left still hold every removal that matters to them.)
    pub fn reclaim(&self) -> usize {
        let current = self.writer.lock().unwrap_or_else(|p| p.into_inner()).segment;
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        while let Some((&oldest, conversations)) = held.segments.iter().next() {
            if oldest >= current || !conversations.iter().all(|c| held.deleted.contains(c)) {
                break;
            }
            if let Err(error) = std::fs::remove_file(self.path(oldest)) {
                tracing::warn!(segment = oldest, %error, "cannot remove a journal segment no kept conversation needs");
                break;
            }
            held.segments.remove(&oldest);
            removed += 1;
        }
        removed
    }

    /// Appends one record; returns where it started, for [`Journal::undo`].
    pub fn append(&self, kind: Kind, conversation: u64, id: u64, payload: &[u8]) -> Result<Mark, StoreError> {
        let record = segment::frame(kind, conversation, id, payload);
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.len >= self.segment_bytes.load(std::sync::atomic::Ordering::Relaxed) {
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
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.segments.entry(mark.segment).or_default().insert(conversation);
        if kind == Kind::Deleted {
            held.deleted.insert(conversation);
        }
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

/// Every record the journal in `data` holds that checks, its payload decompressed (a turn's or a
/// finding's JSON; empty for a removal): for inspecting what the journal keeps, as recovery reads it.
pub fn read_all(data: &Path) -> Result<Vec<(segment::Located, Vec<u8>)>, StoreError> {
    let scan = restore::JournalScan::read(data)?;
    let mut reader = restore::Reader::new(data);
    let mut out = Vec::with_capacity(scan.records.len());
    for record in &scan.records {
        let payload = reader.payload(record)?;
        let json = match record.kind {
            Kind::Deleted => Vec::new(),
            _ => lz4_flex::decompress_size_prepended(&payload).map_err(|e| StoreError::Damaged {
                tree: "journal",
                key: record.id.to_string(),
                detail: format!("cannot decompress: {e}"),
            })?,
        };
        out.push((*record, json));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use crate::commit::tests::draft;
    use crate::{RetentionPolicy, Store, StoreOptions};

    #[test]
    fn segments_roll_and_the_oldest_go_once_their_conversations_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.journal.as_ref().unwrap().set_segment_bytes(1);
        for c in 1..=4 {
            let mut turn = draft(c, c, &[&format!("m{c}")], "r", None);
            turn.conversation.updated_unix_ms = c * 1000;
            store.commit_turn(&turn).unwrap();
        }
        let segments = || super::segment::list(&dir.path().join(super::JOURNAL_DIR)).unwrap().len();
        assert_eq!(segments(), 4, "one record a segment at this size");
        // Conversations 1 and 2 expire: their segments go; 3's stays, and so does the newest.
        let policy = RetentionPolicy { max_age: Some(std::time::Duration::from_millis(500)), max_bytes: None };
        assert_eq!(store.apply_retention(&policy, 3_200).unwrap().conversations, 2);
        let left: Vec<u64> = super::segment::list(&dir.path().join(super::JOURNAL_DIR)).unwrap().iter().map(|(n, _)| *n).collect();
        assert_eq!(left.first(), Some(&2), "{left:?}");
        // Reopened, what is left restores nothing removed, and everything kept reads.
        drop(store);
        let store = crate::test_support::unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
        assert_eq!(store.conversations().unwrap().iter().map(|c| c.id).collect::<Vec<_>>(), vec![4, 3]);
        assert!(store.check().unwrap().is_clean());
    }
}
