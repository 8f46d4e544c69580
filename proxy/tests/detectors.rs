//! The detectors through the capture pipeline, with synthetic exchanges (the engine's usage is what
//! each test says it is), a real sled store and, where token ids matter, the real default model's
//! tokenizer: every kind fires on its cause, once, and clean traffic raises nothing.

use std::path::PathBuf;

use ctxscope_formats::TokenCounter;
use ctxscope_proxy::capture::pipeline::Pipeline;
use ctxscope_proxy::capture::tokens::TokenCache;
use ctxscope_store::{FindingFilter, FindingKind, FindingRecord, Relation, RetentionPolicy, Store, StoreOptions, TurnRecord};
use serde_json::{json, Value};

mod common;
use common::{assistant, exchange, system, user};

fn model() -> PathBuf {
    ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// What the scripted engine answers.
#[derive(Clone, Default)]
struct Answer {
    reply: String,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    status: Option<(u16, Value)>,
}

fn answer(reply: &str, prompt: u64, cached: u64) -> Answer {
    Answer { reply: reply.into(), prompt_tokens: Some(prompt), cached_tokens: Some(cached), status: None }
}

struct Harness {
    _dir: tempfile::TempDir,
    store: Store,
    pipeline: Pipeline,
    counter: Option<TokenCounter>,
    clock: u64,
}

impl Harness {
    fn new(tokenizer: bool) -> Harness {
        Harness::with(tokenizer, tokenizer)
    }

    /// `tokenizer`: the pipeline counts locally; `counter`: the test can count prompts (to script an
    /// engine's honest answers to a proxy that has no tokenizer).
    fn with(tokenizer: bool, counter: bool) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let tokens = tokenizer.then(|| TokenCache::open(&model()).unwrap());
        let counter = counter.then(|| TokenCounter::open(model()).unwrap());
        let pipeline = Pipeline::new(store.clone(), "http://engine".into(), tokens, RetentionPolicy::default());
        Harness { _dir: dir, store, pipeline, counter, clock: 1_000 }
    }

    /// The prompt's token count with the real tokenizer and template.
    fn local(&self, messages: &[Value]) -> u64 {
        self.counter.as_ref().expect("tokenizer harness").count_prompt(messages).unwrap() as u64
    }

    fn send(&mut self, messages: &[Value], answer: Answer) -> TurnRecord {
        let request = json!({"model": "m", "messages": messages});
        let mut usage = json!({"completion_tokens": 8});
        if let Some(p) = answer.prompt_tokens {
            usage["prompt_tokens"] = json!(p);
        }
        if let Some(c) = answer.cached_tokens {
            usage["prompt_tokens_details"] = json!({"cached_tokens": c});
        }
        let response = match &answer.status {
            Some((_, body)) => body.clone(),
            None => {
                json!({"choices": [{"message": {"role": "assistant", "content": answer.reply}, "finish_reason": "stop"}], "usage": usage})
            }
        };
        let mut ex = exchange(request, response, None);
        self.clock += 1_000;
        ex.time_unix_ms = self.clock;
        if let Some((status, _)) = answer.status {
            ex.status = Some(status);
        }
        self.pipeline.capture(&ex).expect("captured")
    }

    fn findings(&self) -> Vec<FindingRecord> {
        self.store.findings(&FindingFilter::default()).unwrap()
    }

    fn kinds(&self) -> Vec<FindingKind> {
        let mut kinds: Vec<FindingKind> = self.findings().iter().map(|f| f.kind).collect();
        kinds.sort();
        kinds
    }
}

/// A long-ish system prompt so that cache evidence clears the 128-token minimum.
fn long_system(extra: &str) -> Value {
    let rules = "Answer briefly and precisely. Cite the rule you used. Never invent facts. ".repeat(12);
    json!({"role": "system", "content": format!("You are a careful assistant. {extra}{rules}")})
}

/// Runs a conversation whose engine reports exact counts and honest cache reuse.
fn clean_conversation(h: &mut Harness, system_message: Value, turns: usize) -> Vec<Value> {
    let mut messages = vec![system_message];
    let mut previous_prompt = 0;
    for i in 0..turns {
        messages.push(user(&format!("Question {i}: what is {i} times {i}, and why?")));
        let local = h.local(&messages);
        let reply = format!("{} because {i} times {i} is {}.", i * i, i * i);
        h.send(&messages, answer(&reply, local, previous_prompt));
        previous_prompt = local;
        messages.push(assistant(&reply));
    }
    messages
}

#[test]
fn clean_conversations_raise_nothing() {
    let mut h = Harness::new(true);
    clean_conversation(&mut h, long_system(""), 6);
    clean_conversation(&mut h, system(), 5);
    clean_conversation(&mut h, long_system("Be kind. "), 4);
    assert_eq!(h.findings(), vec![], "clean traffic raised findings");
}

#[test]
fn engine_truncation_is_raised_once_per_conversation_from_local_counts() {
    let mut h = Harness::new(true);
    let mut messages = vec![system(), user("The secret word is banana. Please remember it for later.")];
    for i in 0..4 {
        let local = h.local(&messages);
        // SGLang's auto-truncate at 64: keeps the first 57 tokens and reports that many.
        h.send(&messages, answer("Okay.", local.min(57), 0));
        messages.push(assistant("Okay."));
        messages.push(user(&format!("Tell me something interesting about the number {i}, in two sentences.")));
    }
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::EngineTruncation], "{found:#?}");
    assert_eq!(found[0].evidence["engine_prompt_tokens"], 57);
    assert!(found[0].evidence["local_prompt_tokens"].as_u64().unwrap() > 57);
}

#[test]
fn a_single_oversized_prompt_cut_to_a_fraction_is_truncation() {
    let mut h = Harness::new(true);
    let messages = [system(), user(&"Here is a long document about rivers and the sea. ".repeat(40))];
    let local = h.local(&messages);
    h.send(&messages, answer("Rivers.", 57, 0));
    assert_eq!(h.kinds(), vec![FindingKind::EngineTruncation], "local {local}");
}

#[test]
fn without_a_tokenizer_flat_prompt_counts_while_the_history_grows_are_truncation() {
    let mut h = Harness::new(false);
    let mut messages = vec![system(), user("hello")];
    for i in 0..4 {
        // Ollama at num_ctx 2048 after the context filled: about the same count whatever was sent.
        let prompt = if i == 0 { 1500 } else { 2040 + i };
        h.send(&messages, answer("hi", prompt, 0));
        messages.push(assistant("hi"));
        messages.push(user(&format!("{i}: {}", "more words to grow the history. ".repeat(60))));
    }
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::EngineTruncation], "{found:#?}");
    assert_eq!(found[0].evidence["method"], "flat_prompt_tokens");
}

#[test]
fn without_a_tokenizer_honest_counts_raise_nothing_whatever_the_text() {
    let mut h = Harness::with(false, true);
    clean_conversation(&mut h, long_system(""), 8);
    clean_conversation(&mut h, system(), 6);
    // Text of other shapes after a prose start: code, a table rule, CJK, numbers.
    let mut messages = vec![system(), user("Let us talk about sorting algorithms in plain words first.")];
    let replies = [
        "Sure: quicksort picks a pivot and partitions the rest around it.".to_string(),
        format!("```python\ndef sort(xs):\n    if len(xs) < 2:\n        return xs\n    p = xs[0]\n    return sort([x for x in xs[1:] if x < p]) + [p] + sort([x for x in xs[1:] if x >= p])\n```\n{}", "    # indented comment line\n".repeat(8)),
        format!("| name | cost |\n|{}|{}|\n| quick | n log n |", "-".repeat(60), "-".repeat(60)),
        "排序算法有很多种。快速排序的平均复杂度是 n log n，最坏情况是 n 的平方。".repeat(3),
        (0..60).map(|i| (i * 7919 % 10007).to_string()).collect::<Vec<_>>().join(", "),
    ];
    let mut previous = 0;
    for (i, reply) in replies.iter().enumerate() {
        let local = h.local(&messages);
        h.send(&messages, answer(reply, local, previous));
        previous = local;
        messages.push(assistant(reply));
        messages.push(user(&format!("Go on with part {i}, and show me something different.")));
    }
    assert_eq!(h.findings(), vec![], "honest counts raised findings without a tokenizer");
}

#[test]
fn without_a_tokenizer_a_count_that_stops_growing_with_small_turns_is_truncation_by_rate() {
    let mut h = Harness::with(false, true);
    // Earlier conversations give the upstream's tokens-per-byte rate.
    clean_conversation(&mut h, long_system(""), 6);
    let mut messages = vec![system(), user("The secret word is banana. Please remember it for later.")];
    for i in 0..8 {
        let local = h.local(&messages);
        // SGLang's auto-truncate at 128: keeps the first 121 tokens and reports that many. Each turn
        // adds far less than `flat_growth_bytes`, so only the rate can tell.
        h.send(&messages, answer("Okay, noted.", local.min(121), 0));
        messages.push(assistant("Okay, noted."));
        messages.push(user(&format!("Tell me something interesting about the number {i}, in two sentences.")));
    }
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::EngineTruncation], "{found:#?}");
    let evidence = &found[0].evidence;
    assert_eq!(evidence["method"], "byte_rate", "{evidence:#}");
    assert_eq!(found[0].severity, ctxscope_store::Severity::Warning, "an estimate is never critical");
    assert!(["medium", "low"].contains(&evidence["confidence"].as_str().unwrap()), "{evidence:#}");
    assert!(evidence["predicted_prompt_tokens"].as_u64().unwrap() > 121 + 32, "{evidence:#}");
}

#[test]
fn without_a_tokenizer_a_first_turn_cut_far_below_the_upstream_rate_is_truncation() {
    let mut h = Harness::with(false, true);
    clean_conversation(&mut h, long_system(""), 6);
    clean_conversation(&mut h, long_system("Be kind. "), 6);
    let messages = [system(), user(&"Here is a long document about rivers and the sea. ".repeat(60))];
    let local = h.local(&messages);
    h.send(&messages, answer("Rivers.", 200, 0));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::EngineTruncation], "local {local}: {found:#?}");
    assert_eq!(found[0].evidence["confidence"], "low");
    assert_eq!(found[0].severity, ctxscope_store::Severity::Warning);
}

#[test]
fn every_finding_names_its_method_and_confidence() {
    let mut h = Harness::new(true);
    let mut messages = vec![system(), user("The secret word is banana. Please remember it for later.")];
    for _ in 0..3 {
        let local = h.local(&messages);
        h.send(&messages, answer("This is the first message you have sent me.", local.min(40), 0));
        messages.push(assistant("Okay."));
        messages.push(user("And now?"));
    }
    let found = h.findings();
    assert!(found.len() >= 2, "{found:#?}");
    for f in &found {
        assert!(f.evidence["method"].is_string() && f.evidence["confidence"].is_string(), "{f:#?}");
    }
}

#[test]
fn a_length_refusal_is_context_overflow_with_the_engine_numbers() {
    let mut h = Harness::new(false);
    let body = json!({"error": {"message": "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2084 in the messages, 16 in the completion).", "type": "BadRequestError", "code": "context_length_exceeded"}});
    h.send(&[system(), user("x")], Answer { status: Some((400, body)), ..Default::default() });
    let llama = json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 600, "n_ctx": 512}});
    h.send(&[user("another conversation")], Answer { status: Some((400, llama)), ..Default::default() });
    // An unrelated 400 is not an overflow.
    h.send(
        &[user("third")],
        Answer { status: Some((400, json!({"error": {"message": "temperature must be positive"}}))), ..Default::default() },
    );
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::ContextOverflow, FindingKind::ContextOverflow], "{found:#?}");
    assert_eq!(found[0].evidence["engine_context_size"], 512);
    assert_eq!(found[1].evidence["numbers_in_message"], json!([2048, 2100, 2084, 16]));
}

#[test]
fn a_harness_that_drops_the_head_but_keeps_the_latest_reply_is_history_dropped() {
    let mut h = Harness::new(false);
    let mut messages = vec![system()];
    for i in 0..3 {
        messages.push(user(&format!("u{i}")));
        h.send(&messages, answer(&format!("a{i}"), 10, 0));
        messages.push(assistant(&format!("a{i}")));
    }
    // Keep the system prompt and the last exchange only.
    let compacted = vec![system(), user("u2"), assistant("a2"), user("u3")];
    let turn = h.send(&compacted, answer("a3", 10, 0));
    assert!(matches!(turn.relation, Relation::Diverged { shared_messages: 1, .. }), "{:?}", turn.relation);
    // The compacted history then extends normally: no second finding.
    let next = [compacted.clone(), vec![assistant("a3"), user("u4")]].concat();
    assert!(matches!(h.send(&next, answer("a4", 10, 0)).relation, Relation::Extend { .. }));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::HistoryDropped], "{found:#?}");
    assert_eq!(found[0].evidence["removed_messages"], json!([1, 2, 3, 4]));
    assert_eq!(found[0].evidence["user_turns_lost"], 2);
    assert_eq!(found[0].conversation, turn.conversation);
}

#[test]
fn editing_and_resending_the_last_question_is_not_dropped_history() {
    let mut h = Harness::new(false);
    let first = [system(), user("u0")];
    h.send(&first, answer("a0", 10, 0));
    h.send(&[system(), user("u0"), assistant("a0"), user("u1")], answer("a1", 20, 0));
    h.send(&[system(), user("u0"), assistant("a0"), user("u1, rephrased")], answer("a1'", 20, 0));
    assert_eq!(h.findings(), vec![]);
}

#[test]
fn cached_tokens_beyond_any_shared_prefix_are_phantom_reuse() {
    let mut h = Harness::new(true);
    let a = [system(), user("The secret word is banana. What fruit is yellow and curved?")];
    let la = h.local(&a);
    h.send(&a, answer("A banana.", la, 0));
    // The same prompt again: reuse up to its whole length is honest.
    h.send(&a, answer("A banana.", la, la - 1));
    assert_eq!(h.findings(), vec![]);
    // A different conversation of the same shape; the engine claims it reused almost all of it.
    let b = [system(), user("The secret code is 7731. Which planet is known as the red one?")];
    let lb = h.local(&b);
    h.send(&b, answer("Mars.", lb, lb - 2));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::PhantomCacheReuse], "{found:#?}");
    let shared = found[0].evidence["longest_common_prefix"].as_u64().unwrap();
    assert!(shared < lb / 2, "shared {shared} of {lb}");
}

#[test]
fn a_timestamp_in_the_system_prompt_is_named_as_the_cache_miss_cause() {
    let mut h = Harness::new(true);
    // The upstream has reported a hit before (so it reports caching at all).
    clean_conversation(&mut h, system(), 2);
    let stamp = |t: &str| long_system(&format!("Current time: 2026-11-29 13:{t} UTC. "));
    let first = vec![stamp("40:15"), user("What is the capital of France?")];
    let l1 = h.local(&first);
    h.send(&first, answer("Paris.", l1, 0));
    // The harness re-renders the system prompt with a new time, keeps the rest: nothing reusable is left.
    let second = vec![stamp("41:02"), user("What is the capital of France?"), assistant("Paris."), user("And of Italy?")];
    let l2 = h.local(&second);
    h.send(&second, answer("Rome.", l2, 3));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::CacheMiss], "{found:#?}");
    assert_eq!(found[0].evidence["cause"], "volatile_number");
    assert_eq!(found[0].evidence["message"], 0);
    assert!(found[0].summary.contains("message 0"), "{}", found[0].summary);
}

#[test]
fn an_unchanged_prefix_reused_far_less_than_it_could_be_is_eviction_but_only_once_hits_were_seen() {
    // An upstream that never reports a hit: no cache findings at all.
    let mut quiet = Harness::new(true);
    let mut messages = vec![long_system("")];
    for i in 0..3 {
        messages.push(user(&format!("q{i}")));
        let local = quiet.local(&messages);
        quiet.send(&messages, answer("ok", local, 0));
        messages.push(assistant("ok"));
    }
    assert_eq!(quiet.findings(), vec![]);
    // After a hit, a cold answer to a pure extension is an eviction.
    let mut h = Harness::new(true);
    let messages = clean_conversation(&mut h, long_system(""), 3);
    let next = [messages, vec![user("One more question?")]].concat();
    let local = h.local(&next);
    h.send(&next, answer("Sure.", local, 0));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::CacheMiss], "{found:#?}");
    assert_eq!(found[0].evidence["cause"], "eviction");
}

#[test]
fn a_reply_denying_the_context_it_was_given_is_amnesia() {
    let mut h = Harness::new(false);
    // On a first turn the phrase is true: nothing.
    h.send(&[user("Hi")], answer("Hello! This is the first message I have seen from you.", 10, 0));
    let messages = [user("My name is Ada."), assistant("Nice to meet you, Ada."), user("What is my name?")];
    h.send(&messages[..1], answer("Nice to meet you, Ada.", 10, 0));
    h.send(&messages, answer("I’m sorry, but I don’t have any previous conversation with you.", 20, 0));
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::AmnesiaReply], "{found:#?}");
    assert_eq!(found[0].evidence["phrase"], "i don't have any previous conversation");
}

#[test]
fn a_steady_mismatch_between_engine_and_local_counts_is_token_count_drift_not_truncation() {
    let mut h = Harness::new(true);
    let mut messages = vec![system()];
    for i in 0..6 {
        messages.push(user(&format!("Question {i}: {}", "tell me more about this topic please. ".repeat(i + 1))));
        let local = h.local(&messages);
        // The engine's tokenizer makes 20% fewer tokens than the configured one.
        h.send(&messages, answer("ok", local * 8 / 10, 0));
        messages.push(assistant("ok"));
    }
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::TokenCountDrift], "{found:#?}");
    let scale = found[0].evidence["scale"].as_f64().unwrap();
    assert!((scale - 0.8).abs() < 0.02, "scale {scale}");
}

#[test]
fn a_template_offset_is_drift_and_honest_reuse_counted_by_the_engine_is_not_phantom() {
    // The engine's template adds a 21-token default system prompt the configured one lacks.
    let mut h = Harness::new(true);
    let mut messages = Vec::new();
    let mut previous = 0;
    for i in 0..6 {
        messages.push(user(&format!("Question {i}: {}", "what else should I know about the deep ocean? ".repeat(i + 1))));
        let engine = h.local(&messages) + 21;
        // The engine reuses everything the previous turn left (its prompt and its 8 generated tokens).
        h.send(&messages, answer("It is deep.", engine, previous));
        previous = engine + 8;
        messages.push(assistant("It is deep."));
    }
    let found = h.findings();
    assert_eq!(h.kinds(), vec![FindingKind::TokenCountDrift], "{found:#?}");
    let offset = found[0].evidence["offset"].as_f64().unwrap();
    assert!((offset - 21.0).abs() < 0.5, "offset {offset}");
}
