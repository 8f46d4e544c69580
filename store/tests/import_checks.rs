//! Import accepts only what `export` could have written (header first and once, messages before the
//! turns that use them, at least one turn) and marks every imported turn as imported.

use ctxscope_store::export::IMPORTED_NOTE;
mod common;

use common::{hash, msg, open};
use ctxscope_store::*;
use serde_json::json;

/// A two-turn conversation's export lines: header, three messages, two turns.
fn exported() -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let u1 = msg(&store, "user", "one");
    let r1 = msg(&store, "assistant", "uno");
    let u2 = msg(&store, "user", "two");
    let mut t1 = store_test_turn(1, 5, vec![hash(&u1)]);
    t1.reply = Some(r1);
    let mut t2 = store_test_turn(2, 5, vec![hash(&u2)]);
    t2.base = Some(BaseRef { turn: 1, len: 2 });
    t2.index = 1;
    store.put_turn(&t1).unwrap();
    store.put_turn(&t2).unwrap();
    let mut conv: ConversationRecord = serde_json::from_value(json!({
        "id": 5, "name": null, "created_unix_ms": 1, "updated_unix_ms": 2, "upstream": "u",
        "model": "m", "turns": 2, "last_turn": 2, "last_head": "", "last_message_count": 3,
        "last_tail": null, "branch_of": null
    }))
    .unwrap();
    conv.turns = 2;
    store.put_conversation(&conv).unwrap();
    let mut out = Vec::new();
    store.export_conversation(5, &mut out).unwrap();
    String::from_utf8(out).unwrap().lines().map(str::to_string).collect()
}

fn import(lines: &[String]) -> Result<u64, StoreError> {
    let dir = tempfile::tempdir().unwrap();
    let text = lines.join("\n");
    open(dir.path()).import_conversation(&mut text.as_bytes())
}

fn refused(lines: &[String], expected: &str) {
    let error = import(lines).expect_err("accepted a file export could not have written").to_string();
    assert!(error.contains(expected), "{error}");
}

#[test]
fn a_valid_export_imports_with_its_turns_marked() {
    let lines = exported();
    assert_eq!(lines.len(), 6);
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let id = store.import_conversation(&mut lines.join("\n").as_bytes()).unwrap();
    let detail = store.conversation_detail(id).unwrap();
    assert_eq!(detail.turns.len(), 2);
    for view in &detail.turns {
        assert!(view.turn.notes.iter().any(|n| n.starts_with(IMPORTED_NOTE)), "{:?}", view.turn.notes);
    }
    // Imported again from its own export: still one mark per turn.
    let mut again = Vec::new();
    store.export_conversation(id, &mut again).unwrap();
    let id2 = store.import_conversation(&mut again.as_slice()).unwrap();
    let twice = store.conversation_detail(id2).unwrap();
    assert_eq!(twice.turns[0].turn.notes.iter().filter(|n| n.starts_with(IMPORTED_NOTE)).count(), 1);
}

#[test]
fn what_export_could_not_have_written_is_refused() {
    let lines = exported();
    refused(&lines[..1], "no turn lines");
    refused(&lines[..4], "no turn lines");
    // A turn before the messages it references.
    let moved = [&lines[..1], &lines[4..5], &lines[1..4], &lines[5..]].concat();
    refused(&moved, "which no line before it holds");
    // A message after the turns.
    let late = [&lines[..1], &lines[2..], &lines[1..2]].concat();
    refused(&late, "which no line before it holds");
    let after = [&lines[..], &lines[1..2]].concat();
    refused(&after, "after the turns");
    // No header first, or two headers.
    refused(&lines[1..], "first line must be the export header");
    let two = [&lines[..1], &lines[..]].concat();
    refused(&two, "second header");
}
