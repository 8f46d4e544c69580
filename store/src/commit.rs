//! One captured turn, one write. [`Store::commit_turn`] lands everything a turn adds at once: its new
//! messages (packed into one record, large ones on their own), the turn record and its place in the
//! conversation, its Responses API id, prefix entries, the conversation record and the indexes the
//! store keeps for it (listing order, name, open ends, latest reply). The writes are computed first,
//! recorded as one intent (one sled insert, atomic on its own), applied, then the intent is removed;
//! an intent found on open is applied again (`intent`), so a crash never leaves a conversation
//! pointing at a turn that is not there. (A sled transaction did the same, but sealed sled's I/O
//! buffer and woke its I/O threads on every turn: BENCHMARKS.md, "Proxy latency".) The records
//! written do not grow with the number of messages (sled spends hundreds of bytes of disk and memory
//! on each record, more than a short message).

use sled::transaction::TransactionError;

use crate::codec::{self, decode, encode, id_key, pair_key, trees};
use crate::hash::{from_hex, Hash, ZERO_HASH};
use crate::intent::{Op, Slot};
use crate::prefixes::recorded_lengths;
use crate::records::{CaptureLevel, ConversationRecord, PrefixEntry, TurnRecord};
use crate::{Store, StoreError};

/// Everything one turn writes, computed by the capture and committed at once.
#[derive(Debug, Clone)]
pub struct TurnDraft {
    /// The messages this turn adds, hash and canonical JSON: the request's past its base, then the
    /// reply (the turn's `new_messages` and `reply`, in that order). Short ones go into the turn's
    /// pack; one of [`codec::PACK_LIMIT`] bytes or more is stored once by hash (kept if already there).
    /// Below [`CaptureLevel::Full`] (the turn's `capture`) the hash is still the message's as sent and
    /// the JSON is what is kept of it: masked (all of it packed), or nothing (empty; no pack).
    pub messages: Vec<(Hash, Vec<u8>)>,
    /// The request's prefix chain: `chain[i]` covers messages `0..=i`. Some lengths past the turn's
    /// base get prefix entries (`prefixes`; unless an earlier turn has them); the last is its head.
    pub chain: Vec<Hash>,
    /// The chain over the request's messages followed by the reply, when there was one.
    pub tail: Option<Hash>,
    pub turn: TurnRecord,
    /// The conversation as it stands after this turn (new, or its previous record updated).
    pub conversation: ConversationRecord,
}

/// Free space kept beyond a write's own size: sled appends to its log in segments (512 KiB by
/// default) and rewrites pages, so a write needs room past its own bytes.
pub const ROOM_MARGIN: u64 = 1 << 20;

impl Store {
    /// Refuses a write of about `bytes` when the store's filesystem has less than twice that plus
    /// [`ROOM_MARGIN`] free. sled 0.34 makes an ENOSPC in its background log writer sticky (every
    /// later call fails until the database is reopened), so the store must not reach it: with this
    /// guard a full disk costs the turns written meanwhile, and capture resumes once space is freed.
    /// When free space cannot be read, the write goes ahead.
    pub fn ensure_room(&self, bytes: u64) -> Result<(), StoreError> {
        let needed = 2 * bytes + ROOM_MARGIN;
        match fs2::available_space(self.path()) {
            Ok(free) if free < needed => Err(StoreError::NoRoom { path: self.path().to_path_buf(), free, needed }),
            _ => Ok(()),
        }
    }

    /// Writes a turn and everything it changes, all or nothing (`intent`). What the store derives
    /// itself: the turn's entry in its conversation's turn list; the response id index, for a
    /// successful (2xx) Responses turn; the listing index and name of the conversation; its open ends
    /// (the head and tail of its latest turn, replacing the previous turn's) and its latest-reply mark.
    /// The turn is journaled first (`journal`) and the journal record removed again if sled refuses it.
    pub fn commit_turn(&self, draft: &TurnDraft) -> Result<(), StoreError> {
        self.ensure_room(draft.messages.iter().map(|(_, json)| json.len() as u64 + 64).sum::<u64>() + 4096)?;
        let commit = draft.commit();
        let ops = self.turn_ops(&commit)?;
        let mark = match &self.journal {
            Some(journal) => {
                let payload = crate::journal::encode_turn(
                    commit.turn,
                    commit.conversation,
                    commit.messages,
                    &commit.points,
                    Some(commit.head),
                    commit.tail,
                )?;
                Some(journal.append(crate::journal::segment::Kind::Turn, commit.conversation.id, commit.turn.id, &payload)?)
            }
            None => None,
        };
        let written = self.write_intended(&id_key(draft.turn.id), ops);
        if let (Err(_), Some(journal), Some(mark)) = (&written, &self.journal, mark) {
            journal.undo(mark);
        }
        written
    }

    /// The writes of a turn, decided against the store as it is: the turn's own records, then its
    /// conversation's record and the indexes that follow it.
    pub(crate) fn turn_ops(&self, commit: &Commit<'_>) -> Result<Vec<Op>, StoreError> {
        let mut ops = self.turn_local_ops(commit)?;
        self.conversation_ops(commit, &mut ops)?;
        Ok(ops)
    }

    /// A turn's own records: its new messages and pack, the turn, its place in its conversation's
    /// list, its Responses API id and its prefix entries.
    pub(crate) fn turn_local_ops(&self, commit: &Commit<'_>) -> Result<Vec<Op>, StoreError> {
        let t = self.t()?;
        let (turn, conversation) = (commit.turn, commit.conversation);
        debug_assert_eq!(turn.conversation, conversation.id, "a turn commits with its own conversation");
        let turn_key = id_key(turn.id);
        let (pack, messages, turn_value) = pack(commit, &turn_key)?;
        let prefixes = prefix_entries(commit)?;
        let succeeded = (200..300).contains(&turn.status);
        let response_id = turn.responses.as_ref().and_then(|r| r.response_id.as_deref()).filter(|_| succeeded);

        let mut ops = Vec::with_capacity(messages.len() + prefixes.len() + 12);
        for (hash, value) in messages {
            if !t.messages.contains_key(hash)? {
                ops.push(Op::put(Slot::Messages, hash, value));
            }
        }
        if let Some(pack) = pack {
            ops.push(Op::put(Slot::Packs, turn_key, pack));
        }
        ops.push(Op::put(Slot::Turns, turn_key, turn_value));
        ops.push(Op::put(Slot::ConversationTurns, pair_key(conversation.id, turn.id), []));
        if let Some(id) = response_id {
            ops.push(Op::put(Slot::ResponseIds, id.as_bytes(), turn_key));
        }
        for (chain, value) in prefixes {
            if !t.prefixes.contains_key(chain)? {
                ops.push(Op::put(Slot::Prefixes, chain, value));
            }
        }
        Ok(ops)
    }

    /// The conversation's record as it stands after the turn, and its indexes moved to it.
    fn conversation_ops(&self, commit: &Commit<'_>, ops: &mut Vec<Op>) -> Result<(), StoreError> {
        let t = self.t()?;
        let conversation = commit.conversation;
        let conversation_key = id_key(conversation.id);
        let conversation_value = encode(trees::CONVERSATIONS, &conversation_key, conversation)?;
        let reply = conversation.last_reply.as_deref().and_then(from_hex);
        // The previous conversation record says which index entries move.
        if let Some(old) = t.conversations.get(conversation_key)? {
            let old: ConversationRecord = decode(trees::CONVERSATIONS, &conversation_key, &old)?;
            ops.push(Op::remove(Slot::ByUpdated, pair_key(old.updated_unix_ms, old.id)));
            let old_ends = [from_hex(&old.last_head), old.last_tail.as_deref().and_then(from_hex)];
            for end in old_ends.iter().flatten() {
                if t.ends.get(end)?.as_deref() == Some(&conversation_key[..]) {
                    ops.push(Op::remove(Slot::Ends, end));
                }
            }
            if let Some(old_reply) = old.last_reply.as_deref().and_then(from_hex) {
                if t.replies.get(old_reply)?.as_deref() == Some(&conversation_key[..]) {
                    ops.push(Op::remove(Slot::Replies, old_reply));
                }
            }
        }
        ops.push(Op::put(Slot::Conversations, conversation_key, conversation_value));
        ops.push(Op::put(Slot::ByUpdated, pair_key(conversation.updated_unix_ms, conversation.id), []));
        if let Some(name) = &conversation.name {
            ops.push(Op::put(Slot::Names, name.as_bytes(), conversation_key));
        }
        ops.push(Op::put(Slot::Ends, commit.head, conversation_key));
        if let Some(tail) = &commit.tail {
            ops.push(Op::put(Slot::Ends, tail, conversation_key));
        }
        if let Some(reply) = &reply {
            ops.push(Op::put(Slot::Replies, reply, conversation_key));
        }
        Ok(())
    }
}

/// What a turn's commit writes, from a capture's [`TurnDraft`] or from the journal (which keeps
/// the prefix points a turn recorded, not its whole chain).
pub(crate) struct Commit<'a> {
    pub messages: &'a [(Hash, Vec<u8>)],
    /// The prefix lengths recorded ([`recorded_lengths`]) with their chain hashes.
    pub points: Vec<(usize, Hash)>,
    /// The request's chain hash (all zeros for a request without messages).
    pub head: Hash,
    pub tail: Option<Hash>,
    pub turn: &'a TurnRecord,
    pub conversation: &'a ConversationRecord,
}

impl TurnDraft {
    pub(crate) fn commit(&self) -> Commit<'_> {
        let head = self.chain.len();
        let base = self.turn.base.map_or(0, |b| b.len as usize).min(head);
        let point = |len: usize| (len, if len > head { self.tail.unwrap_or(ZERO_HASH) } else { self.chain[len - 1] });
        Commit {
            messages: &self.messages,
            points: recorded_lengths(base, head, self.tail.is_some()).map(point).collect(),
            head: self.chain.last().copied().unwrap_or(ZERO_HASH),
            tail: self.tail,
            turn: &self.turn,
            conversation: &self.conversation,
        }
    }
}

/// The turn's pack (its short new messages, in one record; `None` when it added none), the large
/// messages stored on their own, framed, and the turn record (leaving its packed messages' hashes to
/// the pack).
type Packed = (Option<Vec<u8>>, Vec<(Hash, Vec<u8>)>, Vec<u8>);

fn pack(draft: &Commit<'_>, turn_key: &[u8]) -> Result<Packed, StoreError> {
    let turn = draft.turn;
    debug_assert_eq!(
        draft.messages.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
        turn.new_messages.iter().copied().chain(turn.reply.as_deref().and_then(from_hex)).collect::<Vec<_>>(),
        "a draft's messages are its turn's new messages, then its reply"
    );
    match turn.capture {
        CaptureLevel::Full => {}
        // No text: no pack, and every hash in the turn record (none is the hash of a stored JSON).
        CaptureLevel::Hashes => return Ok((None, Vec::new(), codec::encode_turn(turn_key, turn)?)),
        // Masked text is not the message its hash names: all of it in the turn's own pack (never
        // by hash in `messages`, which holds what its key is the SHA-256 of), every hash in the record.
        CaptureLevel::Redacted => {
            let entries: Vec<Option<&[u8]>> = draft.messages.iter().map(|(_, json)| Some(json.as_slice())).collect();
            let pack = (!entries.is_empty()).then(|| crate::pack::encode_pack(turn_key, &entries));
            return Ok((pack, Vec::new(), codec::encode_turn(turn_key, turn)?));
        }
    }
    let mut entries = Vec::with_capacity(draft.messages.len());
    let mut large = Vec::new();
    for (hash, json) in draft.messages {
        if json.len() < codec::PACK_LIMIT {
            entries.push(Some(json.as_slice()));
        } else {
            entries.push(None);
            large.push((*hash, codec::frame(hash, json)));
        }
    }
    if entries.is_empty() {
        return Ok((None, large, codec::encode_turn(turn_key, turn)?));
    }
    let record = codec::encode_packed_turn(turn_key, turn, |i| entries[i].is_some())?;
    Ok((Some(crate::pack::encode_pack(turn_key, &entries)), large, record))
}

/// The prefix entries a turn records (its points: the lengths [`recorded_lengths`] picks past its
/// base, its head and its tail).
fn prefix_entries(commit: &Commit<'_>) -> Result<Vec<(Hash, Vec<u8>)>, StoreError> {
    let turn = commit.turn;
    let entry = |len: usize| PrefixEntry { conversation: turn.conversation, turn: turn.id, len: len as u32 };
    let mut entries = Vec::with_capacity(commit.points.len());
    for &(len, chain) in &commit.points {
        entries.push((chain, encode(trees::PREFIXES, &chain, &entry(len))?));
    }
    Ok(entries)
}

/// A failed transaction as a store error: the closure's own, or sled's.
pub(crate) fn transaction_error(error: TransactionError<StoreError>) -> StoreError {
    match error {
        TransactionError::Abort(error) => error,
        TransactionError::Storage(error) => StoreError::Sled(error),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::records::{BaseRef, Relation};
    use crate::test_support::unlocked;
    use crate::{chain_next, message_hash, store_test_turn, to_hex, StoreOptions};
    use serde_json::json;

    /// A turn of conversation `id` whose request is `texts` (assistant messages start with `r`, the
    /// others are the user's) and whose reply is `reply`.
    pub(crate) fn draft(id: u64, turn_id: u64, texts: &[&str], reply: &str, base: Option<BaseRef>) -> TurnDraft {
        let mut messages = Vec::new();
        let mut chain = Vec::new();
        let mut h = ZERO_HASH;
        let mut hashes = Vec::new();
        for text in texts {
            let role = if text.starts_with('r') { "assistant" } else { "user" };
            let (hash, bytes) = message_hash(&json!({"role": role, "content": text}));
            h = chain_next(&h, &hash);
            chain.push(h);
            hashes.push(hash);
            messages.push((hash, bytes));
        }
        let base_len = base.map_or(0, |b| b.len as usize);
        messages.drain(..base_len);
        let (reply_hash, reply_bytes) = message_hash(&json!({"role": "assistant", "content": reply}));
        messages.push((reply_hash, reply_bytes));
        let tail = chain_next(&h, &reply_hash);
        let mut turn = store_test_turn(turn_id, id, hashes[base_len..].to_vec());
        turn.base = base;
        turn.message_count = texts.len() as u32;
        turn.head = to_hex(&h);
        turn.reply = Some(to_hex(&reply_hash));
        turn.tail = Some(to_hex(&tail));
        turn.time_unix_ms = turn_id * 100;
        let conversation = ConversationRecord {
            id,
            name: Some(format!("c{id}")),
            created_unix_ms: 100,
            updated_unix_ms: turn.time_unix_ms,
            upstream: "u".into(),
            model: None,
            turns: 1,
            last_turn: turn_id,
            last_head: turn.head.clone(),
            last_message_count: turn.message_count,
            last_tail: turn.tail.clone(),
            branch_of: None,
            last_reply: turn.reply.clone(),
            capture: Default::default(),
        };
        TurnDraft { messages, chain, tail: Some(tail), turn, conversation }
    }

    #[test]
    fn a_write_larger_than_the_free_space_is_refused_before_sled_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.ensure_room(1024).unwrap();
        let free = fs2::available_space(dir.path()).unwrap();
        match store.ensure_room(free) {
            Err(StoreError::NoRoom { needed, .. }) => assert_eq!(needed, 2 * free + ROOM_MARGIN),
            other => panic!("expected NoRoom, got {other:?}"),
        }
        assert_eq!(store.turn(1).unwrap(), None);
    }

    #[test]
    fn a_turn_lands_with_every_index_and_moves_the_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let first = draft(1, 1, &["a"], "ra", None);
        store.commit_turn(&first).unwrap();
        assert_eq!(store.turn(1).unwrap().unwrap(), first.turn);
        assert_eq!(store.conversation_turn_ids(1).unwrap(), vec![1]);
        assert_eq!(store.conversation_by_name("c1").unwrap(), Some(1));
        assert_eq!(store.end(&first.chain[0]).unwrap(), Some(1));
        assert_eq!(store.end(&first.tail.unwrap()).unwrap(), Some(1));
        assert_eq!(store.prefix(&first.tail.unwrap()).unwrap().map(|p| p.len), Some(2));
        assert_eq!(store.message_count(), 2);

        // The next turn extends the first (base: its message and reply).
        let mut second = draft(1, 2, &["a", "ra", "b"], "rb", Some(BaseRef { turn: 1, len: 2 }));
        second.turn.relation = Relation::Extend { parent_turn: 1 };
        second.conversation.turns = 2;
        store.commit_turn(&second).unwrap();
        assert_eq!(store.conversation_turn_ids(1).unwrap(), vec![1, 2]);
        assert_eq!(store.end(&first.chain[0]).unwrap(), None, "the previous head is no longer an end");
        assert_eq!(store.end(&first.tail.unwrap()).unwrap(), None);
        assert_eq!(store.end(second.chain.last().unwrap()).unwrap(), Some(1));
        let old_reply = crate::from_hex(first.turn.reply.as_ref().unwrap()).unwrap();
        assert_eq!(store.reply_of(&old_reply).unwrap(), None);
        assert_eq!(store.reply_of(&crate::from_hex(second.turn.reply.as_ref().unwrap()).unwrap()).unwrap(), Some(1));
        // Prefixes already recorded by turn 1 stay turn 1's.
        assert_eq!(store.prefix(&second.chain[1]).unwrap().map(|p| p.turn), Some(1));
        assert_eq!(store.prefix(&second.chain[2]).unwrap().map(|p| p.turn), Some(2));
        let page = store.conversations_page(&crate::PageQuery::default(), |_| Ok(true)).unwrap();
        assert_eq!(page.scanned, 1, "the listing index moved, not duplicated");
    }

    #[test]
    fn a_commit_that_cannot_be_decided_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        store.commit_turn(&draft(1, 1, &["a"], "ra", None)).unwrap();
        // Damage the conversation record: the next commit reads it last, after deciding the messages,
        // the turn, its list entry and prefixes, and must write none of them.
        let key = id_key(1);
        let mut bytes = store.t().unwrap().conversations.get(key).unwrap().unwrap().to_vec();
        let at = bytes.len() - 3;
        bytes[at] ^= 0x01;
        store.t().unwrap().conversations.insert(key, bytes).unwrap();
        let before = store.message_count();
        let mut second = draft(1, 2, &["a", "ra", "b"], "rb", Some(BaseRef { turn: 1, len: 2 }));
        second.conversation.turns = 2;
        let error = store.commit_turn(&second).unwrap_err();
        assert!(matches!(&error, StoreError::Damaged { tree: "conversations", .. }), "{error}");
        assert_eq!(store.turn(2).unwrap(), None);
        assert_eq!(store.conversation_turn_ids(1).unwrap(), vec![1]);
        assert_eq!(store.message_count(), before);
        assert_eq!(store.prefix(&second.chain[2]).unwrap(), None);
        assert_eq!(store.end(second.chain.last().unwrap()).unwrap(), None);
    }

    #[test]
    fn turns_below_full_keep_the_hashes_as_sent_and_only_what_their_level_keeps() {
        use crate::records::CaptureLevel;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let first = draft(1, 1, &["a"], "ra", None);
        // Turn 2, redacted: its new message and reply kept masked, under the hashes of the originals.
        let mut second = draft(1, 2, &["a", "ra", "b me@example.com"], "rb", Some(BaseRef { turn: 1, len: 2 }));
        second.turn.capture = CaptureLevel::Redacted;
        second.conversation.capture = CaptureLevel::Redacted;
        second.conversation.turns = 2;
        second.messages[0].1 = serde_json::to_vec(&json!({"content": "b [redacted:email]", "role": "user"})).unwrap();
        // Turn 3, hashes only: nothing of its text.
        let mut third = draft(1, 3, &["a", "ra", "b me@example.com", "rb", "c"], "rc", Some(BaseRef { turn: 2, len: 4 }));
        third.turn.capture = CaptureLevel::Hashes;
        third.conversation.capture = CaptureLevel::Hashes;
        third.conversation.turns = 3;
        third.messages.iter_mut().for_each(|(_, json)| json.clear());
        for d in [&first, &second, &third] {
            store.commit_turn(d).unwrap();
        }
        let expect = |store: &Store| {
            for d in [&first, &second, &third] {
                assert_eq!(store.turn(d.turn.id).unwrap().unwrap(), d.turn, "turn {} as committed, its hashes the originals'", d.turn.id);
            }
            let history = store.turn_history(&third.turn).unwrap();
            let hashes: Vec<Hash> = history.iter().map(|(h, _)| *h).collect();
            let texts = ["a", "ra", "b me@example.com", "rb", "c"];
            let role = |t: &str| if t.starts_with('r') { "assistant" } else { "user" };
            let mut sent: Vec<Hash> = texts.iter().map(|t| message_hash(&json!({"role": role(t), "content": t})).0).collect();
            sent.extend(third.turn.reply.as_deref().and_then(from_hex));
            assert_eq!(hashes, sent, "the hashes of the messages as sent, whatever was kept");
            let texts: Vec<Option<String>> =
                history.iter().map(|(_, v)| v.as_ref().map(|v| v["content"].as_str().unwrap_or_default().to_string())).collect();
            assert_eq!(texts, [Some("a".into()), Some("ra".into()), Some("b [redacted:email]".into()), Some("rb".into()), None, None]);
            assert_eq!(store.conversation(1).unwrap().unwrap().capture, CaptureLevel::Hashes);
            let report = store.check().unwrap();
            assert!(report.is_clean(), "{:?}", report.problems);
        };
        expect(&store);
        // sled loses turns 2 and 3 and their packs: the journal gives them back as they were.
        store.checkpoint().unwrap();
        for id in [2, 3] {
            store.t().unwrap().turns.remove(id_key(id)).unwrap();
            store.t().unwrap().packs.remove(id_key(id)).unwrap();
        }
        drop(store);
        let store = unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
        assert_eq!(store.restored_on_open().0, 2);
        expect(&store);
    }

    #[test]
    fn a_failed_responses_turn_is_not_indexed_by_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let mut ok = draft(1, 1, &["a"], "ra", None);
        ok.turn.responses = Some(crate::ResponsesInfo { response_id: Some("resp_1".into()), ..Default::default() });
        store.commit_turn(&ok).unwrap();
        let mut failed = draft(2, 2, &["b"], "rb", None);
        failed.turn.status = 500;
        failed.turn.responses = Some(crate::ResponsesInfo { response_id: Some("resp_2".into()), ..Default::default() });
        store.commit_turn(&failed).unwrap();
        assert_eq!(store.turn_by_response_id("resp_1").unwrap().map(|t| t.id), Some(1));
        assert_eq!(store.turn_by_response_id("resp_2").unwrap(), None);
    }

    #[test]
    fn large_packs_and_messages_live_in_files_sled_holding_markers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        // 3,000 messages that compress poorly (hex), and one of 70 KB: both past SPILL_FROM.
        let texts: Vec<String> = (0..3000).map(|i| format!("m{i} {}", to_hex(&message_hash(&json!(i)).0))).collect();
        let big = "x".repeat(70_000);
        let mut all: Vec<&str> = texts.iter().map(String::as_str).collect();
        all.push(&big);
        let turn = draft(1, 1, &all, "ra", None);
        store.commit_turn(&turn).unwrap();
        let pack = store.t().unwrap().packs.get(id_key(1)).unwrap().unwrap();
        assert!(crate::spill::is_spilled(&pack) && pack.len() < 64, "sled holds a marker of {} bytes", pack.len());
        let (big_hash, _) = message_hash(&json!({"role": "user", "content": big}));
        assert!(crate::spill::is_spilled(&store.t().unwrap().messages.get(big_hash).unwrap().unwrap()));
        let files = |tree: &str| std::fs::read_dir(dir.path().join("spill").join(tree)).map_or(0, |d| d.count());
        assert_eq!((files("packs"), files("messages")), (1, 1));
        // Retention by size counts a spilled value at its file's length, not its marker's.
        let pack_file = std::fs::metadata(dir.path().join("spill/packs").join(crate::codec::hex_key(&id_key(1)))).unwrap().len();
        assert!(store.logical_size().unwrap() > pack_file + 70_000, "{} bytes counted", store.logical_size().unwrap());
        let expect = |store: &Store| {
            let values = store.turn_message_values(&store.turn(1).unwrap().unwrap()).unwrap();
            assert_eq!(values.len(), 3001);
            assert_eq!(values[7].1.as_ref().unwrap()["content"], texts[7].as_str());
            assert_eq!(values[3000].1.as_ref().unwrap()["content"], big.as_str());
        };
        expect(&store);
        assert_eq!(store.message_count(), 3002);
        assert!(store.check().unwrap().problems.is_empty());
        // Reopened, the same; a file no record names (a crash between file and marker) is swept.
        std::fs::write(dir.path().join("spill/packs").join(crate::codec::hex_key(&id_key(9))), b"orphan").unwrap();
        drop(store);
        // Inspected read-only (a private copy, spilled files linked or copied): the same, and the
        // original keeps its files (the copy's open swept only its own orphan).
        let copy = unlocked(|| Store::open_read_only(dir.path(), &StoreOptions::default()));
        expect(&copy);
        drop(copy);
        assert_eq!(files("packs"), 2, "the original untouched by the copy's sweep");
        let store = unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
        expect(&store);
        assert_eq!(files("packs"), 1, "the orphan went on open");
        // A missing file is damage that check names, not a silent gap.
        let pack_file = dir.path().join("spill/packs").join(crate::codec::hex_key(&id_key(1)));
        let saved = std::fs::read(&pack_file).unwrap();
        std::fs::remove_file(&pack_file).unwrap();
        let report = store.check().unwrap();
        assert!(report.problems.iter().any(|p| p.tree == "packs" && p.kind == crate::ProblemKind::Damaged), "{:?}", report.problems);
        std::fs::write(&pack_file, saved).unwrap();
        // Deleting the conversation removes its pack's file; retention's sweep the message's.
        store.delete_conversation(1).unwrap();
        assert_eq!(files("packs"), 0);
        store.sweep_messages().unwrap();
        assert_eq!(files("messages"), 0);
    }
}
