//! KV caches: one per sequence (per layer, rows of K and V for each position), and the prefix cache
//! that lets a new request start from the longest token prefix an earlier sequence computed.
//!
//! Prefix reuse is token-exact: the cache keeps finished sequences (their tokens and KV) in an LRU
//! bounded by a token budget and finds the longest common token prefix by comparing token ids, so two
//! different prompts can never share KV (no hashing, no collisions). Entries are keyed by a namespace
//! (model fingerprint and computation path), so reuse never crosses models or paths. The prefix cache
//! holds any backend's [`SequenceKv`] (host rows here, device buffers on a GPU) and copies it through
//! the backend, so a lookup can fail like any backend call.

use crate::backend::{BackendError, SequenceKv};

/// K and V rows of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    kv_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, kv_dim: usize) -> KvCache {
        KvCache { kv_dim, k: vec![Vec::new(); n_layers], v: vec![Vec::new(); n_layers], len: 0 }
    }

    /// Positions computed and committed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends rows for `layer` (positions `len..`), visible to attention before [`commit`].
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        self.k[layer].extend_from_slice(k);
        self.v[layer].extend_from_slice(v);
    }

    /// Marks `n` appended positions as part of the sequence.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
    }

    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.k[layer]
    }

    pub fn values(&self, layer: usize) -> &[f32] {
        &self.v[layer]
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.truncate(len * self.kv_dim);
        }
        self.len = len;
    }

    /// A copy of the first `len` positions.
    pub fn prefix(&self, len: usize) -> KvCache {
        let len = len.min(self.len);
        let cut = |layers: &Vec<Vec<f32>>| layers.iter().map(|l| l[..len * self.kv_dim].to_vec()).collect();
        KvCache { kv_dim: self.kv_dim, k: cut(&self.k), v: cut(&self.v), len }
    }
}

struct Entry<K> {
    namespace: String,
    tokens: Vec<u32>,
    kv: K,
    used: u64,
}

/// Finished sequences available for prefix reuse.
pub struct PrefixCache<K: SequenceKv = KvCache> {
    entries: Vec<Entry<K>>,
    budget_tokens: usize,
    clock: u64,
}

impl<K: SequenceKv> PrefixCache<K> {
    pub fn new(budget_tokens: usize) -> PrefixCache<K> {
        PrefixCache { entries: Vec::new(), budget_tokens, clock: 0 }
    }

    /// KV for the longest cached prefix of `tokens` in `namespace`, leaving at least the last token
    /// to compute (its logits are needed). Returns a copy of the cache and the reused token count;
    /// fails when the backend cannot copy it.
    pub fn lookup(&mut self, namespace: &str, tokens: &[u32]) -> Result<Option<(K, usize)>, BackendError> {
        let limit = tokens.len().saturating_sub(1);
        let (best, lcp) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.namespace == namespace)
            .map(|(i, e)| (i, e.kv.reusable(common_prefix(&e.tokens[..e.kv.len().min(e.tokens.len())], tokens).min(limit))))
            .max_by_key(|(_, lcp)| *lcp)
            .unwrap_or((0, 0));
        self.take(best, lcp)
    }

    /// The `prefix_cache_weak_hash` fault: blocks of `block` tokens are compared only by their length
    /// and first token (a weak hash), so a prompt that shares neither text nor prefix can take another
    /// sequence's KV. Returns a copy of the cache and the (falsely) reused token count.
    pub fn lookup_weak(&mut self, namespace: &str, tokens: &[u32], block: usize) -> Result<Option<(K, usize)>, BackendError> {
        let limit = tokens.len().saturating_sub(1);
        let weak_prefix = |cached: &[u32]| -> usize {
            let mut matched = 0;
            for (a, b) in cached.chunks(block).zip(tokens.chunks(block)) {
                if a.len() != b.len() || a[0] != b[0] {
                    break;
                }
                matched += a.len();
            }
            matched
        };
        let (best, n) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.namespace == namespace)
            .map(|(i, e)| (i, e.kv.reusable(weak_prefix(&e.tokens[..e.kv.len().min(e.tokens.len())]).min(limit))))
            .max_by_key(|(_, n)| *n)
            .unwrap_or((0, 0));
        self.take(best, n)
    }

    /// A copy of entry `index`'s first `len` positions (none when `len` is 0), marked as just used.
    fn take(&mut self, index: usize, len: usize) -> Result<Option<(K, usize)>, BackendError> {
        if len == 0 {
            return Ok(None);
        }
        self.clock += 1;
        let entry = &mut self.entries[index];
        entry.used = self.clock;
        Ok(Some((entry.kv.prefix(len)?, len)))
    }

    /// Offers a finished sequence; entries it extends are replaced, the least recently used evicted.
    pub fn insert(&mut self, namespace: &str, tokens: Vec<u32>, kv: K) {
        if kv.is_empty() || self.budget_tokens == 0 {
            return;
        }
        self.entries.retain(|e| !(e.namespace == namespace && tokens.starts_with(&e.tokens[..e.kv.len().min(e.tokens.len())])));
        self.clock += 1;
        self.entries.push(Entry { namespace: namespace.to_string(), tokens, kv, used: self.clock });
        while self.entries.iter().map(|e| e.kv.len()).sum::<usize>() > self.budget_tokens && self.entries.len() > 1 {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i).unwrap_or(0);
            self.entries.remove(oldest);
        }
        if self.entries.iter().map(|e| e.kv.len()).sum::<usize>() > self.budget_tokens {
            self.entries.clear();
        }
    }

    /// Drops every entry (used when the model's KV layout changes).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_with(len: usize) -> KvCache {
        let mut kv = KvCache::new(2, 3);
        for l in 0..2 {
            let rows: Vec<f32> = (0..len * 3).map(|i| (l * 1000 + i) as f32).collect();
            kv.append(l, &rows, &rows);
        }
        kv.commit(len);
        kv
    }

    #[test]
    fn lookup_reuses_the_longest_common_prefix_but_not_the_last_token() {
        let mut cache: PrefixCache = PrefixCache::new(1000);
        cache.insert("m", vec![1, 2, 3, 4, 5], kv_with(5));
        let (kv, n) = cache.lookup("m", &[1, 2, 3, 9]).unwrap().unwrap();
        assert_eq!((n, kv.len()), (3, 3));
        assert_eq!(kv.keys(1)[..3], [1000.0, 1001.0, 1002.0]);
        // Identical prompt: all but the last token.
        assert_eq!(cache.lookup("m", &[1, 2, 3, 4, 5]).unwrap().unwrap().1, 4);
        assert!(cache.lookup("other-model", &[1, 2, 3]).unwrap().is_none());
        assert!(cache.lookup("m", &[7, 1, 2]).unwrap().is_none());
    }

    #[test]
    fn weak_hash_lookup_collides_on_different_prefixes() {
        let mut cache: PrefixCache = PrefixCache::new(1000);
        let a: Vec<u32> = (0..8).collect();
        cache.insert("m", a, kv_with(8));
        // Same first token of each 4-token block, different everything else.
        let b = vec![0, 90, 91, 92, 4, 93, 94, 95, 96];
        assert_eq!(cache.lookup("m", &b).unwrap().map(|r| r.1), Some(1));
        assert_eq!(cache.lookup_weak("m", &b, 4).unwrap().map(|r| r.1), Some(8));
    }

    #[test]
    fn budget_evicts_least_recently_used() {
        let mut cache: PrefixCache = PrefixCache::new(8);
        cache.insert("m", vec![1, 1, 1, 1], kv_with(4));
        cache.insert("m", vec![2, 2, 2, 2], kv_with(4));
        cache.lookup("m", &[1, 1, 1, 9]).unwrap();
        cache.insert("m", vec![3, 3, 3, 3], kv_with(4));
        assert!(cache.lookup("m", &[2, 2, 2, 9]).unwrap().is_none());
        assert!(cache.lookup("m", &[1, 1, 1, 9]).unwrap().is_some());
    }

    /// A cache whose copies always fail, like a device out of memory.
    struct Unreadable(usize);

    impl SequenceKv for Unreadable {
        fn len(&self) -> usize {
            self.0
        }

        fn prefix(&self, _len: usize) -> Result<Unreadable, BackendError> {
            Err(BackendError::new("test", "out of memory"))
        }
    }

    #[test]
    fn a_failed_copy_is_the_lookup_error() {
        let mut cache = PrefixCache::new(1000);
        cache.insert("m", vec![1, 2, 3, 4], Unreadable(4));
        let err = cache.lookup("m", &[1, 2, 3, 9]).err().expect("the copy fails");
        assert_eq!(err.to_string(), "test backend: out of memory");
        assert!(cache.lookup("m", &[5, 6]).unwrap().is_none(), "no match, no copy");
    }

    #[test]
    fn truncate_and_prefix_agree() {
        let mut kv = kv_with(5);
        let p = kv.prefix(2);
        kv.truncate(2);
        assert_eq!(kv.keys(0), p.keys(0));
        assert_eq!(kv.len(), 2);
    }
}
