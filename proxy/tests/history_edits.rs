//! Harness edits through the capture pipeline with a real sled store: a request that is the previous
//! history pruned, compacted or stripped of reasoning continues its conversation and raises
//! `history_dropped` with the edit's cause; a true branch stays a branch and raises nothing.

use ctxscope_proxy::detect::context_report::context_report;
use ctxscope_store::{FindingRecord, Relation, TurnRecord};
use serde_json::{json, Value};

mod common;
use common::{assistant, system, user, Capture};

/// The pipeline, answering each request with one assistant message.
struct Harness(Capture);

impl Harness {
    fn new() -> Harness {
        Harness(Capture::new("http://engine"))
    }

    /// Sends `messages` to `model`; the engine answers with `reply` (an assistant message).
    fn send(&mut self, model: &str, messages: &[Value], reply: Value) -> TurnRecord {
        let request = json!({"model": model, "messages": messages});
        let response =
            json!({"choices": [{"message": reply, "finish_reason": "stop"}], "usage": {"prompt_tokens": 100, "completion_tokens": 8}});
        self.0.send(request, response)
    }

    fn findings(&self) -> Vec<FindingRecord> {
        self.0.findings()
    }
}

fn call(id: &str, reasoning: Option<&str>) -> Value {
    let mut v = json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]});
    if let Some(r) = reasoning {
        v["reasoning_content"] = json!(r);
    }
    v
}

fn result(id: &str, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": text})
}

/// An agent loop of `n` tool calls, each followed by the user's next question.
fn agent(h: &mut Harness, n: usize) -> (Vec<Value>, u64) {
    let mut messages = vec![system(), user("Look at the project.")];
    let mut conversation = 0;
    for i in 0..n {
        let id = format!("call_{i}");
        messages.extend([call(&id, None), result(&id, &format!("file {i}: {}", "fn main() {} ".repeat(20)))]);
        messages.push(user(&format!("And then {i}?")));
        conversation = h.send("m", &messages, assistant(&format!("Answer {i}."))).conversation;
        messages.push(assistant(&format!("Answer {i}.")));
    }
    (messages, conversation)
}

#[test]
fn pruned_tool_results_continue_the_conversation_and_are_named() {
    let mut h = Harness::new();
    let (messages, conversation) = agent(&mut h, 4);
    // The harness removes every tool result but the last, keeping every user and assistant message.
    let last_result = messages.iter().rposition(|m| m["role"] == "tool").unwrap();
    let mut pruned: Vec<Value> =
        messages.iter().enumerate().filter(|(i, m)| m["role"] != "tool" || *i == last_result).map(|(_, m)| m.clone()).collect();
    pruned.push(user("Summarise."));
    let turn = h.send("m", &pruned, assistant("Done."));
    assert_eq!(turn.conversation, conversation, "{:?}", turn.relation);
    assert!(matches!(turn.relation, Relation::Diverged { .. }), "{:?}", turn.relation);
    let found = h.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    let e = &found[0].evidence;
    assert_eq!((e["cause"].as_str(), e["lost"]["tool_result"]["messages"].as_u64()), (Some("pruned"), Some(3)), "{e:#}");
    assert_eq!(found[0].severity.as_str(), "info", "only old tool results were lost");
    assert!(found[0].summary.contains("3 tool_result"), "{}", found[0].summary);
    // The context report: 4 tool results said, 1 still visible, the rest all there.
    let report = context_report(&h.0.store.conversation_detail(conversation).unwrap());
    let last = report.turns.last().unwrap();
    assert_eq!((last.visible["tool_result"].messages, last.ever["tool_result"].messages), (1, 4));
    assert_eq!((last.visible["user"].messages, last.ever["user"].messages), (6, 6));
    assert!(last.visible_share < 1.0 && report.turns[0].visible_share == 1.0, "{report:#?}");
    // The export carries the decision (the diverged turn) and the finding with its evidence; an
    // import keeps the turn diverged.
    let mut jsonl = Vec::new();
    h.0.store.export_conversation(conversation, &mut jsonl).unwrap();
    let lines: Vec<Value> = jsonl.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    let finding = lines.iter().find(|l| l["kind"] == "finding").expect("a finding line");
    assert_eq!(finding["finding"]["evidence"]["cause"], "pruned");
    assert_eq!(lines.iter().rfind(|l| l["kind"] == "turn").unwrap()["relation"]["kind"], "diverged");
    let imported = h.0.store.import_conversation(&mut jsonl.as_slice()).unwrap();
    let detail = h.0.store.conversation_detail(imported).unwrap();
    assert!(
        matches!(detail.turns.last().unwrap().turn.relation, Relation::Diverged { .. }),
        "{:?}",
        detail.turns.last().unwrap().turn.relation
    );
}

#[test]
fn a_reply_given_twice_word_for_word_is_said_twice() {
    let mut h = Harness::new();
    let mut messages = vec![system(), user("u0")];
    let conversation = h.send("m", &messages, assistant("I cannot help.")).conversation;
    messages.extend([assistant("I cannot help."), user("u1")]);
    h.send("m", &messages, assistant("I cannot help."));
    messages.extend([assistant("I cannot help."), user("u2")]);
    h.send("m", &messages, assistant("Fine."));
    let report = context_report(&h.0.store.conversation_detail(conversation).unwrap());
    for t in &report.turns {
        let (seen, said) = (t.visible.get("assistant").map_or(0, |c| c.messages), t.ever.get("assistant").map_or(0, |c| c.messages));
        assert_eq!(seen, said, "turn {}: nothing was dropped: {report:#?}", t.index);
        assert_eq!(t.visible_share, 1.0);
    }
}

#[test]
fn a_branch_stays_a_branch() {
    let mut h = Harness::new();
    let mut messages = vec![system(), user("u0")];
    let first = h.send("m", &messages, assistant("a0")).conversation;
    messages.extend([assistant("a0"), user("u1")]);
    h.send("m", &messages, assistant("a1"));
    messages.extend([assistant("a1"), user("u2")]);
    h.send("m", &messages, assistant("a2"));
    // Back to after the first answer, and on differently.
    let branch = h.send("m", &[system(), user("u0"), assistant("a0"), user("something else entirely")], assistant("b1"));
    assert_ne!(branch.conversation, first);
    assert!(matches!(branch.relation, Relation::Branch { shared_messages: 3, .. }), "{:?}", branch.relation);
    assert_eq!(h.findings(), vec![]);
}

#[test]
fn a_compaction_that_kept_only_the_system_prompt_is_found_by_its_summary() {
    let mut h = Harness::new();
    let mut messages = vec![system(), user("u0")];
    let conversation = h.send("m", &messages, assistant("a0")).conversation;
    messages.extend([assistant("a0"), user("Your task is to create a detailed summary of the conversation so far.")]);
    let summary = "The user greeted the assistant twice and asked about the weather in Paris; the answer was sunny, 21 degrees.";
    h.send("m", &messages, assistant(summary));
    let continued = format!(
        "This session is being continued from a previous conversation that ran out of context. The conversation is summarized below:\n{summary}"
    );
    let turn = h.send("m", &[system(), user(&continued), user("And tomorrow?")], assistant("Rain."));
    assert_eq!(turn.conversation, conversation, "{:?}", turn.relation);
    let found = h.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].evidence["cause"], "compaction");
    assert_eq!(found[0].evidence["summary"]["harness"], "claude_code");
}

#[test]
fn reasoning_dropped_inside_a_deepseek_tool_loop_but_not_between_user_turns() {
    let mut h = Harness::new();
    let model = "deepseek-v4-flash";
    let mut messages = vec![system(), user("Fix the test.")];
    // The engine answers with a tool call and its reasoning; the harness resends it without.
    let reply = call("c1", Some("I should read the failing test first."));
    let conversation = h.send(model, &messages, reply).conversation;
    messages.extend([call("c1", None), result("c1", "assert_eq!(parse(\" 1\"), 1) failed")]);
    let turn = h.send(model, &messages, assistant("Trim the input."));
    assert_eq!(turn.conversation, conversation);
    let found = h.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].evidence["cause"].as_str(), found[0].evidence["reasoning_rule"].as_str()),
        (Some("reasoning_dropped"), Some("deepseek"))
    );
    // A new question after the answer: DeepSeek's encoding drops earlier reasoning itself.
    let mut h = Harness::new();
    let mut messages = vec![system(), user("Hi.")];
    h.send(model, &messages, json!({"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}));
    messages.extend([assistant("Hello."), user("How are you?")]);
    let turn = h.send(model, &messages, assistant("Fine."));
    assert!(matches!(turn.relation, Relation::Extend { .. }), "{:?}", turn.relation);
    assert_eq!(h.findings(), vec![]);
}

#[test]
fn images_stripped_from_earlier_messages_are_named() {
    // No engine this project runs reads images (the engine and llama-server without a projector refuse
    // them), so this edit is checked here, through the pipeline and the store, not in the corpus.
    let mut h = Harness::new();
    let image = |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]});
    let mut messages = vec![system(), image("What is in this picture?")];
    let conversation = h.send("m", &messages, assistant("A cat on a mat.")).conversation;
    messages.extend([assistant("A cat on a mat."), user("What colour is the cat?")]);
    h.send("m", &messages, assistant("Black."));
    let stripped = vec![
        system(),
        json!({"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}),
        assistant("A cat on a mat."),
        user("What colour is the cat?"),
        assistant("Black."),
        user("And the mat?"),
    ];
    let turn = h.send("m", &stripped, assistant("Red."));
    assert_eq!(turn.conversation, conversation, "{:?}", turn.relation);
    let found = h.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].evidence["cause"].as_str(), found[0].evidence["lost"]["media"]["messages"].as_u64()),
        (Some("media_stripped"), Some(1))
    );
    assert_eq!(found[0].severity.as_str(), "info");
}

#[test]
fn a_side_request_sharing_only_developer_instructions_is_a_new_conversation() {
    // Codex sends its base instructions as a developer message; its title request shares only that.
    let mut h = Harness::new();
    let developer = json!({"role": "developer", "content": "You are a coding agent running in the Codex CLI."});
    let first = h.send("m", &[developer.clone(), user("Remember the code word PLUM.")], assistant("Noted.")).conversation;
    let title = h.send("m", &[developer, user("Generate a concise title for this task.")], assistant("Code word"));
    assert_ne!(title.conversation, first);
    assert!(matches!(title.relation, Relation::New), "{:?}", title.relation);
}

#[test]
fn a_new_codex_session_sharing_only_its_preamble_is_not_a_branch() {
    let mut h = Harness::new();
    let developer = json!({"role": "developer", "content": "You are a coding agent running in the Codex CLI."});
    let context = user("<environment_context>\n  <cwd>/work</cwd>\n  <shell>bash</shell>\n</environment_context>");
    let first = h.send("m", &[developer.clone(), context.clone(), user("Fix the parser.")], assistant("Done.")).conversation;
    let next = h.send("m", &[developer, context, user("Write the README.")], assistant("Written."));
    assert_ne!(next.conversation, first);
    assert!(matches!(next.relation, Relation::New), "{:?}", next.relation);
}
