//! Prefix-cache evidence: the prompts recently sent to the upstream (token ids, prompt plus reply, as an
//! engine's prefix cache holds them) and the longest common token prefix a new prompt shares with any
//! of them, which bounds what an honest engine can report as cached.

use std::collections::VecDeque;
use std::sync::Arc;

/// An earlier prompt (and reply) the engine may still hold.
#[derive(Debug, Clone)]
pub struct Recent {
    pub ids: Arc<[u32]>,
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
        self.entries
            .iter()
            .map(|e| Shared {
                tokens: common_prefix(&e.ids, ids),
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
        self.entries.retain(|e| !(e.ids.len() <= entry.ids.len() && entry.ids.starts_with(&e.ids)));
        if self.entries.len() != before {
            self.tokens = self.entries.iter().map(|e| e.ids.len()).sum();
        }
        self.tokens += entry.ids.len();
        self.entries.push_back(entry);
        while self.entries.len() > self.max_entries || (self.tokens > self.max_tokens && self.entries.len() > 1) {
            if let Some(old) = self.entries.pop_front() {
                self.tokens -= old.ids.len();
            }
        }
    }
}

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent(ids: &[u32], turn: u64, time: u64) -> Recent {
        Recent { ids: ids.into(), time_unix_ms: time, conversation: 1, turn }
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
