//! The newest-first conversation listing: an index keyed by (updated time, id) so that a page is a
//! bounded range scan from a cursor, never a scan of every conversation; plus "what is new since id N"
//! for live views.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::codec::{decode, id_key, key_id, pair_key, trees};
use crate::records::{ConversationRecord, FindingKind, FindingRecord, TurnRecord};
use crate::{Store, StoreError};

/// Marks the (updated, id) index as complete for the conversations present when it was built.
const BY_UPDATED_BUILT: &[u8] = b"by_updated_built";

/// A position in the newest-first listing: the last conversation a page showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub updated_unix_ms: u64,
    pub id: u64,
}

impl Cursor {
    /// `"<updated_unix_ms>-<id>"`, the form that travels in URLs.
    pub fn parse(text: &str) -> Option<Cursor> {
        let (updated, id) = text.split_once('-')?;
        Some(Cursor { updated_unix_ms: updated.parse().ok()?, id: id.parse().ok()? })
    }

    pub fn to_text(self) -> String {
        format!("{}-{}", self.updated_unix_ms, self.id)
    }
}

/// Which page of conversations to list.
#[derive(Debug, Clone)]
pub struct PageQuery {
    /// Start after this position (`None`: from the newest).
    pub after: Option<Cursor>,
    pub limit: usize,
    /// Only conversations updated at or after this time (Unix ms).
    pub since_unix_ms: Option<u64>,
    /// Only conversations updated at or before this time (Unix ms).
    pub until_unix_ms: Option<u64>,
    /// Stop after examining this many index entries even when the page is not full (filters that
    /// match rarely stay bounded; the answer's `next` continues from there).
    pub max_scan: usize,
}

impl Default for PageQuery {
    fn default() -> Self {
        PageQuery { after: None, limit: 50, since_unix_ms: None, until_unix_ms: None, max_scan: 20_000 }
    }
}

/// One page of the listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationPage {
    pub conversations: Vec<ConversationRecord>,
    /// Where the next page starts; `None` at the end.
    pub next: Option<Cursor>,
    /// Index entries examined for this page.
    pub scanned: usize,
}

impl Store {
    /// Conversations newest first from `query.after`, those `keep` accepts, at most `query.limit`.
    pub fn conversations_page(
        &self,
        query: &PageQuery,
        mut keep: impl FnMut(&ConversationRecord) -> Result<bool, StoreError>,
    ) -> Result<ConversationPage, StoreError> {
        let low = pair_key(query.since_unix_ms.unwrap_or(0), 0);
        let until = pair_key(query.until_unix_ms.unwrap_or(u64::MAX), u64::MAX);
        let high = match query.after {
            Some(c) => pair_key(c.updated_unix_ms, c.id).min(until),
            None => until,
        };
        let mut page = ConversationPage { conversations: Vec::new(), next: None, scanned: 0 };
        if low > high {
            return Ok(page);
        }
        let mut entries = self.t()?.by_updated.range(low..high).rev().peekable();
        while let Some(item) = entries.next() {
            let (key, _) = item?;
            let cursor = cursor_of(&key);
            page.scanned += 1;
            if let Some(conversation) = self.conversation(cursor.id)? {
                if keep(&conversation)? {
                    page.conversations.push(conversation);
                }
            }
            let full = page.conversations.len() >= query.limit || page.scanned >= query.max_scan;
            if full {
                if entries.peek().is_some() {
                    page.next = Some(cursor);
                }
                break;
            }
        }
        Ok(page)
    }

    /// Conversations among `ids`, newest first, after the cursor, at most `limit` (a listing
    /// restricted to a set found elsewhere, e.g. the conversations with a kind of finding).
    pub fn conversations_among(
        &self,
        ids: impl IntoIterator<Item = u64>,
        query: &PageQuery,
        mut keep: impl FnMut(&ConversationRecord) -> Result<bool, StoreError>,
    ) -> Result<ConversationPage, StoreError> {
        let mut ordered = BTreeMap::new();
        for id in ids {
            if let Some(c) = self.conversation(id)? {
                let cursor = Cursor { updated_unix_ms: c.updated_unix_ms, id: c.id };
                let in_time = !matches!(query.since_unix_ms, Some(t) if c.updated_unix_ms < t)
                    && !matches!(query.until_unix_ms, Some(t) if c.updated_unix_ms > t);
                if in_time && !matches!(query.after, Some(a) if pair_key(a.updated_unix_ms, a.id) <= pair_key(c.updated_unix_ms, c.id)) {
                    ordered.insert(pair_key(cursor.updated_unix_ms, cursor.id), c);
                }
            }
        }
        let mut page = ConversationPage { conversations: Vec::new(), next: None, scanned: 0 };
        let mut rest = ordered.into_values().rev().peekable();
        while let Some(c) = rest.next() {
            page.scanned += 1;
            let cursor = Cursor { updated_unix_ms: c.updated_unix_ms, id: c.id };
            if keep(&c)? {
                page.conversations.push(c);
            }
            if page.conversations.len() >= query.limit {
                if rest.peek().is_some() {
                    page.next = Some(cursor);
                }
                break;
            }
        }
        Ok(page)
    }

    /// Findings per kind over the whole store (one pass over the findings, which are one per cause).
    pub fn finding_counts(&self) -> Result<BTreeMap<FindingKind, u64>, StoreError> {
        let mut counts = BTreeMap::new();
        for item in self.t()?.findings.iter() {
            let (key, value) = item?;
            let finding: FindingRecord = decode(trees::FINDINGS, &key, &value)?;
            *counts.entry(finding.kind).or_insert(0) += 1;
        }
        Ok(counts)
    }

    /// The newest turn id, if any turn is stored.
    pub fn latest_turn_id(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.t()?.turns.last()?.and_then(|(k, _)| key_id(&k)))
    }

    /// The newest finding id, if any.
    pub fn latest_finding_id(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.t()?.findings.last()?.and_then(|(k, _)| key_id(&k)))
    }

    /// Turns with ids above `id`, oldest first, at most `limit`.
    pub fn turns_after(&self, id: u64, limit: usize) -> Result<Vec<TurnRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.t()?.turns.range(id_key(id.saturating_add(1))..).take(limit) {
            let (key, value) = item?;
            out.push(self.decode_turn(&key, &value)?);
        }
        Ok(out)
    }

    /// Findings with ids above `id`, oldest first, at most `limit`.
    pub fn findings_after(&self, id: u64, limit: usize) -> Result<Vec<FindingRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.t()?.findings.range(id_key(id.saturating_add(1))..).take(limit) {
            let (key, value) = item?;
            out.push(decode(trees::FINDINGS, &key, &value)?);
        }
        Ok(out)
    }

    /// Keeps the (updated, id) index in step with a conversation write; `previous` is the record's
    /// bytes before it.
    pub(crate) fn index_updated(&self, previous: Option<&[u8]>, conversation: &ConversationRecord) -> Result<(), StoreError> {
        if let Some(old) = previous {
            self.unindex_updated(&id_key(conversation.id), old)?;
        }
        self.t()?.by_updated.insert(pair_key(conversation.updated_unix_ms, conversation.id), &[])?;
        Ok(())
    }

    pub(crate) fn unindex_updated(&self, key: &[u8], record: &[u8]) -> Result<(), StoreError> {
        let old: ConversationRecord = decode(trees::CONVERSATIONS, key, record)?;
        self.t()?.by_updated.remove(pair_key(old.updated_unix_ms, old.id))?;
        Ok(())
    }

    /// Builds the index once for a store written before it existed.
    pub(crate) fn backfill_updated_index(&self) -> Result<(), StoreError> {
        if self.t()?.meta.contains_key(BY_UPDATED_BUILT)? {
            return Ok(());
        }
        self.t()?.by_updated.clear()?;
        for item in self.t()?.conversations.iter() {
            let (key, value) = item?;
            // A damaged record is left out of the index and said so; `store check` reports it too.
            match decode::<ConversationRecord>(trees::CONVERSATIONS, &key, &value) {
                Ok(c) => {
                    self.t()?.by_updated.insert(pair_key(c.updated_unix_ms, c.id), &[])?;
                }
                Err(error) => tracing::warn!(%error, "conversation left out of the listing index"),
            }
        }
        self.t()?.meta.insert(BY_UPDATED_BUILT, &[1])?;
        Ok(())
    }
}

/// The position an entry of the listing index (updated time, then id, big-endian) stands for.
pub(crate) fn cursor_of(key: &[u8]) -> Cursor {
    let part = |range: std::ops::Range<usize>| key.get(range).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).unwrap_or(0);
    Cursor { updated_unix_ms: part(0..8), id: part(8..16) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;

    fn conversation(id: u64, updated: u64, model: &str) -> ConversationRecord {
        ConversationRecord {
            id,
            name: None,
            created_unix_ms: updated,
            updated_unix_ms: updated,
            upstream: "http://u".into(),
            model: Some(model.into()),
            turns: 1,
            last_turn: id,
            last_head: String::new(),
            last_message_count: 1,
            last_tail: None,
            branch_of: None,
            last_reply: None,
            capture: Default::default(),
        }
    }

    #[test]
    fn pages_walk_newest_first_and_follow_updates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        for id in 1..=7 {
            store.put_conversation(&conversation(id, 100 + id, if id % 2 == 0 { "a" } else { "b" })).unwrap();
        }
        // Conversation 2 is updated last: it moves to the front, once.
        store.put_conversation(&conversation(2, 500, "a")).unwrap();
        let ids = |p: &ConversationPage| p.conversations.iter().map(|c| c.id).collect::<Vec<_>>();
        let query = PageQuery { limit: 3, ..Default::default() };
        let first = store.conversations_page(&query, |_| Ok(true)).unwrap();
        assert_eq!(ids(&first), vec![2, 7, 6]);
        let second = store.conversations_page(&PageQuery { after: first.next, ..query.clone() }, |_| Ok(true)).unwrap();
        assert_eq!(ids(&second), vec![5, 4, 3]);
        let third = store.conversations_page(&PageQuery { after: second.next, ..query.clone() }, |_| Ok(true)).unwrap();
        assert_eq!((ids(&third), third.next), (vec![1], None));
        let models = store.conversations_page(&query, |c| Ok(c.model.as_deref() == Some("a"))).unwrap();
        assert_eq!(ids(&models), vec![2, 6, 4]);
        let window = PageQuery { since_unix_ms: Some(103), until_unix_ms: Some(105), ..query.clone() };
        assert_eq!(ids(&store.conversations_page(&window, |_| Ok(true)).unwrap()), vec![5, 4, 3]);
        let among = store.conversations_among([1, 2, 5], &query, |_| Ok(true)).unwrap();
        assert_eq!(ids(&among), vec![2, 5, 1]);
        store.delete_conversation(7).unwrap();
        assert_eq!(ids(&store.conversations_page(&query, |_| Ok(true)).unwrap()), vec![2, 6, 5]);
        assert_eq!(Cursor::parse(&Cursor { updated_unix_ms: 5, id: 9 }.to_text()), Some(Cursor { updated_unix_ms: 5, id: 9 }));
    }

    #[test]
    fn a_store_without_the_index_is_backfilled_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
            store.put_conversation(&conversation(3, 10, "a")).unwrap();
            store.t().unwrap().by_updated.clear().unwrap();
            store.t().unwrap().meta.remove(BY_UPDATED_BUILT).unwrap();
            store.t().unwrap().db.flush().unwrap();
        }
        let store = crate::test_support::unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
        let page = store.conversations_page(&PageQuery::default(), |_| Ok(true)).unwrap();
        assert_eq!(page.conversations.len(), 1);
    }
}
