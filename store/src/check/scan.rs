//! The reading half of a check: every tree once, each record's frame, checksum and JSON verified
//! (a message's content also against its SHA-256 key, a packed one against the hash its turn lists),
//! and the facts the judgement needs kept in memory (turns and findings without their texts).
//! Nothing is written.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::de::{DeserializeOwned, IgnoredAny};
use sha2::{Digest, Sha256};

use super::{readable_key, Problem, ProblemKind};
use crate::codec::{self, key_id, trees};
use crate::hash::Hash;
use crate::records::{ConversationRecord, FindingRecord, PrefixEntry, TurnRecord};
use crate::{Store, StoreError};

/// An index entry whose value names a record by id (`None`: the value is not an 8-byte id).
pub(crate) type Entry = (Vec<u8>, Option<u64>);

/// Everything a check read.
#[derive(Default)]
pub(crate) struct Scanned {
    pub records: BTreeMap<String, u64>,
    pub problems: Vec<Problem>,
    /// Records to remove whatever else is decided: damaged ones.
    pub damaged: Vec<(&'static str, Vec<u8>)>,
    pub messages: HashSet<Hash>,
    /// The messages each turn's pack holds, checked against their hashes (packs whole and sound only).
    pub packed: HashMap<u64, HashSet<Hash>>,
    /// Keys of the packs read whole, by turn id.
    pub packs: Vec<(Vec<u8>, u64)>,
    pub turns: BTreeMap<u64, TurnRecord>,
    /// Turn records that are damaged (their ids, from their keys).
    pub damaged_turns: BTreeSet<u64>,
    pub conversations: BTreeMap<u64, ConversationRecord>,
    pub damaged_conversations: BTreeSet<u64>,
    pub prefixes: Vec<(Vec<u8>, PrefixEntry)>,
    pub findings: BTreeMap<u64, FindingRecord>,
    /// (conversation, turn) pairs of the turn-list index.
    pub conversation_turns: Vec<(u64, u64)>,
    /// (conversation, finding) pairs.
    pub conversation_findings: Vec<(u64, u64)>,
    /// (updated_unix_ms, conversation) pairs of the listing index.
    pub by_updated: Vec<(u64, u64)>,
    pub ends: Vec<Entry>,
    pub replies: Vec<Entry>,
    pub names: Vec<Entry>,
    pub response_ids: Vec<Entry>,
}

impl Scanned {
    pub fn read(store: &Store) -> Result<Scanned, StoreError> {
        let mut s = Scanned::default();
        let message_problem = |key: &[u8], value: &[u8]| match unspilled(store, trees::MESSAGES, key, value) {
            Ok(value) => message_problem(key, &value),
            Err(detail) => Some(detail),
        };
        s.each(&store.t()?.messages, trees::MESSAGES, |s, key, value| match message_problem(key, value) {
            None => {
                if let Ok(hash) = Hash::try_from(key) {
                    s.messages.insert(hash);
                }
            }
            Some(detail) => s.damage(trees::MESSAGES, key, detail),
        });
        s.each(&store.t()?.turns, trees::TURNS, |s, key, value| match s.turn(store, key, value) {
            Some(mut turn) => {
                turn.reply_text = String::new();
                turn.params.clear();
                s.turns.insert(turn.id, turn);
            }
            None => {
                s.damaged_turns.extend(key_id(key));
            }
        });
        s.each(&store.t()?.packs, trees::PACKS, |s, key, value| match unspilled(store, trees::PACKS, key, value) {
            Ok(value) => s.pack(key, &value),
            Err(detail) => s.damage(trees::PACKS, key, detail),
        });
        s.each(&store.t()?.conversations, trees::CONVERSATIONS, |s, key, value| {
            match s.record::<ConversationRecord>(trees::CONVERSATIONS, key, value, |c| c.id) {
                Some(conversation) => {
                    s.conversations.insert(conversation.id, conversation);
                }
                None => {
                    s.damaged_conversations.extend(key_id(key));
                }
            }
        });
        s.each(&store.t()?.prefixes, trees::PREFIXES, |s, key, value| {
            if let Some(entry) = s.decoded::<PrefixEntry>(trees::PREFIXES, key, value) {
                s.prefixes.push((key.to_vec(), entry));
            }
        });
        s.each(&store.t()?.findings, trees::FINDINGS, |s, key, value| {
            if let Some(mut finding) = s.record::<FindingRecord>(trees::FINDINGS, key, value, |f| f.id) {
                finding.evidence = serde_json::Value::Null;
                finding.summary = String::new();
                s.findings.insert(finding.id, finding);
            }
        });
        s.each(&store.t()?.replays, trees::REPLAYS, |s, key, value| {
            s.decoded::<IgnoredAny>(trees::REPLAYS, key, value);
        });
        let fingerprints = store.db_tree(trees::FINGERPRINTS.as_bytes())?;
        s.each(&fingerprints, trees::FINGERPRINTS, |s, key, value| {
            s.decoded::<IgnoredAny>(trees::FINGERPRINTS, key, value);
        });
        s.each(&store.t()?.conversation_turns, trees::CONVERSATION_TURNS, |s, key, _| {
            if let Some(pair) = s.pair(trees::CONVERSATION_TURNS, key) {
                s.conversation_turns.push(pair);
            }
        });
        s.each(&store.t()?.conversation_findings, trees::CONVERSATION_FINDINGS, |s, key, _| {
            if let Some(pair) = s.pair(trees::CONVERSATION_FINDINGS, key) {
                s.conversation_findings.push(pair);
            }
        });
        s.each(&store.t()?.by_updated, trees::CONVERSATIONS_BY_UPDATED, |s, key, _| {
            if let Some(pair) = s.pair(trees::CONVERSATIONS_BY_UPDATED, key) {
                s.by_updated.push(pair);
            }
        });
        s.each(&store.t()?.ends, trees::ENDS, |s, key, value| s.ends.push(entry(key, value)));
        s.each(&store.t()?.replies, trees::REPLIES, |s, key, value| s.replies.push(entry(key, value)));
        s.each(&store.t()?.names, trees::NAMES, |s, key, value| s.names.push(entry(key, value)));
        s.each(&store.t()?.response_ids, trees::RESPONSE_IDS, |s, key, value| s.response_ids.push(entry(key, value)));
        Ok(s)
    }

    /// Visits every entry of a tree; a tree sled cannot read to its end is reported, not fatal.
    fn each(&mut self, tree: &sled::Tree, name: &'static str, mut visit: impl FnMut(&mut Scanned, &[u8], &[u8])) {
        let mut count = 0;
        let mut last: Option<Vec<u8>> = None;
        for item in tree.iter() {
            match item {
                Ok((key, value)) => {
                    count += 1;
                    visit(self, &key, &value);
                    last = Some(key.to_vec());
                }
                Err(error) => {
                    let key = last.map_or_else(|| "(first entry)".to_string(), |k| format!("after {}", readable_key(name, &k)));
                    let detail = format!("sled cannot read the rest of this tree: {error}");
                    self.problems.push(Problem { tree: name.into(), key, kind: ProblemKind::Unreadable, detail, repairable: false });
                    break;
                }
            }
        }
        self.records.insert(name.to_string(), count);
    }

    pub fn damage(&mut self, tree: &'static str, key: &[u8], detail: String) {
        self.problems.push(Problem {
            tree: tree.into(),
            key: readable_key(tree, key),
            kind: ProblemKind::Damaged,
            detail,
            repairable: true,
        });
        self.damaged.push((tree, key.to_vec()));
    }

    /// A record decoded, or reported damaged and `None`.
    fn decoded<T: DeserializeOwned>(&mut self, tree: &'static str, key: &[u8], value: &[u8]) -> Option<T> {
        match codec::decode(tree, key, value) {
            Ok(record) => Some(record),
            Err(StoreError::Damaged { detail, .. }) => {
                self.damage(tree, key, detail);
                None
            }
            Err(error) => {
                self.damage(tree, key, format!("not a valid record: {}", error_detail(&error)));
                None
            }
        }
    }

    /// A record with an id, which must be its key.
    fn record<T: DeserializeOwned>(&mut self, tree: &'static str, key: &[u8], value: &[u8], id: impl Fn(&T) -> u64) -> Option<T> {
        let record = self.decoded::<T>(tree, key, value)?;
        if key_id(key) != Some(id(&record)) || key.len() != 8 {
            self.damage(tree, key, format!("holds the record of id {} under another key", id(&record)));
            return None;
        }
        Some(record)
    }

    /// A turn record (any layout; one that leaves its hashes to its pack, read with it), whose id
    /// must be its key.
    fn turn(&mut self, store: &Store, key: &[u8], value: &[u8]) -> Option<TurnRecord> {
        let turn = match store.decode_turn(key, value) {
            Ok(turn) => turn,
            Err(error) => {
                let detail = match error {
                    StoreError::Damaged { tree: trees::PACKS, detail, .. } => {
                        format!("its message hashes are in its pack, which is damaged: {detail}")
                    }
                    StoreError::Damaged { detail, .. } => detail,
                    other => format!("not a valid record: {}", error_detail(&other)),
                };
                self.damage(trees::TURNS, key, detail);
                return None;
            }
        };
        if key_id(key) != Some(turn.id) || key.len() != 8 {
            self.damage(trees::TURNS, key, format!("holds the record of id {} under another key", turn.id));
            return None;
        }
        Some(turn)
    }

    /// A turn's pack (read after the turns): its frame, and each packed message against the hash its
    /// turn lists for it. A pack whose turn is not there is judged dangling later.
    fn pack(&mut self, key: &[u8], value: &[u8]) {
        let Some(id) = key_id(key).filter(|_| key.len() == 8) else {
            self.damage(trees::PACKS, key, format!("key of {} bytes is not a turn id", key.len()));
            return;
        };
        let pack = match crate::pack::decode_pack(key, value) {
            Ok(pack) => pack,
            Err(error) => {
                let detail = match error {
                    StoreError::Damaged { detail, .. } => detail,
                    other => other.to_string(),
                };
                self.damage(trees::PACKS, key, detail);
                return;
            }
        };
        self.packs.push((key.to_vec(), id));
        let Some(turn) = self.turns.get(&id) else { return };
        let hashes: Vec<Hash> = turn.new_messages.iter().copied().chain(turn.reply.as_deref().and_then(crate::from_hex)).collect();
        if hashes.len() != pack.len() {
            let detail = format!("holds {} messages, its turn added {}", pack.len(), hashes.len());
            self.packs.pop();
            self.damage(trees::PACKS, key, detail);
            return;
        }
        // A redacted turn's pack holds masked text: not what its hashes were taken of.
        let masked = turn.capture != crate::CaptureLevel::Full;
        let mut held = HashSet::new();
        for (i, (hash, entry)) in hashes.iter().zip(pack.entries()).enumerate() {
            let Some(json) = entry else { continue };
            if !masked && Sha256::digest(json).as_slice() != hash {
                self.packs.pop();
                self.damage(trees::PACKS, key, format!("message {i} does not match its hash {}", crate::to_hex(hash)));
                return;
            }
            held.insert(*hash);
        }
        self.packed.insert(id, held);
    }

    /// A 16-byte key of two ids.
    fn pair(&mut self, tree: &'static str, key: &[u8]) -> Option<(u64, u64)> {
        match (key.len(), key_id(key), key.get(8..).and_then(key_id)) {
            (16, Some(a), Some(b)) => Some((a, b)),
            _ => {
                self.damage(tree, key, format!("key of {} bytes is not two ids", key.len()));
                None
            }
        }
    }
}

fn entry(key: &[u8], value: &[u8]) -> Entry {
    (key.to_vec(), if value.len() == 8 { key_id(value) } else { None })
}

/// What is wrong with a stored message, if anything: its frame, or its content against its hash key.
fn message_problem(key: &[u8], value: &[u8]) -> Option<String> {
    let payload = match codec::unframe(trees::MESSAGES, key, value) {
        Ok(payload) => payload,
        Err(StoreError::Damaged { detail, .. }) => return Some(detail),
        Err(error) => return Some(error.to_string()),
    };
    if key.len() != 32 {
        return Some(format!("key of {} bytes is not a message hash", key.len()));
    }
    if Sha256::digest(payload).as_slice() != key {
        return Some("content does not match its hash".into());
    }
    None
}

/// A value as written: a spilled one read from its file (`spill`); a file missing or altered is the
/// record's damage.
fn unspilled<'a>(store: &Store, tree: &'static str, key: &[u8], value: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>, String> {
    if !crate::spill::is_spilled(value) {
        return Ok(std::borrow::Cow::Borrowed(value));
    }
    match store.spill.load(tree, key, sled::IVec::from(value)) {
        Ok(crate::spill::Value::Spilled(bytes)) => Ok(std::borrow::Cow::Owned(bytes)),
        Ok(crate::spill::Value::Stored(_)) => Ok(std::borrow::Cow::Borrowed(value)),
        Err(StoreError::Damaged { detail, .. }) => Err(detail),
        Err(error) => Err(error.to_string()),
    }
}

/// A decode error's cause, without the advice the error's display adds.
fn error_detail(error: &StoreError) -> String {
    match error {
        StoreError::Decode { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}
