//! Where a reply left golden's path, in context: golden's tokens and the target's around the first
//! divergent position, the differing token in `<mark>`, plus each side's top alternatives there.
//! Replies without logprobs carry no tokens; then the two texts are compared by character.

use super::view::escape;
use crate::model::{Divergence, Reply, TokenStep};
use std::fmt::Write as _;

/// Tokens shown on each side of the first divergent token.
pub const CONTEXT_TOKENS: usize = 12;
/// Characters shown on each side when comparing texts (no tokens).
const CONTEXT_CHARS: usize = 80;

/// Two rows (golden, target) of highlighted context and a note on the alternatives, as HTML.
pub(crate) fn context(golden_name: &str, golden: &Reply, name: &str, reply: &Reply, d: &Divergence) -> String {
    let mut s = String::from(r#"<table class="ctx">"#);
    match d.first_diff {
        Some(pos) if !golden.tokens.is_empty() && !reply.tokens.is_empty() => {
            for (who, r) in [(golden_name, golden), (name, reply)] {
                let _ = write!(s, "<tr><th>{}</th><td>{}</td></tr>", escape(who), token_window(&r.tokens, pos));
            }
            s.push_str("</table>");
            for (who, r) in [(golden_name, golden), (name, reply)] {
                if let Some(step) = r.tokens.get(pos) {
                    s.push_str(&alternatives(who, pos, step));
                }
            }
        }
        _ => {
            let at = common_prefix_chars(&golden.text, &reply.text);
            for (who, r) in [(golden_name, golden), (name, reply)] {
                let _ = write!(s, "<tr><th>{}</th><td>{}</td></tr>", escape(who), char_window(&r.text, at));
            }
            s.push_str("</table>");
            let _ = write!(
                s,
                r#"<p class="note">no token logprobs on both sides: texts compared by character, first difference at character {at}</p>"#
            );
        }
    }
    s
}

/// The tokens `pos - CONTEXT_TOKENS ..= pos + CONTEXT_TOKENS`, the one at `pos` marked (or an end
/// marker when the reply stopped before `pos`).
fn token_window(tokens: &[TokenStep], pos: usize) -> String {
    let start = pos.saturating_sub(CONTEXT_TOKENS);
    let end = (pos + CONTEXT_TOKENS + 1).min(tokens.len());
    let mut s = String::from(r#"<span class="toks">"#);
    if start > 0 {
        s.push_str(r#"<span class="more">…</span>"#);
    }
    for (i, t) in tokens.iter().enumerate().take(end).skip(start.min(end)) {
        let text = visible(&t.token);
        if i == pos {
            let _ = write!(s, r#"<mark class="tok" title="position {pos}, logprob {:.3}">{text}</mark>"#, t.logprob);
        } else {
            let _ = write!(s, r#"<span class="tok">{text}</span>"#);
        }
    }
    if pos >= tokens.len() {
        s.push_str(r#"<mark class="end">⟨end⟩</mark>"#);
    } else if end < tokens.len() {
        s.push_str(r#"<span class="more">…</span>"#);
    }
    s.push_str("</span>");
    s
}

/// The text around character `at`, the word starting there marked.
fn char_window(text: &str, at: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    let start = at.saturating_sub(CONTEXT_CHARS);
    let before: String = chars[start.min(chars.len())..at.min(chars.len())].iter().collect();
    let mut s = String::from(r#"<span class="toks">"#);
    if start > 0 {
        s.push_str(r#"<span class="more">…</span>"#);
    }
    s.push_str(&visible(&before));
    if at >= chars.len() {
        s.push_str(r#"<mark class="end">⟨end⟩</mark>"#);
    } else {
        let word_end = (at + 1..chars.len()).find(|&i| chars[i].is_whitespace()).unwrap_or(chars.len());
        let word: String = chars[at..word_end].iter().collect();
        let after_end = (word_end + CONTEXT_CHARS).min(chars.len());
        let after: String = chars[word_end..after_end].iter().collect();
        let _ = write!(s, r#"<mark class="tok">{}</mark>{}"#, visible(&word), visible(&after));
        if after_end < chars.len() {
            s.push_str(r#"<span class="more">…</span>"#);
        }
    }
    s.push_str("</span>");
    s
}

/// A side's top alternatives at the divergent position.
fn alternatives(who: &str, pos: usize, step: &TokenStep) -> String {
    if step.top.is_empty() {
        return String::new();
    }
    let alts: Vec<String> = step.top.iter().take(5).map(|(tok, lp)| format!("<code>{}</code> {lp:.3}", visible(tok))).collect();
    format!(r#"<p class="alts">{}'s top at {pos}: {}</p>"#, escape(who), alts.join(" · "))
}

/// Escaped, with line breaks and tabs shown as glyphs so a token made of whitespace stays visible.
fn visible(s: &str) -> String {
    escape(s).replace('\n', "↵").replace('\t', "⇥").replace('\r', "␍")
}

fn common_prefix_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}
