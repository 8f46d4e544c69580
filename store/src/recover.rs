//! Putting into sled what sled lost, from the record journal: on open, and in `store check
//! --repair` after damaged records were removed. A turn sled does not have is committed again from
//! its journal record (its conversation record moved forward only when sled's is older); a finding
//! likewise. Conversations removed on purpose stay removed.

use std::collections::BTreeSet;
use std::path::Path;

use crate::codec::{id_key, trees};
use crate::journal::restore::{JournalScan, Reader};
use crate::journal::segment::{self, Kind, Located};
use crate::journal::{TurnEntry, JOURNAL_DIR};
use crate::{Store, StoreError};

/// What the journal holds that sled does not.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Missing {
    pub turns: Vec<Located>,
    pub findings: Vec<Located>,
}

impl Missing {
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty() && self.findings.is_empty()
    }

    pub fn conversations(&self) -> BTreeSet<u64> {
        self.turns.iter().map(|r| r.conversation).collect()
    }
}

/// What a restore put back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub turns: u64,
    pub findings: u64,
    pub conversations: u64,
    /// Journal records that could not be read back (damaged past their checksum's reach).
    pub unreadable: u64,
}

impl Store {
    /// The journal's turns and findings that sled lacks (of conversations not removed on purpose).
    pub(crate) fn missing_from(&self, scan: &JournalScan) -> Result<Missing, StoreError> {
        let trees = self.t()?;
        let mut missing = Missing::default();
        for record in scan.live(Kind::Turn) {
            if !trees.turns.contains_key(id_key(record.id))? {
                missing.turns.push(*record);
            }
        }
        // A finding counts when the turn it names is there: one without it is dangling (`check`).
        let mut reader = Reader::new(self.path());
        for record in scan.live(Kind::Finding) {
            if trees.findings.contains_key(id_key(record.id))? || !trees.conversations.contains_key(id_key(record.conversation))? {
                continue;
            }
            let finding = reader.payload(record).and_then(|payload| crate::journal::decode_finding(&payload, record.id));
            if finding.is_ok_and(|f| trees.turns.contains_key(id_key(f.turn)).unwrap_or(false)) {
                missing.findings.push(*record);
            }
        }
        Ok(missing)
    }

    /// Commits again every turn and finding sled lacks, oldest first; findings after their turns.
    pub(crate) fn restore(&self, scan: &JournalScan) -> Result<Restored, StoreError> {
        let mut restored = Restored::default();
        let missing = self.missing_from(scan)?;
        if missing.is_empty() {
            return Ok(restored);
        }
        restored.conversations = missing.conversations().len() as u64;
        let mut reader = Reader::new(self.path());
        for record in &missing.turns {
            let entry = reader.payload(record).and_then(|payload| crate::journal::decode_turn(&payload, record.id));
            match entry.and_then(|entry| self.recommit(&entry)) {
                Ok(()) => restored.turns += 1,
                Err(error) => {
                    tracing::error!(turn = record.id, %error, "cannot restore a turn from the journal");
                    restored.unreadable += 1;
                }
            }
        }
        // Findings of conversations that exist now (some came back above).
        for record in self.missing_from(scan)?.findings {
            let finding = reader.payload(&record).and_then(|payload| crate::journal::decode_finding(&payload, record.id));
            match finding.and_then(|finding| self.store_finding(&finding)) {
                Ok(_) => restored.findings += 1,
                Err(error) => {
                    tracing::error!(finding = record.id, %error, "cannot restore a finding from the journal");
                    restored.unreadable += 1;
                }
            }
        }
        self.flush_sled()?;
        Ok(restored)
    }

    /// Opens a store whose sled files cannot be opened (damaged beyond sled's own recovery): moves
    /// them (and the spilled values they named) aside into `damaged-<unix ms>/` in the directory,
    /// opens a new sled there and puts back everything the journal holds. Returns the store and the
    /// folder the old files went to.
    pub fn rebuild(path: &Path, options: &crate::StoreOptions) -> Result<(Store, std::path::PathBuf), StoreError> {
        let aside = path.join(format!("damaged-{}", crate::clock::now_ms()));
        let io = |source| StoreError::Spill { path: aside.clone(), source };
        std::fs::create_dir_all(&aside).map_err(io)?;
        for entry in std::fs::read_dir(path).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if matches!(text.as_ref(), "conf" | "db" | "blobs" | "spill") || text.starts_with("snap.") {
                std::fs::rename(entry.path(), aside.join(&name)).map_err(io)?;
            }
        }
        let store = Store::open(path, options)?;
        tracing::warn!(aside = %aside.display(), "rebuilt the capture store from its record journal; sled's damaged files are kept aside");
        Ok((store, aside))
    }

    /// Rewrites every journal segment that has damaged bytes without them (its good records kept in
    /// order) and reads the journal again. The appending end moves to the rewritten newest segment.
    pub(crate) fn drop_damaged_journal(&self, scan: &JournalScan) -> Result<JournalScan, StoreError> {
        let dir = self.path().join(JOURNAL_DIR);
        let damaged: BTreeSet<u64> = scan.damaged.iter().map(|s| s.segment).collect();
        for number in damaged {
            let path = dir.join(segment::file_name(number));
            let io = |source| StoreError::Spill { path: path.clone(), source };
            let bytes = std::fs::read(&path).map_err(io)?;
            let mut kept = segment::MAGIC.to_vec();
            for record in scan.records.iter().filter(|r| r.segment == number) {
                let start = record.offset as usize - segment::HEADER;
                kept.extend_from_slice(&bytes[start..record.offset as usize + record.len as usize]);
            }
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, &kept).and_then(|_| std::fs::rename(&temporary, &path)).map_err(io)?;
            tracing::warn!(segment = number, dropped = bytes.len() - kept.len(), "dropped the damaged bytes of a journal segment");
        }
        let scan = JournalScan::read(self.path())?;
        if let (Some(journal), Some(resume)) = (&self.journal, scan.resume) {
            journal.reposition(resume);
        }
        Ok(scan)
    }

    /// Writes a journaled turn back into sled. Its conversation record (and the indexes that follow
    /// it) moves only when sled's is older than the turn: a later turn of it may have survived.
    fn recommit(&self, entry: &TurnEntry) -> Result<(), StoreError> {
        let messages = entry.hashed_messages().ok_or_else(|| StoreError::Damaged {
            tree: "journal",
            key: entry.turn.id.to_string(),
            detail: "its messages do not match the turn's hashes".into(),
        })?;
        let commit = crate::commit::Commit {
            messages: &messages,
            points: entry.points(),
            head: entry.head.as_deref().and_then(crate::from_hex).unwrap_or(crate::ZERO_HASH),
            tail: entry.tail.as_deref().and_then(crate::from_hex),
            turn: &entry.turn,
            conversation: &entry.conversation,
        };
        let current: Option<crate::ConversationRecord> =
            crate::store::get(&self.t()?.conversations, trees::CONVERSATIONS, &id_key(entry.conversation.id)).unwrap_or(None);
        let newer = current.is_some_and(|c| c.last_turn > entry.turn.id);
        let ops = if newer { self.turn_local_ops(&commit)? } else { self.turn_ops(&commit)? };
        self.write_intended(&id_key(entry.turn.id), ops)
    }
}
