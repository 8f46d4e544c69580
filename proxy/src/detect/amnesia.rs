//! `amnesia_reply`: the reply denies prior context ("this is the first message", "I can't see what we
//! discussed before") although the request carried earlier turns. Recognised by fixed phrases (data:
//! phrases/amnesia.txt, plus `--amnesia-phrases FILE`) and by sentence structure (denial.rs, word
//! lists in phrases/amnesia_structure.txt).

#[cfg(test)]
mod corpus;
pub(crate) mod denial;

use ctxscope_store::{FindingKind, Severity};
use serde_json::{json, Value};

use super::config::normalise;
use super::{Context, Draft};
use denial::Method;

pub(crate) fn amnesia(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let earlier_replies = cx.obs.messages.iter().filter(|m| m.role() == Some("assistant")).count();
    if earlier_replies == 0 || turn.reply_text.is_empty() {
        return None;
    }
    let found = denial::recognise(&turn.reply_text, &cx.config.amnesia_phrases)?;
    let reply = normalise(&turn.reply_text);
    let sentence = normalise(&found.sentence);
    let at = reply.find(sentence.as_str()).map(|byte| reply[..byte].chars().count()).unwrap_or(0);
    let replies = format!("{earlier_replies} earlier repl{}", if earlier_replies == 1 { "y" } else { "ies" });
    let summary = match found.method {
        Method::Phrase => format!("reply says \"{}\" in a conversation with {replies}", found.rule),
        // Captured without text (`--capture hashes`): the frame, not the reply's own sentence.
        Method::Structure if turn.capture == ctxscope_store::CaptureLevel::Hashes => {
            format!("reply denies earlier context ({} frame) in a conversation with {replies}", found.rule)
        }
        Method::Structure => {
            format!("reply denies earlier context (\"{}\") in a conversation with {replies}", super::history::excerpt(&found.sentence, 0))
        }
    };
    let cues: serde_json::Map<String, Value> =
        found.cues.iter().map(|(role, words)| (role.to_string(), Value::from(words.as_str()))).collect();
    let level = if found.confidence >= 0.85 {
        "high"
    } else if found.confidence >= 0.7 {
        "medium"
    } else {
        "low"
    };
    Some(Draft {
        kind: FindingKind::AmnesiaReply,
        severity: Severity::Warning,
        summary,
        evidence: json!({
            "method": found.method.as_str(),
            "phrase": (found.method == Method::Phrase).then_some(&found.rule),
            "rule": found.rule,
            "sentence": found.sentence,
            "cues": cues,
            "confidence": level,
            "confidence_score": found.confidence,
            "reply_excerpt": super::history::excerpt(&reply, at),
            "earlier_replies": earlier_replies,
            "messages": turn.message_count,
            "engine_prompt_tokens": turn.usage.as_ref().and_then(|u| u.prompt_tokens),
            "local_prompt_tokens": turn.local_tokens.as_ref().map(|l| l.prompt),
        }),
        cause: format!("amnesia_reply/{}", turn.conversation),
    })
}
