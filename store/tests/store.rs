//! Store behaviour against a real sled directory: schema checks, foreign directories, delta-encoded
//! message lists, linear growth, and export/import round trips.

mod common;

use common::{hash, msg, open, unlocked};
use ctxscope_store::*;
use serde_json::json;

#[test]
fn schema_version_mismatch_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.flush().unwrap();
    }
    {
        let db = unlocked(|| sled::open(dir.path())).unwrap();
        db.open_tree("meta").unwrap().insert("schema_version", &99u32.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
    let err = unlocked(|| Store::open(dir.path(), &StoreOptions::default())).err().expect("must refuse");
    let text = err.to_string();
    assert!(text.contains("schema version 99"), "{text}");
}

#[test]
fn foreign_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let err = Store::open(dir.path(), &StoreOptions::default()).err().expect("must refuse");
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("not a ctxscope data directory"));
}

#[test]
fn corrupt_files_give_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        msg(&store, "user", "hello");
        store.flush().unwrap();
    }
    std::fs::write(dir.path().join("conf"), b"\xff\xfe garbage").unwrap();
    std::fs::write(dir.path().join("db"), vec![0xAB; 4096]).unwrap();
    let result = std::panic::catch_unwind(|| Store::open(dir.path(), &StoreOptions::default()).map(|_| ()));
    let outcome = result.expect("opening a corrupt store must not panic");
    assert!(outcome.is_err(), "corrupt store opened as if fine");
}

#[test]
fn turns_store_deltas_and_resolve_full_lists() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = msg(&store, "system", "be brief");
    let u1 = msg(&store, "user", "one");
    let r1 = msg(&store, "assistant", "uno");
    let u2 = msg(&store, "user", "two");
    let mut t1 = store_test_turn(1, 7, vec![hash(&s), hash(&u1)]);
    t1.reply = Some(r1.clone());
    store.put_turn(&t1).unwrap();
    let mut t2 = store_test_turn(2, 7, vec![hash(&u2)]);
    t2.base = Some(BaseRef { turn: 1, len: 3 });
    store.put_turn(&t2).unwrap();
    assert_eq!(store.turn_messages(&t2).unwrap(), [s, u1, r1, u2].map(|h| hash(&h)));
    assert_eq!(store.conversation_turn_ids(7).unwrap(), vec![1, 2]);
}

#[test]
fn store_grows_linearly_with_conversation_length() {
    // 100 turns, each resending the whole history: stored bytes per turn must stay flat.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut sizes = Vec::new();
    let mut prev: Option<u64> = None;
    let mut len = 0u32;
    for i in 1..=100u64 {
        let u = msg(&store, "user", &format!("question number {i} with some padding text"));
        let r = msg(&store, "assistant", &format!("answer number {i} with some padding text"));
        let mut t = store_test_turn(i, 1, vec![hash(&u)]);
        t.base = prev.map(|p| BaseRef { turn: p, len });
        t.reply = Some(r);
        store.put_turn(&t).unwrap();
        len += 2;
        prev = Some(i);
        if i == 10 || i == 100 {
            sizes.push(store.logical_size().unwrap());
        }
    }
    let per_turn_early = sizes[0] as f64 / 10.0;
    let per_turn_late = sizes[1] as f64 / 100.0;
    assert!(per_turn_late < per_turn_early * 1.5, "storage grows superlinearly: {sizes:?}");
    let last = store.turn(100).unwrap().unwrap();
    assert_eq!(store.turn_messages(&last).unwrap().len(), 199);
}

#[test]
fn export_import_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let u1 = msg(&store, "user", "one");
    let r1 = msg(&store, "assistant", "uno");
    let u2 = msg(&store, "user", "two");
    let mut t1 = store_test_turn(1, 5, vec![hash(&u1)]);
    t1.reply = Some(r1);
    t1.reply_text = "uno".into();
    let mut t2 = store_test_turn(2, 5, vec![hash(&u2)]);
    t2.base = Some(BaseRef { turn: 1, len: 2 });
    t2.index = 1;
    store.put_turn(&t1).unwrap();
    store.put_turn(&t2).unwrap();
    let conv = ConversationRecord {
        id: 5,
        name: Some("n".into()),
        created_unix_ms: 1,
        updated_unix_ms: 2,
        upstream: "u".into(),
        model: Some("m".into()),
        turns: 2,
        last_turn: 2,
        last_head: String::new(),
        last_message_count: 3,
        last_tail: None,
        branch_of: None,
        last_reply: None,
        capture: Default::default(),
    };
    store.put_conversation(&conv).unwrap();
    let mut out = Vec::new();
    store.export_conversation(5, &mut out).unwrap();
    let original = store.conversation_detail(5).unwrap();

    let dir2 = tempfile::tempdir().unwrap();
    let other = open(dir2.path());
    let id = other.import_conversation(&mut out.as_slice()).unwrap();
    let imported = other.conversation_detail(id).unwrap();
    assert_eq!(imported.messages, original.messages);
    let lists = |d: &ConversationDetail| d.turns.iter().map(|t| t.messages.clone()).collect::<Vec<_>>();
    assert_eq!(lists(&imported), lists(&original));
    assert_eq!(imported.turns[0].turn.reply_text, "uno");

    let mut tampered = String::from_utf8(out).unwrap().replace("\"uno\"", "\"dos\"");
    tampered.push('\n');
    let dir3 = tempfile::tempdir().unwrap();
    let err = open(dir3.path()).import_conversation(&mut tampered.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn each_kind_numbers_its_ids_from_one_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let ids: Vec<u64> = (0..3).map(|_| store.next_id_in(IdSpace::Conversation).unwrap()).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(store.next_id_in(IdSpace::Turn).unwrap(), 1);
        assert_eq!(store.next_id_in(IdSpace::Turn).unwrap(), 2);
        assert_eq!(store.next_id_in(IdSpace::Finding).unwrap(), 1);
        store.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(store.next_id_in(IdSpace::Conversation).unwrap(), 4, "the counter survives a restart");
    assert_eq!(store.next_id_in(IdSpace::Turn).unwrap(), 3);
}

#[test]
fn a_store_written_before_checksums_opens_reads_and_is_marked_current() {
    // A version 1 store as that release wrote it: bare JSON values, schema 1.
    let dir = tempfile::tempdir().unwrap();
    let (hash, bytes) = message_hash(&json!({"role": "user", "content": "from before"}));
    let mut turn = store_test_turn(1, 1, vec![hash]);
    turn.reply_text = "old reply".into();
    {
        let db = unlocked(|| sled::open(dir.path())).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert("schema_version", &1u32.to_be_bytes()).unwrap();
        db.open_tree("messages").unwrap().insert(hash, bytes).unwrap();
        db.open_tree("turns").unwrap().insert(1u64.to_be_bytes(), serde_json::to_vec(&turn).unwrap()).unwrap();
        db.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(store.turn(1).unwrap().unwrap().reply_text, "old reply");
    assert_eq!(store.message(&hash).unwrap().unwrap()["content"], "from before");
    // Its messages are stored by hash, not packed: a turn's content still resolves.
    let old = store.turn(1).unwrap().unwrap();
    assert_eq!(store.turn_message_values(&old).unwrap(), vec![(hash, Some(json!({"content": "from before", "role": "user"})))]);
    drop(store);
    let db = unlocked(|| sled::open(dir.path())).unwrap();
    let version = db.open_tree("meta").unwrap().get("schema_version").unwrap().unwrap();
    assert_eq!(version.as_ref(), &SCHEMA_VERSION.to_be_bytes());
    assert_eq!(SCHEMA_VERSION, 5);
    // A record damaged in place is reported, naming its tree and key, never skipped.
    let turns = db.open_tree("turns").unwrap();
    let mut framed = turns.get(1u64.to_be_bytes()).unwrap().unwrap().to_vec();
    framed[3] = b'X';
    turns.insert(1u64.to_be_bytes(), framed).unwrap();
    db.flush().unwrap();
    drop((turns, db));
    let error = open(dir.path()).turn(1).unwrap_err();
    assert!(matches!(&error, StoreError::Decode { kind: "turns", key, .. } if key == "0000000000000001"), "{error}");
}
