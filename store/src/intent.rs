//! Write intents: how a turn's many writes land all or nothing without a sled transaction. The
//! writes are computed first, as plain puts and removes whose conditions were already decided
//! against the store (the capture worker is the only writer of these trees), and recorded as one
//! framed record in `intents` under the turn's id: a single sled insert, atomic on its own. Then
//! they are applied in order and the intent removed. sled recovers a prefix of the writes made, so
//! after a crash either the intent is not there (and none of its writes are) or it is, and applying
//! it again from the start finishes the turn: every write is a put or a remove of a given value,
//! which gives the same result applied once or twice. Open and every commit apply what an earlier
//! one left (in id order, before anything newer).

use crate::codec::{self, trees};
use crate::{Store, StoreError};

/// The trees a turn writes, in a fixed numbering that intents record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Slot {
    Messages,
    Packs,
    Turns,
    ConversationTurns,
    ResponseIds,
    Prefixes,
    Conversations,
    ByUpdated,
    Names,
    Ends,
    Replies,
}

const SLOTS: [Slot; 11] = [
    Slot::Messages,
    Slot::Packs,
    Slot::Turns,
    Slot::ConversationTurns,
    Slot::ResponseIds,
    Slot::Prefixes,
    Slot::Conversations,
    Slot::ByUpdated,
    Slot::Names,
    Slot::Ends,
    Slot::Replies,
];

/// One write: `value` put under `key` in the slot's tree, or the key removed (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Op {
    slot: Slot,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
}

impl Op {
    pub fn put(slot: Slot, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Op {
        Op { slot, key: key.as_ref().to_vec(), value: Some(value.as_ref().to_vec()) }
    }

    pub fn remove(slot: Slot, key: impl AsRef<[u8]>) -> Op {
        Op { slot, key: key.as_ref().to_vec(), value: None }
    }
}

/// An intent's payload: per write, its slot, then the key and (for a put) the value, each as a
/// 4-byte big-endian length and the bytes; a remove's value length is `u32::MAX`.
fn encode(key: &[u8], ops: &[Op]) -> Vec<u8> {
    let size = ops.iter().map(|op| 9 + op.key.len() + op.value.as_ref().map_or(0, Vec::len)).sum();
    let mut payload = Vec::with_capacity(size);
    for op in ops {
        payload.push(op.slot as u8);
        payload.extend_from_slice(&(op.key.len() as u32).to_be_bytes());
        payload.extend_from_slice(&op.key);
        match &op.value {
            Some(value) => {
                payload.extend_from_slice(&(value.len() as u32).to_be_bytes());
                payload.extend_from_slice(value);
            }
            None => payload.extend_from_slice(&u32::MAX.to_be_bytes()),
        }
    }
    codec::frame(key, &payload)
}

fn decode(key: &[u8], bytes: &[u8]) -> Result<Vec<Op>, StoreError> {
    let bad = |detail: &str| codec::damaged(trees::INTENTS, key, detail.into());
    let mut rest = codec::unframe(trees::INTENTS, key, bytes)?;
    let mut take = |n: usize| -> Result<&[u8], StoreError> {
        let (head, tail) = rest.split_at_checked(n).ok_or_else(|| bad("intent cut short"))?;
        rest = tail;
        Ok(head)
    };
    let mut ops = Vec::new();
    loop {
        let Ok(slot) = take(1) else { break };
        let slot = *SLOTS.get(usize::from(slot[0])).ok_or_else(|| bad("unknown tree in an intent"))?;
        let len = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let key_len = len(take(4)?) as usize;
        let op_key = take(key_len)?.to_vec();
        let value = match len(take(4)?) {
            u32::MAX => None,
            n => Some(take(n as usize)?.to_vec()),
        };
        ops.push(Op { slot, key: op_key, value });
    }
    Ok(ops)
}

impl Store {
    fn slot_tree(trees: &crate::store::Trees, slot: Slot) -> &sled::Tree {
        match slot {
            Slot::Messages => &trees.messages,
            Slot::Packs => &trees.packs,
            Slot::Turns => &trees.turns,
            Slot::ConversationTurns => &trees.conversation_turns,
            Slot::ResponseIds => &trees.response_ids,
            Slot::Prefixes => &trees.prefixes,
            Slot::Conversations => &trees.conversations,
            Slot::ByUpdated => &trees.by_updated,
            Slot::Names => &trees.names,
            Slot::Ends => &trees.ends,
            Slot::Replies => &trees.replies,
        }
    }

    fn spill_large(&self, op: Op) -> Result<Op, StoreError> {
        let tree = match op.slot {
            Slot::Packs => trees::PACKS,
            Slot::Messages => trees::MESSAGES,
            _ => return Ok(op),
        };
        let Op { slot, key, value } = op;
        let value = value.map(|value| self.spill.put(tree, &key, value)).transpose()?;
        Ok(Op { slot, key, value })
    }

    fn apply(&self, ops: &[Op]) -> Result<(), StoreError> {
        let trees = self.t()?;
        for op in ops {
            let tree = Store::slot_tree(&trees, op.slot);
            match &op.value {
                Some(value) => tree.insert(&op.key, value.as_slice())?,
                None => tree.remove(&op.key)?,
            };
        }
        Ok(())
    }

    /// Records `ops` as the intent under `key`, applies them, and removes the intent (after
    /// finishing any an earlier write left). Large packs and messages go to their own files first
    /// (`spill`); the intent and sled hold their markers.
    pub(crate) fn write_intended(&self, key: &[u8], ops: Vec<Op>) -> Result<(), StoreError> {
        let t = self.t()?;
        self.finish_intents()?;
        let ops = ops.into_iter().map(|op| self.spill_large(op)).collect::<Result<Vec<_>, _>>()?;
        t.intents.insert(key, encode(key, &ops))?;
        self.apply(&ops)?;
        t.intents.remove(key)?;
        Ok(())
    }

    /// Applies every intent left by a write that did not finish (a crash, a failed write), oldest
    /// first; returns how many. One that cannot be read (damaged) is removed and reported: what it
    /// had applied, if anything, is left for `store check` to judge.
    pub(crate) fn finish_intents(&self) -> Result<usize, StoreError> {
        let t = self.t()?;
        let mut finished = 0;
        if t.intents.is_empty() {
            return Ok(finished);
        }
        for item in t.intents.iter() {
            let (key, value) = item?;
            match decode(&key, &value) {
                Ok(ops) => {
                    self.apply(&ops)?;
                    finished += 1;
                }
                Err(error) => tracing::error!(%error, "an unfinished turn's write intent is damaged; dropped it"),
            }
            t.intents.remove(&key)?;
        }
        Ok(finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::id_key;
    use crate::commit::tests::draft;
    use crate::test_support::unlocked;
    use crate::StoreOptions;

    #[test]
    fn an_intent_round_trips_and_damage_is_named() {
        let ops = vec![Op::put(Slot::Turns, id_key(3), b"turn"), Op::remove(Slot::Ends, [7u8; 32]), Op::put(Slot::Names, b"n", [])];
        let bytes = encode(&id_key(3), &ops);
        assert_eq!(decode(&id_key(3), &bytes).unwrap(), ops);
        for cut in [bytes.len() - 1, bytes.len() - 5, 9] {
            assert!(decode(&id_key(3), &codec::frame(&id_key(3), &codec::unframe("t", &id_key(3), &bytes).unwrap()[..cut - 5])).is_err());
        }
        let mut flipped = bytes.clone();
        flipped[8] ^= 1;
        assert!(matches!(decode(&id_key(3), &flipped), Err(StoreError::Damaged { tree: "intents", .. })));
        assert!(decode(&id_key(3), &codec::frame(&id_key(3), &[42, 0, 0, 0, 0, 0, 0, 0, 0])).is_err(), "no tree 42");
    }

    /// A crash after the intent was written and part of it applied: the next open finishes the turn,
    /// and the store is as if the commit had gone through.
    #[test]
    fn an_interrupted_turn_is_finished_on_open() {
        let whole = tempfile::tempdir().unwrap();
        let first = draft(1, 1, &["a"], "ra", None);
        let mut second = draft(1, 2, &["a", "ra", "b"], "rb", Some(crate::BaseRef { turn: 1, len: 2 }));
        second.conversation.turns = 2;
        {
            let store = Store::open(whole.path(), &StoreOptions::default()).unwrap();
            store.commit_turn(&first).unwrap();
            store.commit_turn(&second).unwrap();
            assert!(store.t().unwrap().intents.is_empty(), "a finished commit leaves no intent");
        }
        // The same two turns, the second cut short after half its writes: its intent stays behind.
        let replay = tempfile::tempdir().unwrap();
        {
            let store = Store::open(replay.path(), &StoreOptions::default()).unwrap();
            store.commit_turn(&first).unwrap();
            let ops = store.turn_ops(&second.commit()).unwrap();
            let intent = encode(&id_key(2), &ops);
            assert!(ops.len() > 6, "{ops:?}");
            store.t().unwrap().intents.insert(id_key(2), intent).unwrap();
            store.apply(&ops[..ops.len() / 2]).unwrap();
            store.flush().unwrap();
        }
        let store = unlocked(|| Store::open(replay.path(), &StoreOptions::default()));
        assert!(store.t().unwrap().intents.is_empty(), "open finished the intent");
        let expected = unlocked(|| Store::open(whole.path(), &StoreOptions::default()));
        for slot in SLOTS {
            let ours: Vec<_> = Store::slot_tree(&store.t().unwrap(), slot).iter().flatten().collect();
            let theirs: Vec<_> = Store::slot_tree(&expected.t().unwrap(), slot).iter().flatten().collect();
            assert_eq!(ours, theirs, "{slot:?}");
        }
        assert!(store.check().unwrap().problems.is_empty());
    }
}
