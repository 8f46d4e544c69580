//! What the record journal adds to a turn's commit: the same 3 conversations of 100 turns (each
//! turn adding a ~330-byte user message and its reply, the capture bench's shape) committed into a
//! store with the journal and one without, alternating, in one process. Prints the median and mean
//! commit time per turn for each, and the bytes each wrote.
//!
//! `cargo run --release -p ctxscope-store --features test-support --example journal_cost`

use std::time::Instant;

use ctxscope_store::*;

const CONVERSATIONS: u64 = 3;
const TURNS: u64 = 100;
const ROUNDS: usize = 5;

fn drafts() -> Vec<TurnDraft> {
    let mut out = Vec::new();
    let mut id = 0;
    for c in 1..=CONVERSATIONS {
        let mut history: Vec<(&str, String)> = Vec::new();
        for t in 1..=TURNS {
            id += 1;
            history.push(("user", format!("conversation {c} turn {t}: {}", "lorem ipsum dolor sit amet ".repeat(11))));
            let reply = format!("reply {c}.{t} {}", "x".repeat(300));
            out.push(store_test_draft(c, id, &history, &reply, t));
            history.push(("assistant", reply));
        }
    }
    out
}

/// Commit times in µs, and bytes on disk after a flush.
fn run(journal: bool, drafts: &[TurnDraft]) -> (Vec<f64>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default();
    let store = if journal { Store::open(dir.path(), &options) } else { Store::open_without_journal(dir.path(), &options) }.unwrap();
    let mut times = Vec::with_capacity(drafts.len());
    for draft in drafts {
        let start = Instant::now();
        store.commit_turn(draft).unwrap();
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    store.flush().unwrap();
    let journal_bytes: u64 =
        std::fs::read_dir(dir.path().join(JOURNAL_DIR)).map_or(0, |d| d.flatten().map(|e| e.metadata().map_or(0, |m| m.len())).sum());
    (times, journal_bytes)
}

fn main() {
    let drafts = drafts();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut journal_bytes = 0;
    for _ in 0..ROUNDS {
        let (times, bytes) = run(true, &drafts);
        with.extend(times);
        journal_bytes = bytes;
        without.extend(run(false, &drafts).0);
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64, v[v.len() * 99 / 100])
    };
    let (w, wo) = (stats(&mut with), stats(&mut without));
    println!("| store | turns committed | commit p50 (µs) | mean (µs) | p99 (µs) |");
    println!("|---|---|---|---|---|");
    println!("| without the journal | {} | {:.1} | {:.1} | {:.1} |", without.len(), wo.0, wo.1, wo.2);
    println!("| with the journal | {} | {:.1} | {:.1} | {:.1} |", with.len(), w.0, w.1, w.2);
    println!();
    println!("journal bytes for {} turns: {journal_bytes} ({:.0} per turn)", drafts.len(), journal_bytes as f64 / drafts.len() as f64);
}
