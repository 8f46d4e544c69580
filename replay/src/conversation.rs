//! Teacher forcing: each captured turn becomes the request it was, rebuilt from the store's
//! [`ConversationDetail`] (message hashes resolved, the captured model and sampling parameters kept),
//! so turn k is replayed on the captured history, never on replayed replies. Only chat-completions
//! turns are replayed; the others are skipped with a note.

use ctxscope_store::{CaptureLevel, ConversationDetail, Endpoint, TurnView};
use serde_json::{json, Map, Value};

/// Captured parameters sent again on replay. The rest is replaced (`temperature`, `seed`,
/// `max_tokens`: greedy, seeded, bounded) or dropped (`n`, `stream`, `stream_options`, Ollama's
/// `options`).
const KEPT_PARAMS: [&str; 7] = ["stop", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty"];

/// One captured turn as a replayable request.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRequest {
    /// Turn index in the conversation, from 0.
    pub turn: u32,
    /// The request's messages as captured (OpenAI chat shape), in order.
    pub messages: Vec<Value>,
    /// The captured model name.
    pub model: Option<String>,
    /// The captured sampling parameters worth sending again (see [`KEPT_PARAMS`]).
    pub params: Map<String, Value>,
    /// The captured `max_tokens` / `max_completion_tokens`, when the client set one.
    pub captured_max_tokens: Option<u64>,
    /// The captured reply text (None when the turn got no reply).
    pub captured_text: Option<String>,
    /// The captured reply as the assistant message a client sends back (tool calls included).
    pub captured_message: Option<Value>,
}

impl TurnRequest {
    /// A recall probe after this turn: its messages, its captured reply, then `question` as the user.
    pub fn probe_messages(&self, question: &str) -> Vec<Value> {
        let mut messages = self.messages.clone();
        if let Some(reply) = &self.captured_message {
            messages.push(reply.clone());
        }
        messages.push(json!({"role": "user", "content": question}));
        messages
    }
}

/// A captured conversation, ready to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: u64,
    /// Turns in the capture, replayable or not.
    pub total_turns: u32,
    /// The replayable turns, by index.
    pub turns: Vec<TurnRequest>,
    /// Why turns were skipped, and what the replay cannot reproduce (for people).
    pub notes: Vec<String>,
}

impl Conversation {
    /// Rebuilds every chat-completions turn of `detail`; skipped turns are explained in `notes`.
    pub fn from_detail(detail: &ConversationDetail) -> Conversation {
        let mut turns = Vec::new();
        let mut notes = Vec::new();
        if let Some(note) = masked_note(detail) {
            notes.push(note);
        }
        for view in &detail.turns {
            match turn_request(detail, view) {
                Ok((request, note)) => {
                    turns.push(request);
                    notes.extend(note);
                }
                Err(note) => notes.push(note),
            }
        }
        turns.sort_by_key(|t| t.turn);
        Conversation { id: detail.conversation.id, total_turns: detail.turns.len() as u32, turns, notes }
    }

    pub fn turn(&self, index: u32) -> Option<&TurnRequest> {
        self.turns.iter().find(|t| t.turn == index)
    }
}

/// The request of one turn, plus a note on what it cannot reproduce; Err(note) when it is skipped.
fn turn_request(detail: &ConversationDetail, view: &TurnView) -> Result<(TurnRequest, Option<String>), String> {
    let record = &view.turn;
    let responses = record.endpoint == Endpoint::Responses;
    if record.endpoint != Endpoint::ChatCompletions && !responses {
        return Err(format!(
            "turn {} skipped: it used the {} endpoint; replay covers chat completions and Responses API turns only",
            record.index,
            record.endpoint.as_str()
        ));
    }
    // A message stored without text (`--capture hashes`) reads as null: not sent as a message.
    let messages = view
        .messages
        .iter()
        .map(|hash| detail.messages.get(hash).filter(|m| !m.is_null()).cloned().ok_or_else(|| missing(record.index, hash)))
        .collect::<Result<Vec<Value>, String>>()?;
    let messages = if responses { responses_as_chat(record.index, messages)? } else { messages };
    if messages.is_empty() {
        return Err(format!("turn {} skipped: the capture holds no request messages for it", record.index));
    }
    let captured_message = captured_reply(detail, view);
    let captured_text = captured_message.as_ref().map(|_| record.reply_text.clone());
    let note = record.tools.as_ref().map(|tools| {
        format!(
            "turn {}: the client sent {} tool definition(s) ({}); captures keep only their digest, so the replay sends none",
            record.index,
            tools.names.len(),
            tools.names.join(", ")
        )
    });
    let request = TurnRequest {
        turn: record.index,
        messages,
        model: record.model.clone(),
        params: KEPT_PARAMS.iter().filter_map(|k| record.params.get(*k).map(|v| (k.to_string(), v.clone()))).collect(),
        captured_max_tokens: ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| record.params.get(*k).and_then(Value::as_u64)),
        captured_text,
        captured_message,
    };
    Ok((request, note))
}

/// A Responses API turn replays as the chat its capture already is (docs/capture.md, "The Responses
/// API"): the opaque `reasoning_items` / `output_items` kept beside assistant messages are left out;
/// an item the mapping kept verbatim (`responses_item`) has no chat form, so its turn is skipped.
fn responses_as_chat(turn: u32, mut messages: Vec<Value>) -> Result<Vec<Value>, String> {
    for message in &mut messages {
        if message.get("role").and_then(Value::as_str) == Some("responses_item") {
            let kind = message.pointer("/item/type").and_then(Value::as_str).unwrap_or("unknown");
            return Err(format!("turn {turn} skipped: its Responses API input holds a {kind} item, which has no chat form"));
        }
        if let Some(object) = message.as_object_mut() {
            object.remove("reasoning_items");
            object.remove("output_items");
        }
    }
    Ok(messages)
}

/// The turns of `detail` captured without text (`--capture hashes`): none of them can be sent again,
/// nor any turn after them (their history is text the store does not hold).
pub fn textless_turns(detail: &ConversationDetail) -> Vec<u32> {
    detail.turns.iter().filter(|view| view.turn.capture == CaptureLevel::Hashes).map(|view| view.turn.index).collect()
}

/// What a replay of a conversation captured with `--capture redacted` must say: it sends masked text.
pub fn masked_note(detail: &ConversationDetail) -> Option<String> {
    let masked =
        detail.conversation.capture == CaptureLevel::Redacted || detail.turns.iter().any(|v| v.turn.capture == CaptureLevel::Redacted);
    masked.then(|| {
        format!(
            "conversation {} was captured with --capture redacted: it is replayed with its masked text ([redacted:KIND] where secrets and personal data were), which the captured replies never saw",
            detail.conversation.id
        )
    })
}

fn missing(turn: u32, hash: &str) -> String {
    format!("turn {turn} skipped: its message {} is not in the capture (removed by retention?)", short(hash))
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// The captured reply message: the stored one when the capture kept it, else one built from the text.
fn captured_reply(detail: &ConversationDetail, view: &TurnView) -> Option<Value> {
    let record = &view.turn;
    if let Some(message) = record.reply.as_ref().and_then(|hash| detail.messages.get(hash)) {
        return Some(message.clone());
    }
    (record.reply.is_some() || !record.reply_text.is_empty()).then(|| json!({"role": "assistant", "content": record.reply_text}))
}

/// Captured conversation `id` of `turns` chat turns, for tests here and in dependents (feature
/// `test-support`): turn k sends system + (user i, assistant "captured i") for i < k + user
/// "question k"; its captured reply is "captured k", with temperature 0.7, max_tokens 32 and stop
/// ["\n\n"].
#[cfg(any(test, feature = "test-support"))]
pub fn replay_test_conversation(id: u64, turns: u32) -> ConversationDetail {
    use ctxscope_store::{store_test_turn, ConversationRecord};
    let mut messages = std::collections::BTreeMap::new();
    let mut put = |value: Value| {
        let hash = format!("{:064x}", messages.len());
        messages.insert(hash.clone(), value);
        hash
    };
    let mut history = vec![put(json!({"role": "system", "content": "be brief"}))];
    let mut views = Vec::new();
    for k in 0..turns {
        history.push(put(json!({"role": "user", "content": format!("question {k}")})));
        let reply = put(json!({"role": "assistant", "content": format!("captured {k}")}));
        let mut record = store_test_turn(k as u64 + 1, id, history.iter().filter_map(|h| ctxscope_store::from_hex(h)).collect());
        record.index = k;
        record.model = Some("captured-model".into());
        record.reply = Some(reply.clone());
        record.reply_text = format!("captured {k}");
        record.params.insert("temperature".into(), json!(0.7));
        record.params.insert("stop".into(), json!(["\n\n"]));
        record.params.insert("max_tokens".into(), json!(32));
        views.push(TurnView { turn: record, messages: history.clone() });
        history.push(reply);
    }
    let conversation = ConversationRecord {
        id,
        name: None,
        created_unix_ms: 0,
        updated_unix_ms: 0,
        upstream: "http://upstream".into(),
        model: Some("captured-model".into()),
        turns,
        last_turn: turns as u64,
        last_head: String::new(),
        last_message_count: 0,
        last_tail: None,
        branch_of: None,
        last_reply: None,
        capture: Default::default(),
    };
    ConversationDetail { conversation, turns: views, messages, findings: Vec::new() }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ctxscope_store::ToolsDigest;

    pub fn detail(turns: u32) -> ConversationDetail {
        crate::replay_test_conversation(1, turns)
    }

    #[test]
    fn turn_k_carries_the_captured_history() {
        let c = Conversation::from_detail(&detail(3));
        assert_eq!(c.turns.len(), 3);
        assert_eq!(c.total_turns, 3);
        let t2 = c.turn(2).unwrap();
        let contents: Vec<&str> = t2.messages.iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(contents, ["be brief", "question 0", "captured 0", "question 1", "captured 1", "question 2"]);
        assert_eq!(t2.model.as_deref(), Some("captured-model"));
        assert_eq!(t2.captured_text.as_deref(), Some("captured 2"));
        assert_eq!(t2.captured_max_tokens, Some(32));
        assert_eq!(t2.params.get("stop"), Some(&json!(["\n\n"])));
        assert!(!t2.params.contains_key("temperature"), "temperature is replaced by greedy");
    }

    #[test]
    fn probe_appends_the_captured_reply_and_the_question() {
        let c = Conversation::from_detail(&detail(2));
        let probe = c.turn(1).unwrap().probe_messages("what was the secret word?");
        let n = probe.len();
        assert_eq!(probe[n - 2], json!({"role": "assistant", "content": "captured 1"}));
        assert_eq!(probe[n - 1], json!({"role": "user", "content": "what was the secret word?"}));
    }

    #[test]
    fn other_endpoints_and_missing_messages_are_skipped_with_a_note() {
        let mut d = detail(3);
        d.turns[0].turn.endpoint = Endpoint::Completions;
        d.turns[1].messages.push("ff".repeat(32));
        d.turns[2].turn.tools = Some(ToolsDigest { hash: String::new(), names: vec!["get_weather".into()] });
        let c = Conversation::from_detail(&d);
        assert_eq!(c.turns.iter().map(|t| t.turn).collect::<Vec<_>>(), [2]);
        assert_eq!(c.notes.len(), 3, "{:?}", c.notes);
        assert!(c.notes[0].contains("completions endpoint"), "{:?}", c.notes);
        assert!(c.notes[1].contains("not in the capture"), "{:?}", c.notes);
        assert!(c.notes[2].contains("get_weather"), "{:?}", c.notes);
    }

    #[test]
    fn responses_turns_replay_as_chat_without_their_opaque_items() {
        let mut d = detail(2);
        for view in &mut d.turns {
            view.turn.endpoint = Endpoint::Responses;
        }
        let captured = d.turns[1].messages[2].clone();
        d.messages.get_mut(&captured).unwrap()["reasoning_items"] = json!([{"type": "reasoning", "id": "rs_1"}]);
        let c = Conversation::from_detail(&d);
        assert_eq!(c.turns.len(), 2, "{:?}", c.notes);
        assert_eq!(c.turn(1).unwrap().messages[2], json!({"role": "assistant", "content": "captured 0"}));
        let opaque = "ab".repeat(32);
        d.messages.insert(opaque.clone(), json!({"role": "responses_item", "item": {"type": "web_search_call"}}));
        d.turns[1].messages.push(opaque);
        let c = Conversation::from_detail(&d);
        assert_eq!(c.turns.len(), 1);
        assert!(c.notes[0].contains("web_search_call item"), "{:?}", c.notes);
    }

    #[test]
    fn a_conversation_without_text_is_refused_and_a_masked_one_says_so() {
        let mut d = detail(2);
        assert!(crate::run::check_text(&d).is_ok() && masked_note(&d).is_none());
        d.turns[1].turn.capture = CaptureLevel::Redacted;
        d.conversation.capture = CaptureLevel::Redacted;
        assert!(crate::run::check_text(&d).is_ok());
        let c = Conversation::from_detail(&d);
        assert!(c.notes[0].contains("captured with --capture redacted"), "{:?}", c.notes);
        d.turns[1].turn.capture = CaptureLevel::Hashes;
        d.conversation.capture = CaptureLevel::Hashes;
        let error = crate::run::check_text(&d).unwrap_err().to_string();
        assert!(error.contains("--capture hashes") && error.contains("[1]") && error.contains("cannot be replayed"), "{error}");
        // A message stored without text reads as null: the turn is skipped, never sent with a null.
        let hash = d.turns[1].messages[1].clone();
        d.messages.insert(hash, Value::Null);
        let c = Conversation::from_detail(&d);
        assert!(c.turn(1).is_none() && c.notes.iter().any(|n| n.contains("turn 1 skipped")), "{:?}", c.notes);
    }

    #[test]
    fn reply_text_without_a_stored_message_still_counts() {
        let mut d = detail(1);
        d.turns[0].turn.reply = None;
        let c = Conversation::from_detail(&d);
        assert_eq!(c.turns[0].captured_message, Some(json!({"role": "assistant", "content": "captured 0"})));
        d.turns[0].turn.reply_text.clear();
        let c = Conversation::from_detail(&d);
        assert_eq!(c.turns[0].captured_text, None);
    }
}
