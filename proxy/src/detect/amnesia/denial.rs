//! Recognises a reply that denies earlier context ("I can't see anything we discussed before"), in any
//! wording: by fixed phrases (phrases/amnesia.txt) and by structure, per clause: a negation or absence
//! cue, a reference to the conversation's past, and a frame about the assistant's own access, the
//! user's disclosures or the conversation's state must meet in one clause. Code blocks, inline code
//! and quoted text are ignored, and hypothetical, conditional or fictional clauses never count. The
//! structural word lists are data: phrases/amnesia_structure.txt.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::detect::config::normalise;

/// How a denial was recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A fixed phrase of the phrase list.
    Phrase,
    /// The structural rules.
    Structure,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Phrase => "phrase",
            Method::Structure => "structure",
        }
    }
}

/// One recognised denial: where, how, on which cues, and how sure.
#[derive(Debug, Clone, PartialEq)]
pub struct Denial {
    pub method: Method,
    /// The sentence that denies (code and quotes removed, whitespace collapsed).
    pub sentence: String,
    /// The phrase that matched (method `Phrase`), or the structural frame (`self_access`,
    /// `disclosure`, `we`, `state`, `existential`, `self_object`, `absence`, `missing`).
    pub rule: String,
    /// The cues that matched, as (role, words).
    pub cues: Vec<(&'static str, String)>,
    /// 0..1: how specific the match is (a fixed phrase 0.95; a frame 0.6 to 0.9).
    pub confidence: f64,
}

/// The structural lexicon could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum LexiconError {
    #[error("line {line}: entry before any [section]")]
    NoSection { line: usize },
    #[error("line {line}: unknown section [{name}]")]
    UnknownSection { line: usize, name: String },
    #[error("line {line}: a contraction needs `word = expansion`")]
    BadContraction { line: usize },
}

/// Entries of one section, single or multi-word, indexed by first word.
#[derive(Debug, Default)]
struct Cues {
    by_first: HashMap<String, Vec<Vec<String>>, Fnv>,
}

impl Cues {
    fn add(&mut self, entry: &str) {
        let words: Vec<String> = entry.split_whitespace().map(str::to_string).collect();
        if let Some(first) = words.first() {
            let list = self.by_first.entry(first.clone()).or_default();
            list.push(words[1..].to_vec());
            list.sort_by_key(|rest| std::cmp::Reverse(rest.len()));
        }
    }

    /// The number of words of the longest entry that starts at `i`.
    fn at(&self, words: &[&str], i: usize) -> Option<usize> {
        let rests = self.by_first.get(*words.get(i)?)?;
        rests
            .iter()
            .find(|rest| rest.iter().enumerate().all(|(k, w)| words.get(i + 1 + k).is_some_and(|x| x == w)))
            .map(|rest| rest.len() + 1)
    }

    /// A single-word entry.
    fn has(&self, word: &str) -> bool {
        self.by_first.get(word).is_some_and(|rests| rests.iter().any(Vec::is_empty))
    }
}

/// The word lists of phrases/amnesia_structure.txt.
#[derive(Debug, Default)]
pub struct Lexicon {
    contractions: HashMap<String, Vec<String>, Fnv>,
    negation: Cues,
    access: Cues,
    conversation: Cues,
    self_conversation: Cues,
    compound: Cues,
    temporal_strong: Cues,
    temporal_weak: Cues,
    disclosure: Cues,
    we_verbs: Cues,
    raise: Cues,
    self_object: Cues,
    guard: Cues,
    third_party: Cues,
}

impl Lexicon {
    /// Parses `[section]` headers and one entry per line (`#` comments).
    pub fn parse(text: &str) -> Result<Lexicon, LexiconError> {
        let mut lexicon = Lexicon::default();
        let mut section: Option<String> = None;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let line_no = n + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(name.to_string());
                continue;
            }
            let entry = normalise(line);
            let name = section.as_deref().ok_or(LexiconError::NoSection { line: line_no })?;
            let cues = match name {
                "contractions" => {
                    let (word, expansion) = entry.split_once('=').ok_or(LexiconError::BadContraction { line: line_no })?;
                    let expansion: Vec<String> = expansion.split_whitespace().map(str::to_string).collect();
                    if word.trim().is_empty() || expansion.is_empty() {
                        return Err(LexiconError::BadContraction { line: line_no });
                    }
                    lexicon.contractions.insert(word.trim().to_string(), expansion);
                    continue;
                }
                "negation" => &mut lexicon.negation,
                "access" => &mut lexicon.access,
                "conversation" => &mut lexicon.conversation,
                "self_conversation" => &mut lexicon.self_conversation,
                "compound" => &mut lexicon.compound,
                "temporal_strong" => &mut lexicon.temporal_strong,
                "temporal_weak" => &mut lexicon.temporal_weak,
                "disclosure" => &mut lexicon.disclosure,
                "we_verbs" => &mut lexicon.we_verbs,
                "raise" => &mut lexicon.raise,
                "self_object" => &mut lexicon.self_object,
                "guard" => &mut lexicon.guard,
                "third_party" => &mut lexicon.third_party,
                other => return Err(LexiconError::UnknownSection { line: line_no, name: other.to_string() }),
            };
            cues.add(&entry);
        }
        Ok(lexicon)
    }
}

static LEXICON: LazyLock<Lexicon> =
    LazyLock::new(|| Lexicon::parse(include_str!("../phrases/amnesia_structure.txt")).expect("the built-in amnesia lexicon parses"));

/// The first denial in `reply`: a fixed phrase (from `phrases`, normalised) or a structural match,
/// whichever is more confident (the earlier sentence on a tie).
pub fn recognise(reply: &str, phrases: &[String]) -> Option<Denial> {
    recognise_with(&LEXICON, reply, phrases)
}

pub fn recognise_with(lexicon: &Lexicon, reply: &str, phrases: &[String]) -> Option<Denial> {
    let mut best: Option<Denial> = None;
    // Most replies hold no phrase at all: one pass over the whole reply spares one per sentence.
    let index = PhraseIndex::new(phrases);
    let normalised = normalise(reply);
    let index = if index.find(&normalised.split(' ').collect::<Vec<_>>()).is_some() { Some(index) } else { None };
    for sentence in sentences(reply) {
        let lower = sentence.to_lowercase();
        let words = words(lexicon, &lower);
        // "When the chat starts, there are no messages": a generic or conditional sentence.
        let conditional = words.first().is_some_and(|w| matches!(*w, "when" | "whenever" | "if" | "unless"));
        let found = index.as_ref().and_then(|index| phrase_in(lexicon, &sentence, index)).or_else(|| {
            let clauses = clauses(&words).filter(|c| !conditional && triggered(lexicon, c) && !guarded(lexicon, c));
            clauses.filter_map(|c| frames(lexicon, c)).max_by(|a, b| a.2.total_cmp(&b.2))
        });
        if let Some((rule, cues, confidence)) = found {
            let method = if cues.is_empty() { Method::Phrase } else { Method::Structure };
            if best.as_ref().is_none_or(|b| confidence > b.confidence) {
                best = Some(Denial { method, sentence: sentence.clone(), rule, cues, confidence });
            }
        }
    }
    best
}

type Found = (String, Vec<(&'static str, String)>, f64);

/// The phrases by first word, as word sequences.
struct PhraseIndex<'p> {
    by_first: HashMap<&'p str, Vec<(&'p String, Vec<&'p str>)>, Fnv>,
}

impl<'p> PhraseIndex<'p> {
    fn new(phrases: &'p [String]) -> PhraseIndex<'p> {
        let mut by_first: HashMap<&str, Vec<(&String, Vec<&str>)>, Fnv> = HashMap::default();
        for phrase in phrases {
            let words: Vec<&str> = phrase.split(' ').collect();
            by_first.entry(words[0]).or_default().push((phrase, words));
        }
        PhraseIndex { by_first }
    }

    /// The first phrase in `words` (normalised text split at spaces) and the index of its first word.
    /// Words match when equal once trailing punctuation is trimmed; the phrase's last word may also be
    /// the start of the text's ("conversation" in "conversations").
    fn find(&self, words: &[&str]) -> Option<(&'p String, usize)> {
        fn bare(w: &str) -> &str {
            w.trim_end_matches(|c: char| c.is_ascii_punctuation())
        }
        for i in 0..words.len() {
            let Some(candidates) = self.by_first.get(bare(words[i])).or_else(|| self.by_first.get(words[i])) else {
                continue;
            };
            for (phrase, pw) in candidates {
                let last = pw.len() - 1;
                let matched = pw
                    .iter()
                    .enumerate()
                    .all(|(k, p)| words.get(i + k).is_some_and(|w| bare(w) == *p || *w == *p || (k == last && w.starts_with(p))));
                if matched {
                    return Some((phrase, i));
                }
            }
        }
        None
    }
}

/// A fixed phrase in the sentence, unless a guard word (if, hypothetically, ...) comes before it.
fn phrase_in(lexicon: &Lexicon, sentence: &str, index: &PhraseIndex<'_>) -> Option<Found> {
    let text = normalise(sentence);
    let split: Vec<&str> = text.split(' ').collect();
    let (phrase, at) = index.find(&split)?;
    let before = words(lexicon, &text[..split[..at].iter().map(|w| w.len() + 1).sum::<usize>()]);
    if (0..before.len()).any(|i| lexicon.guard.at(&before, i).is_some()) {
        return None;
    }
    Some((phrase.clone(), Vec::new(), 0.95))
}

/// FNV-1a: the lexicon's keys are short words, for which SipHash costs more than the lookup.
#[derive(Debug, Default, Clone, Copy)]
struct Fnv;

impl std::hash::BuildHasher for Fnv {
    type Hasher = FnvHasher;
    fn build_hasher(&self) -> FnvHasher {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

struct FnvHasher(u64);

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The reply's sentences, without fenced code blocks, block quotes, inline code and quoted text.
fn sentences(reply: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in reply.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code || trimmed.starts_with('>') || line.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        let cleaned = strip_spans(line);
        let mut current = String::new();
        let chars: Vec<char> = cleaned.chars().collect();
        for (i, &ch) in chars.iter().enumerate() {
            current.push(ch);
            let next = chars.get(i + 1).copied();
            if matches!(ch, '.' | '!' | '?') && next.is_none_or(char::is_whitespace) {
                push_sentence(&mut out, &mut current);
            }
        }
        push_sentence(&mut out, &mut current);
    }
    out
}

fn push_sentence(out: &mut Vec<String>, current: &mut String) {
    let sentence = current.split_whitespace().collect::<Vec<_>>().join(" ");
    if sentence.chars().any(char::is_alphabetic) {
        out.push(sentence);
    }
    current.clear();
}

/// Inline code and quoted text replaced by a placeholder word.
fn strip_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        let boundary_before = i == 0 || !chars[i - 1].is_alphanumeric();
        let close = match ch {
            '`' => Some('`'),
            '"' => Some('"'),
            '\u{201c}' => Some('\u{201d}'),
            '\'' | '\u{2018}' if boundary_before => Some(if ch == '\'' { '\'' } else { '\u{2019}' }),
            _ => None,
        };
        if let Some(close) = close {
            let end = (i + 1..chars.len()).find(|&j| {
                chars[j] == close && (close != '\'' && close != '\u{2019}' || chars.get(j + 1).is_none_or(|c| !c.is_alphanumeric()))
            });
            if let Some(end) = end {
                out.push_str(if ch == '`' { " code " } else { " quote " });
                i = end + 1;
                continue;
            }
        }
        out.push(ch);
        i += 1;
    }
    out
}

/// A clause break: punctuation (kept as the word ",") or a conjunction.
const BREAK: &str = ",";

/// Lower-cased words, contractions expanded; clause punctuation becomes `,`.
fn words<'a>(lexicon: &'a Lexicon, lower: &'a str) -> Vec<&'a str> {
    let mut out = Vec::new();
    for piece in lower.split(|c: char| c.is_whitespace() || matches!(c, '/' | '.' | '!' | '?' | '*')) {
        let mut rest = piece;
        while !rest.is_empty() {
            let end = rest.find([',', ';', ':', '(', ')', '[', ']', '\u{2014}', '\u{2013}']).unwrap_or(rest.len());
            let word = rest[..end].trim_matches(|c: char| !c.is_alphanumeric());
            if !word.is_empty() {
                match lexicon.contractions.get(word) {
                    Some(expansion) => out.extend(expansion.iter().map(String::as_str)),
                    None => out.push(word),
                }
            } else if rest[..end] == *"-" {
                out.push(BREAK);
            }
            if end < rest.len() {
                out.push(BREAK);
                let width = rest[end..].chars().next().map_or(1, char::len_utf8);
                rest = &rest[end + width..];
            } else {
                rest = "";
            }
        }
    }
    out
}

/// Clauses: runs of words between breaks and conjunctions ("so far" is not a break).
fn clauses<'w, 'a>(words: &'w [&'a str]) -> impl Iterator<Item = &'w [&'a str]> {
    let mut start = 0;
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let conjunction = matches!(*w, "but" | "because" | "although" | "though" | "however" | "whereas" | "while")
            || (*w == "so" && words.get(i + 1) != Some(&"far"));
        if *w == BREAK || conjunction {
            if i > start {
                out.push(&words[start..i]);
            }
            start = i + 1;
        }
    }
    if words.len() > start {
        out.push(&words[start..]);
    }
    out.into_iter()
}

/// Every frame needs a negation cue, "missing", or a word of the conversation's start: a clause
/// without one (most clauses) is not examined further.
fn triggered(lexicon: &Lexicon, c: &[&str]) -> bool {
    c.iter().any(|w| {
        lexicon.negation.has(w)
            || matches!(*w, "missing" | "first" | "start" | "beginning" | "opening" | "initial" | "starting" | "getting")
            || matches!(*w, "begins" | "starts" | "begin" | "begun" | "empty")
    })
}

fn guarded(lexicon: &Lexicon, c: &[&str]) -> bool {
    c.first() == Some(&"when") || (0..c.len()).any(|i| lexicon.guard.at(c, i).is_some())
}

/// The most confident frame that matches the clause.
fn frames(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let found = [
        self_access(lx, c),
        disclosure(lx, c),
        we(lx, c),
        state(lx, c),
        existential(lx, c),
        self_object(lx, c),
        absence(lx, c),
        missing(lx, c),
        subject(lx, c),
    ];
    found.into_iter().flatten().max_by(|a, b| a.2.total_cmp(&b.2))
}

fn is_conversation(lx: &Lexicon, c: &[&str], i: usize, with_self: bool) -> bool {
    let head = lx.conversation.has(c[i]) || (with_self && lx.self_conversation.has(c[i]));
    head && !c.get(i + 1).is_some_and(|next| lx.compound.has(next))
}

/// `you` (or `we`/`us`) followed within three words by a verb of disclosure: "the code you mentioned".
fn disclosed_at(lx: &Lexicon, c: &[&str], i: usize) -> Option<usize> {
    let verbs = |w: &str| match c[i] {
        "you" => lx.disclosure.has(w),
        "we" | "us" => lx.we_verbs.has(w) || lx.disclosure.has(w) || matches!(w, "discussing" | "talking" | "chatting" | "speaking"),
        _ => false,
    };
    (i + 1..c.len().min(i + 4)).find(|&j| verbs(c[j]))
}

/// A reference to the conversation's past in `c[from..]`: a conversation word, a disclosure, a
/// strong temporal phrase, or a weak temporal word after `your`/`our`.
fn past(lx: &Lexicon, c: &[&str], from: usize, with_self: bool) -> Option<String> {
    for i in from..c.len() {
        if is_conversation(lx, c, i, with_self) {
            return Some(c[i].to_string());
        }
        if let Some(n) = lx.temporal_strong.at(c, i) {
            return Some(c[i..i + n].join(" "));
        }
        if let Some(j) = disclosed_at(lx, c, i) {
            return Some(c[i..=j].join(" "));
        }
        if lx.temporal_weak.has(c[i]) && i > 0 && matches!(c[i - 1], "your" | "our") {
            return Some(c[i - 1..=i].join(" "));
        }
    }
    None
}

/// A weak temporal word in a clause whose object is a "what ..." / "anything ..." clause.
fn weak_past(lx: &Lexicon, c: &[&str], from: usize) -> Option<String> {
    let wh = c[from.min(c.len())..].iter().any(|w| matches!(*w, "what" | "anything" | "everything"));
    let word = c[from.min(c.len())..].iter().find(|w| lx.temporal_weak.has(w))?;
    wh.then(|| word.to_string())
}

fn neg_in(lx: &Lexicon, c: &[&str], range: std::ops::Range<usize>) -> Option<usize> {
    range.take_while(|&i| i < c.len()).find(|&i| lx.negation.has(c[i]))
}

fn cues(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(role, w)| (*role, w.to_string())).collect()
}

/// "I don't have / can't see / have no record of / am unable to access" + the conversation's past.
fn self_access(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    for i in (0..c.len()).filter(|&i| c[i] == "i") {
        let neg_access = neg_in(lx, c, i + 1..i + 8).and_then(|n| {
            if matches!(c[n], "without" | "lack" | "lacking") {
                return Some((n, n));
            }
            let a = (n + 1..c.len().min(n + 4)).find(|&a| lx.access.at(c, a).is_some())?;
            Some((n, a))
        });
        let have_no = || {
            (i + 1..c.len().min(i + 5))
                .find(|&a| {
                    matches!(c[a], "have" | "had" | "has" | "got") && c.get(a + 1).is_some_and(|w| matches!(*w, "no" | "nothing" | "zero"))
                })
                .map(|a| (a + 1, a))
        };
        let see_only = || {
            (i + 1..c.len().min(i + 5)).find(|&a| lx.access.has(c[a]) && c[a + 1..c.len().min(a + 3)].contains(&"only")).map(|a| (a + 1, a))
        };
        let Some((n, a)) = neg_access.or_else(have_no).or_else(see_only) else {
            continue;
        };
        let found = past(lx, c, 0, true).map(|p| (p, 0.8)).or_else(|| weak_past(lx, c, a + 1).map(|p| (p, 0.7)));
        if let Some((p, confidence)) = found {
            return Some(("self_access".into(), cues(&[("subject", "i"), ("negation", c[n]), ("access", c[a]), ("past", &p)]), confidence));
        }
    }
    None
}

/// "You haven't told me", "you never mentioned", "I don't think you've shared".
fn disclosure(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let raised = (1..c.len()).any(|r| lx.raise.has(c[r]) && c[..r].contains(&"not") && c[..r].contains(&"i"));
    for u in (0..c.len()).filter(|&u| c[u] == "you") {
        let n = neg_in(lx, c, u + 1..u + 4).filter(|&n| c[n] != "only");
        let start = n.map_or(u + 1, |n| n + 1);
        if n.is_none() && !(raised && c[..u].contains(&"not")) {
            continue;
        }
        let Some(d) = (start..c.len().min(start + 3)).find(|&d| lx.disclosure.has(c[d])) else {
            continue;
        };
        if c.get(d + 1).is_some_and(|w| lx.third_party.has(w)) {
            continue;
        }
        let neg = n.map_or("not (raised)", |n| c[n]);
        return Some(("disclosure".into(), cues(&[("subject", "you"), ("negation", neg), ("disclosure", c[d])]), 0.8));
    }
    None
}

/// "We haven't spoken before", "we have no shared history", "I don't believe we've chatted".
fn we(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    for w in (0..c.len()).filter(|&w| c[w] == "we") {
        let n = neg_in(lx, c, w + 1..w + 4).filter(|&n| c[n] != "only");
        let raised = c[..w].contains(&"not") && c[..w].iter().any(|x| lx.raise.has(x));
        if n.is_none() && !raised {
            continue;
        }
        let start = n.map_or(w + 1, |n| n + 1);
        let verb = (start..c.len().min(start + 3)).find(|&v| lx.we_verbs.has(c[v]) || (c[v] == "worked" && c.contains(&"together")));
        let history = n.filter(|&n| c[n] == "no").and_then(|n| (n + 1..c.len().min(n + 3)).find(|&h| is_conversation(lx, c, h, true)));
        if let Some(v) = verb.or(history) {
            let neg = n.map_or("not (raised)", |n| c[n]);
            return Some(("we".into(), cues(&[("subject", "we"), ("negation", neg), ("past", c[v])]), 0.8));
        }
    }
    None
}

/// The conversation's state: "this is the first message you've sent", "we're just getting started",
/// "our conversation begins with", "my context starts at your last message", "our chat is empty".
fn state(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    // "this is / seems to be / appears to be the first ... (conversation word | you)"
    for f in (0..c.len()).filter(|&f| matches!(c[f], "first" | "start" | "beginning" | "opening" | "initial")) {
        let window = &c[f.saturating_sub(5)..f];
        let framed = window.iter().any(|w| matches!(*w, "this" | "it"))
            && window.iter().any(|w| matches!(*w, "is" | "seems" | "appears" | "looks" | "be"));
        let mut d = f;
        while d > 0 && c[d - 1] == "very" {
            d -= 1;
        }
        if !framed || d == 0 || !matches!(c[d - 1], "the" | "our" | "my" | "this") {
            continue;
        }
        let after = f + 1..c.len().min(f + 7);
        let object = after.clone().find(|&j| is_conversation(lx, c, j, false) || c[j] == "you" || (c[j] == "hearing" && c[j - 1] == "am"));
        if let Some(j) = object {
            return Some(("state".into(), cues(&[("frame", "this is the"), ("past", c[f]), ("conversation", c[j])]), 0.85));
        }
    }
    // "we are (just) starting / getting started / at the start of"
    if let Some(w) = c.iter().position(|w| *w == "we") {
        let mut k = w + 1;
        while c.get(k).is_some_and(|x| {
            matches!(*x, "are" | "appear" | "seem" | "to" | "be" | "just" | "only" | "now" | "at" | "the" | "very" | "here")
        }) {
            k += 1;
        }
        if c.get(k).is_some_and(|x| matches!(*x, "starting" | "beginning" | "start" | "getting")) {
            let mut e = k + 1;
            while c.get(e).is_some_and(|x| {
                matches!(*x, "out" | "started" | "fresh" | "from" | "scratch" | "over" | "here" | "then" | "of" | "this" | "our" | "the")
            }) {
                e += 1;
            }
            let object_ok = e >= c.len() || is_conversation(lx, c, e, false);
            if object_ok && k > w + 1 {
                return Some(("state".into(), cues(&[("subject", "we"), ("frame", c[k]), ("past", "start of the conversation")]), 0.8));
            }
        }
    }
    // "(our | this | my) conversation ... begins / starts / is empty"
    for i in 0..c.len() {
        let owned = i > 0 && matches!(c[i - 1], "our" | "this" | "my");
        let subject = is_conversation(lx, c, i, false) || (i > 0 && c[i - 1] == "my" && matches!(c[i], "context" | "view" | "history"));
        if owned && subject {
            if let Some(v) =
                (i + 1..c.len().min(i + 5)).find(|&v| matches!(c[v], "begins" | "starts" | "start" | "begin" | "begun" | "empty"))
            {
                return Some(("state".into(), cues(&[("conversation", c[i]), ("frame", c[v])]), 0.85));
            }
        }
    }
    None
}

const MODIFIERS: &[&str] = &[
    "any", "of", "the", "your", "our", "my", "this", "earlier", "previous", "prior", "past", "other", "real", "such", "more", "shared",
    "part", "parts", "trace", "sign", "mention", "a", "an", "single", "kind", "at", "all",
];

/// "There's no earlier conversation", "No previous messages were included", "Nothing has been said".
fn existential(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let mut quantifiers = Vec::new();
    if let Some(t) = c.iter().position(|w| *w == "there") {
        let mut k = t + 1;
        while c.get(k).is_some_and(|x| {
            matches!(*x, "is" | "are" | "was" | "were" | "has" | "have" | "been" | "seems" | "to" | "be" | "appear" | "appears")
        }) {
            k += 1;
        }
        if c.get(k).is_some_and(|x| matches!(*x, "no" | "nothing" | "none" | "not")) {
            quantifiers.push(k);
        }
    }
    let lead =
        c.iter().position(|w| !matches!(*w, "sorry" | "unfortunately" | "okay" | "ok" | "hmm" | "well" | "and" | "no")).unwrap_or(c.len());
    quantifiers.extend((0..c.len()).filter(|&q| matches!(c[q], "none" | "nothing") || (c[q] == "no" && q + 1 == lead.max(1))));
    for q in quantifiers {
        let mut h = q + 1;
        while h < c.len() && h <= q + 6 && MODIFIERS.contains(&c[h]) && !is_conversation(lx, c, h, false) {
            h += 1;
        }
        let head = (h < c.len() && is_conversation(lx, c, h, false)).then(|| c[h].to_string());
        let temporal = lx.temporal_strong.at(c, q + 1).map(|n| c[q + 1..q + 1 + n].join(" "));
        let said = (c[q] == "nothing")
            .then(|| (q + 1..c.len().min(q + 5)).find(|&d| lx.disclosure.has(c[d]) || lx.we_verbs.has(c[d])).map(|d| c[d].to_string()))
            .flatten();
        let location = location(lx, c);
        if let Some(p) = head.or(temporal).or(said).or(location) {
            return Some(("existential".into(), cues(&[("negation", c[q]), ("past", &p)]), 0.8));
        }
    }
    None
}

/// "in this conversation", "in our chat", "earlier in the thread", "in anything you've sent".
fn location(lx: &Lexicon, c: &[&str]) -> Option<String> {
    for i in (0..c.len()).filter(|&i| matches!(c[i], "in" | "from")) {
        let mut k = i + 1;
        while c.get(k).is_some_and(|x| matches!(*x, "this" | "our" | "my" | "the" | "what" | "anything")) {
            k += 1;
        }
        let mine = c[k - 1] == "my";
        if k > i + 1 && k < c.len() && is_conversation(lx, c, k, mine) && !matches!(c[k - 1], "the" | "what" | "anything") {
            return Some(c[i..=k].join(" "));
        }
        if c.get(i + 1).is_some_and(|x| matches!(*x, "what" | "anything"))
            && c.get(i + 2) == Some(&"you")
            && disclosed_at(lx, c, i + 2).is_some()
        {
            return Some(c[i..c.len().min(i + 5)].join(" "));
        }
    }
    None
}

/// "Your earlier messages aren't visible to me", "None of it reached me", "nothing in my memory".
fn self_object(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let n = neg_in(lx, c, 0..c.len()).filter(|&n| c[n] != "only")?;
    let (o, len) = (0..c.len()).find_map(|i| lx.self_object.at(c, i).map(|len| (i, len)))?;
    let p = past(lx, c, 0, true).or_else(|| (c.contains(&"memory") && o > 0 && c[o - 1] == "in").then(|| "my memory".to_string()))?;
    Some(("self_object".into(), cues(&[("negation", c[n]), ("to", &c[o..o + len].join(" ")), ("past", &p)]), 0.75))
}

/// "I can't see it anywhere in our conversation", "it isn't in this chat".
fn absence(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let n = neg_in(lx, c, 0..c.len()).filter(|&n| c[n] != "only")?;
    let at = location(lx, c)?;
    Some(("absence".into(), cues(&[("negation", c[n]), ("past", &at)]), 0.7))
}

/// "The earlier context isn't something I can see": the conversation's past as the subject, a negation,
/// and the assistant in the clause.
fn subject(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let mut k = 0;
    while c.get(k).is_some_and(|w| matches!(*w, "the" | "your" | "our" | "this")) {
        k += 1;
    }
    let weak = c.get(k).is_some_and(|w| lx.temporal_weak.has(w));
    let head = k + usize::from(weak);
    if k == 0 || head >= c.len() || !is_conversation(lx, c, head, false) || !(weak || c[k - 1] == "our") {
        return None;
    }
    let n = neg_in(lx, c, head + 1..c.len()).filter(|&n| c[n] != "only")?;
    let me = c[n..].iter().find(|w| matches!(**w, "i" | "me" | "my"))?;
    Some(("subject".into(), cues(&[("past", &c[k..=head].join(" ")), ("negation", c[n]), ("self", me)]), 0.75))
}

/// "I'm missing the earlier conversation", "the earlier turns are missing".
fn missing(lx: &Lexicon, c: &[&str]) -> Option<Found> {
    let m = c.iter().position(|w| *w == "missing")?;
    let conv = (m.saturating_sub(4)..c.len().min(m + 5)).find(|&i| i != m && is_conversation(lx, c, i, false))?;
    Some(("missing".into(), cues(&[("negation", "missing"), ("past", c[conv])]), 0.75))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recognised(text: &str) -> Option<Denial> {
        recognise(text, &crate::detect::config::DetectConfig::default().amnesia_phrases)
    }

    #[test]
    fn the_built_in_lexicon_parses_and_bad_files_are_errors() {
        assert!(Lexicon::parse(include_str!("../phrases/amnesia_structure.txt")).is_ok());
        assert!(matches!(Lexicon::parse("word"), Err(LexiconError::NoSection { line: 1 })));
        assert!(matches!(Lexicon::parse("[nope]\nx"), Err(LexiconError::UnknownSection { line: 2, .. })));
        assert!(matches!(Lexicon::parse("[contractions]\ndon't"), Err(LexiconError::BadContraction { line: 2 })));
    }

    #[test]
    fn reworded_denials_are_recognised_by_structure() {
        for text in [
            "Sorry, I can't see anything we talked about before this message.",
            "Hmm. I have no record of an earlier conversation with you. Could you paste the file?",
            "You never told me which database you use.",
            "It looks like we're just getting started, so I don't know your project yet.",
            "Here's the fix.\n```rust\nlet x = 1;\n```\nThe earlier messages aren't visible to me, so the imports may differ.",
        ] {
            let found = recognised(text).unwrap_or_else(|| panic!("missed: {text}"));
            assert_eq!(found.method, Method::Structure, "{text}: {found:?}");
            assert!(!found.cues.is_empty() && found.confidence >= 0.6, "{found:?}");
        }
    }

    #[test]
    fn innocent_uses_of_the_same_words_are_not_denials() {
        for text in [
            "As I mentioned earlier, the vector reallocates when it grows.",
            "The first step is to install the dependencies.",
            "I don't have a preference between the previous two options.",
            "There is no previous version of this API.",
            "This is the first time the function is called, so the cache is empty.",
            "You said \"I don't have any previous conversation with you\", which is what the bot replied.",
            "My colleague doesn't remember our previous meeting.",
            "```python\n# there is no previous message in this conversation yet\nhistory = []\n```",
            "If I didn't have the earlier messages, I would ask you to repeat them.",
            "Hypothetically, a model that lost its history would say this is our first conversation.",
            "Git has no record of the file because it was never committed.",
            "I don't have access to your server, but the earlier logs are in journald.",
        ] {
            assert_eq!(recognised(text), None, "{text}");
        }
    }

    #[test]
    fn a_fixed_phrase_is_reported_as_a_phrase() {
        let found = recognised("I'm sorry, but I don't have any previous conversation with you.").unwrap();
        assert_eq!((found.method, found.rule.as_str()), (Method::Phrase, "i don't have any previous conversation"));
        assert_eq!(found.sentence, "I'm sorry, but I don't have any previous conversation with you.");
    }
}
