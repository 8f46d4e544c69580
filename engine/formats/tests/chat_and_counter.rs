//! The SmolLM2 chat template and the token counter on the real GGUF: renders equal Hugging Face's
//! `apply_chat_template` (from the fixture) and the expected ChatML text, segments concatenate to
//! the render, and segment counts plus the generation prompt add up to the prompt count. The same
//! model rebuilt as tokenizer.json + tokenizer_config.json must count identically.

mod common;

use ctxscope_formats::{Gguf, Segments, TokenCounter};
use serde_json::{json, Value};

const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

fn messages(chat: &Value) -> Vec<Value> {
    chat["messages"].as_array().unwrap().clone()
}

#[test]
fn renders_like_apply_chat_template() {
    let counter = TokenCounter::open(common::model_path()).unwrap();
    assert!(!counter.template().is_fallback());
    let fixture = common::fixture();
    for chat in fixture["chats"].as_array().unwrap() {
        let msgs = messages(chat);
        assert_eq!(counter.render(&msgs, false).unwrap(), chat["render"].as_str().unwrap(), "{}", chat["name"]);
        assert_eq!(counter.render(&msgs, true).unwrap(), chat["render_generation_prompt"].as_str().unwrap(), "{}", chat["name"]);
        let ids = counter.tokenizer().encode(&counter.render(&msgs, true).unwrap(), true);
        assert_eq!(ids, common::ids(&chat["ids_generation_prompt"]), "{}", chat["name"]);
    }
}

#[test]
fn smollm2_adds_its_default_system_prompt_only_without_a_system_message() {
    let counter = TokenCounter::open(common::model_path()).unwrap();
    let msgs = [
        json!({"role": "user", "content": "What is the capital of France?"}),
        json!({"role": "assistant", "content": "Paris."}),
        json!({"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]}),
    ];
    let expected = format!(
        "{DEFAULT_SYSTEM}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(counter.render(&msgs, true).unwrap(), expected);

    let with_system = [json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "Hi"})];
    assert_eq!(counter.render(&with_system, false).unwrap(), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

fn check_counts(counter: &TokenCounter, msgs: &[Value]) -> Segments {
    let segments = counter.segments(msgs).unwrap();
    assert_eq!(segments.texts.len(), msgs.len());
    assert_eq!(segments.texts.concat(), counter.render(msgs, false).unwrap());
    let sum: usize = segments.texts.iter().map(|s| counter.count_segment(s)).sum();
    assert_eq!(sum + counter.generation_prompt_tokens() + counter.bos_tokens(), counter.count_prompt(msgs).unwrap());
    segments
}

#[test]
fn segments_add_up_to_the_prompt_count() {
    let counter = TokenCounter::open(common::model_path()).unwrap();
    // "<|im_start|>assistant\n" = <|im_start|>, "ass", "istant", "\n" (llama.cpp: 1, 520, 9531, 198).
    assert_eq!(counter.generation_prompt_tokens(), 4);
    assert_eq!(counter.tokenizer().encode("<|im_start|>assistant\n", true), [1, 520, 9531, 198]);
    assert_eq!(counter.bos_tokens(), 0);
    let msgs = [
        json!({"role": "user", "content": "Write fn add(a: i32, b: i32) -> i32 in Rust.\n\n  Thanks 😀"}),
        json!({"role": "assistant", "content": "```rust\nfn add(a: i32, b: i32) -> i32 { a + b }\n```"}),
        json!({"role": "user", "content": "Now 12345 and 日本語?"}),
    ];
    let segments = check_counts(&counter, &msgs);
    assert!(segments.prefix_consistent);
    assert!(segments.texts[0].starts_with(DEFAULT_SYSTEM), "the default system prompt belongs to message 0");
    assert_eq!(segments.texts[1], "<|im_start|>assistant\n```rust\nfn add(a: i32, b: i32) -> i32 { a + b }\n```<|im_end|>\n");
    // The fixture's reference count for its three-message chat.
    let fixture = common::fixture();
    let chat = &fixture["chats"][0];
    let n = common::ids(&chat["ids_generation_prompt"]).len();
    assert_eq!(counter.count_prompt(&messages(chat)).unwrap(), n);
    check_counts(&counter, &messages(chat));
    assert_eq!(counter.count_text("Hello, world!"), 4);
    assert!(counter.segments(&[]).unwrap().texts.is_empty());
}

/// Writes the GGUF's vocabulary as a Hugging Face tokenizer.json shaped like SmolLM2's upstream one,
/// and its chat template into tokenizer_config.json.
fn write_hf_files(gguf: &Gguf, dir: &std::path::Path) {
    let tokens = gguf.get_str_array("tokenizer.ggml.tokens").unwrap();
    let types = gguf.get_i64_array("tokenizer.ggml.token_type").unwrap();
    let vocab: serde_json::Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == 3)
        .map(|(i, (t, _))| json!({"id": i, "content": t, "special": true, "normalized": false}))
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": gguf.get_str_array("tokenizer.ggml.merges").unwrap()}
    });
    let config = json!({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": false,
        "chat_template": gguf.get_str("tokenizer.chat_template").unwrap()
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

#[test]
fn tokenizer_json_directory_counts_like_the_gguf() {
    let path = common::model_path();
    let gguf = Gguf::open(&path).unwrap();
    let dir = std::env::temp_dir().join(format!("ctxscope-formats-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_hf_files(&gguf, &dir);

    let from_gguf = TokenCounter::open(&path).unwrap();
    let from_dir = TokenCounter::open(&dir).unwrap();
    let from_file = TokenCounter::open(dir.join("tokenizer.json")).unwrap();
    assert!(!from_dir.template().is_fallback());
    let fixture = common::fixture();
    for case in fixture["cases"].as_array().unwrap().iter().chain(fixture["fuzz"].as_array().unwrap()) {
        let text = case["text"].as_str().unwrap();
        let ps = case["parse_special"].as_bool().unwrap();
        assert_eq!(from_dir.tokenizer().encode(text, ps), common::ids(&case["llama_cpp_ids"]), "{text:?}");
    }
    for chat in fixture["chats"].as_array().unwrap() {
        let msgs = messages(chat);
        assert_eq!(from_dir.count_prompt(&msgs).unwrap(), from_gguf.count_prompt(&msgs).unwrap());
        assert_eq!(from_file.segments(&msgs).unwrap(), from_gguf.segments(&msgs).unwrap());
    }
    assert_eq!(from_dir.tokenizer().bos(), Some(1));

    // Without tokenizer_config.json there is no template: the ChatML fallback, flagged.
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    let bare = TokenCounter::open(&dir).unwrap();
    assert!(bare.template().is_fallback());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inconsistent_prefix_renders_fall_back_to_the_last_message() {
    use ctxscope_formats::{ChatTemplate, Tokenizer};
    let gguf = Gguf::open(common::model_path()).unwrap();
    // A template that prints the message count first: no render is a prefix of the next.
    let template = ChatTemplate::new("{{ messages | length }}{% for m in messages %}<{{ m.content }}>{% endfor %}").unwrap();
    let counter = TokenCounter::new(Tokenizer::from_gguf(&gguf).unwrap(), template).unwrap();
    let msgs = [json!({"role": "user", "content": "a"}), json!({"role": "user", "content": "b"}), json!({"role": "user", "content": "c"})];
    let s = counter.segments(&msgs).unwrap();
    assert!(!s.prefix_consistent);
    assert_eq!(s.texts, ["", "", "3<a><b><c>"]);
    assert!(matches!(TokenCounter::open("/nonexistent/model.bin"), Err(ctxscope_formats::CounterError::UnknownSource(_))));
}

#[test]
fn tools_tokens_are_what_the_template_adds_for_them() {
    use ctxscope_formats::{ChatTemplate, Tokenizer};
    let gguf = Gguf::open(common::model_path()).unwrap();
    let tools =
        json!([{"type": "function", "function": {"name": "read_file", "description": "Read one file", "parameters": {"type": "object"}}}]);
    let msgs = [json!({"role": "system", "content": "rules"}), json!({"role": "user", "content": "hi"})];
    // A template that writes the tool definitions as JSON ahead of the messages.
    let source = "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let options = |tools| ctxscope_formats::template::RenderOptions { tools, ..Default::default() };
    let (with, without) = {
        let template = ChatTemplate::new(source).unwrap();
        (template.render(&msgs, &options(Some(&tools))).unwrap(), template.render(&msgs, &options(None)).unwrap())
    };
    let added = with.strip_suffix(without.as_str()).expect("the tools go ahead of the messages");
    assert!(added.starts_with("<tools>[{") && added.contains("read_file"), "{added}");
    let counter = TokenCounter::new(Tokenizer::from_gguf(&gguf).unwrap(), ChatTemplate::new(source).unwrap()).unwrap();
    let alone = counter.tokenizer().encode(added, true).len();
    let n = counter.tools_tokens(&msgs, &tools).unwrap();
    assert!(n > 10 && n.abs_diff(alone) <= 2, "{n} tokens for the tools, {alone} for their text alone");
    // SmolLM2's own template renders no tools: they add nothing to its prompt.
    let smol = TokenCounter::open(common::model_path()).unwrap();
    assert_eq!(smol.tools_tokens(&msgs, &tools).unwrap(), 0);
}
