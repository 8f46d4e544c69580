//! Byte-pair merging of one pre-tokenized, byte-level-encoded word, in llama.cpp's order: always
//! the adjacent pair of lowest merge rank, the leftmost on ties, until no pair has a rank. A symbol
//! left outside the vocabulary falls back to single-byte tokens exactly as llama.cpp does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge table: (left id, right id) -> (rank, merged id).
pub(crate) type Merges = HashMap<(u32, u32), (u32, u32)>;

struct Symbol {
    /// Byte range in the encoded word.
    start: usize,
    end: usize,
    /// Vocabulary id of the symbol's text, if it is a token.
    id: Option<u32>,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

/// A candidate merge: ordered by rank, then by left position (both ascending via `Reverse`).
type Candidate = Reverse<(u32, usize, usize, u32, u32)>;

fn candidate(symbols: &[Symbol], merges: &Merges, left: usize, right: usize) -> Option<Candidate> {
    let (l, r) = (symbols[left].id?, symbols[right].id?);
    let (rank, _) = merges.get(&(l, r))?;
    Some(Reverse((*rank, left, right, l, r)))
}

/// Appends the tokens of `word` (byte-level encoded) to `out`.
pub(crate) fn merge_word(
    word: &str,
    token_to_id: &HashMap<String, u32>,
    merges: &Merges,
    ignore_merges: bool,
    out: &mut Vec<u32>,
) {
    if word.is_empty() {
        return;
    }
    if ignore_merges {
        if let Some(&id) = token_to_id.get(word) {
            out.push(id);
            return;
        }
    }

    let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
        let end = start + c.len_utf8();
        symbols.push(Symbol {
            start,
            end,
            id: token_to_id.get(&word[start..end]).copied(),
            prev: i.checked_sub(1),
            next: None,
            alive: true,
        });
    }
    let n = symbols.len();
    for (i, s) in symbols.iter_mut().enumerate().take(n.saturating_sub(1)) {
        s.next = Some(i + 1);
    }

    let mut queue: BinaryHeap<Candidate> = (1..n)
        .filter_map(|i| candidate(&symbols, merges, i - 1, i))
        .collect();

    while let Some(Reverse((_, left, right, l_id, r_id))) = queue.pop() {
        // Skip candidates made stale by an earlier merge of either side.
        let (l, r) = (&symbols[left], &symbols[right]);
        if !l.alive || !r.alive || l.id != Some(l_id) || r.id != Some(r_id) || l.next != Some(right)
        {
            continue;
        }
        let Some(&(_, merged)) = merges.get(&(l_id, r_id)) else {
            continue;
        };
        let right_next = symbols[right].next;
        let right_end = symbols[right].end;
        symbols[right].alive = false;
        let l = &mut symbols[left];
        l.end = right_end;
        l.id = Some(merged);
        l.next = right_next;
        if let Some(rn) = right_next {
            symbols[rn].prev = Some(left);
        }
        if let Some(p) = symbols[left].prev {
            queue.extend(candidate(&symbols, merges, p, left));
        }
        if let Some(rn) = right_next {
            queue.extend(candidate(&symbols, merges, left, rn));
        }
    }

    for s in symbols.iter().filter(|s| s.alive) {
        match s.id {
            Some(id) => out.push(id),
            None => {
                // llama.cpp: look each byte of the symbol's text up as a one-byte token; bytes
                // that are not tokens are dropped.
                for b in word[s.start..s.end].bytes().filter(u8::is_ascii) {
                    let one = [b];
                    if let Some(&id) = std::str::from_utf8(&one)
                        .ok()
                        .and_then(|t| token_to_id.get(t))
                    {
                        out.push(id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str]) -> HashMap<String, u32> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect()
    }

    fn merges(v: &HashMap<String, u32>, pairs: &[(&str, &str)]) -> Merges {
        pairs
            .iter()
            .enumerate()
            .map(|(rank, (a, b))| ((v[*a], v[*b]), (rank as u32, v[&format!("{a}{b}")])))
            .collect()
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        let v = vocab(&["a", "b", "c", "ab", "bc", "abc", "aa"]);
        let m = merges(&v, &[("b", "c"), ("a", "b"), ("a", "bc"), ("a", "a")]);
        let mut out = Vec::new();
        merge_word("abc", &v, &m, false, &mut out);
        assert_eq!(out, [v["abc"]]);
        out.clear();
        merge_word("aaa", &v, &m, false, &mut out);
        assert_eq!(out, [v["aa"], v["a"]]);
        out.clear();
        merge_word("cab", &v, &m, false, &mut out);
        assert_eq!(out, [v["c"], v["ab"]]);
    }

    #[test]
    fn unknown_symbols_fall_back_to_ascii_bytes_or_vanish() {
        let v = vocab(&["a", "b"]);
        let m = Merges::new();
        let mut out = Vec::new();
        merge_word("aéb", &v, &m, false, &mut out);
        assert_eq!(out, [v["a"], v["b"]]);
    }

    #[test]
    fn ignore_merges_emits_whole_word_tokens() {
        let v = vocab(&["a", "b", "ab", "ba", "aba"]);
        let m = merges(&v, &[("a", "b"), ("b", "a")]);
        let mut out = Vec::new();
        merge_word("aba", &v, &m, false, &mut out);
        assert_eq!(out, [v["ab"], v["a"]]);
        out.clear();
        merge_word("aba", &v, &m, true, &mut out);
        assert_eq!(out, [v["aba"]]);
    }
}
