//! Requests known by their bytes. Every turn resends the whole history; a request whose body starts
//! with all the messages of a recent request, byte for byte (compared, not hashed), takes those
//! messages' hashes, chain and facts from it and parses only the rest: the top-level fields and the
//! new messages. Anything else (another layout, an edit in the history, another API) is parsed
//! whole. Chat completions and Ollama chat, whose messages are the body's array as sent.

use std::collections::VecDeque;

use bytes::Bytes;
use ctxscope_store::{Endpoint, Hash};
use serde_json::Value;

use crate::parse::message::{Facts, Message};
use crate::parse::skim::{self, Layout};
use crate::parse::{self, ParseError, ParsedRequest};

/// Bodies kept at most, and their bytes at most (a larger body is not kept).
const MAX_RECORDS: usize = 64;
const MAX_BYTES: usize = 4 << 20;
const MAX_BODY: usize = 1 << 20;

/// A parsed request and what was known of it.
pub struct Parsed {
    pub request: ParsedRequest,
    /// Hashes and chain links of the first messages, known from an earlier request (may be empty).
    pub hashes: Vec<Hash>,
    pub chain: Vec<Hash>,
    /// Where the messages lie in the body, when the body can be remembered.
    layout: Option<Layout>,
    /// The record this request continues (replaced by it when remembered).
    continues: Option<usize>,
}

/// Recent requests' bodies with their messages' spans, hashes, chain links and facts.
#[derive(Default)]
pub struct KnownRequests {
    records: VecDeque<Record>,
    bytes: usize,
}

struct Record {
    body: Bytes,
    open: usize,
    /// The messages' spans in `body`, with what they hashed to.
    entries: Vec<Entry>,
}

struct Entry {
    start: usize,
    end: usize,
    hash: Hash,
    chain: Hash,
    facts: Facts,
}

impl KnownRequests {
    /// Parses a request, reusing what a recent request it extends knew.
    pub fn parse(&self, endpoint: Endpoint, body: &Bytes) -> Result<Parsed, ParseError> {
        let chat = matches!(endpoint, Endpoint::ChatCompletions | Endpoint::OllamaChat);
        if chat {
            for (at, record) in self.records.iter().enumerate().rev() {
                if record.is_prefix_of(body) {
                    if let Some(parsed) = record.extend(endpoint, body, at) {
                        return Ok(parsed);
                    }
                    break;
                }
            }
        }
        let request = parse::request(endpoint, body)?;
        let layout = if chat && body.len() <= MAX_BODY { skim::layout(body) } else { None };
        // The scan must agree with serde_json, or nothing is remembered.
        let layout = layout.filter(|l| l.spans.len() == request.messages.len());
        Ok(Parsed { request, hashes: Vec::new(), chain: Vec::new(), layout, continues: None })
    }

    /// Keeps `body` with its messages' hashes and chain, for the requests that will extend it.
    pub fn remember(&mut self, body: &Bytes, parsed: &Parsed, hashes: &[Hash], chain: &[Hash]) {
        let Some(layout) = &parsed.layout else { return };
        let messages = &parsed.request.messages;
        if layout.spans.is_empty() || body.len() > MAX_BODY || hashes.len() != messages.len() || chain.len() != messages.len() {
            return;
        }
        if let Some(at) = parsed.continues {
            if let Some(old) = self.records.remove(at) {
                self.bytes -= old.body.len();
            }
        }
        while self.records.len() >= MAX_RECORDS || self.bytes + body.len() > MAX_BYTES {
            let Some(old) = self.records.pop_front() else { break };
            self.bytes -= old.body.len();
        }
        let entries = (layout.spans.iter().zip(messages).zip(hashes.iter().zip(chain)))
            .map(|((&(start, end), message), (&hash, &chain))| Entry { start, end, hash, chain, facts: message.facts().clone() })
            .collect();
        // An exact copy: the body may be a view into a larger buffer.
        let body = Bytes::copy_from_slice(body);
        self.bytes += body.len();
        self.records.push_back(Record { body, open: layout.open, entries });
    }
}

impl Record {
    /// Whether `body` starts with all of this request's messages, byte for byte.
    fn is_prefix_of(&self, body: &[u8]) -> bool {
        let Some(last) = self.entries.last() else { return false };
        let end = last.end;
        // The end of the last message first: it tells conversations with one system prompt apart.
        let tail = end.saturating_sub(32);
        body.len() > end && body[tail..end] == self.body[tail..end] && body[..end] == self.body[..end]
    }

    /// `body`, which starts with this request's messages: the rest parsed, the messages reused.
    fn extend(&self, endpoint: Endpoint, body: &Bytes, at: usize) -> Option<Parsed> {
        let known = self.entries.len();
        let (new_spans, close) = skim::rest_of_array(body, self.entries[known - 1].end)?;
        // The fields besides the messages, with the array replaced by a marker: were there another
        // `messages` key after it, serde_json would keep that one and the marker would be gone.
        let mut top = Vec::with_capacity(self.open + 4 + body.len() - close);
        top.extend_from_slice(&body[..self.open]);
        top.extend_from_slice(b"true");
        top.extend_from_slice(&body[close + 1..]);
        let top: Value = serde_json::from_slice(&top).ok()?;
        let object = top.as_object().filter(|o| o.get("messages") == Some(&Value::Bool(true)))?;
        let mut request = parse::head(endpoint, object);
        request.messages.reserve(known + new_spans.len());
        for entry in &self.entries {
            request.messages.push(Message::known(body.slice(entry.start..entry.end), entry.facts.clone()));
        }
        for &(start, end) in &new_spans {
            request.messages.push(Message::new(serde_json::from_slice(&body[start..end]).ok()?));
        }
        let spans = self.entries.iter().map(|e| (e.start, e.end)).chain(new_spans).collect();
        Some(Parsed {
            request,
            hashes: self.entries.iter().map(|e| e.hash).collect(),
            chain: self.entries.iter().map(|e| e.chain).collect(),
            layout: (body.len() <= MAX_BODY).then_some(Layout { open: self.open, close, spans }),
            continues: Some(at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxscope_store::{extend_chain, message_hash};
    use serde_json::json;

    fn remember(known: &mut KnownRequests, body: &Bytes) -> Parsed {
        let parsed = known.parse(Endpoint::ChatCompletions, body).unwrap();
        let mut hashes = parsed.hashes.clone();
        hashes.extend(parsed.request.messages[hashes.len()..].iter().map(|m| message_hash(m).0));
        let mut chain = parsed.chain.clone();
        extend_chain(&mut chain, &hashes[parsed.chain.len()..]);
        known.remember(body, &parsed, &hashes, &chain);
        let whole = parse::request(Endpoint::ChatCompletions, body).unwrap();
        assert_eq!(parsed.request, whole, "reused parse differs from the whole parse");
        let expected: Vec<Hash> = whole.messages.iter().map(|m| message_hash(m).0).collect();
        assert_eq!(hashes, expected);
        assert_eq!(
            parsed.request.messages.iter().map(Message::facts).collect::<Vec<_>>(),
            whole.messages.iter().map(Message::facts).collect::<Vec<_>>()
        );
        parsed
    }

    fn body(value: Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&value).unwrap())
    }

    #[test]
    fn an_extending_request_reuses_every_known_message_and_parses_like_the_whole() {
        let mut known = KnownRequests::default();
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        for turn in 0..5 {
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
            let parsed =
                remember(&mut known, &body(json!({"model": "m", "messages": messages, "stream": turn % 2 == 0, "temperature": 0.5})));
            assert_eq!(parsed.hashes.len(), if turn == 0 { 0 } else { messages.len() - 2 }, "turn {turn}");
            messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        }
        assert_eq!(known.records.len(), 1, "each turn replaced the record it extended");
        // Another conversation with the same system prompt is not confused with this one.
        let other = remember(&mut known, &body(json!({"model": "m", "messages": [messages[0], {"role": "user", "content": "other"}]})));
        assert!(other.hashes.is_empty());
        assert_eq!(known.records.len(), 2);
    }

    #[test]
    fn edits_other_layouts_and_tricks_fall_back_to_the_whole_parse() {
        let mut known = KnownRequests::default();
        let first = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;
        remember(&mut known, &Bytes::from(first));
        let cases = [
            // Regenerated with the last message edited.
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"c"}]}"#,
            // A second messages key after the array: serde_json keeps the later one.
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"d"}],"messages":[{"role":"user","content":"z"}]}"#,
            // Extended, with fields after the array.
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"} , {"role":"user","content":"e"}] , "stream" : true}"#,
        ];
        for case in cases {
            remember(&mut known, &Bytes::from(case));
        }
        let broken =
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"x"]}"#;
        let error = known.parse(Endpoint::ChatCompletions, &Bytes::from(broken)).err();
        assert!(matches!(error, Some(ParseError::NotJson(_))), "{error:?}");
    }
}
