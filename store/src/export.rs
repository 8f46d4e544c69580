//! The portable form of a conversation: self-contained JSONL that `ctxscope export` writes and
//! `ctxscope import` reads back. Line 1 is a header, then one line per message, then one per turn
//! (with its relation: a `diverged` turn is a harness's edit), then one per finding with its evidence
//! (the exporting store's diagnosis: kept for reading, not imported). The header names the capture
//! level (`capture`): below `full` the message lines hold masked text (`redacted`) or are left out
//! (`hashes`: no text was stored), and such a file is refused by import, whose messages are stored by
//! the hash of their content.

use std::collections::HashSet;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::hash::{from_hex, message_hash, Hash};
use crate::records::*;
use crate::{Store, StoreError};

pub const EXPORT_FORMAT: &str = "ctxscope-conversation";
pub const EXPORT_VERSION: u32 = 1;
/// The note an imported turn carries (followed by its id in the store it was exported from).
pub const IMPORTED_NOTE: &str = "imported from an export file";
/// Longest import line read: memory for an import is bounded by it, whatever the body.
pub const MAX_IMPORT_LINE: usize = 64 << 20;

/// One line of an export file. (The header is larger than a message line; lines are read one at a
/// time, so the size difference costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExportLine {
    Header {
        format: String,
        version: u32,
        /// The conversation's capture level (exports from before the levels: full).
        #[serde(default)]
        capture: CaptureLevel,
        conversation: ConversationRecord,
    },
    Message {
        hash: HashHex,
        message: Value,
    },
    Turn(TurnView),
    Finding {
        finding: FindingRecord,
    },
}

impl Store {
    /// Writes conversation `id` as JSONL.
    pub fn export_conversation(&self, id: u64, out: &mut dyn Write) -> Result<(), StoreError> {
        let detail = self.conversation_detail(id)?;
        let io = |e: std::io::Error| StoreError::Import { line: 0, detail: format!("write failed: {e}") };
        let mut line = |value: &ExportLine| -> Result<(), StoreError> {
            let bytes = crate::codec::json("export", value)?;
            out.write_all(&bytes).map_err(io)?;
            out.write_all(b"\n").map_err(io)
        };
        let capture = detail.conversation.capture;
        line(&ExportLine::Header {
            format: EXPORT_FORMAT.into(),
            version: EXPORT_VERSION,
            capture,
            conversation: detail.conversation.clone(),
        })?;
        for (hash, message) in &detail.messages {
            // Captured without text: a message not stored is left out, not written as null.
            if capture != CaptureLevel::Full && message.is_null() {
                continue;
            }
            line(&ExportLine::Message { hash: hash.clone(), message: message.clone() })?;
        }
        for turn in detail.turns {
            line(&ExportLine::Turn(turn))?;
        }
        for finding in detail.findings {
            line(&ExportLine::Finding { finding })?;
        }
        Ok(())
    }

    /// Reads a JSONL export into a new conversation (fresh ids); returns its id. Only what `export`
    /// could have written is accepted: the header first and once, then messages (each matching its
    /// hash), then at least one turn referencing only messages listed before it. Reads line by line,
    /// so memory follows the longest line and the number of messages, not the file. Imported turns
    /// carry the note [`IMPORTED_NOTE`] with their original id.
    pub fn import_conversation(&self, input: &mut dyn BufRead) -> Result<u64, StoreError> {
        let mut header = None;
        let mut seen: HashSet<Hash> = HashSet::new();
        let mut turns = Vec::new();
        let mut last_line = 0;
        let mut raw = Vec::new();
        for n in 0.. {
            let bad = |detail: String| StoreError::Import { line: n + 1, detail };
            match read_line(input, &mut raw, MAX_IMPORT_LINE) {
                Ok(true) => {}
                Ok(false) => break,
                Err(LineError::TooLong) => return Err(StoreError::ImportLineTooLong { line: n + 1, limit: MAX_IMPORT_LINE }),
                Err(LineError::Io(e)) => return Err(bad(e.to_string())),
            }
            let line = std::str::from_utf8(&raw).map_err(|e| bad(format!("not UTF-8: {e}")))?;
            last_line = n + 1;
            if line.trim().is_empty() {
                continue;
            }
            let parsed = serde_json::from_str::<ExportLine>(line).map_err(|e| bad(e.to_string()))?;
            if header.is_none() && !matches!(parsed, ExportLine::Header { .. }) {
                return Err(bad("the first line must be the export header".into()));
            }
            match parsed {
                ExportLine::Header { format, version, capture, conversation } => {
                    if header.is_some() {
                        return Err(bad("a second header line".into()));
                    }
                    if format != EXPORT_FORMAT || version != EXPORT_VERSION {
                        return Err(bad(format!("unsupported export {format} v{version}")));
                    }
                    let level = capture.max(conversation.capture);
                    if level != CaptureLevel::Full {
                        return Err(not_full(n + 1, level));
                    }
                    header = Some(conversation);
                }
                ExportLine::Message { hash, message } => {
                    if !turns.is_empty() {
                        return Err(bad("a message line after the turns (an export lists every message first)".into()));
                    }
                    let (computed, bytes) = message_hash(&message);
                    if from_hex(&hash) != Some(computed) {
                        return Err(bad(format!("message {hash} does not match its content")));
                    }
                    self.put_message(&computed, &bytes)?;
                    seen.insert(computed);
                }
                ExportLine::Turn(view) => {
                    if view.turn.capture != CaptureLevel::Full {
                        return Err(not_full(n + 1, view.turn.capture));
                    }
                    for hash in view.messages.iter().chain(view.turn.reply.iter()) {
                        if !from_hex(hash).is_some_and(|h| seen.contains(&h)) {
                            return Err(bad(format!("turn {} references message {hash}, which no line before it holds", view.turn.id)));
                        }
                    }
                    turns.push(view);
                }
                // The exporting store's findings name its ids; the detectors' evidence is read there.
                ExportLine::Finding { .. } => {}
            }
        }
        let mut conversation = header.ok_or_else(|| StoreError::Import { line: 1, detail: "missing header line".into() })?;
        if turns.is_empty() {
            return Err(StoreError::Import { line: last_line, detail: "no turn lines: an export holds at least one turn".into() });
        }
        conversation.id = self.next_id_in(crate::IdSpace::Conversation)?;
        conversation.name = None;
        conversation.branch_of = None;
        conversation.turns = turns.len() as u32;
        let mut previous: Option<(u64, Vec<HashHex>)> = None;
        let mut records = Vec::with_capacity(turns.len());
        for (index, view) in turns.into_iter().enumerate() {
            let mut turn = view.turn;
            let note = format!("{IMPORTED_NOTE} (turn {} of the exported store)", turn.id);
            turn.notes.retain(|n| !n.starts_with(IMPORTED_NOTE));
            turn.notes.push(note);
            turn.id = self.next_id_in(crate::IdSpace::Turn)?;
            turn.conversation = conversation.id;
            turn.index = index as u32;
            let shared = previous.as_ref().map_or(0, |(_, prev)| common_prefix(prev, &view.messages));
            turn.base = previous.as_ref().filter(|_| shared > 0).map(|(id, _)| BaseRef { turn: *id, len: shared as u32 });
            turn.new_messages = view.messages[shared..].iter().filter_map(|h| from_hex(h)).collect();
            turn.relation = match (&previous, &turn.relation) {
                (None, _) => Relation::New,
                // An edited history stays one: the harness's edit is what the turn shows.
                (Some((id, _)), Relation::Diverged { shared_messages, .. }) => {
                    Relation::Diverged { previous_turn: *id, shared_messages: *shared_messages }
                }
                (Some((id, _)), _) => Relation::Extend { parent_turn: *id },
            };
            let mut with_reply = view.messages.clone();
            with_reply.extend(turn.reply.clone());
            conversation.last_turn = turn.id;
            previous = Some((turn.id, with_reply));
            records.push(turn);
        }
        // The turns and the conversation in one transaction: a crash or a full disk leaves either
        // the whole conversation or none of it (its messages, stored as their lines came, are
        // content-addressed and swept by retention if nothing uses them).
        self.commit_import(&conversation, &records)?;
        self.flush()?;
        Ok(conversation.id)
    }
}

/// An export captured below full: its messages are not what their hashes name, so they cannot be
/// stored by them.
fn not_full(line: usize, level: CaptureLevel) -> StoreError {
    let what = match level {
        CaptureLevel::Hashes => "no message text was stored",
        _ => "its message text was masked",
    };
    StoreError::Import {
        line,
        detail: format!("this conversation was captured with --capture {level} ({what}): only full captures can be imported"),
    }
}

fn common_prefix(a: &[HashHex], b: &[HashHex]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Why a line could not be read.
enum LineError {
    TooLong,
    Io(std::io::Error),
}

/// The next line of `input` into `line` (without its `\n` or `\r\n`); false at the end. A line
/// longer than `limit` stops the read as soon as it passes the limit, so memory stays bounded.
fn read_line(input: &mut dyn BufRead, line: &mut Vec<u8>, limit: usize) -> Result<bool, LineError> {
    line.clear();
    let mut any = false;
    loop {
        let available = input.fill_buf().map_err(LineError::Io)?;
        if available.is_empty() {
            return Ok(any);
        }
        any = true;
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (available.len(), false),
        };
        if line.len() + take > limit {
            return Err(LineError::TooLong);
        }
        line.extend_from_slice(&available[..take]);
        input.consume(take + usize::from(done));
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8], limit: usize) -> Vec<Result<String, &'static str>> {
        let mut input = std::io::BufReader::with_capacity(4, text);
        let (mut out, mut line) = (Vec::new(), Vec::new());
        loop {
            match read_line(&mut input, &mut line, limit) {
                Ok(true) => out.push(Ok(String::from_utf8(line.clone()).unwrap())),
                Ok(false) => return out,
                Err(LineError::TooLong) => {
                    out.push(Err("too long"));
                    return out;
                }
                Err(LineError::Io(_)) => panic!("io"),
            }
        }
    }

    #[test]
    fn an_export_names_its_capture_level_and_one_below_full_is_not_imported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &crate::StoreOptions::default()).unwrap();
        let mut turn = crate::commit::tests::draft(1, 1, &["secret question"], "secret answer", None);
        turn.turn.capture = CaptureLevel::Hashes;
        turn.conversation.capture = CaptureLevel::Hashes;
        turn.messages.iter_mut().for_each(|(_, json)| json.clear());
        store.commit_turn(&turn).unwrap();
        let mut out = Vec::new();
        store.export_conversation(1, &mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["capture"], "hashes");
        assert!(text.lines().all(|l| !l.contains(r#""kind":"message""#)), "no message lines without text: {text}");
        assert!(text.contains(r#""capture":"hashes""#) && !text.contains("secret"), "{text}");
        let error = store.import_conversation(&mut out.as_slice()).unwrap_err().to_string();
        assert!(error.contains("--capture hashes") && error.contains("only full captures can be imported"), "{error}");
        // An export from before the levels reads as full.
        let old = r#"{"kind":"header","format":"ctxscope-conversation","version":1,"conversation":{"id":1,"name":null,"created_unix_ms":1,"updated_unix_ms":1,"upstream":"u","model":null,"turns":0,"last_turn":0,"last_head":"","last_message_count":0,"last_tail":null,"branch_of":null}}"#;
        match serde_json::from_str::<ExportLine>(old).unwrap() {
            ExportLine::Header { capture, conversation, .. } => {
                assert_eq!((capture, conversation.capture), (CaptureLevel::Full, CaptureLevel::Full))
            }
            _ => panic!("a header"),
        }
    }

    #[test]
    fn lines_are_read_within_the_limit_and_stop_past_it() {
        assert_eq!(lines(b"ab\r\ncdef\n\nlast", 8), [Ok("ab".into()), Ok("cdef".into()), Ok(String::new()), Ok("last".into())]);
        assert_eq!(lines(b"12345678\n123456789\nnever", 8), [Ok("12345678".into()), Err("too long")]);
        assert!(lines(b"", 8).is_empty());
    }
}
