//! How two replies to the same teacher-forced prompt differ: token agreement, the first flip and how
//! close the reference was to a tie there, logprob drift before the flip and top-k KL up to it
//! ([`divergence`]); and how a replayed reply compares with the captured text ([`text_match`]).

use std::collections::BTreeMap;

use crate::model::{Divergence, Reply, TextMatch, TokenStep};

/// Default near-tie threshold, in nats (top-1 minus top-2 logprob of the reference where the two
/// first differ). Rounding patches move logits by 0.03–0.3 on average and their first greedy flips
/// in BENCHMARKS.md ("Patches: distance from golden") sit at margins of 0.08–0.14, while the
/// position-collision flip of `rope_bf16` sits at 0.62: under 0.5 a flip is noise, not drift.
pub const DEFAULT_NEAR_TIE: f64 = 0.5;

/// Compares `other` with `reference` (see [`Divergence`]). Token strings are compared when both
/// replies carry logprobs, whitespace-split words otherwise (then there is no margin, drift or KL).
/// `compared_tokens` is the longer of the two sequences (the denominator of `agreement`).
pub fn divergence(reference: &Reply, other: &Reply, near_tie: f64) -> Divergence {
    let exact = reference.text == other.text;
    let by_tokens = !reference.tokens.is_empty() && !other.tokens.is_empty();
    let (a, b): (Vec<&str>, Vec<&str>) = if by_tokens {
        (token_strings(&reference.tokens), token_strings(&other.tokens))
    } else {
        (reference.text.split_whitespace().collect(), other.text.split_whitespace().collect())
    };
    let compared_tokens = a.len().max(b.len());
    let first_diff = if exact { None } else { first_difference(&a, &b) };
    let agreement =
        if exact || compared_tokens == 0 { 1.0 } else { a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / compared_tokens as f64 };
    let margin_at_diff = match (by_tokens, first_diff) {
        (true, Some(i)) => reference.tokens.get(i).and_then(top_margin),
        _ => None,
    };
    let shorter = a.len().min(b.len());
    let agreed = first_diff.unwrap_or(shorter);
    // The flip itself is compared too: both sides chose there after the same tokens, so a reply that
    // differs from its first token on still has a distance (it had none, and no KL, before).
    let same_prefix = (agreed + 1).min(shorter);
    let (max_logprob_diff, mean_logprob_diff) =
        if by_tokens { logprob_drift(&reference.tokens[..agreed], &other.tokens[..agreed]) } else { (None, None) };
    let kl_topk = if by_tokens { mean_kl(&reference.tokens[..same_prefix], &other.tokens[..same_prefix]) } else { None };
    Divergence {
        exact,
        first_diff,
        margin_at_diff,
        near_tie: margin_at_diff.is_some_and(|m| m < near_tie),
        agreement,
        compared_tokens,
        max_logprob_diff,
        mean_logprob_diff,
        kl_topk,
    }
}

/// Compares a replayed reply with the captured text.
pub fn text_match(captured: &str, replayed: &str) -> TextMatch {
    TextMatch {
        exact: captured == replayed,
        common_prefix_chars: captured.chars().zip(replayed.chars()).take_while(|(a, b)| a == b).count(),
        captured_chars: captured.chars().count(),
    }
}

fn token_strings(tokens: &[TokenStep]) -> Vec<&str> {
    tokens.iter().map(|t| t.token.as_str()).collect()
}

/// The first position where the sequences differ, or the shorter length when one is a strict prefix.
fn first_difference(a: &[&str], b: &[&str]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// Top-1 minus top-2 logprob of a step's alternatives (None with fewer than two).
fn top_margin(step: &TokenStep) -> Option<f64> {
    let mut lps: Vec<f64> = step.top.iter().map(|(_, lp)| *lp).filter(|lp| lp.is_finite()).collect();
    lps.sort_by(|x, y| y.total_cmp(x));
    match lps.as_slice() {
        [first, second, ..] => Some(first - second),
        _ => None,
    }
}

/// Over agreeing positions: max and mean |Δ logprob| of the chosen token.
fn logprob_drift(reference: &[TokenStep], other: &[TokenStep]) -> (Option<f64>, Option<f64>) {
    let diffs: Vec<f64> = reference.iter().zip(other).map(|(r, o)| (r.logprob - o.logprob).abs()).filter(|d| d.is_finite()).collect();
    (diffs.iter().copied().reduce(f64::max), mean(&diffs))
}

/// Mean top-k KL over positions that follow the same tokens on both sides.
fn mean_kl(reference: &[TokenStep], other: &[TokenStep]) -> Option<f64> {
    let kls: Vec<f64> = reference.iter().zip(other).filter_map(|(r, o)| kl_topk(&r.top, &o.top)).collect();
    mean(&kls)
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// KL(p || q) on the tokens both top lists hold, each side renormalised over them (None when the
/// lists share no token or one is empty).
fn kl_topk(p: &[(String, f64)], q: &[(String, f64)]) -> Option<f64> {
    let p = probabilities(p);
    let q = probabilities(q);
    let shared: Vec<(f64, f64)> = p.iter().filter_map(|(token, pp)| q.get(token).map(|qq| (*pp, *qq))).collect();
    let (sum_p, sum_q) = shared.iter().fold((0.0, 0.0), |(a, b), (pp, qq)| (a + pp, b + qq));
    if shared.is_empty() || sum_p <= 0.0 || sum_q <= 0.0 {
        return None;
    }
    let kl =
        shared.iter().map(|(pp, qq)| (pp / sum_p, qq / sum_q)).filter(|(pp, _)| *pp > 0.0).map(|(pp, qq)| pp * (pp / qq).ln()).sum::<f64>();
    kl.is_finite().then_some(kl.max(0.0))
}

/// Token -> probability (tokens that print alike, e.g. partial UTF-8, are summed).
fn probabilities(top: &[(String, f64)]) -> BTreeMap<&str, f64> {
    let mut out = BTreeMap::new();
    for (token, lp) in top.iter().filter(|(_, lp)| lp.is_finite()) {
        *out.entry(token.as_str()).or_insert(0.0) += lp.exp();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(token: &str, logprob: f64, top: &[(&str, f64)]) -> TokenStep {
        TokenStep { token: token.into(), logprob, top: top.iter().map(|(t, lp)| (t.to_string(), *lp)).collect() }
    }

    fn reply(tokens: Vec<TokenStep>) -> Reply {
        let text = tokens.iter().map(|t| t.token.as_str()).collect();
        Reply { text, tokens, prompt_tokens: None, cached_tokens: None, completion_tokens: None, finish_reason: None, wall_ms: 0.0 }
    }

    fn text_reply(text: &str) -> Reply {
        Reply { text: text.into(), ..reply(Vec::new()) }
    }

    #[test]
    fn identical_replies_are_exact() {
        let r = reply(vec![step("a", -0.1, &[("a", -0.1), ("b", -2.5)]), step("b", -0.2, &[("b", -0.2)])]);
        let d = divergence(&r, &r.clone(), DEFAULT_NEAR_TIE);
        assert!(d.exact);
        assert_eq!((d.first_diff, d.agreement, d.compared_tokens), (None, 1.0, 2));
        assert_eq!(d.max_logprob_diff, Some(0.0));
        assert_eq!(d.kl_topk, Some(0.0));
        assert!(!d.near_tie);
    }

    #[test]
    fn a_flip_at_a_near_tie_is_flagged_with_its_margin() {
        let golden = reply(vec![
            step("The", -0.05, &[("The", -0.05), ("A", -3.0)]),
            step(" cat", -0.60, &[(" cat", -0.60), (" dog", -0.80)]),
            step(" sat", -0.1, &[(" sat", -0.1)]),
        ]);
        let patched = reply(vec![
            step("The", -0.07, &[("The", -0.07), ("A", -2.9)]),
            step(" dog", -0.65, &[(" dog", -0.65), (" cat", -0.75)]),
            step(" sat", -0.1, &[(" sat", -0.1)]),
        ]);
        let d = divergence(&golden, &patched, DEFAULT_NEAR_TIE);
        assert!(!d.exact);
        assert_eq!(d.first_diff, Some(1));
        assert!((d.margin_at_diff.unwrap() - 0.2).abs() < 1e-9);
        assert!(d.near_tie);
        assert!((d.agreement - 2.0 / 3.0).abs() < 1e-9);
        assert!((d.max_logprob_diff.unwrap() - 0.02).abs() < 1e-9, "only positions before the flip");
        assert!(d.kl_topk.unwrap() > 0.0);
        assert!(!divergence(&golden, &patched, 0.1).near_tie, "the threshold decides");
    }

    #[test]
    fn a_reply_that_differs_from_its_first_token_still_has_a_kl() {
        let golden = reply(vec![step("A", -0.2, &[("A", -0.2), ("B", -1.8)]), step("x", -0.1, &[("x", -0.1)])]);
        let patched = reply(vec![step("B", -0.3, &[("B", -0.3), ("A", -1.4)]), step("y", -0.1, &[("y", -0.1)])]);
        let d = divergence(&golden, &patched, DEFAULT_NEAR_TIE);
        assert_eq!(d.first_diff, Some(0));
        assert_eq!(d.max_logprob_diff, None, "no agreeing position");
        // KL over the first position alone, where both followed the same prompt.
        let (p, q) = ([(-0.2f64).exp(), (-1.8f64).exp()], [(-1.4f64).exp(), (-0.3f64).exp()]);
        let (p, q) = ([p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1])], [q[0] / (q[0] + q[1]), q[1] / (q[0] + q[1])]);
        let expected = p[0] * (p[0] / q[0]).ln() + p[1] * (p[1] / q[1]).ln();
        assert!((d.kl_topk.unwrap() - expected).abs() < 1e-12, "{:?} against {expected}", d.kl_topk);
    }

    #[test]
    fn a_prefix_differs_where_the_shorter_ends() {
        let long = reply(vec![step("a", -0.1, &[]), step("b", -0.1, &[])]);
        let short = reply(vec![step("a", -0.1, &[])]);
        let d = divergence(&long, &short, DEFAULT_NEAR_TIE);
        assert_eq!((d.first_diff, d.agreement, d.compared_tokens), (Some(1), 0.5, 2));
        assert_eq!(d.margin_at_diff, None, "no top list there");
        assert_eq!(d.kl_topk, None, "no top lists at all");
        let d = divergence(&short, &long, DEFAULT_NEAR_TIE);
        assert_eq!(d.first_diff, Some(1));
        assert_eq!(d.margin_at_diff, None, "the reference had ended");
    }

    #[test]
    fn without_logprobs_words_are_compared() {
        let with = reply(vec![step("one", -0.1, &[]), step(" two", -0.1, &[])]);
        let without = text_reply("one three");
        let d = divergence(&with, &without, DEFAULT_NEAR_TIE);
        assert_eq!((d.first_diff, d.agreement, d.compared_tokens), (Some(1), 0.5, 2));
        assert_eq!((d.margin_at_diff, d.max_logprob_diff, d.kl_topk), (None, None, None));
        let d = divergence(&text_reply(""), &text_reply(""), DEFAULT_NEAR_TIE);
        assert!(d.exact && d.agreement == 1.0 && d.compared_tokens == 0);
    }

    #[test]
    fn kl_uses_shared_tokens_renormalised() {
        let p = [("a".to_string(), 0.5f64.ln()), ("b".to_string(), 0.25f64.ln()), ("x".to_string(), 0.25f64.ln())];
        let q = [("a".to_string(), 0.25f64.ln()), ("b".to_string(), 0.25f64.ln()), ("y".to_string(), 0.5f64.ln())];
        // Shared {a, b}: p = (2/3, 1/3), q = (1/2, 1/2).
        let expected = (2.0 / 3.0) * ((2.0 / 3.0) / 0.5f64).ln() + (1.0 / 3.0) * ((1.0 / 3.0) / 0.5f64).ln();
        assert!((kl_topk(&p, &q).unwrap() - expected).abs() < 1e-12);
        assert_eq!(kl_topk(&p, &[("z".to_string(), -0.1)]), None);
    }

    #[test]
    fn text_match_counts_characters() {
        let m = text_match("héllo world", "héllo there");
        assert_eq!((m.exact, m.common_prefix_chars, m.captured_chars), (false, 6, 11));
        assert!(text_match("same", "same").exact);
    }
}
