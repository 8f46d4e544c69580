//! Findings: stored once per cause, listed newest first, filtered by kind, conversation and time.

use sled::transaction::{ConflictableTransactionError, Transactional};

use crate::codec::{decode, encode, id_key, pair_key, trees};
use crate::records::{FindingKind, FindingRecord};
use crate::{Store, StoreError};

/// Which findings to list.
#[derive(Debug, Clone, Default)]
pub struct FindingFilter {
    pub kind: Option<FindingKind>,
    pub conversation: Option<u64>,
    pub since_unix_ms: Option<u64>,
    /// At most this many, newest first (`None`: all).
    pub limit: Option<usize>,
}

impl Store {
    /// Stores a finding unless one with the same cause exists; returns whether it was new. The cause,
    /// the record and its conversation index land together or not at all. Written after the turn it
    /// names ([`Store::commit_turn`]): sled recovers a prefix of its log, so a finding that survives a
    /// crash has its turn.
    pub fn put_finding(&self, finding: &FindingRecord) -> Result<bool, StoreError> {
        let mark = match &self.journal {
            Some(journal) if !self.has_cause(&finding.cause)? => {
                let payload = crate::journal::encode_finding(finding)?;
                Some(journal.append(crate::journal::segment::Kind::Finding, finding.conversation, finding.id, &payload)?)
            }
            _ => None,
        };
        let stored = self.store_finding(finding);
        if let (Ok(false) | Err(_), Some(journal), Some(mark)) = (&stored, &self.journal, mark) {
            journal.undo(mark);
        }
        stored
    }

    /// [`Store::put_finding`] without the journal (restoring from it).
    pub(crate) fn store_finding(&self, finding: &FindingRecord) -> Result<bool, StoreError> {
        let t = self.t()?;
        let key = id_key(finding.id);
        let value = encode(trees::FINDINGS, &key, finding)?;
        let trees = (&t.finding_causes, &t.findings, &t.conversation_findings);
        let stored = trees.transaction(|(causes, findings, by_conversation)| {
            if causes.get(finding.cause.as_bytes())?.is_some() {
                return Ok(false);
            }
            causes.insert(finding.cause.as_bytes(), &key)?;
            findings.insert(&key, value.as_slice())?;
            by_conversation.insert(&pair_key(finding.conversation, finding.id), &[])?;
            Ok::<_, ConflictableTransactionError<StoreError>>(true)
        });
        stored.map_err(crate::commit::transaction_error)
    }

    /// Whether a cause has already been raised.
    pub fn has_cause(&self, cause: &str) -> Result<bool, StoreError> {
        Ok(self.t()?.finding_causes.contains_key(cause.as_bytes())?)
    }

    pub fn finding(&self, id: u64) -> Result<Option<FindingRecord>, StoreError> {
        match self.t()?.findings.get(id_key(id))? {
            Some(bytes) => Ok(Some(decode(trees::FINDINGS, &id_key(id), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Findings matching `filter`, newest first.
    pub fn findings(&self, filter: &FindingFilter) -> Result<Vec<FindingRecord>, StoreError> {
        let mut found = Vec::new();
        let ids: Box<dyn Iterator<Item = Result<u64, StoreError>>> = match filter.conversation {
            Some(c) => Box::new(self.t()?.conversation_findings.scan_prefix(id_key(c)).rev().map(|item| {
                let (key, _) = item?;
                Ok(key.get(8..16).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).unwrap_or(0))
            })),
            None => Box::new(self.t()?.findings.iter().keys().rev().map(|key| Ok(crate::codec::key_id(&key?).unwrap_or(0)))),
        };
        for id in ids {
            let Some(finding) = self.finding(id?)? else { continue };
            if filter.kind.is_some_and(|k| k != finding.kind) {
                continue;
            }
            if filter.since_unix_ms.is_some_and(|t| finding.time_unix_ms < t) {
                continue;
            }
            found.push(finding);
            if filter.limit.is_some_and(|l| found.len() >= l) {
                break;
            }
        }
        Ok(found)
    }

    /// A conversation's findings, oldest first.
    pub fn conversation_findings(&self, conversation: u64) -> Result<Vec<FindingRecord>, StoreError> {
        let mut all = self.findings(&FindingFilter { conversation: Some(conversation), ..Default::default() })?;
        all.reverse();
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FindingKind, Severity, StoreOptions};

    fn finding(id: u64, conversation: u64, kind: FindingKind, cause: &str) -> FindingRecord {
        FindingRecord {
            id,
            kind,
            severity: Severity::Critical,
            time_unix_ms: id * 10,
            upstream: "http://u".into(),
            model: None,
            conversation,
            turn: id,
            turn_index: 0,
            summary: String::new(),
            evidence: serde_json::json!({}),
            cause: cause.into(),
        }
    }

    #[test]
    fn a_cause_is_stored_once_and_filters_apply() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        assert!(store.put_finding(&finding(1, 7, FindingKind::EngineTruncation, "engine_truncation/7")).unwrap());
        assert!(!store.put_finding(&finding(2, 7, FindingKind::EngineTruncation, "engine_truncation/7")).unwrap());
        assert!(store.put_finding(&finding(3, 8, FindingKind::AmnesiaReply, "amnesia_reply/8")).unwrap());
        assert!(store.put_finding(&finding(4, 7, FindingKind::CacheMiss, "cache_miss/7/eviction")).unwrap());
        let all = store.findings(&FindingFilter::default()).unwrap();
        assert_eq!(all.iter().map(|f| f.id).collect::<Vec<_>>(), vec![4, 3, 1]);
        let conv = store.conversation_findings(7).unwrap();
        assert_eq!(conv.iter().map(|f| f.id).collect::<Vec<_>>(), vec![1, 4]);
        let kind = store.findings(&FindingFilter { kind: Some(FindingKind::AmnesiaReply), ..Default::default() }).unwrap();
        assert_eq!(kind.len(), 1);
        let since = store.findings(&FindingFilter { since_unix_ms: Some(25), limit: Some(1), ..Default::default() }).unwrap();
        assert_eq!(since.iter().map(|f| f.id).collect::<Vec<_>>(), vec![4]);
        store.delete_conversation(7).unwrap();
        assert_eq!(store.findings(&FindingFilter::default()).unwrap().len(), 1);
        assert!(store.has_cause("engine_truncation/7").unwrap());
    }
}
