//! A turn's full message list and the messages' content. A turn stores only what it added past its
//! base (`base` names an earlier turn and how many of its messages, reply included, come first), so
//! its list is resolved by walking the base chain. A message's content is in the pack of the turn
//! that added it (`pack::encode_pack`), or stored once by hash in `messages` (a large message, an
//! imported one, or one written before packs).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::codec::{self, id_key, trees};
use crate::hash::{from_hex, to_hex, Hash};
use crate::records::{ConversationDetail, TurnRecord, TurnView};
use crate::{Store, StoreError};

/// Resolves turns against one store, remembering the turns it has resolved (and, when asked for
/// content, the packed messages of every turn it walked through).
pub(crate) struct Resolver<'s> {
    store: &'s Store,
    /// Each resolved turn's messages followed by its reply.
    lists: HashMap<u64, Vec<Hash>>,
    /// Canonical JSON of packed messages read so far; `None`: the caller wants hashes only.
    packed: Option<HashMap<Hash, Vec<u8>>>,
}

impl<'s> Resolver<'s> {
    pub fn new(store: &'s Store, with_content: bool) -> Resolver<'s> {
        Resolver { store, lists: HashMap::new(), packed: with_content.then(HashMap::new) }
    }

    /// Hashes of a turn's request messages.
    pub fn messages(&mut self, turn: &TurnRecord) -> Result<Vec<Hash>, StoreError> {
        // Walk the base chain iteratively: collect ancestors until one is resolved or has no base.
        let mut stack = vec![turn.clone()];
        loop {
            let top = stack.last().map(|t| t.base).unwrap_or(None);
            match top {
                Some(base) if !self.lists.contains_key(&base.turn) => {
                    if stack.len() > 100_000 {
                        return Err(StoreError::Corrupt { path: self.store.path().to_path_buf(), detail: "turn base chain loops".into() });
                    }
                    let parent = self.store.turn(base.turn)?.ok_or_else(|| StoreError::NotFound(format!("turn {}", base.turn)))?;
                    stack.push(parent);
                }
                _ => break,
            }
        }
        let mut result = Vec::new();
        while let Some(t) = stack.pop() {
            self.read_pack(&t)?;
            let mut messages = match t.base {
                Some(base) => self.lists.get(&base.turn).map(|p| p[..p.len().min(base.len as usize)].to_vec()).unwrap_or_default(),
                None => Vec::new(),
            };
            messages.extend_from_slice(&t.new_messages);
            result.clone_from(&messages);
            messages.extend(t.reply.as_deref().and_then(from_hex));
            self.lists.insert(t.id, messages);
        }
        Ok(result)
    }

    /// The content of a message of a turn resolved before (`None`: not stored).
    pub fn content(&self, hash: &Hash) -> Result<Option<Value>, StoreError> {
        match self.packed.as_ref().and_then(|p| p.get(hash)) {
            Some(json) => serde_json::from_slice(json).map(Some).map_err(|source| StoreError::Decode {
                kind: trees::PACKS,
                key: to_hex(hash),
                source,
            }),
            None => self.store.message(hash),
        }
    }

    /// Remembers the packed messages of `turn` (its new messages, then its reply), when content is wanted.
    fn read_pack(&mut self, turn: &TurnRecord) -> Result<(), StoreError> {
        let Some(packed) = self.packed.as_mut() else { return Ok(()) };
        let key = id_key(turn.id);
        let Some(bytes) = self.store.value(&self.store.t()?.packs, trees::PACKS, &key)? else { return Ok(()) };
        let pack = crate::pack::decode_pack(&key, &bytes)?;
        let hashes: Vec<Hash> = turn.new_messages.iter().copied().chain(turn.reply.as_deref().and_then(from_hex)).collect();
        if pack.len() != hashes.len() {
            let detail = format!("holds {} messages, its turn added {}", pack.len(), hashes.len());
            return Err(StoreError::Damaged { tree: trees::PACKS, key: codec::hex_key(&key), detail });
        }
        for (hash, entry) in hashes.into_iter().zip(pack.entries()) {
            if let Some(json) = entry {
                packed.entry(hash).or_insert_with(|| json.to_vec());
            }
        }
        Ok(())
    }
}

impl Store {
    /// Hashes of a turn's request messages, resolved through its `base` chain.
    pub fn turn_messages(&self, turn: &TurnRecord) -> Result<Vec<Hash>, StoreError> {
        Resolver::new(self, false).messages(turn)
    }

    /// A turn's request messages with their canonical content (`None` where a message is not stored).
    pub fn turn_message_values(&self, turn: &TurnRecord) -> Result<Vec<(Hash, Option<Value>)>, StoreError> {
        let mut resolver = Resolver::new(self, true);
        let hashes = resolver.messages(turn)?;
        hashes.into_iter().map(|hash| Ok((hash, resolver.content(&hash)?))).collect()
    }

    /// A turn's history as the next request should carry it: its request messages, then its reply,
    /// with their canonical content (`None` where a message is not stored).
    pub fn turn_history(&self, turn: &TurnRecord) -> Result<Vec<(Hash, Option<Value>)>, StoreError> {
        let mut resolver = Resolver::new(self, true);
        let hashes = resolver.messages(turn)?;
        let reply = turn.reply.as_deref().and_then(from_hex);
        hashes.into_iter().chain(reply).map(|hash| Ok((hash, resolver.content(&hash)?))).collect()
    }

    /// A conversation with every turn's message list and every referenced message.
    pub fn conversation_detail(&self, id: u64) -> Result<ConversationDetail, StoreError> {
        let conversation = self.conversation(id)?.ok_or_else(|| StoreError::NotFound(format!("conversation {id}")))?;
        let mut resolver = Resolver::new(self, true);
        let mut turns = Vec::new();
        let mut messages = BTreeMap::new();
        for turn_id in self.conversation_turn_ids(id)? {
            let Some(turn) = self.turn(turn_id)? else { continue };
            let list = resolver.messages(&turn)?;
            for hash in list.iter().copied().chain(turn.reply.as_deref().and_then(from_hex)) {
                if let std::collections::btree_map::Entry::Vacant(slot) = messages.entry(to_hex(&hash)) {
                    slot.insert(resolver.content(&hash)?.unwrap_or(Value::Null));
                }
            }
            turns.push(TurnView { turn, messages: list.iter().map(to_hex).collect() });
        }
        let findings = self.conversation_findings(id)?;
        Ok(ConversationDetail { conversation, turns, messages, findings })
    }
}
