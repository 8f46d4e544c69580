//! `--capture` levels through the capture pipeline with a real sled store: the same traffic (chat
//! turns that extend, a window that drops history, a reply that denies earlier context, a Responses
//! API `previous_response_id` chain) is threaded into the same conversations with the same hashes,
//! heads and tails and raises the same findings at `full`, `redacted` and `hashes`; what differs is
//! only what is kept of the text.

use ctxscope_proxy::capture::exchange::Exchange;
use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_store::{CaptureLevel, FindingKind, FindingRecord, RetentionPolicy, Store, StoreOptions, TurnRecord};
use serde_json::{json, Value};

mod common;
use common::{assistant, responses_exchange, system, user};

const EMAIL: &str = "ada@example.com";

fn chat(messages: &[Value], reply: &str) -> Exchange {
    let response = json!({"choices": [{"message": assistant(reply), "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 40, "completion_tokens": 5}});
    common::exchange(json!({"model": "m", "messages": messages}), response, None)
}

fn response(id: u32, reply: &str) -> Value {
    json!({"id": format!("resp_{id}"), "object": "response", "status": "completed",
           "output": [{"type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": reply, "annotations": []}]}],
           "usage": {"input_tokens": 30 * id, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 0}}})
}

/// The traffic, captured at `level`: every stored turn and every finding, and the store.
fn capture(level: CaptureLevel) -> (Vec<TurnRecord>, Vec<FindingRecord>, Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let mut pipeline = Pipeline::new(store.clone(), "http://up".into(), None, RetentionPolicy::default()).with_capture(level);
    let mut turns = Vec::new();
    let mut send = |ex: Exchange| {
        let (turn, _) = pipeline.capture_with_findings(&ex).expect("captured");
        turns.push(turn);
    };
    // Chat: two turns, a window that drops the first exchange, then a reply denying context.
    let u1 = user(&format!("I am {EMAIL}; remember it."));
    let a1 = "Noted, I will remember your address.";
    send(chat(&[system(), u1.clone()], a1));
    let u2 = user("Call me on +1 415 555 2671 tomorrow.");
    let a2 = "I will call you tomorrow at that number.";
    send(chat(&[system(), u1, assistant(a1), u2.clone()], a2));
    let u3 = user("What is my e-mail?");
    let a3 = "I can't see anything you shared earlier in our chat, so I do not know your address.";
    send(chat(&[system(), u2, assistant(a2), u3], a3));
    // Responses: a chain of three, each naming the previous response.
    for i in 1..=3u32 {
        let mut request = json!({"model": "m", "input": format!("question {i} from {EMAIL}")});
        if i > 1 {
            request["previous_response_id"] = json!(format!("resp_{}", i - 1));
        }
        send(responses_exchange(request, response(i, &format!("answer {i}"))));
    }
    let findings = store.findings(&ctxscope_store::FindingFilter::default()).unwrap();
    (turns, findings, store, dir)
}

/// What threading and hashing decided for a turn (the same at every level), as JSON.
fn shape(turn: &TurnRecord) -> Value {
    json!({"conversation": turn.conversation, "index": turn.index, "relation": turn.relation, "message_count": turn.message_count,
           "new_messages": turn.new_messages.iter().map(ctxscope_store::to_hex).collect::<Vec<_>>(),
           "head": turn.head, "reply": turn.reply, "tail": turn.tail})
}

#[test]
fn every_level_threads_hashes_and_diagnoses_the_same_traffic_the_same_way() {
    let (full, full_findings, _, _full_dir) = capture(CaptureLevel::Full);
    let kinds = |findings: &[FindingRecord]| findings.iter().map(|f| (f.kind, f.turn, f.cause.clone())).collect::<Vec<_>>();
    assert!(full_findings.iter().any(|f| f.kind == FindingKind::HistoryDropped), "{full_findings:#?}");
    assert!(full_findings.iter().any(|f| f.kind == FindingKind::AmnesiaReply), "{full_findings:#?}");
    assert_eq!(full[5].relation, ctxscope_store::Relation::Extend { parent_turn: full[4].id }, "the chain extends");
    for level in [CaptureLevel::Redacted, CaptureLevel::Hashes] {
        let (turns, findings, store, _dir) = capture(level);
        assert_eq!(turns.iter().map(shape).collect::<Vec<_>>(), full.iter().map(shape).collect::<Vec<_>>(), "{level}");
        assert_eq!(kinds(&findings), kinds(&full_findings), "{level}");
        assert!(turns.iter().all(|t| t.capture == level), "{level}");
        for conversation in store.conversations().unwrap() {
            assert_eq!(conversation.capture, level);
            let detail = serde_json::to_string(&store.conversation_detail(conversation.id).unwrap()).unwrap();
            assert!(!detail.contains(EMAIL) && !detail.contains("415 555 2671"), "{level}: {detail}");
            if level == CaptureLevel::Redacted {
                assert!(detail.contains("[redacted:email]"), "{detail}");
            }
        }
        let amnesia = findings.iter().find(|f| f.kind == FindingKind::AmnesiaReply).unwrap();
        let history = findings.iter().find(|f| f.kind == FindingKind::HistoryDropped).unwrap();
        match level {
            CaptureLevel::Hashes => {
                assert!(!amnesia.summary.contains("I can't see"), "no quote without text: {}", amnesia.summary);
                assert!(amnesia.evidence.get("sentence").is_none() && amnesia.evidence.get("reply_excerpt").is_none());
                assert!(history.evidence.get("first_before").is_none(), "{:#}", history.evidence);
                assert!(turns.iter().all(|t| t.reply_text.is_empty()));
                let values = store.turn_history(&turns[2]).unwrap();
                assert!(values.iter().all(|(_, v)| v.is_none()), "no text stored: {values:?}");
            }
            _ => {
                assert!(amnesia.summary.contains("I can't see"), "{}", amnesia.summary);
                assert_eq!(turns[0].reply_text, "Noted, I will remember your address.");
            }
        }
    }
}
