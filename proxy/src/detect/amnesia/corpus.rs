//! The amnesia recogniser over the labeled replies in tests/fixtures/amnesia/: precision and recall
//! floors on the development part (tuned on) and the held-out part (never tuned on), the
//! misclassified lines printed, and the cost of a 4 KiB reply.

use std::path::PathBuf;
use std::time::Instant;

use serde::Deserialize;

use super::denial::{recognise, Denial};
use crate::detect::config::DetectConfig;

#[derive(Deserialize)]
struct Labeled {
    id: String,
    label: String,
    text: String,
}

fn load(name: &str) -> Vec<Labeled> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/amnesia").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}"))).collect()
}

struct Score {
    tp: usize,
    fp: usize,
    fn_: usize,
    tn: usize,
}

impl Score {
    fn precision(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fp).max(1) as f64
    }
    fn recall(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fn_).max(1) as f64
    }
}

fn score(name: &str) -> Score {
    let phrases = DetectConfig::default().amnesia_phrases;
    let set = load(name);
    let (mut tp, mut fp, mut fn_, mut tn) = (0, 0, 0, 0);
    for item in &set {
        let denial = match item.label.as_str() {
            "denial" => true,
            "innocent" => false,
            other => panic!("{}: unknown label {other}", item.id),
        };
        let found: Option<Denial> = recognise(&item.text, &phrases);
        match (denial, &found) {
            (true, Some(_)) => tp += 1,
            (false, None) => tn += 1,
            (true, None) => {
                fn_ += 1;
                println!("{name} MISSED {}: {:?}", item.id, item.text);
            }
            (false, Some(d)) => {
                fp += 1;
                println!("{name} FALSE {}: {:?} <- {} {} {:?}", item.id, d.sentence, d.method.as_str(), d.rule, d.cues);
            }
        }
    }
    let s = Score { tp, fp, fn_, tn };
    println!(
        "{name}: {} denials, {} innocent; TP {tp} FP {fp} FN {fn_} TN {tn}; precision {:.3} recall {:.3}",
        tp + fn_,
        fp + tn,
        s.precision(),
        s.recall()
    );
    s
}

#[test]
fn development_set_floors() {
    let s = score("dev.jsonl");
    assert!(s.tp + s.fn_ >= 100 && s.fp + s.tn >= 100, "the development set has at least 100 + 100");
    assert!(s.precision() >= 0.95 && s.recall() >= 0.90, "precision {:.3} recall {:.3}", s.precision(), s.recall());
}

#[test]
fn held_out_set_floors() {
    let s = score("heldout.jsonl");
    assert!(s.tp + s.fn_ >= 50 && s.fp + s.tn >= 50, "the held-out set has at least 50 + 50");
    assert!(s.precision() >= 0.90 && s.recall() >= 0.85, "precision {:.3} recall {:.3}", s.precision(), s.recall());
}

#[test]
fn a_4_kib_reply_costs_well_under_a_millisecond() {
    // The worst case: no denial, so every sentence is run through every rule.
    let innocent: Vec<String> = load("dev.jsonl").into_iter().filter(|l| l.label == "innocent").map(|l| l.text).collect();
    let mut reply = String::new();
    for text in innocent.iter().cycle() {
        if reply.len() >= 4096 {
            break;
        }
        reply.push_str(text);
        reply.push_str("\n\n");
    }
    let phrases = DetectConfig::default().amnesia_phrases;
    assert_eq!(recognise(&reply, &phrases), None);
    let runs = 200;
    let start = Instant::now();
    for _ in 0..runs {
        std::hint::black_box(recognise(std::hint::black_box(&reply), &phrases));
    }
    let per_reply = start.elapsed() / runs;
    println!("{} byte reply: {per_reply:?} per reply (this build's profile)", reply.len());
    // Release: well under a millisecond; a debug build is about 20 times slower.
    let bound_us = if cfg!(debug_assertions) { 20_000 } else { 1_000 };
    assert!(per_reply.as_micros() < bound_us, "{per_reply:?}");
}
