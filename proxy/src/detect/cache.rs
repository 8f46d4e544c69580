//! Prefix-cache evidence: the prompts recently sent to the upstream (prompt plus reply, as an engine's
//! prefix cache holds them) and the longest common token prefix a new prompt shares with any of them,
//! which bounds what an honest engine can report as cached.
//!
//! A prompt is held as a chain of one-byte fingerprints, not its token ids: byte i is the top byte of
//! a 64-bit hash of tokens 0..=i, so equal prefixes have equal bytes, and at the first token that
//! differs the bytes differ too except with probability 1/256 (and again, independently, at each
//! token after it). The common prefix of two chains therefore never falls short of the true one and
//! exceeds it by k tokens with probability 256^-k: a bound that stays a bound, at a quarter of the
//! memory (the 4 M tokens held at most take 4 MiB, not 16).

use std::collections::VecDeque;
use std::sync::Arc;

/// An earlier prompt (and reply) the engine may still hold.
#[derive(Debug, Clone)]
pub struct Recent {
    /// [`fingerprints`] of its token ids.
    pub fingerprints: Arc<[u8]>,
    pub time_unix_ms: u64,
    pub conversation: u64,
    pub turn: u64,
}

/// The longest shared prefix found, and with what.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shared {
    pub tokens: usize,
    pub conversation: u64,
    pub turn: u64,
    pub time_unix_ms: u64,
}

/// A bounded set of earlier prompts, newest last.
pub struct RecentPrompts {
    entries: VecDeque<Recent>,
    tokens: usize,
    max_entries: usize,
    max_tokens: usize,
}

impl RecentPrompts {
    pub fn new(max_entries: usize, max_tokens: usize) -> RecentPrompts {
        RecentPrompts { entries: VecDeque::new(), tokens: 0, max_entries: max_entries.max(1), max_tokens }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The prefix `ids` shares with each entry, in one pass (the detectors then pick from it with
    /// `longest` under their own time windows).
    pub fn shared(&self, ids: &[u32]) -> Vec<Shared> {
        let query = fingerprints(ids.iter().copied());
        self.entries
            .iter()
            .map(|e| Shared {
                tokens: common_prefix(&e.fingerprints, &query),
                conversation: e.conversation,
                turn: e.turn,
                time_unix_ms: e.time_unix_ms,
            })
            .collect()
    }
}

/// The longest of `shared` from an entry newer than `since_unix_ms` (all when `None`); ties go to the newest.
pub fn longest(shared: &[Shared], since_unix_ms: Option<u64>) -> Option<Shared> {
    shared.iter().filter(|s| since_unix_ms.is_none_or(|t| s.time_unix_ms >= t)).copied().max_by_key(|s| (s.tokens, s.time_unix_ms))
}

impl RecentPrompts {
    /// Adds an entry; entries it extends are dropped (it shares at least as much with anything they do).
    pub fn push(&mut self, entry: Recent) {
        let before = self.entries.len();
        self.entries.retain(|e| !entry.fingerprints.starts_with(&e.fingerprints));
        if self.entries.len() != before {
            self.tokens = self.entries.iter().map(|e| e.fingerprints.len()).sum();
        }
        self.tokens += entry.fingerprints.len();
        self.entries.push_back(entry);
        while self.entries.len() > self.max_entries || (self.tokens > self.max_tokens && self.entries.len() > 1) {
            if let Some(old) = self.entries.pop_front() {
                self.tokens -= old.fingerprints.len();
            }
        }
    }
}

/// The fingerprint chain of a token sequence (see the module's documentation).
pub fn fingerprints(ids: impl IntoIterator<Item = u32>) -> Arc<[u8]> {
    let mut state = 0x243f_6a88_85a3_08d3u64;
    ids.into_iter()
        .map(|id| {
            // splitmix64's finaliser over the running state and the token.
            let mut z = (state ^ u64::from(id)).wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            state = z ^ (z >> 31);
            (state >> 56) as u8
        })
        .collect()
}

/// Length of the common prefix of two sequences (32 bytes at a time, then byte by byte).
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 32 <= n && a[i..i + 32] == b[i..i + 32] {
        i += 32;
    }
    i + a[i..n].iter().zip(&b[i..n]).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent(ids: &[u32], turn: u64, time: u64) -> Recent {
        Recent { fingerprints: fingerprints(ids.iter().copied()), time_unix_ms: time, conversation: 1, turn }
    }

    #[test]
    fn fingerprint_prefixes_follow_token_prefixes() {
        let a: Vec<u32> = (0..5000).collect();
        let mut b = a.clone();
        b[3000] = 7;
        let (fa, fb) = (fingerprints(a.iter().copied()), fingerprints(b.iter().copied()));
        assert_eq!(common_prefix(&fa, &fa), 5000);
        // Never short of the true prefix; past it only by chance (1/256 a token).
        let shared = common_prefix(&fa, &fb);
        assert!((3000..3004).contains(&shared), "{shared}");
        // Over many pairs the overshoot is rare.
        let overshoot = (0..2000u32)
            .filter(|&seed| {
                let x: Vec<u32> = (0..64).map(|i| i * 31 + seed).collect();
                let mut y = x.clone();
                y[40] ^= 1;
                common_prefix(&fingerprints(x.iter().copied()), &fingerprints(y.iter().copied())) > 40
            })
            .count();
        assert!(overshoot < 30, "{overshoot} of 2000 overshot");
    }

    #[test]
    fn longest_prefix_respects_the_window_and_extensions_replace_their_prefix() {
        let mut recent_prompts = RecentPrompts::new(8, 1000);
        recent_prompts.push(recent(&[1, 2, 3], 1, 10));
        recent_prompts.push(recent(&[1, 2, 3, 4, 5], 2, 20));
        assert_eq!(recent_prompts.entries.len(), 1, "the extension replaced its prefix");
        recent_prompts.push(recent(&[9, 9], 3, 30));
        let shared = recent_prompts.shared(&[1, 2, 3, 4, 7]);
        let best = longest(&shared, None).unwrap();
        assert_eq!((best.tokens, best.turn), (4, 2));
        assert_eq!(longest(&shared, Some(25)).unwrap().tokens, 0);
    }

    #[test]
    fn bounded_by_entries_and_tokens() {
        let mut recent_prompts = RecentPrompts::new(2, 5);
        recent_prompts.push(recent(&[1, 1], 1, 1));
        recent_prompts.push(recent(&[2, 2], 2, 2));
        recent_prompts.push(recent(&[3, 3, 3], 3, 3));
        assert_eq!(recent_prompts.entries.iter().map(|e| e.turn).collect::<Vec<_>>(), vec![2, 3], "oldest evicted");
        assert_eq!(recent_prompts.tokens, 5);
        recent_prompts.push(recent(&[4, 4, 4, 4], 4, 4));
        assert_eq!(recent_prompts.entries.iter().map(|e| e.turn).collect::<Vec<_>>(), vec![4], "token budget");
    }
}
