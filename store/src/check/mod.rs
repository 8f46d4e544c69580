//! `ctxscope store check`: read every tree, verify every record's checksum and every index against
//! the records it names, and say exactly what is damaged and what is kept. [`Store::check`] changes
//! nothing (the CLI runs it on a private copy); [`Store::repair`] applies the plan a check made:
//! removes damaged records and entries that name what is gone, cuts conversations back to the turns
//! whose message lists still resolve (noting the cut on the last kept turn), and rebuilds a damaged
//! conversation record from its turns.

mod plan;
mod scan;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::journal::restore::JournalScan;
use crate::{Store, StoreError};

/// What a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A record whose checksum, frame or JSON is wrong, or that does not match its key.
    Damaged,
    /// A record or index entry naming something that is not there.
    Dangling,
    /// A turn whose message list no longer resolves: one of its messages, or its base turn, is gone.
    Unresolvable,
    /// An index entry a record needs and does not have (repair adds it).
    Missing,
    /// Records the last checkpoint saw are gone: sled cut its log short on open.
    Lost,
    /// sled itself cannot read part of a tree; repair cannot help (export what is readable).
    Unreadable,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Damaged => "damaged",
            ProblemKind::Dangling => "dangling",
            ProblemKind::Unresolvable => "unresolvable",
            ProblemKind::Missing => "missing",
            ProblemKind::Lost => "lost",
            ProblemKind::Unreadable => "unreadable",
        }
    }
}

/// One thing wrong, where it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    /// The sled tree (or `log` for records lost from sled's log).
    pub tree: String,
    /// The key, readable: an id, `conversation/turn` for pair keys, hex for hashes, text for names.
    pub key: String,
    pub kind: ProblemKind,
    pub detail: String,
    /// Whether `--repair` fixes it.
    pub repairable: bool,
}

/// What happened to a conversation that is not whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Some of its turns are gone; the rest are kept and the record is moved back to the last of them.
    Cut,
    /// Its record was damaged or missing; it is rebuilt from its turns (its name from the name index).
    Rebuilt,
    /// Nothing of it is left.
    Lost,
}

/// A conversation that is not whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConversationFate {
    pub id: u64,
    pub fate: Fate,
    pub turns_kept: u64,
    pub turns_removed: u64,
}

/// The result of a check: what was read, what is wrong, what is kept.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// Records read per tree.
    pub records: BTreeMap<String, u64>,
    pub problems: Vec<Problem>,
    pub conversations_total: u64,
    pub conversations_whole: u64,
    /// Conversations cut, rebuilt or lost.
    pub conversations: Vec<ConversationFate>,
    pub turns_total: u64,
    pub turns_kept: u64,
    /// The record journal: segments, records and damaged bytes read.
    pub journal: JournalSummary,
    /// Turns the journal holds past sled's last checkpoint (cut from sled's buffer by a crash; the
    /// next open writes them back): not damage.
    pub journal_pending_turns: u64,
    /// Turns and findings the repair put back from the journal.
    pub restored_turns: u64,
    pub restored_findings: u64,
    /// Losses recorded and not yet acknowledged (`ctxscope store ack`); each is also a problem.
    pub losses: Vec<crate::Loss>,
    /// Whether `repair` applied this report's plan.
    pub repaired: bool,
    /// Records and index entries the repair removed, and those it wrote (moved conversations, their
    /// indexes and notes, missing index entries).
    pub removed: u64,
    pub written: u64,
    #[serde(skip)]
    plan: plan::Plan,
}

/// What a check read of the record journal.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JournalSummary {
    pub segments: u64,
    pub records: u64,
    pub damaged_bytes: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether every problem found is one `repair` fixes.
    pub fn fully_repairable(&self) -> bool {
        self.problems.iter().all(|p| p.repairable)
    }
}

impl Store {
    /// Reads every record and index and reports what is damaged; writes nothing.
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        let scanned = scan::Scanned::read(self)?;
        let mut report = plan::judge(self, scanned)?;
        self.compare_journal(&mut report)?;
        Ok(report)
    }

    /// Adds to a report what the journal holds that sled lacks, the journal's own damage, and the
    /// losses not yet acknowledged.
    fn compare_journal(&self, report: &mut CheckReport) -> Result<(), StoreError> {
        let scan = JournalScan::read(self.path())?;
        report.journal = JournalSummary {
            segments: scan.segments.len() as u64,
            records: scan.records.len() as u64,
            damaged_bytes: scan.damaged.iter().map(|s| s.end - s.start).sum(),
        };
        let journaled: std::collections::HashSet<u64> = scan.turn_ids().collect();
        for problem in report.problems.iter_mut().filter(|p| matches!(p.kind, ProblemKind::Damaged | ProblemKind::Unresolvable)) {
            let turn = matches!(problem.tree.as_str(), "turns" | "packs").then(|| problem.key.parse::<u64>().ok()).flatten();
            if turn.is_some_and(|id| journaled.contains(&id)) {
                problem.detail.push_str(" (the record journal holds this turn: repair puts it back)");
            }
        }
        let missing = self.missing_from(&scan)?;
        // Turns past the last checkpoint's flush are what a crash or kill -9 cut from sled's buffer:
        // not damage, and the next open writes them back.
        let flushed = self.committed_turn_mark().unwrap_or(0);
        let (pending, missing_turns): (Vec<&crate::journal::segment::Located>, Vec<_>) = missing.turns.iter().partition(|t| t.id > flushed);
        report.journal_pending_turns = pending.len() as u64;
        for turn in missing_turns {
            report.problems.push(Problem {
                tree: "turns".into(),
                key: turn.id.to_string(),
                kind: ProblemKind::Missing,
                detail: format!(
                    "turn {} of conversation {} is in the record journal but not in the store (repair puts it back)",
                    turn.id, turn.conversation
                ),
                repairable: true,
            });
        }
        for finding in &missing.findings {
            report.problems.push(Problem {
                tree: "findings".into(),
                key: finding.id.to_string(),
                kind: ProblemKind::Missing,
                detail: "in the record journal but not in the store (repair puts it back)".into(),
                repairable: true,
            });
        }
        for (span, ids) in scan.gaps() {
            report.problems.push(Problem {
                tree: "journal".into(),
                key: format!("{}/{}", crate::journal::segment::file_name(span.segment), span.start),
                kind: ProblemKind::Damaged,
                detail: format!(
                    "{} bytes of the record journal are damaged (turn ids {}..={} could stand there; repair drops the bytes and records as lost those the store lacks)",
                    span.end - span.start,
                    ids.start(),
                    ids.end()
                ),
                repairable: true,
            });
        }
        report.losses = self.unacknowledged_losses()?;
        for loss in &report.losses {
            report.problems.push(Problem {
                tree: "losses".into(),
                key: loss.id.to_string(),
                kind: ProblemKind::Lost,
                detail: format!("{} (`ctxscope store ack {}` once dealt with)", loss.detail, loss.id),
                repairable: false,
            });
        }
        Ok(())
    }

    /// Repairs what `report` (a check of this same store) found: first from the journal, then what
    /// is left from sled alone; records what neither could give back as losses, raises the id
    /// counters past every id used, and checkpoints. Returns the report with what was done.
    pub fn repair(&self, mut report: CheckReport) -> Result<CheckReport, StoreError> {
        // 1. Damaged turns, packs and messages the journal can give back are removed first, and
        //    everything sled lacks is put back from the journal; what the journal's own damage held
        //    and sled lacks is recorded as lost, and its damaged bytes go.
        let scan = JournalScan::read(self.path())?;
        let removed = self.remove_restorable(&report, &scan)?;
        self.record_gap_losses(&scan)?;
        let scan = if scan.damaged.is_empty() { scan } else { self.drop_damaged_journal(&scan)? };
        let restored = self.restore(&scan)?;
        (report.restored_turns, report.restored_findings) = (restored.turns, restored.findings);
        // 2. What is still wrong is judged again and repaired from sled alone: conversations cut
        //    back, records rebuilt, dangling entries removed. Its fates are what the repair did.
        let left = plan::judge(self, scan::Scanned::read(self)?)?;
        (report.removed, report.written) = left.plan.apply(self)?;
        report.removed += removed;
        report.conversations = left.conversations;
        for fate in &report.conversations {
            if fate.turns_removed > 0 {
                let had = fate.turns_kept + fate.turns_removed;
                self.record_loss(crate::NewLoss {
                    key: format!("repair:conversation:{}:{had}", fate.id),
                    conversations: vec![fate.id],
                    turns: fate.turns_removed,
                    detail: format!(
                        "conversation {} lost {} of its {had} turn(s) to damage the journal could not make good",
                        fate.id, fate.turns_removed
                    ),
                })?;
            }
        }
        self.settle(&scan)?;
        self.checkpoint()?;
        report.repaired = true;
        Ok(report)
    }

    /// Removes the damaged (or unresolvable) turns and packs whose turn the journal holds, and the
    /// damaged messages, so that restoring from the journal writes them anew; returns how many went.
    fn remove_restorable(&self, report: &CheckReport, scan: &JournalScan) -> Result<u64, StoreError> {
        use crate::codec::{id_key, trees};
        let journaled: std::collections::HashSet<u64> = scan.turn_ids().collect();
        let mut removed = 0;
        for problem in &report.problems {
            let bad = matches!(problem.kind, ProblemKind::Damaged | ProblemKind::Unresolvable);
            match problem.tree.as_str() {
                trees::TURNS | trees::PACKS if bad => {
                    let Ok(id) = problem.key.parse::<u64>() else { continue };
                    if !journaled.contains(&id) {
                        continue;
                    }
                    for (name, tree) in [(trees::TURNS, &self.t()?.turns), (trees::PACKS, &self.t()?.packs)] {
                        if let Some(value) = tree.remove(id_key(id))? {
                            self.spill.remove(name, &id_key(id), &value);
                            removed += 1;
                        }
                    }
                }
                trees::MESSAGES if problem.kind == ProblemKind::Damaged => {
                    let Some(hash) = crate::from_hex(&problem.key) else { continue };
                    if let Some(value) = self.t()?.messages.remove(hash)? {
                        self.spill.remove(trees::MESSAGES, &hash, &value);
                        removed += 1;
                    }
                }
                _ => {}
            }
        }
        Ok(removed)
    }
}

/// A key as people read it, for a tree of known shape.
pub(crate) fn readable_key(tree: &str, key: &[u8]) -> String {
    use crate::codec::trees::*;
    let id = |range: std::ops::Range<usize>| key.get(range).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes);
    match tree {
        TURNS | PACKS | CONVERSATIONS | FINDINGS | REPLAYS if key.len() == 8 => id(0..8).map_or_else(String::new, |i| i.to_string()),
        CONVERSATION_TURNS | CONVERSATION_FINDINGS | CONVERSATIONS_BY_UPDATED if key.len() == 16 => {
            format!("{}/{}", id(0..8).unwrap_or(0), id(8..16).unwrap_or(0))
        }
        NAMES | RESPONSE_IDS | FINGERPRINTS | FINDING_CAUSES => String::from_utf8_lossy(key).into_owned(),
        _ => crate::codec::hex_key(key),
    }
}

#[cfg(test)]
mod tests;
