//! The prefix index: which prefix lengths of a turn are recorded, and the lookup of the longest prefix
//! a request shares with any earlier turn. Recording every length cost one sled record per message (a
//! 100,000-message request wrote 100,000 of them). A turn records the first [`PREFIX_RUN`] lengths
//! past its base, every multiple of [`PREFIX_EVERY`], its head and its tail. So every multiple up to a
//! turn's length is recorded (by the turn or by the turns its base stands on): presence over the
//! multiples is monotone, a binary search finds the last one shared, and the lengths between it and
//! the next multiple are probed one by one. A conversation that adds a few messages a turn still has
//! every length recorded; a request that leaves a long run of messages one turn added, past its first
//! [`PREFIX_RUN`], is matched to the last recorded length before the fork (at most
//! [`PREFIX_EVERY`] - 1 messages short, which its own delta then stores again).

use crate::codec::trees;
use crate::hash::Hash;
use crate::records::PrefixEntry;
use crate::{Store, StoreError};

/// The spacing of recorded prefix lengths in a long run of new messages. Each entry is a sled record
/// that sled keeps in memory (about 250 bytes with its node); at 64 a turn of 100,000 new messages
/// wrote 1,630 of them and resident memory grew 0.4 MB a turn; at 512, 261. A lookup probes at most
/// this many lengths one by one past the last multiple (a missing key: about a microsecond each).
pub const PREFIX_EVERY: usize = 512;
/// Every length this close past a turn's base is recorded: a conversation that adds a few messages
/// a turn has every length, so a request is matched exactly to where it left the history.
pub const PREFIX_RUN: usize = 64;

/// The prefix lengths a turn records: past `base`, up to its `head` (the request's length) and, when
/// it has a reply, its tail (`head + 1`).
pub(crate) fn recorded_lengths(base: usize, head: usize, tail: bool) -> impl Iterator<Item = usize> {
    let end = head + usize::from(tail);
    (base + 1..=end).filter(move |&len| len - base <= PREFIX_RUN || len % PREFIX_EVERY == 0 || len >= head)
}

impl Store {
    /// The first turn whose messages began with the prefix this chain hash covers, where recorded.
    pub fn prefix(&self, chain: &Hash) -> Result<Option<PrefixEntry>, StoreError> {
        crate::store::get(&self.t()?.prefixes, trees::PREFIXES, chain)
    }

    /// The longest recorded prefix of `chain` (`chain[i]` covers messages `0..=i`) that an earlier
    /// turn began with: its length and entry.
    pub fn longest_prefix(&self, chain: &[Hash]) -> Result<Option<(usize, PrefixEntry)>, StoreError> {
        // 1. The last multiple of PREFIX_EVERY recorded (presence is monotone over them).
        let (mut lo, mut hi) = (0usize, chain.len() / PREFIX_EVERY);
        let mut best = None;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            match self.prefix(&chain[mid * PREFIX_EVERY - 1])? {
                Some(entry) => {
                    best = Some((mid * PREFIX_EVERY, entry));
                    lo = mid;
                }
                None => hi = mid - 1,
            }
        }
        // 2. The lengths after it, short of the next multiple, longest first.
        let from = lo * PREFIX_EVERY;
        for len in (from + 1..=(from + PREFIX_EVERY - 1).min(chain.len())).rev() {
            if let Some(entry) = self.prefix(&chain[len - 1])? {
                return Ok(Some((len, entry)));
            }
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_deltas_record_every_length_long_ones_a_sample() {
        assert_eq!(recorded_lengths(3, 5, true).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(recorded_lengths(0, 0, true).collect::<Vec<_>>(), [1]);
        let long: Vec<usize> = recorded_lengths(10, 3000, true).collect();
        assert_eq!(long.len(), PREFIX_RUN + 3000 / PREFIX_EVERY + 2);
        assert!(long.contains(&74) && !long.contains(&75) && long.contains(&512) && !long.contains(&128));
        assert!(long.ends_with(&[2560, 3000, 3001]));
    }
}
