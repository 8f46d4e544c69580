//! Responses API turns in the capture: the context a request with `previous_response_id` stands on,
//! expanded from the store (the parent turn's messages, less its own `instructions`, and its reply),
//! and threading such a turn to its parent exactly. A parent the proxy never saw is marked, not guessed.

use ctxscope_store::{to_hex, BaseRef, BranchRef, CaptureLevel, Hash, Relation, ResponsesInfo, Store, StoreError, TurnRecord};
use serde_json::Value;

use super::thread::Decision;
use crate::parse::message::Message;
use crate::parse::ParsedRequest;

/// A Responses request after expansion: its record fields and the turn it chains to.
pub struct Chained {
    pub info: ResponsesInfo,
    pub parent: Option<TurnRecord>,
    /// Where the chain's messages went in the request, and the hashes they were stored under (those
    /// of the messages as sent: below `--capture full` the stored text is not what they hash).
    pub spliced: Option<(usize, Vec<Hash>)>,
    /// Some of the chain's messages have no stored text (`--capture hashes`): they stand in the
    /// request as `null`, known by their hashes only.
    pub textless: bool,
}

/// What a response chained to another stands on: the turn that produced it and that turn's history
/// (less its own instructions), each message's hash with what the store kept of it.
pub struct ParentContext {
    pub turn: TurnRecord,
    pub messages: Vec<(Hash, Option<Value>)>,
    /// The most withholding capture level of the conversation the chain's text comes from: below
    /// full, a message's text is masked or absent.
    pub capture: CaptureLevel,
}

impl ParentContext {
    /// The messages as JSON, when every one was stored whole (the chain can be sent upstream).
    pub fn whole(self) -> Result<Vec<Value>, StoreError> {
        let turn = self.turn.id;
        self.messages
            .into_iter()
            .map(|(hash, message)| message.ok_or_else(|| StoreError::NotFound(format!("message {} of turn {turn}", to_hex(&hash)))))
            .collect()
    }
}

/// The turn that produced `response_id` and the messages a response chained to it stands on.
pub fn parent_context(store: &Store, response_id: &str) -> Result<Option<ParentContext>, StoreError> {
    let Some(turn) = store.turn_by_response_id(response_id)? else {
        return Ok(None);
    };
    let history = store.turn_history(&turn)?;
    let skip = usize::from(turn.responses.as_ref().is_some_and(|r| r.instructions));
    let conversation = store.conversation(turn.conversation)?.map_or(CaptureLevel::Full, |c| c.capture);
    let capture = conversation.max(turn.capture);
    Ok(Some(ParentContext { messages: history.into_iter().skip(skip).collect(), turn, capture }))
}

/// Puts the chain named by `previous_response_id` ahead of the request's own input (after its
/// instructions); `None` for requests of other APIs.
pub fn expand(store: &Store, request: &mut ParsedRequest, notes: &mut Vec<String>) -> Result<Option<Chained>, StoreError> {
    let Some(sent) = &request.responses else {
        return Ok(None);
    };
    let mut info = ResponsesInfo {
        previous_response_id: sent.previous_response_id.clone(),
        instructions: sent.instructions,
        input_messages: sent.input_messages,
        truncation: sent.truncation.clone(),
        store: sent.store,
        conversation: sent.conversation.clone(),
        ..ResponsesInfo::default()
    };
    let Some(previous) = &sent.previous_response_id else {
        return Ok(Some(Chained { info, parent: None, spliced: None, textless: false }));
    };
    match parent_context(store, previous)? {
        Some(ParentContext { turn: parent, messages: context, .. }) => {
            let at = usize::from(sent.instructions).min(request.messages.len());
            info.parent_turn = Some(parent.id);
            info.chain_messages = context.len() as u32;
            let textless = context.iter().any(|(_, message)| message.is_none());
            if textless {
                notes.push(format!(
                    "the chain of previous_response_id {previous} was captured without text (--capture hashes): its messages are known by their hashes only"
                ));
            }
            let hashes = context.iter().map(|(hash, _)| *hash).collect();
            request.messages.splice(at..at, context.into_iter().map(|(_, message)| Message::new(message.unwrap_or(Value::Null))));
            Ok(Some(Chained { info, parent: Some(parent), spliced: Some((at, hashes)), textless }))
        }
        None => {
            info.parent_unknown = true;
            notes.push(format!("previous_response_id {previous} was never captured: the context before this request's input is unknown"));
            Ok(Some(Chained { info, parent: None, spliced: None, textless: false }))
        }
    }
}

/// Threads a chained request: it extends its parent's conversation when the parent is that
/// conversation's latest turn, repeats the latest turn when it sends the same messages again (a
/// retry), and otherwise branches from the parent (a fork of an earlier response).
pub fn decide(store: &Store, parent: &TurnRecord, chain: &[Hash]) -> Result<Decision, StoreError> {
    let k = parent.message_count as usize;
    let carries_parent = chain.len() > k && parent.tail.as_deref() == Some(to_hex(&chain[k]).as_str());
    let base = carries_parent.then_some(BaseRef { turn: parent.id, len: k as u32 + 1 });
    let head = chain.last().map(to_hex).unwrap_or_default();
    match store.conversation(parent.conversation)? {
        Some(c) if c.last_turn == parent.id => {
            Ok(Decision { conversation: Some(c), relation: Relation::Extend { parent_turn: parent.id }, base, branch_of: None })
        }
        Some(c) if c.last_head == head => {
            let relation = Relation::Regenerate { turn: c.last_turn };
            Ok(Decision { conversation: Some(c), relation, base, branch_of: None })
        }
        _ => {
            let shared_messages = base.map_or(0, |b| b.len);
            let branch = BranchRef { conversation: parent.conversation, turn: parent.id, shared_messages };
            let relation = Relation::Branch { conversation: parent.conversation, turn: parent.id, shared_messages };
            Ok(Decision { conversation: None, relation, base, branch_of: Some(branch) })
        }
    }
}

/// A request whose parent is unknown starts a conversation of its own.
pub fn unknown_parent() -> Decision {
    Decision { conversation: None, relation: Relation::New, base: None, branch_of: None }
}
