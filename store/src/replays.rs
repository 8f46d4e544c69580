//! Replay runs: stored whole (the replay crate's report as JSON) under their id, listed newest first
//! without their reports.

use serde_json::Value;

use crate::codec::{decode, encode, id_key, trees};
use crate::records::ReplayEntry;
use crate::{Store, StoreError};

impl Store {
    /// Stores (or replaces, when resumed) a replay run.
    pub fn put_replay(&self, entry: &ReplayEntry) -> Result<(), StoreError> {
        let key = id_key(entry.id);
        self.t()?.replays.insert(key, encode(trees::REPLAYS, &key, entry)?)?;
        Ok(())
    }

    /// Stores a new replay run, or replaces the run it resumes (same id, conversation and start time,
    /// as `--resume` sends); any other run under that id is left untouched and returned.
    pub fn insert_replay(&self, entry: &ReplayEntry) -> Result<Option<ReplayEntry>, StoreError> {
        let key = id_key(entry.id);
        let value = encode(trees::REPLAYS, &key, entry)?;
        loop {
            let current = self.t()?.replays.get(key)?;
            if let Some(bytes) = &current {
                let existing: ReplayEntry = decode(trees::REPLAYS, &key, bytes)?;
                if existing.conversation != entry.conversation || existing.started_unix_ms != entry.started_unix_ms {
                    return Ok(Some(existing));
                }
            }
            if self.t()?.replays.compare_and_swap(key, current, Some(value.clone()))?.is_ok() {
                return Ok(None);
            }
        }
    }

    pub fn replay(&self, id: u64) -> Result<Option<ReplayEntry>, StoreError> {
        match self.t()?.replays.get(id_key(id))? {
            Some(bytes) => Ok(Some(decode(trees::REPLAYS, &id_key(id), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every replay run, newest first, without the reports.
    pub fn replays(&self) -> Result<Vec<ReplayEntry>, StoreError> {
        let mut all = Vec::new();
        for item in self.t()?.replays.iter().rev() {
            let (key, value) = item?;
            let mut entry: ReplayEntry = decode(trees::REPLAYS, &key, &value)?;
            entry.report = Value::Null;
            all.push(entry);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;

    #[test]
    fn replays_round_trip_and_list_newest_first_without_reports() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        for id in [3, 9] {
            let entry = ReplayEntry {
                id,
                conversation: 1,
                started_unix_ms: id,
                finished_unix_ms: id + 1,
                targets: vec!["golden".into(), "engine:kv_fp8".into()],
                summary: format!("run {id}"),
                report: serde_json::json!({"results": [id]}),
            };
            store.put_replay(&entry).unwrap();
        }
        let list = store.replays().unwrap();
        assert_eq!(list.iter().map(|e| e.id).collect::<Vec<_>>(), vec![9, 3]);
        assert!(list.iter().all(|e| e.report.is_null()));
        assert_eq!(store.replay(3).unwrap().unwrap().report, serde_json::json!({"results": [3]}));
        assert!(store.replay(4).unwrap().is_none());
    }

    #[test]
    fn insert_replay_never_overwrites_another_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let entry = |conversation, started, summary: &str| ReplayEntry {
            id: 7,
            conversation,
            started_unix_ms: started,
            finished_unix_ms: started + 1,
            targets: vec![],
            summary: summary.into(),
            report: serde_json::Value::Null,
        };
        assert!(store.insert_replay(&entry(1, 100, "first")).unwrap().is_none());
        // Resumed: same conversation and start, replaced.
        assert!(store.insert_replay(&entry(1, 100, "resumed")).unwrap().is_none());
        assert_eq!(store.replay(7).unwrap().unwrap().summary, "resumed");
        // Another run under the same id: refused, the stored one kept.
        for other in [entry(2, 100, "other"), entry(1, 999, "other")] {
            assert_eq!(store.insert_replay(&other).unwrap().unwrap().summary, "resumed");
        }
        assert_eq!(store.replay(7).unwrap().unwrap().summary, "resumed");
    }
}
