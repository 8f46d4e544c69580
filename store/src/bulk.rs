//! Whole-conversation writes, each one sled transaction like a captured turn's: an imported
//! conversation's turns, turn list, record and listing entry land together or not at all, and a
//! deleted conversation (retention) goes with every record and index entry that names it. A crash
//! in the middle leaves the store as it was before, never a conversation without its turns or turns
//! without their conversation.

use sled::transaction::{ConflictableTransactionError, Transactional, TransactionalTree};
use sled::IVec;

use crate::codec::{self, decode, encode, id_key, key_id, pair_key, trees};
use crate::commit::transaction_error;
use crate::records::{ConversationRecord, PrefixEntry, TurnRecord};
use crate::{Store, StoreError};

/// Everything a conversation's deletion removes, gathered before the transaction.
struct Doomed {
    turns: Vec<u64>,
    conversation: Option<ConversationRecord>,
    prefixes: Vec<IVec>,
    ends: Vec<IVec>,
    replies: Vec<IVec>,
    findings: Vec<(IVec, Option<u64>)>,
    response_ids: Vec<String>,
}

impl Store {
    /// Writes an imported conversation (its messages already stored by hash) and its turns at once.
    pub(crate) fn commit_import(&self, conversation: &ConversationRecord, turns: &[TurnRecord]) -> Result<(), StoreError> {
        let key = id_key(conversation.id);
        let value = encode(trees::CONVERSATIONS, &key, conversation)?;
        let records = turns
            .iter()
            .map(|turn| Ok((id_key(turn.id), codec::encode_turn(&id_key(turn.id), turn)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let all = (&self.t()?.turns, &self.t()?.conversation_turns, &self.t()?.conversations, &self.t()?.by_updated);
        let result = all.transaction(|(t_turns, t_conversation_turns, t_conversations, t_by_updated)| {
            for ((turn_key, record), turn) in records.iter().zip(turns) {
                t_turns.insert(&turn_key[..], record.as_slice())?;
                t_conversation_turns.insert(&pair_key(conversation.id, turn.id)[..], &[][..])?;
            }
            t_conversations.insert(&key[..], value.as_slice())?;
            t_by_updated.insert(&pair_key(conversation.updated_unix_ms, conversation.id)[..], &[][..])?;
            Ok::<_, ConflictableTransactionError<StoreError>>(())
        });
        result.map_err(transaction_error)
    }

    /// Removes a conversation's turns, record, findings and index entries in one transaction
    /// (messages stored by hash are swept by retention; its findings' causes stay claimed, so a
    /// deleted conversation's cause is not raised again); returns how many turns went.
    pub fn delete_conversation(&self, id: u64) -> Result<usize, StoreError> {
        // A turn write that failed midway finishes first: applied later, it would bring back what
        // this removes.
        self.finish_intents()?;
        let doomed = self.doomed(id)?;
        // Journaled first: replaying the journal must not bring back what this removes.
        if let Some(journal) = &self.journal {
            journal.append(crate::journal::segment::Kind::Deleted, id, 0, &crate::journal::encode_deleted())?;
        }
        let conversation_key = id_key(id);
        let trees = [
            &self.t()?.turns,
            &self.t()?.packs,
            &self.t()?.conversation_turns,
            &self.t()?.conversations,
            &self.t()?.by_updated,
            &self.t()?.names,
            &self.t()?.prefixes,
            &self.t()?.ends,
            &self.t()?.replies,
            &self.t()?.findings,
            &self.t()?.conversation_findings,
            &self.t()?.response_ids,
        ];
        let result = trees[..].transaction(|t| {
            let [t_turns, t_packs, t_conversation_turns, t_conversations, t_by_updated, t_names, t_prefixes, t_ends, t_replies, t_findings, t_conversation_findings, t_response_ids] =
                &t[..]
            else {
                unreachable!("one transactional tree per tree named")
            };
            for turn in &doomed.turns {
                t_turns.remove(&id_key(*turn)[..])?;
                t_packs.remove(&id_key(*turn)[..])?;
                t_conversation_turns.remove(&pair_key(id, *turn)[..])?;
            }
            t_conversations.remove(&conversation_key[..])?;
            if let Some(conversation) = &doomed.conversation {
                t_by_updated.remove(&pair_key(conversation.updated_unix_ms, id)[..])?;
                if let Some(name) = &conversation.name {
                    unmark(t_names, name.as_bytes(), id)?;
                }
            }
            for key in &doomed.prefixes {
                t_prefixes.remove(key)?;
            }
            for key in &doomed.ends {
                unmark(t_ends, key, id)?;
            }
            for key in &doomed.replies {
                unmark(t_replies, key, id)?;
            }
            for (key, finding) in &doomed.findings {
                if let Some(finding) = finding {
                    t_findings.remove(&id_key(*finding)[..])?;
                }
                t_conversation_findings.remove(key)?;
            }
            for response_id in &doomed.response_ids {
                t_response_ids.remove(response_id.as_bytes())?;
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(())
        });
        result.map_err(transaction_error)?;
        for turn in &doomed.turns {
            self.spill.discard(trees::PACKS, &id_key(*turn));
        }
        Ok(doomed.turns.len())
    }

    fn doomed(&self, id: u64) -> Result<Doomed, StoreError> {
        let turns = self.conversation_turn_ids(id)?;
        // A damaged turn record still goes; only its Responses id index entry cannot be found.
        let response_ids = turns
            .iter()
            .filter_map(|turn| self.turn(*turn).ok().flatten())
            .filter_map(|turn| turn.responses.and_then(|r| r.response_id))
            .collect();
        let conversation = match self.t()?.conversations.get(id_key(id))? {
            Some(bytes) => decode::<ConversationRecord>(trees::CONVERSATIONS, &id_key(id), &bytes).ok(),
            None => None,
        };
        let mut prefixes = Vec::new();
        for item in self.t()?.prefixes.iter() {
            let (key, value) = item?;
            if decode::<PrefixEntry>(trees::PREFIXES, &key, &value)?.conversation == id {
                prefixes.push(key);
            }
        }
        let mut findings = Vec::new();
        for item in self.t()?.conversation_findings.scan_prefix(id_key(id)) {
            let (key, _) = item?;
            let finding = key.get(8..).and_then(key_id);
            findings.push((key, finding));
        }
        Ok(Doomed {
            turns,
            conversation,
            prefixes,
            ends: marks_of(&self.t()?.ends, id)?,
            replies: marks_of(&self.t()?.replies, id)?,
            findings,
            response_ids,
        })
    }
}

/// The keys of a mark tree (`ends`, `replies`) that name `conversation`.
fn marks_of(tree: &sled::Tree, conversation: u64) -> Result<Vec<IVec>, StoreError> {
    let mut keys = Vec::new();
    for item in tree.iter() {
        let (key, value) = item?;
        if key_id(&value) == Some(conversation) {
            keys.push(key);
        }
    }
    Ok(keys)
}

/// Removes a mark only if it still names `conversation`.
fn unmark(tree: &TransactionalTree, key: &[u8], conversation: u64) -> Result<(), ConflictableTransactionError<StoreError>> {
    if tree.get(key)?.is_some_and(|value| key_id(&value) == Some(conversation)) {
        tree.remove(key)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::tests::draft;
    use crate::StoreOptions;

    #[test]
    fn a_deleted_conversation_leaves_nothing_naming_it_and_spares_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let kept = draft(1, 1, &["a", "r1", "b"], "r2", None);
        store.commit_turn(&kept).unwrap();
        let mut gone = draft(2, 2, &["x", "ry", "z"], "rz", None);
        gone.turn.responses = Some(crate::records::ResponsesInfo { response_id: Some("resp_gone".into()), ..Default::default() });
        store.commit_turn(&gone).unwrap();
        assert!(store.turn_by_response_id("resp_gone").unwrap().is_some());
        assert_eq!(store.conversation_by_name("c2").unwrap(), Some(2));
        let names = |tree: &sled::Tree, id: u64| tree.iter().values().flatten().filter(|v| key_id(v) == Some(id)).count();
        let prefixes_of = |id: u64| {
            store
                .t()
                .unwrap()
                .prefixes
                .iter()
                .flatten()
                .filter(|(k, v)| decode::<PrefixEntry>(trees::PREFIXES, k, v).unwrap().conversation == id)
                .count()
        };
        assert!(
            names(&store.t().unwrap().ends, 2) > 0 && names(&store.t().unwrap().replies, 2) > 0 && prefixes_of(2) > 0,
            "the doomed one is indexed"
        );

        assert_eq!(store.delete_conversation(2).unwrap(), 1);
        assert!(store.conversation(2).unwrap().is_none());
        assert!(store.t().unwrap().turns.get(id_key(2)).unwrap().is_none() && store.t().unwrap().packs.get(id_key(2)).unwrap().is_none());
        assert!(store.conversation_turn_ids(2).unwrap().is_empty());
        assert_eq!(store.conversation_by_name("c2").unwrap(), None);
        assert!(store.t().unwrap().response_ids.get(b"resp_gone").unwrap().is_none());
        assert_eq!((names(&store.t().unwrap().ends, 2), names(&store.t().unwrap().replies, 2), prefixes_of(2)), (0, 0, 0));
        // The other conversation is whole, and the store checks clean.
        assert_eq!(store.conversation_by_name("c1").unwrap(), Some(1));
        assert_eq!(store.conversation_turn_ids(1).unwrap(), vec![1]);
        assert!(names(&store.t().unwrap().ends, 1) > 0 && prefixes_of(1) > 0);
        let report = store.check().unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}
