//! `check` and `repair` on stores damaged on purpose: a flipped byte in a record, a dangling index
//! entry, records lost from the log; what is reported, what a repair keeps, and that a second check
//! is clean.

use super::*;
use crate::codec::{id_key, trees};
use crate::commit::tests::draft;
use crate::records::{BaseRef, Relation};
use crate::{StoreOptions, TurnDraft};

/// Conversation 1: turns 1, 2, 3 (each extending the one before). Conversation 2: turn 4.
fn store_with_two_conversations(dir: &std::path::Path) -> (Store, Vec<TurnDraft>) {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    let mut drafts = vec![draft(1, 1, &["a"], "ra", None)];
    let mut second = draft(1, 2, &["a", "ra", "b"], "rb", Some(BaseRef { turn: 1, len: 2 }));
    second.turn.relation = Relation::Extend { parent_turn: 1 };
    second.conversation.turns = 2;
    drafts.push(second);
    let mut third = draft(1, 3, &["a", "ra", "b", "rb", "c"], "rc", Some(BaseRef { turn: 2, len: 4 }));
    third.turn.relation = Relation::Extend { parent_turn: 2 };
    third.conversation.turns = 3;
    drafts.push(third);
    drafts.push(draft(2, 4, &["other"], "r-other", None));
    for d in &drafts {
        store.commit_turn(d).unwrap();
    }
    (store, drafts)
}

/// Removes the record journal, as for a store written before it: what `check` and `repair` do with
/// sled alone.
fn without_journal(dir: &std::path::Path) {
    std::fs::remove_dir_all(dir.join(crate::JOURNAL_DIR)).unwrap();
}

fn flip_byte(store: &Store, tree: &str, key: &[u8]) {
    let tree = store.db_tree(tree.as_bytes()).unwrap();
    let mut value = tree.get(key).unwrap().unwrap().to_vec();
    let at = value.len() - 2;
    value[at] ^= 0x04;
    tree.insert(key, value).unwrap();
}

/// After a repair without the journal: the conversations named lost turns, each recorded as a loss
/// (the only problem left) until acknowledged.
fn only_losses_of(store: &Store, conversations: &[u64]) {
    let again = store.check().unwrap();
    assert!(again.problems.iter().all(|p| p.tree == "losses"), "{:?}", again.problems);
    let named: Vec<u64> = again.losses.iter().flat_map(|l| l.conversations.clone()).collect();
    assert_eq!(named, conversations);
    store.acknowledge_losses(&[]).unwrap();
    let again = store.check().unwrap();
    assert!(again.is_clean(), "{:?}", again.problems);
}

#[test]
fn a_clean_store_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    let report = store.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!((report.conversations_total, report.conversations_whole), (2, 2));
    assert_eq!((report.turns_total, report.turns_kept), (4, 4));
    assert_eq!(report.records["turns"], 4);
}

#[test]
fn a_damaged_turn_cuts_its_conversation_and_repair_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (store, drafts) = store_with_two_conversations(dir.path());
    flip_byte(&store, trees::TURNS, &id_key(2));

    without_journal(dir.path());
    let report = store.check().unwrap();
    let damaged: Vec<_> = report.problems.iter().filter(|p| p.kind == ProblemKind::Damaged).collect();
    assert_eq!(damaged.len(), 1, "{:?}", report.problems);
    assert_eq!((damaged[0].tree.as_str(), damaged[0].key.as_str()), ("turns", "2"));
    assert!(damaged[0].detail.contains("checksum mismatch"), "{}", damaged[0].detail);
    // Turn 3 stands on turn 2: it no longer resolves.
    assert!(report.problems.iter().any(|p| p.kind == ProblemKind::Unresolvable && p.key == "3"), "{:?}", report.problems);
    assert!(report.problems.iter().any(|p| p.tree == "prefixes" && p.kind == ProblemKind::Dangling));
    assert_eq!(report.conversations, vec![ConversationFate { id: 1, fate: Fate::Cut, turns_kept: 1, turns_removed: 2 }]);
    assert_eq!((report.conversations_whole, report.turns_kept), (1, 2));
    // A check writes nothing.
    assert!(matches!(store.turn(2), Err(StoreError::Damaged { .. })));

    let repaired = store.repair(report).unwrap();
    assert!(repaired.repaired);
    only_losses_of(&store, &[1]);
    let cut = store.conversation(1).unwrap().unwrap();
    assert_eq!((cut.turns, cut.last_turn, cut.last_head.as_str()), (1, 1, drafts[0].turn.head.as_str()));
    let detail = store.conversation_detail(1).unwrap();
    assert_eq!(detail.turns.len(), 1);
    assert!(
        detail.turns[0].turn.notes.iter().any(|n| n.contains("cut this conversation") && n.contains("2, 3")),
        "{:?}",
        detail.turns[0].turn.notes
    );
    // The next request extending turn 1 threads back onto the cut conversation.
    assert_eq!(store.end(&drafts[0].tail.unwrap()).unwrap(), Some(1));
    assert_eq!(store.conversation_detail(2).unwrap().conversation, drafts[3].conversation);
}

#[test]
fn a_damaged_conversation_record_is_rebuilt_from_its_turns() {
    let dir = tempfile::tempdir().unwrap();
    let (store, drafts) = store_with_two_conversations(dir.path());
    flip_byte(&store, trees::CONVERSATIONS, &id_key(1));
    let report = store.check().unwrap();
    assert!(report.problems.iter().any(|p| p.tree == "conversations" && p.key == "1" && p.kind == ProblemKind::Damaged));
    assert_eq!(report.conversations, vec![ConversationFate { id: 1, fate: Fate::Rebuilt, turns_kept: 3, turns_removed: 0 }]);
    store.repair(report).unwrap();
    assert!(store.check().unwrap().is_clean());
    let rebuilt = store.conversation(1).unwrap().unwrap();
    let before = &drafts[2].conversation;
    assert_eq!((rebuilt.name.as_deref(), rebuilt.turns, rebuilt.last_turn), (before.name.as_deref(), 3, 3));
    assert_eq!((rebuilt.last_head.as_str(), rebuilt.last_tail.as_ref()), (before.last_head.as_str(), before.last_tail.as_ref()));
    assert_eq!(store.conversations().unwrap().len(), 2);
}

#[test]
fn a_damaged_pack_loses_the_turns_that_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    // Conversation 2's only turn: its request message and reply are packed in its record.
    flip_byte(&store, trees::PACKS, &id_key(4));
    without_journal(dir.path());
    let report = store.check().unwrap();
    assert!(report.problems.iter().any(|p| p.tree == "packs" && p.key == "4" && p.kind == ProblemKind::Damaged), "{:?}", report.problems);
    assert_eq!(report.conversations, vec![ConversationFate { id: 2, fate: Fate::Lost, turns_kept: 0, turns_removed: 1 }]);
    store.repair(report).unwrap();
    only_losses_of(&store, &[2]);
    assert_eq!(store.conversations().unwrap().iter().map(|c| c.id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(store.conversation_by_name("c2").unwrap(), None);
}

#[test]
fn a_damaged_large_message_loses_the_turns_that_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    // A message too large to pack is stored on its own, by hash.
    let large = "x".repeat(crate::codec::PACK_LIMIT);
    let big = draft(3, 5, &[large.as_str()], "r-big", None);
    store.commit_turn(&big).unwrap();
    assert!(store.t().unwrap().messages.contains_key(big.messages[0].0).unwrap());
    flip_byte(&store, trees::MESSAGES, &big.messages[0].0);
    without_journal(dir.path());
    let report = store.check().unwrap();
    assert!(report.problems.iter().any(|p| p.tree == "messages" && p.kind == ProblemKind::Damaged));
    assert_eq!(report.conversations, vec![ConversationFate { id: 3, fate: Fate::Lost, turns_kept: 0, turns_removed: 1 }]);
    store.repair(report).unwrap();
    only_losses_of(&store, &[3]);
    assert_eq!(store.conversations().unwrap().iter().map(|c| c.id).collect::<std::collections::BTreeSet<_>>(), [1, 2].into());
    assert_eq!(store.t().unwrap().packs.get(id_key(5)).unwrap(), None, "the lost turn's pack went with it");
}

#[test]
fn dangling_entries_and_a_finding_without_its_turn_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    let finding = crate::FindingRecord {
        id: 1,
        kind: crate::FindingKind::CacheMiss,
        severity: crate::Severity::Warning,
        time_unix_ms: 0,
        upstream: "u".into(),
        model: None,
        conversation: 2,
        turn: 99,
        turn_index: 0,
        summary: String::new(),
        evidence: serde_json::json!({}),
        cause: "cache_miss/2".into(),
    };
    store.put_finding(&finding).unwrap();
    store.t().unwrap().names.insert(b"ghost", &id_key(77)).unwrap();
    let report = store.check().unwrap();
    let keys: Vec<(&str, &str)> = report.problems.iter().map(|p| (p.tree.as_str(), p.key.as_str())).collect();
    assert!(keys.contains(&("findings", "1")) && keys.contains(&("conversation_findings", "2/1")), "{keys:?}");
    assert!(keys.contains(&("names", "ghost")), "{keys:?}");
    assert_eq!(report.conversations_whole, 2, "index damage cuts no conversation");
    store.repair(report).unwrap();
    assert!(store.check().unwrap().is_clean());
    assert_eq!(store.finding(1).unwrap(), None);
}

#[test]
fn records_lost_from_the_log_are_reported_and_their_ids_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    std::fs::write(dir.path().join(crate::MARKS_FILE), "conversation 0\nturn 9\nfinding 0\n").unwrap();
    let report = store.check().unwrap();
    assert!(
        report.problems.iter().any(|p| p.tree == "log" && p.kind == ProblemKind::Lost && p.detail.contains("turn ids")),
        "{:?}",
        report.problems
    );
    store.repair(report).unwrap();
    assert!(store.check().unwrap().is_clean());
    assert_eq!(store.next_id_in(crate::IdSpace::Turn).unwrap(), 10);
}

#[test]
fn committed_turns_in_neither_sled_nor_the_journal_are_a_loss_until_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    std::fs::write(dir.path().join(crate::MARKS_FILE), "conversation 2\nturn 9\nfinding 0\ncommitted_turn 9\n").unwrap();
    let report = store.check().unwrap();
    store.repair(report).unwrap();
    let again = store.check().unwrap();
    assert_eq!(again.losses.len(), 1, "{:?}", again.problems);
    assert!(again.losses[0].detail.contains("turn ids 5..=9"), "{}", again.losses[0].detail);
    assert!(!again.is_clean() && !again.fully_repairable());
    // Remembered across a restart, and never recorded twice.
    drop(store);
    let store = crate::test_support::unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
    assert_eq!(store.unacknowledged_losses().unwrap().len(), 1);
    assert_eq!(store.acknowledge_losses(&[]).unwrap(), 1);
    assert!(store.check().unwrap().is_clean());
    assert_eq!(store.losses().unwrap().len(), 1, "acknowledged, still on record");
    assert_eq!(store.next_id_in(crate::IdSpace::Turn).unwrap(), 10);
}

#[test]
fn a_store_written_before_checksums_and_packs_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    // Rewrite every record bare, as a release before framing stored it: turns as JSON, their packed
    // messages stored by hash, every length's prefix entry.
    for item in store.t().unwrap().packs.iter() {
        let (key, value) = item.unwrap();
        let turn = store.turn(crate::codec::key_id(&key).unwrap()).unwrap().unwrap();
        let hashes = turn.new_messages.iter().copied().chain(turn.reply.as_deref().and_then(crate::from_hex));
        for (hash, json) in hashes.zip(crate::pack::decode_pack(&key, &value).unwrap().entries()) {
            store.t().unwrap().messages.insert(hash, json.unwrap()).unwrap();
        }
        store.t().unwrap().turns.insert(&key, crate::codec::json("turn", &turn).unwrap()).unwrap();
        store.t().unwrap().packs.remove(&key).unwrap();
    }
    for item in store.t().unwrap().turns.iter() {
        let (key, value) = item.unwrap();
        let turn = store.decode_turn(&key, &value).unwrap();
        store.t().unwrap().turns.insert(&key, crate::codec::json("turn", &turn).unwrap()).unwrap();
    }
    for name in [trees::CONVERSATIONS, trees::PREFIXES] {
        let tree = store.db_tree(name.as_bytes()).unwrap();
        for item in tree.iter() {
            let (key, value) = item.unwrap();
            tree.insert(&key, &value[5..]).unwrap();
        }
    }
    let report = store.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let detail = store.conversation_detail(1).unwrap();
    assert_eq!(detail.turns.len(), 3);
    assert_eq!(detail.turns[2].messages.len(), 5);
    assert!(detail.messages.values().all(|m| m["content"].is_string()), "{:?}", detail.messages);
}

#[test]
fn a_pack_whose_turn_is_gone_is_dangling() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    store.t().unwrap().packs.insert(id_key(9), crate::pack::encode_pack(&id_key(9), &[Some(&b"{}"[..])])).unwrap();
    let report = store.check().unwrap();
    assert!(report.problems.iter().any(|p| p.tree == "packs" && p.key == "9" && p.kind == ProblemKind::Dangling), "{:?}", report.problems);
    store.repair(report).unwrap();
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn turns_written_without_their_conversation_record_are_counted_in_it() {
    // What separate writes could leave before a turn was one transaction: a turn stored, its
    // conversation record not (a new conversation), or not moved on (an existing one).
    let dir = tempfile::tempdir().unwrap();
    let (store, drafts) = store_with_two_conversations(dir.path());
    let orphan = draft(3, 5, &["third"], "r-third", None);
    for (hash, json) in &orphan.messages {
        store.put_message(hash, json).unwrap();
    }
    store.put_turn(&orphan.turn).unwrap();
    let mut later = draft(2, 6, &["other", "r-other", "more"], "r-more", Some(BaseRef { turn: 4, len: 2 }));
    later.turn.relation = Relation::Extend { parent_turn: 4 };
    for (hash, json) in &later.messages {
        store.put_message(hash, json).unwrap();
    }
    store.put_turn(&later.turn).unwrap();

    let report = store.check().unwrap();
    let missing: Vec<(&str, &str)> =
        report.problems.iter().filter(|p| p.kind == ProblemKind::Missing).map(|p| (p.tree.as_str(), p.key.as_str())).collect();
    assert_eq!(missing, vec![("conversations", "2"), ("conversations", "3")], "{:?}", report.problems);
    assert_eq!(report.conversations, vec![ConversationFate { id: 3, fate: Fate::Rebuilt, turns_kept: 1, turns_removed: 0 }]);
    assert_eq!(report.turns_kept, 6);
    store.repair(report).unwrap();
    let again = store.check().unwrap();
    assert!(again.is_clean(), "{:?}", again.problems);
    let moved = store.conversation(2).unwrap().unwrap();
    assert_eq!((moved.turns, moved.last_turn, moved.last_tail), (2, 6, later.turn.tail.clone()));
    assert_eq!(store.end(&later.tail.unwrap()).unwrap(), Some(2));
    assert_eq!(store.end(&drafts[3].tail.unwrap()).unwrap(), None, "the old end moved with the record");
    assert_eq!(store.conversation(3).unwrap().unwrap().last_turn, 5);
}

#[test]
fn repair_puts_back_from_the_journal_what_damage_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, drafts) = store_with_two_conversations(dir.path());
    flip_byte(&store, trees::TURNS, &id_key(2));
    flip_byte(&store, trees::PACKS, &id_key(4));
    let report = store.check().unwrap();
    assert_eq!(report.journal.records, 4);
    let repaired = store.repair(report).unwrap();
    assert_eq!(repaired.restored_turns, 3, "turn 2, turn 3 (which stood on it) and turn 4");
    let again = store.check().unwrap();
    assert!(again.is_clean(), "{:?}", again.problems);
    assert_eq!(store.conversation(1).unwrap().unwrap(), drafts[2].conversation);
    assert_eq!(store.conversation(2).unwrap().unwrap(), drafts[3].conversation);
    assert_eq!(store.conversation_detail(1).unwrap().turns.len(), 3);
    assert_eq!(store.turn(3).unwrap().unwrap(), drafts[2].turn);
    assert!(store.unacknowledged_losses().unwrap().is_empty());
}

#[test]
fn turns_sled_lost_are_reported_missing_and_come_back_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, drafts) = store_with_two_conversations(dir.path());
    // As sled's recovery leaves it after damage to its log: the newest records gone, though the
    // last checkpoint saw them flushed (past it they would be a crash's cut, not damage).
    store.checkpoint().unwrap();
    store.t().unwrap().turns.remove(id_key(3)).unwrap();
    store.t().unwrap().turns.remove(id_key(4)).unwrap();
    let report = store.check().unwrap();
    let missing: Vec<&str> =
        report.problems.iter().filter(|p| p.kind == ProblemKind::Missing && p.tree == "turns").map(|p| p.key.as_str()).collect();
    assert_eq!(missing, vec!["3", "4"], "{:?}", report.problems);
    drop(store);
    let store = crate::test_support::unlocked(|| Store::open(dir.path(), &StoreOptions::default()));
    assert_eq!(store.turn(3).unwrap().unwrap(), drafts[2].turn);
    assert_eq!(store.turn(4).unwrap().unwrap(), drafts[3].turn);
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn damaged_journal_bytes_cost_only_what_sled_also_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_two_conversations(dir.path());
    store.flush().unwrap();
    let segment = dir.path().join(crate::JOURNAL_DIR).join(crate::journal::segment::file_name(0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let scan = crate::journal::restore::JournalScan::read(dir.path()).unwrap();
    let second = scan.records[1];
    bytes[second.offset as usize + 3] ^= 0xFF;
    std::fs::write(&segment, &bytes).unwrap();
    // Sled still has turn 2: the journal's damage is reported, repaired, and costs nothing.
    let report = store.check().unwrap();
    assert!(report.problems.iter().any(|p| p.tree == "journal" && p.kind == ProblemKind::Damaged), "{:?}", report.problems);
    store.repair(report).unwrap();
    assert!(store.check().unwrap().is_clean());
    assert!(store.unacknowledged_losses().unwrap().is_empty());
    assert_eq!(crate::journal::restore::JournalScan::read(dir.path()).unwrap().records.len(), 3);
    // New turns append after the rewritten segment's last record and read back.
    store.commit_turn(&draft(5, 5, &["new"], "r-new", None)).unwrap();
    let scan = crate::journal::restore::JournalScan::read(dir.path()).unwrap();
    assert!(scan.damaged.is_empty() && scan.records.len() == 4, "{scan:?}");
}
