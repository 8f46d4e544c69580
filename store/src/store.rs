//! Opening the sled directory (schema and foreign-directory checks) and typed access to each tree.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::codec::{self, decode, encode, id_key, pair_key, trees};
use crate::hash::{to_hex, Hash};
use crate::records::*;
use crate::StoreError;

/// Bumped whenever a record's meaning or encoding changes incompatibly. 2: values framed with a
/// checksum (`codec`); a version 1 store opens and is marked 2 (its bare-JSON records still decode),
/// while a release that knows only 1 refuses a version 2 store instead of misreading it. 3: turns in
/// the binary layout with their messages packed (`codec::encode_turn`, `codec::encode_pack` then) and
/// prefix entries sampled (`prefixes`); older stores open and are marked 3, their records still read.
/// 4: packs LZ4-compressed and turn records leaving their packed messages' hashes to the pack
/// (`pack`, `codec::FRAME_TURN_V3`), formats a version 3 release would take for damage. 5: large
/// packs and messages in files of their own, sled holding a marker (`spill`).
pub const SCHEMA_VERSION: u32 = 5;
/// The oldest schema this release opens (and upgrades in place).
const OLDEST_READABLE: u32 = 1;

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// sled flushes its write buffer at least this often; a crash loses at most this much.
    pub flush_every_ms: u64,
    /// sled page cache size.
    pub cache_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { flush_every_ms: 500, cache_bytes: 64 << 20 }
    }
}

/// The capture store. Cheap to clone; all clones share one sled database, which [`Store::reopen`]
/// can replace under all of them (after a write error sled keeps failing until reopened).
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    options: StoreOptions,
    /// sled's trees; `None` while a reopen has closed sled and not yet opened it again.
    live: Arc<RwLock<Option<Arc<Trees>>>>,
    /// Large packs and messages, each in its own file (`spill`).
    pub(crate) spill: crate::spill::Spill,
    /// The record journal (`journal`); `None` for an inspection copy, which never appends to it.
    pub(crate) journal: Option<Arc<crate::journal::Journal>>,
    /// What open put back from the journal: (turns, findings).
    restored_on_open: (u64, u64),
}

/// One open sled database and its trees.
pub(crate) struct Trees {
    pub db: sled::Db,
    pub meta: sled::Tree,
    pub messages: sled::Tree,
    pub turns: sled::Tree,
    pub packs: sled::Tree,
    pub conversations: sled::Tree,
    pub conversation_turns: sled::Tree,
    pub prefixes: sled::Tree,
    pub ends: sled::Tree,
    pub names: sled::Tree,
    pub replies: sled::Tree,
    pub findings: sled::Tree,
    pub finding_causes: sled::Tree,
    pub conversation_findings: sled::Tree,
    pub replays: sled::Tree,
    pub by_updated: sled::Tree,
    pub response_ids: sled::Tree,
    pub intents: sled::Tree,
}

impl Trees {
    fn open(path: &Path, options: &StoreOptions) -> Result<Trees, StoreError> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(options.cache_bytes)
            .flush_every_ms(Some(options.flush_every_ms.max(1)))
            .open()
            .map_err(|source| match source {
                sled::Error::Corruption { .. } => StoreError::Corrupt { path: path.to_path_buf(), detail: source.to_string() },
                // What sled says of a damaged `conf` (this store never used a sled that old).
                sled::Error::Unsupported(detail) => StoreError::Corrupt { path: path.to_path_buf(), detail },
                source if crate::error::is_disk_full(&source) => StoreError::DiskFull { path: path.to_path_buf() },
                source => StoreError::Open { path: path.to_path_buf(), source },
            })?;
        let tree = |name: &str| db.open_tree(name);
        Ok(Trees {
            meta: tree(trees::META)?,
            messages: tree(trees::MESSAGES)?,
            turns: tree(trees::TURNS)?,
            packs: tree(trees::PACKS)?,
            conversations: tree(trees::CONVERSATIONS)?,
            conversation_turns: tree(trees::CONVERSATION_TURNS)?,
            prefixes: tree(trees::PREFIXES)?,
            ends: tree(trees::ENDS)?,
            names: tree(trees::NAMES)?,
            replies: tree(trees::REPLIES)?,
            findings: tree(trees::FINDINGS)?,
            finding_causes: tree(trees::FINDING_CAUSES)?,
            conversation_findings: tree(trees::CONVERSATION_FINDINGS)?,
            replays: tree(trees::REPLAYS)?,
            by_updated: tree(trees::CONVERSATIONS_BY_UPDATED)?,
            response_ids: tree(trees::RESPONSE_IDS)?,
            intents: tree(trees::INTENTS)?,
            db,
        })
    }
}

/// The kinds of record that number their own ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSpace {
    Conversation,
    Turn,
    Finding,
}

impl IdSpace {
    pub(crate) fn key(self) -> &'static [u8] {
        match self {
            IdSpace::Conversation => b"next_id/conversation",
            IdSpace::Turn => b"next_id/turn",
            IdSpace::Finding => b"next_id/finding",
        }
    }
}

impl Store {
    /// Opens (creating if needed) the store at `path`, putting back from the record journal what
    /// sled lost (`journal`).
    pub fn open(path: &Path, options: &StoreOptions) -> Result<Store, StoreError> {
        Store::open_with(path, options, true, true)
    }

    /// Opens the store with no record journal (benchmarks: what the journal costs a commit).
    #[cfg(any(test, feature = "test-support"))]
    pub fn open_without_journal(path: &Path, options: &StoreOptions) -> Result<Store, StoreError> {
        Store::open_with(path, options, false, false)
    }

    /// Opens the store as it is, sled's losses not yet put back (`store check --repair`, which
    /// reports them first).
    pub fn open_unrecovered(path: &Path, options: &StoreOptions) -> Result<Store, StoreError> {
        Store::open_with(path, options, true, false)
    }

    /// Opens the store; `journal_writes` false for an inspection copy, whose journal segments are
    /// links to the original's and are only read; `recover` false to leave sled as it was found.
    pub(crate) fn open_with(path: &Path, options: &StoreOptions, journal_writes: bool, recover: bool) -> Result<Store, StoreError> {
        check_not_foreign(path)?;
        let store = Store {
            path: path.to_path_buf(),
            options: options.clone(),
            live: Arc::new(RwLock::new(Some(Arc::new(Trees::open(path, options)?)))),
            spill: crate::spill::Spill::new(path),
            journal: None,
            restored_on_open: (0, 0),
        };
        store.check_schema()?;
        store.finish_intents()?;
        for (name, tree) in [(trees::PACKS, &store.t()?.packs), (trees::MESSAGES, &store.t()?.messages)] {
            let swept = store.spill.sweep(name, tree)?;
            if swept > 0 {
                tracing::info!(swept, tree = name, "removed spilled values no record names (an interrupted write or removal)");
            }
        }
        store.init_id_counters()?;
        store.backfill_updated_index()?;
        let mut store = store;
        if !(recover || journal_writes) {
            // Opened as found and never appended to: the journal is not read (a check reads it).
            return Ok(store);
        }
        let scan = crate::journal::restore::JournalScan::read(path)?;
        if recover {
            let restored = store.recover(&scan)?;
            store.restored_on_open = (restored.turns, restored.findings);
        }
        if journal_writes {
            let journal = Arc::new(crate::journal::Journal::open(path, &scan));
            crate::journal::Journal::spawn_syncer(&journal, std::time::Duration::from_millis(options.flush_every_ms.max(1)));
            store.journal = Some(journal);
        }
        Ok(store)
    }

    /// Each id space's counter starts at 0 in a new store; in one written before the spaces had their
    /// own counters, above every id the shared counter handed out.
    fn init_id_counters(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        let empty = t.turns.is_empty() && t.findings.is_empty() && t.conversations.is_empty();
        for space in [IdSpace::Conversation, IdSpace::Turn, IdSpace::Finding] {
            if t.meta.get(space.key())?.is_none() {
                let floor = if empty { 0 } else { t.db.generate_id()? + 1 };
                t.meta.insert(space.key(), &floor.to_be_bytes())?;
            }
        }
        Ok(())
    }

    fn check_schema(&self) -> Result<(), StoreError> {
        let t = self.t()?;
        match t.meta.get(codec::SCHEMA_KEY)? {
            Some(bytes) => {
                let found = bytes
                    .as_ref()
                    .try_into()
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Corrupt { path: self.path.clone(), detail: "schema version record is malformed".into() })?;
                if !(OLDEST_READABLE..=SCHEMA_VERSION).contains(&found) {
                    return Err(StoreError::Schema { path: self.path.clone(), found, expected: SCHEMA_VERSION });
                }
                if found != SCHEMA_VERSION {
                    t.meta.insert(codec::SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
                }
            }
            None if t.turns.is_empty() && t.messages.is_empty() => {
                t.meta.insert(codec::SCHEMA_KEY, &SCHEMA_VERSION.to_be_bytes())?;
                t.db.flush()?;
            }
            None => return Err(StoreError::Corrupt { path: self.path.clone(), detail: "records without a schema version".into() }),
        }
        Ok(())
    }

    /// sled's trees as they are now; an error while a reopen has sled closed.
    pub(crate) fn t(&self) -> Result<Arc<Trees>, StoreError> {
        match &*self.live.read().unwrap_or_else(|p| p.into_inner()) {
            Some(trees) => Ok(trees.clone()),
            None => Err(StoreError::Reopening { path: self.path.clone() }),
        }
    }

    /// Closes sled and opens it again, under every clone of this store: sled 0.34 keeps the first I/O
    /// error its log writer meets (a full disk) and fails every later call until reopened. Waits up to
    /// `wait` for calls in flight to let go of the old database; if they do not, or sled cannot open
    /// (the disk still full), the store is left closed and the error returned: calling this again
    /// later retries. The journal and spilled files are not sled's and stay as they are.
    pub fn reopen(&self, wait: std::time::Duration) -> Result<(), StoreError> {
        let deadline = std::time::Instant::now() + wait;
        let mut slot = self.live.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            // Calls in flight hold the old trees; they finish without this lock.
            let mut old = old;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(trees) => {
                        drop(trees);
                        break;
                    }
                    Err(shared) if std::time::Instant::now() < deadline => {
                        old = shared;
                        drop(slot);
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        slot = self.live.write().unwrap_or_else(|p| p.into_inner());
                        if slot.is_some() {
                            return Ok(());
                        }
                    }
                    Err(shared) => {
                        *slot = Some(shared);
                        return Err(StoreError::Reopening { path: self.path.clone() });
                    }
                }
            }
        }
        // sled lets go of its lock file a moment after the last handle drops.
        loop {
            match Trees::open(&self.path, &self.options) {
                Ok(trees) => {
                    *slot = Some(Arc::new(trees));
                    break;
                }
                Err(StoreError::Open { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(error) => return Err(error),
            }
        }
        drop(slot);
        self.finish_intents()?;
        tracing::info!(path = %self.path.display(), "reopened the capture store");
        Ok(())
    }

    /// Whether sled is open (false after a reopen that could not open it again).
    pub fn is_open(&self) -> bool {
        self.live.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The turns and findings sled had lost that open put back from the record journal.
    pub fn restored_on_open(&self) -> (u64, u64) {
        self.restored_on_open
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next id of one kind of record: conversations, turns and findings each count 1, 2, 3, ...
    /// (persisted across restarts). A store written before the kinds had their own counters goes on
    /// above every id it used.
    pub fn next_id_in(&self, space: IdSpace) -> Result<u64, StoreError> {
        let key = space.key();
        let next = self.t()?.meta.update_and_fetch(key, |old| {
            let old = old.and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_be_bytes);
            Some((old + 1).to_be_bytes().to_vec())
        })?;
        let bytes = next.as_deref().and_then(|b| <[u8; 8]>::try_from(b).ok());
        bytes.map(u64::from_be_bytes).ok_or_else(|| StoreError::Corrupt {
            path: self.path.clone(),
            detail: format!("id counter {} is not 8 bytes", String::from_utf8_lossy(key)),
        })
    }

    /// Stores a canonical message once; returns whether it was new.
    pub fn put_message(&self, hash: &Hash, canonical_json: &[u8]) -> Result<bool, StoreError> {
        let t = self.t()?;
        if t.messages.contains_key(hash)? {
            return Ok(false);
        }
        let value = self.spill.put(trees::MESSAGES, hash, codec::frame(hash, canonical_json))?;
        let previous = t.messages.compare_and_swap(hash, None as Option<&[u8]>, Some(value))?;
        Ok(previous.is_ok())
    }

    pub fn message(&self, hash: &Hash) -> Result<Option<Value>, StoreError> {
        let Some(value) = self.value(&self.t()?.messages, trees::MESSAGES, hash)? else { return Ok(None) };
        codec::decode(trees::MESSAGES, hash, &value).map(Some)
    }

    /// The value under `key` in `tree` (packs or messages), a spilled one read from its file.
    pub(crate) fn value(&self, tree: &sled::Tree, name: &'static str, key: &[u8]) -> Result<Option<crate::spill::Value>, StoreError> {
        tree.get(key)?.map(|value| self.spill.load(name, key, value)).transpose()
    }

    /// Messages stored: those stored by hash, and those packed into their turns' records (a message
    /// packed by two turns counts twice).
    pub fn message_count(&self) -> usize {
        let Ok(t) = self.t() else { return 0 };
        let packed = t.packs.iter().flatten().map(|(key, value)| {
            let value = self.spill.load(trees::PACKS, &key, value);
            value.and_then(|value| crate::pack::decode_pack(&key, &value)).map_or(0, |p| p.entries().flatten().count())
        });
        t.messages.len() + packed.sum::<usize>()
    }

    /// Writes a turn whose messages are already stored by hash ([`Store::put_message`]; import).
    pub fn put_turn(&self, turn: &TurnRecord) -> Result<(), StoreError> {
        let t = self.t()?;
        let key = id_key(turn.id);
        t.turns.insert(key, codec::encode_turn(&key, turn)?)?;
        t.conversation_turns.insert(pair_key(turn.conversation, turn.id), &[])?;
        Ok(())
    }

    pub fn turn(&self, id: u64) -> Result<Option<TurnRecord>, StoreError> {
        let key = id_key(id);
        self.t()?.turns.get(key)?.map(|bytes| self.decode_turn(&key, &bytes)).transpose()
    }

    /// A turn record read from `turns`, with its pack when its layout leaves hashes to it.
    pub(crate) fn decode_turn(&self, key: &[u8], bytes: &[u8]) -> Result<TurnRecord, StoreError> {
        if !codec::needs_pack(bytes) {
            return codec::decode_turn(key, bytes, None::<std::iter::Empty<_>>);
        }
        let pack = self.value(&self.t()?.packs, trees::PACKS, key)?.map(|value| crate::pack::decode_pack(key, &value)).transpose()?;
        codec::decode_turn(key, bytes, pack.as_ref().map(crate::pack::Pack::entries))
    }

    pub fn put_conversation(&self, conversation: &ConversationRecord) -> Result<(), StoreError> {
        let key = id_key(conversation.id);
        let previous = self.t()?.conversations.insert(key, encode(trees::CONVERSATIONS, &key, conversation)?)?;
        self.index_updated(previous.as_deref(), conversation)?;
        if let Some(name) = &conversation.name {
            self.t()?.names.insert(name.as_bytes(), &id_key(conversation.id))?;
        }
        Ok(())
    }

    pub fn conversation(&self, id: u64) -> Result<Option<ConversationRecord>, StoreError> {
        get(&self.t()?.conversations, trees::CONVERSATIONS, &id_key(id))
    }

    /// The conversation a header named, if it exists.
    pub fn conversation_by_name(&self, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.t()?.names.get(name.as_bytes())?.and_then(|v| codec::key_id(&v)))
    }

    /// All conversations, most recently updated first.
    pub fn conversations(&self) -> Result<Vec<ConversationRecord>, StoreError> {
        let mut all = Vec::new();
        for item in self.t()?.conversations.iter() {
            let (key, value) = item?;
            all.push(decode::<ConversationRecord>(trees::CONVERSATIONS, &key, &value)?);
        }
        all.sort_by(|a, b| b.updated_unix_ms.cmp(&a.updated_unix_ms).then(b.id.cmp(&a.id)));
        Ok(all)
    }

    /// Turn ids of a conversation in order.
    pub fn conversation_turn_ids(&self, conversation: u64) -> Result<Vec<u64>, StoreError> {
        let mut ids = Vec::new();
        for item in self.t()?.conversation_turns.scan_prefix(id_key(conversation)) {
            let (key, _) = item?;
            if let Some(id) = key.get(8..16).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// The conversation whose latest turn ends (head or tail) at this chain hash: a request extending
    /// it continues that conversation. Kept by [`Store::commit_turn`].
    pub fn end(&self, chain: &Hash) -> Result<Option<u64>, StoreError> {
        marked(&self.t()?.ends, chain)
    }

    /// The conversation whose latest reply this message is. Kept by [`Store::commit_turn`].
    pub fn reply_of(&self, message: &Hash) -> Result<Option<u64>, StoreError> {
        marked(&self.t()?.replies, message)
    }

    /// The turn that produced a Responses API response id, when it was captured (and not since removed).
    pub fn turn_by_response_id(&self, response_id: &str) -> Result<Option<TurnRecord>, StoreError> {
        match self.t()?.response_ids.get(response_id.as_bytes())?.and_then(|v| codec::key_id(&v)) {
            Some(id) => self.turn(id),
            None => Ok(None),
        }
    }

    /// Deletes every message stored by hash that no remaining turn references; returns how many went.
    /// (A turn's packed messages go with the turn.)
    pub fn sweep_messages(&self) -> Result<usize, StoreError> {
        let t = self.t()?;
        let mut live = std::collections::HashSet::new();
        for item in t.turns.iter() {
            let (key, value) = item?;
            let turn = self.decode_turn(&key, &value)?;
            live.extend(turn.new_messages);
            live.extend(turn.reply.as_deref().and_then(crate::from_hex));
        }
        let mut removed = 0;
        for item in t.messages.iter() {
            let (key, value) = item?;
            if !Hash::try_from(&key[..]).is_ok_and(|hash| live.contains(&hash)) {
                t.messages.remove(&key)?;
                self.spill.remove(trees::MESSAGES, &key, &value);
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Forces buffered writes to disk: the journal's, then sled's.
    pub fn flush(&self) -> Result<(), StoreError> {
        if let Some(journal) = &self.journal {
            journal.sync()?;
        }
        self.flush_sled()
    }

    pub(crate) fn flush_sled(&self) -> Result<(), StoreError> {
        self.t()?.db.flush()?;
        Ok(())
    }

    pub fn size_on_disk(&self) -> u64 {
        self.t().map_or(0, |t| t.db.size_on_disk().unwrap_or(0)) + self.spill.bytes()
    }

    /// Hex of a hash, re-exported for callers building records.
    pub fn hex(hash: &Hash) -> HashHex {
        to_hex(hash)
    }
}

pub(crate) fn get<T: serde::de::DeserializeOwned>(tree: &sled::Tree, name: &'static str, key: &[u8]) -> Result<Option<T>, StoreError> {
    match tree.get(key)? {
        Some(bytes) => Ok(Some(decode(name, key, &bytes)?)),
        None => Ok(None),
    }
}

fn marked(tree: &sled::Tree, key: &Hash) -> Result<Option<u64>, StoreError> {
    Ok(tree.get(key)?.and_then(|v| codec::key_id(&v)))
}

/// A directory that holds files but no sled database is someone else's: refuse it.
fn check_not_foreign(path: &Path) -> Result<(), StoreError> {
    if path.is_file() {
        return Err(StoreError::Foreign { path: path.to_path_buf() });
    }
    let Ok(mut entries) = std::fs::read_dir(path) else { return Ok(()) };
    let non_empty = entries.next().is_some();
    let ours = ["conf", "db", crate::journal::JOURNAL_DIR, crate::MARKS_FILE].iter().any(|name| path.join(name).exists());
    if non_empty && !ours {
        return Err(StoreError::Foreign { path: path.to_path_buf() });
    }
    Ok(())
}

impl Store {
    pub(crate) fn db_tree_names(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.t()?.db.tree_names().into_iter().map(|n| n.to_vec()).collect())
    }

    pub(crate) fn db_tree(&self, name: &[u8]) -> Result<sled::Tree, StoreError> {
        Ok(self.t()?.db.open_tree(name)?)
    }
}
