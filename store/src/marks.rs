//! High-water marks: after a flush, the id counters then durable are written to a small file beside
//! sled's (`ctxscope-marks`). sled recovers a damaged log by keeping what precedes the damage, which
//! silently drops everything after it; counters found lower than their marks on open reveal that loss.

use std::path::PathBuf;

use crate::store::IdSpace;
use crate::{Store, StoreError};

/// The marks file in a data directory.
pub const MARKS_FILE: &str = "ctxscope-marks";

/// The marks line naming the highest turn id sled held at the checkpoint (the counters also count
/// ids handed out to turns that were never committed).
const COMMITTED_TURN: &str = "committed_turn";

/// Conversations whose latest turn [`Store::damage`] reads on open.
pub const RECENT_CHECKED: usize = 64;

const SPACES: [(IdSpace, &str); 3] = [(IdSpace::Conversation, "conversation"), (IdSpace::Turn, "turn"), (IdSpace::Finding, "finding")];

impl Store {
    /// Flushes, then records the id counters as durable. A crash between the two leaves older marks,
    /// which are still true.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let counters = self.counters()?;
        let committed = self.t()?.turns.last()?.and_then(|(key, _)| crate::codec::key_id(&key)).unwrap_or(0);
        self.flush()?;
        let mut text: String = counters.iter().map(|(name, value)| format!("{name} {value}\n")).collect();
        text.push_str(&format!("{COMMITTED_TURN} {committed}\n"));
        let path = self.marks_path();
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, text).and_then(|_| std::fs::rename(&temporary, &path)).map_err(sled::Error::Io)?;
        Ok(())
    }

    /// What is wrong with the store, checked quickly on open: its counters behind its marks (a log
    /// damaged and cut short), or the newest conversations' records disagreeing with their latest
    /// turns ([`Store::recent_inconsistency`]); `None` when nothing was found. `store check` reads
    /// everything; this reads a few records.
    pub fn damage(&self) -> Result<Option<String>, StoreError> {
        let lost = self.lost_since_checkpoint()?;
        let inconsistent = self.recent_inconsistency(RECENT_CHECKED)?;
        Ok(match (lost, inconsistent) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        })
    }

    /// The newest `count` conversations whose record, or latest turn, cannot be read or does not
    /// match (a conversation pointing at a turn that is not there, or at another conversation's).
    pub fn recent_inconsistency(&self, count: usize) -> Result<Option<String>, StoreError> {
        let mut problems = Vec::new();
        for item in self.t()?.by_updated.iter().rev().take(count) {
            let (key, _) = item?;
            let id = crate::listing::cursor_of(&key).id;
            let problem = match self.conversation(id) {
                Ok(None) => Some(format!("conversation {id} is listed but has no record")),
                Err(error) => Some(format!("conversation {id}: {error}")),
                Ok(Some(c)) if c.turns == 0 => None,
                Ok(Some(c)) => match self.turn(c.last_turn) {
                    Ok(Some(turn)) if turn.conversation == c.id => None,
                    Ok(Some(turn)) => {
                        Some(format!("conversation {id}'s latest turn {} belongs to conversation {}", c.last_turn, turn.conversation))
                    }
                    Ok(None) => Some(format!("conversation {id}'s latest turn {} is missing", c.last_turn)),
                    Err(error) => Some(format!("conversation {id}'s latest turn {}: {error}", c.last_turn)),
                },
            };
            problems.extend(problem);
        }
        Ok((!problems.is_empty()).then(|| {
            format!("the store's records disagree with its indexes ({}); `ctxscope store check` lists all damage", problems.join(", "))
        }))
    }

    /// What the store lost since its last checkpoint, when its counters are behind its marks.
    fn lost_since_checkpoint(&self) -> Result<Option<String>, StoreError> {
        let Ok(text) = std::fs::read_to_string(self.marks_path()) else {
            return Ok(None);
        };
        let counters = self.counters()?;
        let mut lost = Vec::new();
        for line in text.lines() {
            let Some((name, mark)) = line.split_once(' ') else {
                continue;
            };
            let Ok(mark) = mark.trim().parse::<u64>() else {
                continue;
            };
            if let Some((_, now)) = counters.iter().find(|(n, _)| *n == name) {
                if *now < mark {
                    lost.push(format!("{name} ids {}..={mark}", now + 1));
                }
            }
        }
        Ok((!lost.is_empty())
            .then(|| format!("the store's log is damaged: records written before its last checkpoint are missing ({})", lost.join(", "))))
    }

    /// Raises every id counter that is behind its mark to the mark, so that ids a damaged log lost
    /// are never handed out again (`store check --repair`; open does it too).
    pub(crate) fn raise_counters_to_marks(&self) -> Result<(), StoreError> {
        for (space, mark) in self.marks()? {
            self.raise_counter(space, mark)?;
        }
        Ok(())
    }

    /// The marks recorded at the last checkpoint (none before the first).
    pub(crate) fn marks(&self) -> Result<Vec<(IdSpace, u64)>, StoreError> {
        let Ok(text) = std::fs::read_to_string(self.marks_path()) else {
            return Ok(Vec::new());
        };
        let mut marks = Vec::new();
        for line in text.lines() {
            let Some((name, mark)) = line.split_once(' ') else {
                continue;
            };
            if let (Some((space, _)), Ok(mark)) = (SPACES.iter().find(|(_, n)| *n == name), mark.trim().parse::<u64>()) {
                marks.push((*space, mark));
            }
        }
        Ok(marks)
    }

    /// The highest turn id sled held at the last checkpoint, where the marks say.
    pub(crate) fn committed_turn_mark(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.marks_path()).ok()?;
        text.lines().find_map(|line| line.strip_prefix(COMMITTED_TURN)?.trim().parse().ok())
    }

    /// Raises one id counter to at least `floor` (the last id used): the next id is above it.
    pub(crate) fn raise_counter(&self, space: IdSpace, floor: u64) -> Result<(), StoreError> {
        self.t()?.meta.update_and_fetch(space.key(), |old| {
            let old = old.and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_be_bytes);
            Some(old.max(floor).to_be_bytes().to_vec())
        })?;
        Ok(())
    }

    /// The last id handed out in one space.
    pub(crate) fn counter(&self, space: IdSpace) -> Result<u64, StoreError> {
        Ok(self.t()?.meta.get(space.key())?.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok()).map_or(0, u64::from_be_bytes))
    }

    fn counters(&self) -> Result<Vec<(&'static str, u64)>, StoreError> {
        let mut out = Vec::new();
        for (space, name) in SPACES {
            out.push((name, self.counter(space)?));
        }
        Ok(out)
    }

    fn marks_path(&self) -> PathBuf {
        self.path().join(MARKS_FILE)
    }
}

#[cfg(test)]
mod tests {
    use crate::{IdSpace, Store, StoreOptions};

    #[test]
    fn counters_behind_their_marks_are_damage() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert_eq!(store.damage().unwrap(), None);
        for _ in 0..5 {
            store.next_id_in(IdSpace::Turn).unwrap();
        }
        store.checkpoint().unwrap();
        assert_eq!(store.damage().unwrap(), None);
        // Marks ahead of the counters, as after a log cut short.
        std::fs::write(dir.path().join(super::MARKS_FILE), "conversation 0\nturn 9\nfinding 0\n").unwrap();
        let damage = store.damage().unwrap().unwrap();
        assert!(damage.contains("turn ids 6..=9"), "{damage}");
    }

    #[test]
    fn a_recent_conversation_without_its_latest_turn_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.commit_turn(&crate::commit::tests::draft(1, 1, &["a"], "ra", None)).unwrap();
        store.commit_turn(&crate::commit::tests::draft(2, 2, &["b"], "rb", None)).unwrap();
        assert_eq!(store.damage().unwrap(), None);
        // A crash between writes of the old, many-call layout could leave exactly this.
        store.t().unwrap().turns.remove(crate::codec::id_key(2)).unwrap();
        let damage = store.damage().unwrap().unwrap();
        assert!(damage.contains("conversation 2's latest turn 2 is missing") && damage.contains("store check"), "{damage}");
        assert!(!damage.contains("conversation 1"), "{damage}");
    }
}
