//! Fault injection: a store of 20 conversations (3 turns each, one with a message large enough to
//! spill to its own file) is damaged at 20 positions across every file it has (16 bytes flipped),
//! and by truncating sled's log and deleting spilled files; each time it is reopened as the proxy
//! would (rebuilt from the journal when sled cannot open) and checked. The bar: damage costs at most
//! the records it sits in (here: nothing, since sled and the journal never share a byte), every loss
//! is reported, and no id is handed out again.

// Shared with tests/store.rs, which uses all of it.
#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use ctxscope_store::*;
use serde_json::json;

const CONVERSATIONS: u64 = 20;
const TURNS: u64 = 3;

/// Writes the store: conversation c's turn t has id (c-1)*3+t, and conversation 7's first message
/// is 80 KB (a spilled value).
fn build(dir: &Path) {
    let store = common::open(dir);
    let mut next_turn = 0;
    for c in 1..=CONVERSATIONS {
        let mut history: Vec<(&str, String)> = Vec::new();
        for t in 1..=TURNS {
            next_turn += 1;
            let text = if c == 7 && t == 1 { "x".repeat(80_000) } else { format!("conversation {c} turn {t}") };
            history.push(("user", text));
            let reply = format!("reply {c}.{t}");
            store.commit_turn(&store_test_draft(c, next_turn, &history, &reply, t)).unwrap();
            history.push(("assistant", reply));
        }
        assert_eq!(store.next_id_in(IdSpace::Conversation).unwrap(), c);
    }
    for _ in 0..CONVERSATIONS * TURNS {
        store.next_id_in(IdSpace::Turn).unwrap();
    }
    store.checkpoint().unwrap();
}

/// Every file of the store, largest first, with its length.
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                out.push((entry.path(), entry.metadata().unwrap().len()));
            }
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

/// 20 positions across the files: each file gets a share by size (at least one each), spread
/// evenly through it.
fn positions(dir: &Path) -> Vec<(PathBuf, u64)> {
    let files: Vec<_> = files(dir).into_iter().filter(|(_, len)| *len > 0).collect();
    let total: u64 = files.iter().map(|(_, l)| l).sum();
    let mut shares: Vec<usize> = files.iter().map(|_| 1).collect();
    let spare = 20 - files.len().min(20);
    let mut given = 0;
    for (i, (_, len)) in files.iter().enumerate() {
        let share = ((*len as f64 / total as f64) * spare as f64).floor() as usize;
        shares[i] += share;
        given += share;
    }
    shares[0] += spare - given;
    let mut out = Vec::new();
    for ((path, len), share) in files.iter().zip(shares) {
        for k in 0..share {
            out.push((path.clone(), len * (2 * k as u64 + 1) / (2 * share as u64)));
        }
    }
    out.truncate(20);
    out
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = at as usize;
    let end = (at + 16).min(bytes.len());
    for b in &mut bytes[at..end] {
        *b ^= 0xA5;
    }
    std::fs::write(path, bytes).unwrap();
}

/// Opens as the proxy does: sled's own files unreadable, rebuilt from the journal.
fn reopen(dir: &Path) -> Store {
    let opened = common::unlocked(|| match Store::open(dir, &StoreOptions::default()) {
        Err(StoreError::Corrupt { .. }) => Ok(None),
        other => other.map(Some),
    });
    match opened.unwrap() {
        Some(store) => store,
        None => Store::rebuild(dir, &StoreOptions::default()).unwrap().0,
    }
}

/// Conversations whose three turns all read back with their messages.
fn whole(store: &Store) -> u64 {
    (1..=CONVERSATIONS)
        .filter(|&c| {
            store.conversation_detail(c).is_ok_and(|d| {
                d.turns.len() == TURNS as usize && d.turns.iter().all(|t| t.messages.iter().all(|h| d.messages.contains_key(h)))
            })
        })
        .count() as u64
}

struct Outcome {
    survivors: u64,
    /// Whether a loss was left unreported: fewer survivors and a clean check.
    silent: bool,
    reused: bool,
}

/// How the store is reopened after the damage.
#[derive(Clone, Copy, PartialEq)]
enum Journal {
    /// As it is.
    Kept,
    /// Its journal removed first: what a store without one (before it existed) makes of the damage.
    Removed,
}

fn run(damage: impl FnOnce(&Path), journal: Journal) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    damage(dir.path());
    if journal == Journal::Removed {
        std::fs::remove_dir_all(dir.path().join(JOURNAL_DIR)).unwrap();
        match common::unlocked(|| Store::open(dir.path(), &StoreOptions::default())) {
            Ok(store) => return Outcome { survivors: whole(&store), silent: false, reused: false },
            Err(_) => return Outcome { survivors: 0, silent: false, reused: false },
        }
    }
    let store = reopen(dir.path());
    let survivors = whole(&store);
    let report = store.check().unwrap();
    let report = if report.fully_repairable() && !report.is_clean() { store.repair(report).unwrap() } else { report };
    let after = if report.repaired { store.check().unwrap() } else { report };
    let survivors = survivors.max(whole(&store));
    let silent = survivors < CONVERSATIONS && after.is_clean();
    let reused = store.next_id_in(IdSpace::Conversation).unwrap() <= CONVERSATIONS
        || store.next_id_in(IdSpace::Turn).unwrap() <= CONVERSATIONS * TURNS;
    drop(store);
    // Remembered across a restart: a loss stays on record.
    let store = reopen(dir.path());
    let remembered = survivors == CONVERSATIONS || !store.unacknowledged_losses().unwrap().is_empty() || !store.check().unwrap().is_clean();
    Outcome { survivors, silent: silent || !remembered, reused }
}

#[test]
fn a_flip_anywhere_costs_at_most_the_records_it_sits_in() {
    let probe = tempfile::tempdir().unwrap();
    build(probe.path());
    let spots = positions(probe.path());
    assert_eq!(spots.len(), 20);
    let mut table = Vec::new();
    for (path, at) in &spots {
        let relative = path.strip_prefix(probe.path()).unwrap().to_path_buf();
        let before = run(|dir| flip(&dir.join(&relative), *at), Journal::Removed);
        let outcome = run(|dir| flip(&dir.join(&relative), *at), Journal::Kept);
        let name = format!("{} @ {at}", shorten(&relative));
        assert!(!outcome.silent, "flip {name}: a loss went unreported");
        assert!(!outcome.reused, "flip {name}: an id was handed out again");
        table.push((name, before.survivors, outcome.survivors));
    }
    // The table BENCHMARKS.md shows (run with --nocapture).
    eprintln!("| position (file @ byte) | whole without the journal | whole with it |\n|---|---|---|");
    for (name, before, after) in &table {
        eprintln!("| {name} | {before} of {CONVERSATIONS} | {after} of {CONVERSATIONS} |");
    }
    let worst = table.iter().map(|(_, _, after)| *after).min().unwrap();
    assert!(worst >= 18, "a single flip cost more than 2 of 20 conversations: {table:?}");
}

/// A spilled file's name shortened for the table.
fn shorten(path: &Path) -> String {
    let text = path.display().to_string();
    match text.rsplit_once('/') {
        Some((dir, name)) if name.len() > 16 => format!("{dir}/{}…", &name[..8]),
        _ => text,
    }
}

#[test]
fn truncated_logs_and_deleted_spill_files_are_made_good_from_the_journal() {
    // sled's log cut to half its length.
    let outcome = run(
        |dir| {
            let db = dir.join("db");
            let len = std::fs::metadata(&db).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(&db).unwrap().set_len(len / 2).unwrap();
        },
        Journal::Kept,
    );
    assert!(!outcome.silent && !outcome.reused);
    assert_eq!(outcome.survivors, CONVERSATIONS);
    // Every spilled file deleted.
    let outcome = run(
        |dir| {
            for tree in ["packs", "messages"] {
                let _ = std::fs::remove_dir_all(dir.join("spill").join(tree));
            }
        },
        Journal::Kept,
    );
    assert!(!outcome.silent && !outcome.reused);
    assert_eq!(outcome.survivors, CONVERSATIONS);
}

#[test]
fn damage_to_both_copies_is_a_loss_remembered_until_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Conversation 20's last turn (60) gone from sled, and its journal record damaged.
    {
        let store = common::open(dir.path());
        let scan = JournalScanFacts::of(dir.path());
        let (segment, offset) = scan.turn(60);
        drop(store);
        flip(&dir.path().join(JOURNAL_DIR).join(segment), offset + 4);
        let db = common::unlocked(|| sled::open(dir.path())).unwrap();
        db.open_tree("turns").unwrap().remove(60u64.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
    let store = reopen(dir.path());
    let losses = store.unacknowledged_losses().unwrap();
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert!(losses[0].detail.contains("60"), "{}", losses[0].detail);
    let report = store.check().unwrap();
    assert!(!report.is_clean());
    assert_eq!(store.next_id_in(IdSpace::Turn).unwrap(), CONVERSATIONS * TURNS + 1);
    drop(store);
    let store = reopen(dir.path());
    assert_eq!(store.unacknowledged_losses().unwrap().len(), 1, "remembered, not recorded twice");
    store.acknowledge_losses(&[losses[0].id]).unwrap();
    assert!(store.unacknowledged_losses().unwrap().is_empty());
}

/// Where the journal keeps a turn, read with the journal's own scan.
struct JournalScanFacts(Vec<(u64, u64, u64)>);

impl JournalScanFacts {
    fn of(dir: &Path) -> JournalScanFacts {
        let mut out = Vec::new();
        for (number, path) in journal::segment::list(&dir.join(JOURNAL_DIR)).unwrap() {
            let scan = journal::segment::scan_bytes(number, &std::fs::read(path).unwrap());
            out.extend(scan.records.iter().filter(|r| r.kind == journal::segment::Kind::Turn).map(|r| (r.id, number, r.offset)));
        }
        JournalScanFacts(out)
    }

    fn turn(&self, id: u64) -> (String, u64) {
        let (_, segment, offset) = self.0.iter().find(|(t, _, _)| *t == id).copied().unwrap();
        (journal::segment::file_name(segment), offset)
    }
}

/// A full disk under sled: its log writer fails for good, so the store is reopened once there is
/// room, under the clones that hold it, and every write works again. Needs root for a small tmpfs
/// (CTXSCOPE_SKIP_PRIVILEGED=1 skips it where that is impossible).
#[test]
fn a_store_sled_failed_to_write_is_reopened_once_there_is_room() {
    let Some(tmpfs) = ctxscope_testkit::tmpfs::Tmpfs::mount("4m") else { return };
    let point = tmpfs.path().to_path_buf();
    let data = point.join("data");
    let store = common::open(&data);
    let reader = store.clone();
    store.commit_turn(&store_test_draft(1, 1, &[("user", "before".into())], "r", 1)).unwrap();
    store.flush().unwrap();
    // Fill the disk to the last byte, then write past the free-space guard straight into sled.
    let filler = tmpfs.fill("filler");
    let mut failed = false;
    for i in 0..64 {
        let (hash, bytes) = message_hash(&json!({"role": "user", "content": format!("{i} {}", "z".repeat(20_000))}));
        if store.put_message(&hash, &bytes).and_then(|_| store.flush()).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "sled wrote 1.3 MB to a full disk");
    // Still failing with room again: sled keeps its error until reopened.
    std::fs::remove_file(&filler).unwrap();
    let (hash, bytes) = message_hash(&json!({"role": "user", "content": "after"}));
    let sticky = store.put_message(&hash, &bytes).and_then(|_| store.flush());
    assert!(sticky.as_ref().is_err_and(StoreError::needs_reopen), "{sticky:?}");
    store.reopen(std::time::Duration::from_secs(2)).unwrap();
    assert!(store.is_open());
    store.commit_turn(&store_test_draft(2, 2, &[("user", "after the reopen".into())], "r", 1)).unwrap();
    store.flush().unwrap();
    // Every clone sees the reopened store, and nothing stored before the disk filled is lost.
    assert_eq!(reader.conversation_detail(1).unwrap().turns.len(), 1);
    assert_eq!(reader.conversation_detail(2).unwrap().turns.len(), 1);
    assert!(reader.check().unwrap().problems.iter().all(|p| p.tree != "turns"), "{:?}", reader.check().unwrap().problems);
}
