//! Retention: drop whole conversations older than a maximum age, then the oldest ones until the
//! store's logical size fits a budget, then sweep messages no remaining turn references.

use std::time::Duration;

use crate::codec::trees;
use crate::{Store, StoreError};

/// What to keep. `None` means no limit.
#[derive(Debug, Clone, Default)]
pub struct RetentionPolicy {
    pub max_age: Option<Duration>,
    pub max_bytes: Option<u64>,
}

/// What one retention pass removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetentionReport {
    pub conversations: usize,
    pub turns: usize,
    pub messages: usize,
}

impl Store {
    /// Applies `policy` as of `now_unix_ms`.
    pub fn apply_retention(&self, policy: &RetentionPolicy, now_unix_ms: u64) -> Result<RetentionReport, StoreError> {
        let mut report = RetentionReport::default();
        if policy.max_age.is_none() && policy.max_bytes.is_none() {
            return Ok(report);
        }
        // Oldest first.
        let mut conversations = self.conversations()?;
        conversations.reverse();
        let cutoff = policy.max_age.map(|age| now_unix_ms.saturating_sub(age.as_millis() as u64));
        let mut size = match policy.max_bytes {
            Some(_) => self.logical_size()?,
            None => 0,
        };
        for conv in conversations {
            let too_old = cutoff.is_some_and(|c| conv.updated_unix_ms < c);
            let too_big = policy.max_bytes.is_some_and(|max| size > max);
            if !too_old && !too_big {
                continue;
            }
            report.turns += self.delete_conversation(conv.id)?;
            report.conversations += 1;
            if too_big {
                report.messages += self.sweep_messages()?;
                size = self.logical_size()?;
            }
        }
        if report.conversations > 0 {
            report.messages += self.sweep_messages()?;
            if let Some(journal) = &self.journal {
                journal.reclaim();
            }
        }
        Ok(report)
    }

    /// Bytes of keys and values held in all trees, a spilled value counted at its file's length
    /// (sled's files shrink later, on its own schedule).
    pub fn logical_size(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for name in self.db_tree_names()? {
            let tree = self.db_tree(&name)?;
            let spilled = [trees::PACKS, trees::MESSAGES].into_iter().find(|tree_name| tree_name.as_bytes() == &name[..]);
            for item in tree.iter() {
                let (k, v) = item?;
                let value = match spilled {
                    Some(tree_name) => crate::spill::value_len(tree_name, &k, &v)?,
                    None => v.len() as u64,
                };
                total += k.len() as u64 + value;
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::*;
    use crate::StoreOptions;

    fn conv(store: &Store, id: u64, updated: u64) {
        let rec = ConversationRecord {
            id,
            name: None,
            created_unix_ms: updated,
            updated_unix_ms: updated,
            upstream: "u".into(),
            model: None,
            turns: 1,
            last_turn: id * 10,
            last_head: String::new(),
            last_message_count: 1,
            last_tail: None,
            branch_of: None,
            last_reply: None,
            capture: Default::default(),
        };
        store.put_conversation(&rec).unwrap();
        let (hash, bytes) = crate::message_hash(&serde_json::json!({"role": "user", "content": format!("m{id}")}));
        store.put_message(&hash, &bytes).unwrap();
        let turn = crate::store_test_turn(id * 10, id, vec![hash]);
        store.put_turn(&turn).unwrap();
    }

    #[test]
    fn age_retention_drops_old_conversations_and_their_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        conv(&store, 1, 1_000);
        conv(&store, 2, 100_000);
        let policy = RetentionPolicy { max_age: Some(Duration::from_secs(10)), max_bytes: None };
        let report = store.apply_retention(&policy, 105_000).unwrap();
        assert_eq!(report, RetentionReport { conversations: 1, turns: 1, messages: 1 });
        assert!(store.conversation(1).unwrap().is_none());
        assert!(store.conversation(2).unwrap().is_some());
        assert_eq!(store.message_count(), 1);
    }

    #[test]
    fn size_retention_keeps_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        for i in 1..=5 {
            conv(&store, i, i * 1000);
        }
        let one = store.logical_size().unwrap() / 5;
        let policy = RetentionPolicy { max_age: None, max_bytes: Some(one * 2 + one / 2) };
        store.apply_retention(&policy, 10_000).unwrap();
        let left: Vec<u64> = store.conversations().unwrap().iter().map(|c| c.id).collect();
        assert_eq!(left, vec![5, 4]);
    }
}
