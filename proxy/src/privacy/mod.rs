//! What the capture keeps of a turn's text at each `--capture` level (docs/capture.md, "Privacy
//! levels"): everything (`full`), text with secrets and personal data masked (`redacted`, see
//! [`redact`]), or none at all (`hashes`). Applied to what is stored, journaled, alerted and exported
//! over OTLP; never to what the detectors read (the live request and reply, in memory), and never to
//! hashes, which are always taken of the messages as sent, so that threading and detection work the
//! same at every level.

pub mod redact;

use ctxscope_store::{CaptureLevel, TurnRecord};
use serde_json::Value;

/// Evidence fields that quote a message or a reply (history excerpts, the prefix break's before and
/// after, the amnesia sentence): left out of a finding captured without text. Counts, indices,
/// hashes, roles and kinds stay.
pub const QUOTING_FIELDS: [&str; 7] = ["excerpt", "first_before", "first_after", "before", "after", "sentence", "reply_excerpt"];

/// What is stored of a message whose canonical JSON is `canonical`: itself, masked, or nothing
/// (empty: the store keeps no text for it).
pub fn message_json(level: CaptureLevel, canonical: Vec<u8>) -> Vec<u8> {
    match level {
        CaptureLevel::Full => canonical,
        CaptureLevel::Hashes => Vec::new(),
        CaptureLevel::Redacted => match serde_json::from_slice::<Value>(&canonical) {
            Ok(mut value) => match redact::redact_value(&mut value) {
                true => serde_json::to_vec(&value).unwrap_or_default(),
                false => canonical,
            },
            // Canonical JSON always parses; were it not to, nothing of it is kept rather than all.
            Err(_) => b"null".to_vec(),
        },
    }
}

/// The turn as stored at `level` (`None` at full: the turn itself). The capture's own record keeps
/// its text for the detectors; this copy is what reaches the store, the journal and the sinks. The
/// engine's error message and the capture's notes are the engine's and ctxscope's words, not the
/// conversation's: kept, masked, at both levels; so are the sampling parameters (stop strings).
pub fn stored_turn(level: CaptureLevel, turn: &TurnRecord) -> Option<TurnRecord> {
    if level == CaptureLevel::Full {
        return None;
    }
    let mut stored = turn.clone();
    stored.capture = level;
    stored.reply_text = match level {
        CaptureLevel::Redacted => redact::redact(&turn.reply_text).into_owned(),
        _ => String::new(),
    };
    if let Some(error) = &mut stored.error {
        *error = redact::redact(error).into_owned();
    }
    for note in &mut stored.notes {
        *note = redact::redact(note).into_owned();
    }
    for value in stored.params.values_mut() {
        redact::redact_value(value);
    }
    Some(stored)
}

/// A finding's summary and evidence as stored at `level`: masked below full, and without the fields
/// that quote text ([`QUOTING_FIELDS`]) at `hashes`.
pub fn finding(level: CaptureLevel, summary: &mut String, evidence: &mut Value) {
    if level == CaptureLevel::Full {
        return;
    }
    if level == CaptureLevel::Hashes {
        strip_quotes(evidence);
    }
    *summary = redact::redact(summary).into_owned();
    redact::redact_value(evidence);
}

/// Removes the string fields that quote text, at any depth.
fn strip_quotes(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|key, value| !(QUOTING_FIELDS.contains(&key.as_str()) && value.is_string()));
            map.values_mut().for_each(strip_quotes);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_quotes),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_is_kept_masked_or_not_at_all() {
        let (_, canonical) = ctxscope_store::message_hash(&json!({"role": "user", "content": "mail a@example.com"}));
        assert_eq!(message_json(CaptureLevel::Full, canonical.clone()), canonical);
        assert_eq!(message_json(CaptureLevel::Hashes, canonical.clone()), Vec::<u8>::new());
        let masked: Value = serde_json::from_slice(&message_json(CaptureLevel::Redacted, canonical.clone())).unwrap();
        assert_eq!(masked, json!({"role": "user", "content": "mail [redacted:email]"}));
        let (_, plain) = ctxscope_store::message_hash(&json!({"role": "user", "content": "hello"}));
        assert_eq!(message_json(CaptureLevel::Redacted, plain.clone()), plain, "nothing to mask: the same bytes");
    }

    #[test]
    fn the_stored_turn_keeps_no_reply_text_at_hashes_and_masks_it_when_redacted() {
        let mut turn = ctxscope_store::store_test_turn(1, 1, Vec::new());
        turn.reply_text = "call +1 415 555 2671".into();
        turn.error = Some("bad key sk-abcdefghijklmnopqrstuvwxyz0123".into());
        turn.params.insert("stop".into(), json!(["a@example.com"]));
        assert_eq!(stored_turn(CaptureLevel::Full, &turn), None);
        let redacted = stored_turn(CaptureLevel::Redacted, &turn).unwrap();
        assert_eq!((redacted.capture, redacted.reply_text.as_str()), (CaptureLevel::Redacted, "call [redacted:phone]"));
        assert_eq!(redacted.error.as_deref(), Some("bad key [redacted:openai_key]"));
        assert_eq!(redacted.params["stop"], json!(["[redacted:email]"]));
        let hashes = stored_turn(CaptureLevel::Hashes, &turn).unwrap();
        assert_eq!((hashes.capture, hashes.reply_text.as_str()), (CaptureLevel::Hashes, ""));
        assert_eq!(hashes.new_messages, turn.new_messages);
    }

    #[test]
    fn evidence_loses_its_quotes_at_hashes_and_keeps_counts() {
        let evidence = json!({
            "cause": "windowed", "removed_messages": [1, 2], "first_before": "my card 4111 1111 1111 1111",
            "summary": {"at": 3, "role": "user", "recognised_by": "marker", "excerpt": "a@example.com said"},
            "edits": [{"message": 1, "role": "user", "kind": "user", "edit": "removed", "chars_before": 12}],
        });
        let mut summary = "the harness kept only the latest messages".to_string();
        let mut hashed = evidence.clone();
        finding(CaptureLevel::Hashes, &mut summary, &mut hashed);
        assert_eq!(hashed["removed_messages"], json!([1, 2]));
        assert_eq!(hashed["summary"], json!({"at": 3, "role": "user", "recognised_by": "marker"}));
        assert!(hashed.get("first_before").is_none() && hashed["edits"][0]["chars_before"] == 12);
        let mut redacted = evidence.clone();
        finding(CaptureLevel::Redacted, &mut summary, &mut redacted);
        assert_eq!(redacted["first_before"], "my card [redacted:card]");
        assert_eq!(redacted["summary"]["excerpt"], "[redacted:email] said");
        let mut full = evidence.clone();
        finding(CaptureLevel::Full, &mut summary, &mut full);
        assert_eq!(full, evidence);
    }
}
