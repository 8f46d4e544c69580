//! Threading, hashing and storage through the capture pipeline, with synthetic exchanges and a real
//! sled store: extend, regenerate, branch, dropped turns, tool calls, content-addressed messages.

use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_store::{Relation, RetentionPolicy, Store, StoreOptions, TurnRecord};
use serde_json::{json, Value};

mod common;
use common::{assistant, captured, exchange, system, user};

struct Harness {
    _dir: tempfile::TempDir,
    store: Store,
    pipeline: Pipeline,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let pipeline = Pipeline::new(store.clone(), "http://up".into(), None, RetentionPolicy::default());
        Harness { _dir: dir, store, pipeline }
    }

    fn turn(&mut self, messages: &[Value], reply: &str) -> TurnRecord {
        self.turn_named(messages, reply, None)
    }

    fn turn_named(&mut self, messages: &[Value], reply: &str, name: Option<&str>) -> TurnRecord {
        let request = json!({"model": "m", "messages": messages});
        let response = json!({"choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 10 * messages.len(), "completion_tokens": 2}});
        self.pipeline.capture(&exchange(request, response, name)).expect("captured")
    }
}

#[test]
fn extension_of_the_previous_turn_plus_its_reply_continues_the_conversation() {
    let mut h = Harness::new();
    let t1 = h.turn(&[system(), user("a")], "A");
    let t2 = h.turn(&[system(), user("a"), assistant("A"), user("b")], "B");
    let t3 = h.turn(&[system(), user("a"), assistant("A"), user("b"), assistant("B"), user("c")], "C");
    assert_eq!(t1.relation, Relation::New);
    assert_eq!(t2.relation, Relation::Extend { parent_turn: t1.id });
    assert_eq!(t3.relation, Relation::Extend { parent_turn: t2.id });
    assert_eq!((t2.conversation, t3.conversation), (t1.conversation, t1.conversation));
    assert_eq!(t3.index, 2);
    // Delta storage: turn 3 stores only its new user message.
    assert_eq!(t3.new_messages.len(), 1);
    assert_eq!(h.store.turn_messages(&t3).unwrap().len(), 6);
    // Each distinct message stored once: system, a, A, b, B, c, C.
    assert_eq!(h.store.message_count(), 7);
}

#[test]
fn a_harness_that_rewrites_the_reply_still_extends_through_the_request_head() {
    let mut h = Harness::new();
    let t1 = h.turn(&[user("a")], "A");
    // The client resends the reply with trailing whitespace trimmed differently.
    let t2 = h.turn(&[user("a"), assistant("A "), user("b")], "B");
    assert_eq!(t2.relation, Relation::Extend { parent_turn: t1.id });
    assert_eq!(t2.base.unwrap().len, 1);
}

#[test]
fn the_same_messages_again_are_a_regenerate() {
    let mut h = Harness::new();
    let t1 = h.turn(&[user("a")], "A");
    let t2 = h.turn(&[user("a")], "A2");
    assert_eq!(t2.relation, Relation::Regenerate { turn: t1.id });
    assert_eq!(t2.conversation, t1.conversation);
}

#[test]
fn a_shared_prefix_that_diverges_is_a_branch() {
    let mut h = Harness::new();
    let t1 = h.turn(&[system(), user("a")], "A");
    let t2 = h.turn(&[system(), user("a"), assistant("A"), user("b")], "B");
    h.turn(&[system(), user("a"), assistant("A"), user("b"), assistant("B"), user("c")], "C");
    // Edit the second question.
    let edit = h.turn(&[system(), user("a"), assistant("A"), user("b'")], "B'");
    assert_ne!(edit.conversation, t1.conversation);
    assert_eq!(edit.relation, Relation::Branch { conversation: t1.conversation, turn: t1.id, shared_messages: 3 });
    let conv = h.store.conversation(edit.conversation).unwrap().unwrap();
    assert_eq!(conv.branch_of.unwrap().conversation, t1.conversation);
    // The branch continues as its own conversation.
    let next = h.turn(&[system(), user("a"), assistant("A"), user("b'"), assistant("B'"), user("d")], "D");
    assert_eq!(next.conversation, edit.conversation);
    assert_eq!(next.relation, Relation::Extend { parent_turn: edit.id });
    let _ = t2;
}

#[test]
fn sharing_only_the_system_prompt_is_a_new_conversation() {
    let mut h = Harness::new();
    let t1 = h.turn(&[system(), user("a")], "A");
    let other = h.turn(&[system(), user("z")], "Z");
    assert_eq!(other.relation, Relation::New);
    assert_ne!(other.conversation, t1.conversation);
    // ...but its storage still reuses the shared system message.
    assert_eq!(other.base.unwrap().len, 1);
}

#[test]
fn identical_conversations_run_twice_thread_separately() {
    let mut h = Harness::new();
    let a1 = h.turn(&[user("a")], "A");
    let a2 = h.turn(&[user("a"), assistant("A"), user("b")], "B");
    // Second run of the same script, after the first went further.
    let b1 = h.turn(&[user("a")], "A");
    let b2 = h.turn(&[user("a"), assistant("A"), user("b")], "B");
    assert_eq!(a2.conversation, a1.conversation);
    assert_ne!(b1.conversation, a1.conversation);
    assert_eq!(b1.relation, Relation::Branch { conversation: a1.conversation, turn: a1.id, shared_messages: 1 });
    assert_eq!(b2.conversation, b1.conversation, "the rerun's second turn extends the rerun");
    assert_eq!(b2.relation, Relation::Extend { parent_turn: b1.id });
}

#[test]
fn dropped_turns_under_a_named_session_are_marked_diverged_with_the_shared_length() {
    let mut h = Harness::new();
    let s = Some("session-1");
    h.turn_named(&[system(), user("a")], "A", s);
    let t2 = h.turn_named(&[system(), user("a"), assistant("A"), user("b")], "B", s);
    // The harness compacts: earlier turns replaced by a summary.
    let t3 = h.turn_named(&[system(), user("summary of a and b"), user("c")], "C", s);
    assert_eq!(t3.conversation, t2.conversation);
    assert_eq!(t3.relation, Relation::Diverged { previous_turn: t2.id, shared_messages: 1 });
}

#[test]
fn tool_call_replies_thread_when_resent_with_null_content() {
    let mut h = Harness::new();
    let tools_request = json!({"model": "m", "messages": [user("weather?")]});
    let call = json!([{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]);
    let response =
        json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": call}, "finish_reason": "tool_calls"}]});
    let t1 = h.pipeline.capture(&exchange(tools_request, response, None)).unwrap();
    assert_eq!(t1.finish_reason.as_deref(), Some("tool_calls"));
    let follow = [
        user("weather?"),
        json!({"role": "assistant", "content": null, "tool_calls": call}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "18C"}),
    ];
    let t2 = h.turn(&follow, "It is 18C.");
    assert_eq!(t2.relation, Relation::Extend { parent_turn: t1.id });
    assert_eq!(t2.base.unwrap().len, 2, "the resent tool-call message must match the captured reply");
}

#[test]
fn failed_requests_are_recorded_with_the_engine_message() {
    let mut h = Harness::new();
    let mut ex = exchange(json!({"model": "m", "messages": [user("long")]}), json!({}), None);
    ex.status = Some(400);
    ex.response = captured(br#"{"error":{"message":"the request exceeds the available context size","code":400}}"#.to_vec());
    let t = h.pipeline.capture(&ex).unwrap();
    assert_eq!(t.status, 400);
    assert_eq!(t.error.as_deref(), Some("the request exceeds the available context size"));
    assert!(t.reply.is_none());
}

#[test]
fn a_fork_inside_a_long_request_branches_at_a_recorded_length() {
    // One request of 1,300 messages records the first PREFIX_RUN prefix lengths, every
    // PREFIX_EVERY-th and its head and tail (not all 1,300): a fork early on is found exactly, one
    // deep inside at the last recorded length.
    let mut h = Harness::new();
    let long: Vec<Value> = (0..1300).map(|i| if i % 2 == 0 { user(&format!("q{i}")) } else { assistant(&format!("a{i}")) }).collect();
    let first = h.turn(&long, "done");
    assert!(h.store.message_count() >= 1301);
    let mut early = long[..40].to_vec();
    early.push(user("a different question"));
    let t = h.turn(&early, "x");
    assert_eq!(t.relation, Relation::Branch { conversation: first.conversation, turn: first.id, shared_messages: 40 });
    let mut deep = long[..1100].to_vec();
    deep.push(user("another different question"));
    let t = h.turn(&deep, "y");
    let recorded = (1100 / ctxscope_store::PREFIX_EVERY * ctxscope_store::PREFIX_EVERY).max(ctxscope_store::PREFIX_RUN);
    assert!(recorded > ctxscope_store::PREFIX_RUN, "the fork is past a recorded multiple");
    assert_eq!(t.relation, Relation::Branch { conversation: first.conversation, turn: first.id, shared_messages: recorded as u32 });
    // Its own delta holds the rest, so the full list still resolves.
    assert_eq!(h.store.turn_messages(&t).unwrap().len(), 1101);
    let values = h.store.turn_message_values(&t).unwrap();
    assert_eq!(values[1099].1.as_ref().unwrap()["content"], "a1099");
}
