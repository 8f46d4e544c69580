//! The judging half of a check: from what was read, which turns still resolve, what becomes of each
//! conversation, which index entries name what is gone or are missing; and the plan that repairs
//! it (removals, then insertions), applied only by `Store::repair`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::scan::{Entry, Scanned};
use super::{readable_key, CheckReport, ConversationFate, Fate, Problem, ProblemKind};
use crate::codec::{self, encode, id_key, pair_key, trees};
use crate::hash::from_hex;
use crate::records::{BranchRef, ConversationRecord, Relation, TurnRecord};
use crate::{Store, StoreError};

/// What `repair` writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    remove: Vec<(&'static str, Vec<u8>)>,
    insert: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    /// Raise the id counters to the last checkpoint's marks (ids lost from the log stay unused).
    raise_counters: bool,
}

impl Plan {
    /// Removals, then insertions (`Store::repair` then checkpoints); returns how many of each were made.
    pub fn apply(&self, store: &Store) -> Result<(u64, u64), StoreError> {
        let mut removed = 0;
        for (tree, key) in &self.remove {
            let gone = store.db_tree(tree.as_bytes())?.remove(key)?;
            if let Some(value) = &gone {
                store.spill.remove(tree, key, value);
            }
            removed += u64::from(gone.is_some());
        }
        for (tree, key, value) in &self.insert {
            store.db_tree(tree.as_bytes())?.insert(key, value.as_slice())?;
        }
        if self.raise_counters {
            store.raise_counters_to_marks()?;
        }
        Ok((removed, self.insert.len() as u64))
    }

    fn remove(&mut self, tree: &'static str, key: &[u8]) {
        self.remove.push((tree, key.to_vec()));
    }

    fn insert(&mut self, tree: &'static str, key: &[u8], value: Vec<u8>) {
        self.insert.push((tree, key.to_vec(), value));
    }
}

/// Judges what was read and plans the repair.
pub(crate) fn judge(store: &Store, mut s: Scanned) -> Result<CheckReport, StoreError> {
    let mut plan = Plan::default();
    for (tree, key) in std::mem::take(&mut s.damaged) {
        plan.remove(tree, &key);
    }
    let mut problems = std::mem::take(&mut s.problems);
    let mut problem = |tree: &'static str, key: &[u8], kind: ProblemKind, detail: String| {
        problems.push(Problem { tree: tree.into(), key: readable_key(tree, key), kind, detail, repairable: true });
    };

    // 1. Turns whose message list resolves.
    let unresolved = unresolved_turns(&s);
    let mut kept: BTreeMap<u64, &TurnRecord> = BTreeMap::new();
    for (id, turn) in &s.turns {
        if let Some(reason) = unresolved.get(id) {
            problem(trees::TURNS, &id_key(*id), ProblemKind::Unresolvable, reason.clone());
            plan.remove(trees::TURNS, &id_key(*id));
            if s.packed.contains_key(id) {
                plan.remove(trees::PACKS, &id_key(*id));
            }
        } else {
            kept.insert(*id, turn);
        }
    }

    // 2. Each conversation: whole, cut back to its kept turns, rebuilt from them, or lost.
    let mut turns_of: BTreeMap<u64, Vec<&TurnRecord>> = BTreeMap::new();
    for turn in kept.values() {
        turns_of.entry(turn.conversation).or_default().push(turn);
    }
    let mut belonged: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (conversation, turn) in &s.conversation_turns {
        belonged.entry(*conversation).or_default().insert(*turn);
    }
    for (id, turn) in &s.turns {
        belonged.entry(turn.conversation).or_default().insert(*id);
    }
    let now = crate::clock::now_ms();
    let ids: BTreeSet<u64> = s.conversations.keys().chain(&s.damaged_conversations).chain(turns_of.keys()).copied().collect();
    let mut alive: BTreeMap<u64, ConversationRecord> = BTreeMap::new();
    let mut changed: BTreeSet<u64> = BTreeSet::new();
    let mut fates = Vec::new();
    let mut whole = 0;
    for id in ids {
        let turns = turns_of.get(&id).map_or(&[][..], Vec::as_slice);
        let all = belonged.get(&id).map_or(0, BTreeSet::len) as u64;
        let removed = all.saturating_sub(turns.len() as u64);
        let fate = |fate| ConversationFate { id, fate, turns_kept: turns.len() as u64, turns_removed: removed };
        let Some(last) = turns.last() else {
            if let Some(c) = s.conversations.get(&id) {
                let detail = format!("no turn of it is left (its last turn was {})", c.last_turn);
                problem(trees::CONVERSATIONS, &id_key(id), ProblemKind::Dangling, detail);
                plan.remove(trees::CONVERSATIONS, &id_key(id));
            }
            fates.push(fate(Fate::Lost));
            continue;
        };
        let (record, note) = match s.conversations.get(&id) {
            Some(c) if removed == 0 && c.last_turn == last.id => {
                whole += 1;
                alive.insert(id, c.clone());
                continue;
            }
            Some(c) if removed == 0 && kept.contains_key(&c.last_turn) => {
                // Every turn is there, but the record stops short of the last (a turn written without
                // its conversation record, as separate writes before one transaction per turn could).
                let later: Vec<String> = turns.iter().filter(|t| t.id > c.last_turn).map(|t| t.id.to_string()).collect();
                let detail = format!("its record stops at turn {}; later turn(s) {} are not counted in it", c.last_turn, later.join(", "));
                problem(trees::CONVERSATIONS, &id_key(id), ProblemKind::Missing, detail);
                whole += 1;
                let note =
                    format!("`ctxscope store check --repair` at {now} (Unix ms) moved this conversation's record forward to this turn");
                (moved_to(c.clone(), last, turns.len()), note)
            }
            Some(c) => {
                if c.last_turn != last.id && !kept.contains_key(&c.last_turn) {
                    let detail = format!("its last turn {} is gone; cut back to turn {}", c.last_turn, last.id);
                    problem(trees::CONVERSATIONS, &id_key(id), ProblemKind::Dangling, detail);
                }
                fates.push(fate(Fate::Cut));
                let mut gone: BTreeSet<u64> = belonged[&id].iter().filter(|t| !kept.contains_key(t)).copied().collect();
                if !kept.contains_key(&c.last_turn) {
                    gone.insert(c.last_turn);
                }
                let gone: Vec<String> = gone.iter().map(u64::to_string).collect();
                let note = format!(
                    "`ctxscope store check --repair` at {now} (Unix ms) cut this conversation: turn(s) {} were removed (damaged, or standing on damaged records)",
                    gone.join(", ")
                );
                (moved_to(c.clone(), last, turns.len()), note)
            }
            None => {
                fates.push(fate(Fate::Rebuilt));
                let why = if s.damaged_conversations.contains(&id) {
                    "the record was damaged"
                } else {
                    let detail = format!("turn(s) of it are stored ({} to {}) but its record is not", turns[0].id, last.id);
                    problem(trees::CONVERSATIONS, &id_key(id), ProblemKind::Missing, detail);
                    "the record was missing"
                };
                let name = s.names.iter().find(|(_, v)| *v == Some(id)).map(|(k, _)| String::from_utf8_lossy(k).into_owned());
                let note =
                    format!("`ctxscope store check --repair` at {now} (Unix ms) rebuilt this conversation's record from its turns ({why})");
                (rebuilt(id, name, turns), note)
            }
        };
        plan_moved_conversation(store, &s, &mut plan, &record, last, note)?;
        changed.insert(id);
        alive.insert(id, record);
    }

    // 3. Index entries naming turns, conversations and findings that are gone; entries missing.
    let listed: HashSet<(u64, u64)> = s.conversation_turns.iter().copied().collect();
    for (conversation, turn) in &s.conversation_turns {
        if kept.get(turn).is_none_or(|t| t.conversation != *conversation) {
            let key = pair_key(*conversation, *turn);
            problem(trees::CONVERSATION_TURNS, &key, ProblemKind::Dangling, format!("names turn {turn}, which is not there"));
            plan.remove(trees::CONVERSATION_TURNS, &key);
        }
    }
    for turn in kept.values().filter(|t| !listed.contains(&(t.conversation, t.id))) {
        let key = pair_key(turn.conversation, turn.id);
        problem(trees::CONVERSATION_TURNS, &key, ProblemKind::Missing, format!("turn {} is not in its conversation's turn list", turn.id));
        plan.insert(trees::CONVERSATION_TURNS, &key, Vec::new());
    }
    for (key, turn) in &s.packs {
        if !s.turns.contains_key(turn) {
            problem(trees::PACKS, key, ProblemKind::Dangling, format!("holds the messages of turn {turn}, which is not there"));
            plan.remove(trees::PACKS, key);
        }
    }
    for (key, entry) in &s.prefixes {
        if !kept.contains_key(&entry.turn) {
            problem(trees::PREFIXES, key, ProblemKind::Dangling, format!("names turn {}, which is not there", entry.turn));
            plan.remove(trees::PREFIXES, key);
        }
    }
    check_entries(&s.response_ids, trees::RESPONSE_IDS, "turn", |id| kept.contains_key(&id), &mut problem, &mut plan);
    // A moved conversation's ends and reply mark were replanned with it.
    let standing = |id: u64| alive.contains_key(&id) && !changed.contains(&id);
    for (entries, tree) in [(&s.ends, trees::ENDS), (&s.replies, trees::REPLIES)] {
        for (key, _) in entries.iter().filter(|(_, v)| v.is_some_and(|id| changed.contains(&id))) {
            plan.remove(tree, key);
        }
        let others: Vec<Entry> = entries.iter().filter(|(_, v)| !v.is_some_and(|id| changed.contains(&id))).cloned().collect();
        check_entries(&others, tree, "conversation", standing, &mut problem, &mut plan);
    }
    check_entries(&s.names, trees::NAMES, "conversation", |id| alive.contains_key(&id), &mut problem, &mut plan);
    let listing: HashSet<(u64, u64)> = s.by_updated.iter().copied().collect();
    for (updated, id) in &s.by_updated {
        let current = alive.get(id).is_some_and(|c| c.updated_unix_ms == *updated);
        if changed.contains(id) {
            plan.remove(trees::CONVERSATIONS_BY_UPDATED, &pair_key(*updated, *id));
        } else if !current {
            let key = pair_key(*updated, *id);
            problem(
                trees::CONVERSATIONS_BY_UPDATED,
                &key,
                ProblemKind::Dangling,
                format!("lists conversation {id}, which is not there (or not at that time)"),
            );
            plan.remove(trees::CONVERSATIONS_BY_UPDATED, &key);
        }
    }
    for c in alive.values().filter(|c| !changed.contains(&c.id) && !listing.contains(&(c.updated_unix_ms, c.id))) {
        let key = pair_key(c.updated_unix_ms, c.id);
        problem(trees::CONVERSATIONS_BY_UPDATED, &key, ProblemKind::Missing, format!("conversation {} is not in the listing", c.id));
        plan.insert(trees::CONVERSATIONS_BY_UPDATED, &key, Vec::new());
    }
    for (id, finding) in &s.findings {
        let gone = if !kept.contains_key(&finding.turn) {
            Some(format!("names turn {}, which is not there", finding.turn))
        } else {
            (!alive.contains_key(&finding.conversation)).then(|| format!("names conversation {}, which is not there", finding.conversation))
        };
        if let Some(detail) = gone {
            problem(trees::FINDINGS, &id_key(*id), ProblemKind::Dangling, detail);
            plan.remove(trees::FINDINGS, &id_key(*id));
        }
    }
    let surviving = |f: &u64| s.findings.get(f).is_some_and(|f| kept.contains_key(&f.turn) && alive.contains_key(&f.conversation));
    let indexed: HashSet<(u64, u64)> = s.conversation_findings.iter().copied().collect();
    for (conversation, finding) in &s.conversation_findings {
        if !surviving(finding) || s.findings[finding].conversation != *conversation {
            let key = pair_key(*conversation, *finding);
            problem(trees::CONVERSATION_FINDINGS, &key, ProblemKind::Dangling, format!("names finding {finding}, which is not there"));
            plan.remove(trees::CONVERSATION_FINDINGS, &key);
        }
    }
    for f in s.findings.values().filter(|f| surviving(&f.id) && !indexed.contains(&(f.conversation, f.id))) {
        let key = pair_key(f.conversation, f.id);
        problem(trees::CONVERSATION_FINDINGS, &key, ProblemKind::Missing, format!("finding {} is not in its conversation's index", f.id));
        plan.insert(trees::CONVERSATION_FINDINGS, &key, Vec::new());
    }

    // 4. Records the last checkpoint saw and sled's log no longer holds.
    if let Some(lost) = store.damage()? {
        problem("log", b"", ProblemKind::Lost, lost);
        plan.raise_counters = true;
    }

    Ok(CheckReport {
        records: s.records,
        problems,
        conversations_total: alive.len() as u64 + fates.iter().filter(|f| f.fate == Fate::Lost).count() as u64,
        conversations_whole: whole,
        conversations: fates,
        turns_total: (s.turns.len() + s.damaged_turns.len()) as u64,
        turns_kept: kept.len() as u64,
        plan,
        ..CheckReport::default()
    })
}

/// Turns whose message list does not resolve, with why: a message of theirs is gone, or the turn
/// they stand on (`base`) is gone or does not resolve.
fn unresolved_turns(s: &Scanned) -> HashMap<u64, String> {
    let mut state: HashMap<u64, Option<String>> = HashMap::new();
    for &start in s.turns.keys() {
        let mut stack = vec![start];
        let mut on_stack: HashSet<u64> = HashSet::from([start]);
        while let Some(&id) = stack.last() {
            if state.contains_key(&id) {
                stack.pop();
                on_stack.remove(&id);
                continue;
            }
            let Some(turn) = s.turns.get(&id) else {
                state.insert(id, Some(String::new()));
                continue;
            };
            let packed = s.packed.get(&id);
            let held = |h: &crate::Hash| s.messages.contains(h) || packed.is_some_and(|p| p.contains(h));
            let reply = turn.reply.as_ref().map(|hex| from_hex(hex).unwrap_or_default());
            // A turn captured without text (`--capture hashes`) holds none of its messages by design.
            let textless = turn.capture == crate::CaptureLevel::Hashes;
            let own = turn.new_messages.iter().chain(reply.iter()).find(|h| !textless && !held(h));
            let verdict = match (own, turn.base) {
                (Some(missing), _) => Some(format!("its message {} is not there", crate::to_hex(missing))),
                (None, None) => None,
                (None, Some(base)) => match state.get(&base.turn) {
                    Some(None) => None,
                    Some(Some(_)) => Some(format!("it stands on turn {}, which is gone or does not resolve", base.turn)),
                    None if on_stack.contains(&base.turn) => Some(format!("its base chain loops through turn {}", base.turn)),
                    None => {
                        stack.push(base.turn);
                        on_stack.insert(base.turn);
                        continue;
                    }
                },
            };
            state.insert(id, verdict);
        }
    }
    state.into_iter().filter_map(|(id, verdict)| Some((id, verdict?))).filter(|(id, _)| s.turns.contains_key(id)).collect()
}

/// Entries whose value is an id that must name a live record of `what`.
fn check_entries(
    entries: &[Entry],
    tree: &'static str,
    what: &str,
    live: impl Fn(u64) -> bool,
    problem: &mut impl FnMut(&'static str, &[u8], ProblemKind, String),
    plan: &mut Plan,
) {
    for (key, value) in entries {
        let detail = match value {
            None => Some("its value is not an id".to_string()),
            Some(id) if !live(*id) => Some(format!("names {what} {id}, which is not there")),
            Some(_) => None,
        };
        if let Some(detail) = detail {
            let kind = if value.is_none() { ProblemKind::Damaged } else { ProblemKind::Dangling };
            problem(tree, key, kind, detail);
            plan.remove(tree, key);
        }
    }
}

/// A conversation record moved back to `last`, its latest kept turn.
fn moved_to(mut c: ConversationRecord, last: &TurnRecord, turns: usize) -> ConversationRecord {
    c.turns = turns as u32;
    c.last_turn = last.id;
    c.last_head = last.head.clone();
    c.last_message_count = last.message_count;
    c.last_tail = last.tail.clone();
    c.last_reply = last.reply.clone();
    c.updated_unix_ms = last.time_unix_ms;
    c
}

/// A conversation record rebuilt from its turns (oldest first).
fn rebuilt(id: u64, name: Option<String>, turns: &[&TurnRecord]) -> ConversationRecord {
    let (first, last) = (turns[0], turns[turns.len() - 1]);
    let branch_of = match first.relation {
        Relation::Branch { conversation, turn, shared_messages } => Some(BranchRef { conversation, turn, shared_messages }),
        _ => None,
    };
    let record = ConversationRecord {
        id,
        name,
        created_unix_ms: first.time_unix_ms,
        updated_unix_ms: last.time_unix_ms,
        upstream: first.upstream.clone(),
        model: turns.iter().rev().find_map(|t| t.model.clone()),
        turns: 0,
        last_turn: 0,
        last_head: String::new(),
        last_message_count: 0,
        last_tail: None,
        branch_of,
        last_reply: None,
        capture: turns.iter().map(|t| t.capture).max().unwrap_or_default(),
    };
    moved_to(record, last, turns.len())
}

/// The writes that move a conversation to a new record: the record, its listing entry, its ends and
/// latest-reply mark, and the note on its last kept turn.
fn plan_moved_conversation(
    store: &Store,
    s: &Scanned,
    plan: &mut Plan,
    record: &ConversationRecord,
    last: &TurnRecord,
    note: String,
) -> Result<(), StoreError> {
    let key = id_key(record.id);
    plan.insert(trees::CONVERSATIONS, &key, encode(trees::CONVERSATIONS, &key, record)?);
    plan.insert(trees::CONVERSATIONS_BY_UPDATED, &pair_key(record.updated_unix_ms, record.id), Vec::new());
    for end in [Some(record.last_head.as_str()), record.last_tail.as_deref()].into_iter().flatten().filter_map(from_hex) {
        plan.insert(trees::ENDS, &end, key.to_vec());
    }
    if let Some(reply) = record.last_reply.as_deref().and_then(from_hex) {
        plan.insert(trees::REPLIES, &reply, key.to_vec());
    }
    // The full record (the scan kept it without its texts).
    let turn_key = id_key(last.id);
    let mut turn = store.turn(last.id)?.unwrap_or_else(|| s.turns[&last.id].clone());
    turn.notes.push(note);
    plan.insert(trees::TURNS, &turn_key, codec::encode_turn(&turn_key, &turn)?);
    Ok(())
}
