//! `ctxscope replay --probes auto` end to end on the default model: a conversation captured through
//! `ctxscope serve` in which the user states three facts (a dog's name, a locker number, a door code)
//! and the assistant acknowledges each; replay proposes one recall probe per fact, golden answers all
//! three, and a context fault that cuts the first turns (`ctx_shift`) fails at least one.

mod support;

use ctxscope_replay::{Outcome, ReplayReport};
use serde_json::json;
use support::*;

const FACTS: [(&str, &str); 3] =
    [("My dog is called Biscuit.", "Biscuit"), ("My locker number is 4821.", "4821"), ("My door code is QX-731.", "QX-731")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_probes_recall_stated_facts_on_golden_and_fail_under_a_context_fault() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = Serve::start(&model, &data, &[]).await;
    let mut messages = Vec::new();
    for (i, (fact, value)) in FACTS.iter().enumerate() {
        messages.push(json!({"role": "user", "content": fact}));
        let request = json!({"model": "m", "messages": messages, "temperature": 0, "max_tokens": 32});
        let raw = post_json(&format!("{}/v1/chat/completions", serve.proxy_url), &[], &request).await;
        assert_eq!(raw.status, 200, "turn {i}: {}", String::from_utf8_lossy(&raw.body));
        // The harness keeps its own acknowledgement as the assistant's turn.
        let subject = fact.trim_start_matches("My ").split(" is ").next().unwrap();
        messages.push(json!({"role": "assistant", "content": format!("Noted: your {subject} is {value}.")}));
    }
    let list = serve.wait_turns(FACTS.len() as u64).await;
    let id = list[0]["id"].as_u64().expect("a conversation id").to_string();
    serve.stop();

    let fault = "engine:patches=ctx_shift=48";
    let (data, model) = (data.to_str().unwrap(), model.to_str().unwrap());
    let args = ["replay", &id, "--data", data, "--model", model, "--probes", "auto", "--target", fault, "--max-tokens", "24", "--json"];
    let report: ReplayReport = serde_json::from_value(cli_json(&args)).expect("a replay report");
    let probes_of =
        |target: &str| report.results.iter().filter(|r| r.target == target).flat_map(|r| r.probes.iter()).cloned().collect::<Vec<_>>();
    let golden = probes_of("golden");
    let expected: Vec<&str> = golden.iter().map(|p| p.probe.expected.as_str()).collect();
    assert_eq!(expected, FACTS.map(|(_, v)| v), "one probe per stated fact: {golden:?}");
    for probe in &golden {
        let answer = match &probe.outcome {
            Outcome::Ok(reply) => reply.text.clone(),
            Outcome::Failed { error, .. } => panic!("golden probe failed to run: {error}"),
        };
        assert!(probe.passed, "golden did not recall {:?}: {answer:?}", probe.probe.expected);
    }
    let faulty = probes_of("engine:ctx_shift=48");
    assert_eq!(faulty.len(), 3, "the fault target ran every probe: {faulty:?}");
    assert!(faulty.iter().any(|p| !p.passed), "ctx_shift=48 recalled every fact: {faulty:?}");
}
