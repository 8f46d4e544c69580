//! Replay runs: stored whole (the replay crate's report as JSON) under their id, listed newest first
//! without their reports.

use serde_json::Value;

use crate::codec::{decode, encode, id_key};
use crate::records::ReplayEntry;
use crate::{Store, StoreError};

impl Store {
    /// Stores (or replaces, when resumed) a replay run.
    pub fn put_replay(&self, entry: &ReplayEntry) -> Result<(), StoreError> {
        self.replays.insert(id_key(entry.id), encode("replay", entry)?)?;
        Ok(())
    }

    pub fn replay(&self, id: u64) -> Result<Option<ReplayEntry>, StoreError> {
        match self.replays.get(id_key(id))? {
            Some(bytes) => Ok(Some(decode("replay", &id_key(id), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every replay run, newest first, without the reports.
    pub fn replays(&self) -> Result<Vec<ReplayEntry>, StoreError> {
        let mut all = Vec::new();
        for item in self.replays.iter().rev() {
            let (key, value) = item?;
            let mut entry: ReplayEntry = decode("replay", &key, &value)?;
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
}
