//! `amnesia_reply`: the reply denies prior context ("this is the first message") although the request
//! carried earlier turns. The phrases are data (phrases/amnesia.txt, plus `--amnesia-phrases FILE`).

use ctxscope_store::{FindingKind, Severity};
use serde_json::{json, Value};

use super::config::normalise;
use super::{Context, Draft};

pub(crate) fn amnesia(cx: &Context<'_>) -> Option<Draft> {
    let turn = cx.obs.turn;
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    let earlier_replies = cx.obs.messages.iter().filter(|m| role(m).as_deref() == Some("assistant")).count();
    if earlier_replies == 0 || turn.reply_text.is_empty() {
        return None;
    }
    let reply = normalise(&turn.reply_text);
    let phrase = cx.config.amnesia_phrases.iter().find(|p| reply.contains(p.as_str()))?;
    let at = reply.find(phrase.as_str()).map(|byte| reply[..byte].chars().count()).unwrap_or(0);
    Some(Draft {
        kind: FindingKind::AmnesiaReply,
        severity: Severity::Warning,
        summary: format!("reply says \"{phrase}\" in a conversation with {earlier_replies} earlier repl{}", if earlier_replies == 1 { "y" } else { "ies" }),
        evidence: json!({
            "phrase": phrase,
            "reply_excerpt": super::history::excerpt(&reply, at),
            "earlier_replies": earlier_replies,
            "messages": turn.message_count,
            "engine_prompt_tokens": turn.usage.as_ref().and_then(|u| u.prompt_tokens),
            "local_prompt_tokens": turn.local_tokens.as_ref().map(|l| l.prompt),
        }),
        cause: format!("amnesia_reply/{}", turn.conversation),
    })
}
