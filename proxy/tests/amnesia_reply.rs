//! `amnesia_reply` through the capture pipeline: a reworded denial in a continued conversation is
//! recognised by structure, with readable evidence; innocent replies with the same words raise nothing.

use ctxscope_store::{FindingKind, FindingRecord};
use serde_json::{json, Value};

mod common;
use common::{assistant, user, Capture};

struct Harness(Capture);

impl Harness {
    fn new() -> Harness {
        Harness(Capture::new("http://engine"))
    }

    fn send(&mut self, messages: &[Value], reply: &str) {
        let request = json!({"model": "m", "messages": messages});
        let response = json!({
            "choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20 * messages.len(), "completion_tokens": 8},
        });
        self.0.send(request, response);
    }

    /// The amnesia findings (other detectors are not this test's business).
    fn findings(&self) -> Vec<FindingRecord> {
        let all = self.0.findings();
        all.into_iter().filter(|f| f.kind == FindingKind::AmnesiaReply).collect()
    }
}

#[test]
fn a_reworded_denial_is_recognised_by_structure_and_innocent_replies_are_not() {
    let mut h = Harness::new();
    let first = "Done: the loop now stops at EOF.";
    // Innocent replies that use the same words, in a continued conversation: nothing.
    let mut messages = vec![user("Fix the parser."), assistant(first), user("What changed?")];
    h.send(&messages[..1], first);
    let innocent = "As I mentioned earlier, the first step is the EOF check.\n```rust\n// no previous token: this is the first one\nlet prev = None;\n```\nThere is no previous version of this API, so nothing else changes.";
    h.send(&messages, innocent);
    assert_eq!(h.findings(), vec![], "innocent reply raised a finding");
    // A reworded denial in the middle of a coding reply.
    messages.push(assistant(innocent));
    messages.push(user("Now add tests."));
    let reply = "Sure.\n```rust\n#[test]\nfn parses() {}\n```\nI can't see the parser you shared earlier in our chat, so the test is a stub. Paste it and I'll fill it in.";
    h.send(&messages, reply);
    let found = h.findings();
    assert_eq!(found.iter().map(|f| f.kind).collect::<Vec<_>>(), vec![FindingKind::AmnesiaReply], "{found:#?}");
    let evidence = &found[0].evidence;
    assert_eq!(evidence["method"], "structure", "{evidence:#}");
    assert_eq!(evidence["rule"], "self_access", "{evidence:#}");
    assert_eq!(evidence["phrase"], Value::Null, "{evidence:#}");
    assert_eq!(evidence["sentence"], "I can't see the parser you shared earlier in our chat, so the test is a stub.", "{evidence:#}");
    assert_eq!(evidence["cues"]["negation"], "not", "{evidence:#}");
    assert_eq!(evidence["cues"]["access"], "see", "{evidence:#}");
    assert_eq!(evidence["earlier_replies"], 2, "{evidence:#}");
    assert!(["high", "medium", "low"].contains(&evidence["confidence"].as_str().unwrap()), "{evidence:#}");
    assert!(found[0].summary.starts_with("reply denies earlier context (\"I can't see the parser"), "{}", found[0].summary);
}
