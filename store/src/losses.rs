//! Losses, remembered: what damage cost that neither sled nor the journal could give back, written
//! to a file of its own beside sled's (`ctxscope-losses`, one JSON record a line, synced), so that
//! it survives sled's own damage and restarts. `conversations`, `show`, the UI and `/healthz` show
//! every loss until an operator acknowledges it; ids a loss names are never handed out again.

use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::journal::restore::JournalScan;
use crate::store::IdSpace;
use crate::{Store, StoreError};

/// The losses file in a data directory.
pub const LOSSES_FILE: &str = "ctxscope-losses";

/// One loss found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loss {
    /// Numbered 1, 2, 3 ... in the order found.
    pub id: u64,
    /// When it was found.
    pub found_unix_ms: u64,
    /// Conversations known to have lost turns (empty when only id ranges are known).
    #[serde(default)]
    pub conversations: Vec<u64>,
    /// Turns lost (an upper bound where only a range of ids is known).
    pub turns: u64,
    /// What was lost, in words: which ids, and how it was found.
    pub detail: String,
    /// Says what one loss is, so that finding it again does not record it twice.
    pub key: String,
    #[serde(default)]
    pub acknowledged_unix_ms: Option<u64>,
}

impl Loss {
    pub fn acknowledged(&self) -> bool {
        self.acknowledged_unix_ms.is_some()
    }
}

/// A loss about to be recorded.
#[derive(Debug, Clone)]
pub struct NewLoss {
    pub key: String,
    pub conversations: Vec<u64>,
    pub turns: u64,
    pub detail: String,
}

impl Store {
    /// Every loss recorded, acknowledged or not, oldest first. A line that cannot be read is itself
    /// reported as a loss record (so that damage to this file is not silent).
    pub fn losses(&self) -> Result<Vec<Loss>, StoreError> {
        let text = match std::fs::read_to_string(self.losses_path()) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(StoreError::Spill { path: self.losses_path(), source }),
        };
        let mut losses = Vec::new();
        for (line, text) in text.lines().enumerate().filter(|(_, t)| !t.trim().is_empty()) {
            match serde_json::from_str::<Loss>(text) {
                Ok(loss) => losses.push(loss),
                Err(error) => losses.push(Loss {
                    id: 0,
                    found_unix_ms: 0,
                    conversations: Vec::new(),
                    turns: 0,
                    detail: format!("line {} of {LOSSES_FILE} is damaged ({error}); what it recorded is unknown", line + 1),
                    key: format!("damaged-line-{}", line + 1),
                    acknowledged_unix_ms: None,
                }),
            }
        }
        Ok(losses)
    }

    /// The losses not yet acknowledged.
    pub fn unacknowledged_losses(&self) -> Result<Vec<Loss>, StoreError> {
        Ok(self.losses()?.into_iter().filter(|l| !l.acknowledged()).collect())
    }

    /// Records a loss unless one with the same key is recorded; returns it when new.
    pub fn record_loss(&self, loss: NewLoss) -> Result<Option<Loss>, StoreError> {
        let known = self.losses()?;
        if known.iter().any(|l| l.key == loss.key) {
            return Ok(None);
        }
        let recorded = Loss {
            id: known.iter().map(|l| l.id).max().unwrap_or(0) + 1,
            found_unix_ms: crate::clock::now_ms(),
            conversations: loss.conversations,
            turns: loss.turns,
            detail: loss.detail,
            key: loss.key,
            acknowledged_unix_ms: None,
        };
        tracing::error!(loss = recorded.id, turns = recorded.turns, detail = %recorded.detail, "capture store lost records");
        let mut line = serde_json::to_vec(&recorded).map_err(|source| StoreError::Encode { kind: "loss", source })?;
        line.push(b'\n');
        let path = self.losses_path();
        let io = |source| StoreError::Spill { path: path.clone(), source };
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
        file.write_all(&line).and_then(|_| file.sync_data()).map_err(io)?;
        Ok(Some(recorded))
    }

    /// Marks losses acknowledged (`ids` empty: all of them); returns how many changed. Acknowledged
    /// losses stay in the file, no longer shown as warnings.
    pub fn acknowledge_losses(&self, ids: &[u64]) -> Result<usize, StoreError> {
        let mut losses = self.losses()?;
        let now = crate::clock::now_ms();
        let mut changed = 0;
        for loss in losses.iter_mut().filter(|l| !l.acknowledged() && (ids.is_empty() || ids.contains(&l.id))) {
            loss.acknowledged_unix_ms = Some(now);
            changed += 1;
        }
        if changed == 0 {
            return Ok(0);
        }
        let mut text = Vec::new();
        for loss in &losses {
            text.extend(serde_json::to_vec(loss).map_err(|source| StoreError::Encode { kind: "loss", source })?);
            text.push(b'\n');
        }
        let path = self.losses_path();
        let temporary = path.with_extension("tmp");
        let io = |source| StoreError::Spill { path: path.clone(), source };
        std::fs::write(&temporary, text).and_then(|_| std::fs::rename(&temporary, &path)).map_err(io)?;
        Ok(changed)
    }

    /// After open: puts back from the journal what sled lost, then [`Store::settle`].
    pub(crate) fn recover(&self, scan: &JournalScan) -> Result<crate::recover::Restored, StoreError> {
        let restored = self.restore(scan)?;
        if restored.turns + restored.findings > 0 {
            tracing::warn!(
                turns = restored.turns,
                findings = restored.findings,
                conversations = restored.conversations,
                "sled had lost records; put them back from the record journal"
            );
        }
        self.record_gap_losses(scan)?;
        self.settle(scan)?;
        Ok(restored)
    }

    /// Records as lost what neither sled nor the journal holds that the marks say was durable, and
    /// raises every id counter past every id the journal or the marks have seen.
    pub(crate) fn settle(&self, scan: &JournalScan) -> Result<(), StoreError> {
        let (conversations, turns, findings) = scan.max_ids();
        let marks = self.marks()?;
        let mark = |space: IdSpace| marks.iter().find(|(s, _)| *s == space).map_or(0, |(_, m)| *m);
        let turn_mark = mark(IdSpace::Turn);
        let in_sled = self.t()?.turns.last()?.and_then(|(key, _)| crate::codec::key_id(&key)).unwrap_or(0);
        let known = turns.max(in_sled);
        if let Some(committed) = self.committed_turn_mark().filter(|&c| c > known) {
            let from = known + 1;
            self.record_loss(NewLoss {
                key: format!("marks:turn:{from}-{committed}"),
                conversations: Vec::new(),
                turns: committed - from + 1,
                detail: format!(
                    "turn ids {from}..={committed} were durable at the last checkpoint and are in neither sled nor the journal (at most: ids never committed look the same)"
                ),
            })?;
        }
        for (space, floor) in [
            (IdSpace::Conversation, conversations.max(mark(IdSpace::Conversation))),
            (IdSpace::Turn, turns.max(turn_mark)),
            (IdSpace::Finding, findings.max(mark(IdSpace::Finding))),
        ] {
            self.raise_counter(space, floor)?;
        }
        Ok(())
    }

    /// Records as lost the turns a damaged stretch of the journal may have held that sled lacks.
    pub(crate) fn record_gap_losses(&self, scan: &JournalScan) -> Result<(), StoreError> {
        let t = self.t()?;
        let newest = scan.max_ids().1.max(self.counter(IdSpace::Turn)?);
        for (span, ids) in scan.gaps() {
            let last_len = scan.segments.last().filter(|(n, _)| *n == span.segment).map(|(_, len)| *len);
            if scan.resume == Some((span.segment, span.start)) && last_len == Some(span.end) {
                // A torn tail: the append a crash cut short, never committed (appending cuts it off).
                continue;
            }
            let mut lost = Vec::new();
            for id in *ids.start()..=(*ids.end()).min(newest) {
                if !t.turns.contains_key(crate::codec::id_key(id))? {
                    lost.push(id);
                }
            }
            if lost.is_empty() {
                continue;
            }
            self.record_loss(NewLoss {
                key: format!("journal:{}:{}", span.segment, span.start),
                conversations: Vec::new(),
                turns: lost.len() as u64,
                detail: format!(
                    "bytes {}..{} of journal segment {} are damaged and sled lacks turn ids {} (at most: ids never committed look the same)",
                    span.start,
                    span.end,
                    span.segment,
                    ranges(&lost)
                ),
            })?;
        }
        Ok(())
    }

    fn losses_path(&self) -> PathBuf {
        self.path().join(LOSSES_FILE)
    }
}

/// Ids as runs: `3..=5, 9`.
pub(crate) fn ranges(ids: &[u64]) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &id in ids {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == id => *end = id,
            _ => runs.push((id, id)),
        }
    }
    runs.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}..={b}") }).collect::<Vec<_>>().join(", ")
}
