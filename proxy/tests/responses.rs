//! Responses API turns through the capture pipeline with a real sled store: `previous_response_id`
//! chains threaded exactly (across a store reopen), a parent never seen marked, stateless resends
//! threaded by the prefix chain, and an engine that ignores `previous_response_id` found.

use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_store::{FindingKind, Relation, RetentionPolicy, Store, StoreOptions, TurnRecord};
use serde_json::{json, Value};

mod common;
use common::responses_exchange as exchange;

struct Harness {
    dir: tempfile::TempDir,
    store: Store,
    pipeline: Pipeline,
    next: u32,
}

/// What the scripted engine reports as input tokens for a request.
enum Engine {
    /// Keeps state: the chain's input plus this request's.
    Stateful,
    /// Ignores `previous_response_id`: only this request's input.
    Forgets,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let pipeline = Pipeline::new(store.clone(), "http://up".into(), None, RetentionPolicy::default());
        Harness { dir, store, pipeline, next: 0 }
    }

    /// Closes and reopens the store, as a proxy restart does.
    fn restart(self) -> Harness {
        let Harness { dir, store, pipeline, next } = self;
        store.flush().unwrap();
        drop((store, pipeline));
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let pipeline = Pipeline::new(store.clone(), "http://up".into(), None, RetentionPolicy::default());
        Harness { dir, store, pipeline, next }
    }

    fn send(&mut self, request: Value, reply: &str, input_tokens: u64) -> (TurnRecord, Vec<ctxscope_store::FindingRecord>) {
        self.next += 1;
        let response = json!({
            "id": format!("resp_{}", self.next), "object": "response", "status": "completed",
            "output": [{"type": "message", "id": format!("msg_{}", self.next), "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": reply, "annotations": []}]}],
            "usage": {"input_tokens": input_tokens, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 0}}
        });
        self.pipeline.capture_with_findings(&exchange(request, response)).expect("captured")
    }

    /// A chain of `n` responses, each naming the previous one.
    fn chain(&mut self, n: usize, engine: Engine) -> Vec<(TurnRecord, Vec<ctxscope_store::FindingRecord>)> {
        let mut out: Vec<(TurnRecord, Vec<ctxscope_store::FindingRecord>)> = Vec::new();
        let mut total = 0;
        for i in 0..n {
            let mut request = json!({"model": "m", "instructions": "Be brief.", "input": format!("message {i} with some words")});
            if let Some((turn, _)) = out.last() {
                request["previous_response_id"] = json!(turn.responses.as_ref().unwrap().response_id);
            }
            total += 20 + 5;
            let tokens = match engine {
                Engine::Stateful => total,
                Engine::Forgets => 25,
            };
            out.push(self.send(request, &format!("reply {i}"), tokens));
        }
        out
    }
}

#[test]
fn a_previous_response_id_chain_is_one_conversation_with_its_whole_context() {
    let mut h = Harness::new();
    let turns = h.chain(10, Engine::Stateful);
    let first = &turns[0].0;
    for (i, (turn, findings)) in turns.iter().enumerate() {
        assert_eq!(turn.conversation, first.conversation, "turn {i}");
        assert_eq!(turn.index as usize, i);
        assert!(findings.is_empty(), "clean chain raised {findings:?}");
        if i > 0 {
            assert_eq!(turn.relation, Relation::Extend { parent_turn: turns[i - 1].0.id });
            // Delta storage: each turn stores only its own input.
            assert_eq!(turn.new_messages.len(), 1, "turn {i}");
        }
    }
    let last = &turns[9].0;
    // instructions + 10 inputs + 9 replies
    assert_eq!(last.message_count, 20);
    let info = last.responses.as_ref().unwrap();
    assert_eq!((info.chain_messages, info.input_messages, info.instructions), (18, 1, true));
    assert_eq!(h.store.turn_by_response_id("resp_10").unwrap().unwrap().id, last.id);
    let messages = h.store.conversation_detail(first.conversation).unwrap();
    let hashes = &messages.turns[9].messages;
    assert_eq!(messages.messages[&hashes[1]], json!({"role": "user", "content": "message 0 with some words"}));
    assert_eq!(messages.messages[&hashes[2]], json!({"role": "assistant", "content": "reply 0"}));
}

#[test]
fn the_chain_survives_a_restart() {
    let mut h = Harness::new();
    let t1 = h.send(json!({"input": "remember 42"}), "ok", 10).0;
    let mut h = h.restart();
    let t2 = h.send(json!({"input": "what number?", "previous_response_id": "resp_1"}), "42", 20).0;
    assert_eq!(t2.relation, Relation::Extend { parent_turn: t1.id });
    assert_eq!(t2.message_count, 3);
}

#[test]
fn an_unknown_parent_is_marked_not_guessed() {
    let mut h = Harness::new();
    h.send(json!({"input": "hello"}), "hi", 10);
    let t = h.send(json!({"input": "hello", "previous_response_id": "resp_never_seen"}), "hi", 10).0;
    assert_eq!(t.relation, Relation::New);
    assert!(t.responses.as_ref().unwrap().parent_unknown);
    assert!(t.notes.iter().any(|n| n.contains("resp_never_seen")));
}

#[test]
fn a_stateless_client_resending_items_threads_by_the_prefix_chain() {
    let mut h = Harness::new();
    let t1 = h.send(json!({"input": [{"role": "user", "content": "a"}]}), "A", 10).0;
    let items = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "A", "annotations": []}]},
        {"role": "user", "content": "b"}
    ]);
    let t2 = h.send(json!({"input": items}), "B", 20).0;
    assert_eq!(t2.relation, Relation::Extend { parent_turn: t1.id });
    assert_eq!(t2.new_messages.len(), 1);
}

#[test]
fn a_fork_from_an_earlier_response_branches() {
    let mut h = Harness::new();
    let t1 = h.send(json!({"input": "a"}), "A", 10).0;
    h.send(json!({"input": "b", "previous_response_id": "resp_1"}), "B", 20);
    let t3 = h.send(json!({"input": "c", "previous_response_id": "resp_1"}), "C", 20).0;
    assert_eq!(t3.relation, Relation::Branch { conversation: t1.conversation, turn: t1.id, shared_messages: 2 });
}

#[test]
fn an_engine_that_ignores_previous_response_id_is_engine_truncation() {
    let mut h = Harness::new();
    let turns = h.chain(3, Engine::Forgets);
    assert!(turns[0].1.is_empty());
    let finding = turns[1].1.iter().find(|f| f.kind == FindingKind::EngineTruncation).expect("engine_truncation on turn 2");
    assert_eq!(finding.evidence["method"], "responses_chain_usage");
    assert_eq!(finding.evidence["confidence"], "high");
    assert_eq!(finding.evidence["parent_input_tokens"], 25);
    assert_eq!(finding.evidence["engine_prompt_tokens"], 25);
    assert_eq!(finding.evidence["previous_response_id"], "resp_1");
}
