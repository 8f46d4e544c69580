//! Mutation fuzzing on stable Rust: every parser that reads bytes from outside, fed valid seeds
//! mutated at random (bit flips, byte runs, cuts, splices, huge numbers, stray quotes and braces),
//! must answer with a value or a typed error and never panic. Targets: the SSE and NDJSON readers and
//! every response parser, every request parser, import of an export file, the GGUF reader and the
//! tokenizer built from it, the safetensors reader, tokenizer.json loading. Deterministic from
//! `CTXSCOPE_FUZZ_SEED` (default 1); `CTXSCOPE_FUZZ_ITERS` multiplies each target's iterations (a long
//! run: BENCHMARKS.md, "Fuzzing"). An input that panics is written to target/fuzz-crash-<target>.bin.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use ctxscope_formats::{Gguf, SafeTensors, Tokenizer};
use ctxscope_proxy::parse;
use ctxscope_store::{message_hash, store_test_turn, to_hex, BaseRef, ConversationRecord, Endpoint, Store, StoreOptions};
use serde_json::json;

const ENDPOINTS: [Endpoint; 6] = [
    Endpoint::ChatCompletions,
    Endpoint::Completions,
    Endpoint::AnthropicMessages,
    Endpoint::OllamaChat,
    Endpoint::Responses,
    Endpoint::ChatCompletions,
];

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const TOKENS: [&[u8]; 12] =
    [b"\"", b"{", b"}", b"[", b"]", b"\\", b"\n\n", b"data: ", b"99999999999999999999", b"-1", b"\xff\xfe", b"\"\":null,"];

/// One to four random edits of `seed` (another seed may be spliced in).
fn mutate(rng: &mut Rng, seed: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(8) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            3 => {
                let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            4 => out.truncate(at),
            5 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            6 if !others.is_empty() => {
                let other = &others[rng.below(others.len())];
                let from = rng.below(other.len());
                let piece = &other[from..(from + rng.below(64)).min(other.len())];
                out.splice(at..at, piece.iter().copied());
            }
            _ => {
                let end = (at + rng.below(32)).min(out.len());
                let piece = out[at..end].to_vec();
                out.splice(at..at, piece);
            }
        }
    }
    out
}

fn iterations(base: usize) -> usize {
    let scale: usize = std::env::var("CTXSCOPE_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    base * scale.max(1)
}

fn rng() -> Rng {
    let seed: u64 = std::env::var("CTXSCOPE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

/// Runs `target` on `iters` mutations of the seeds; a panic saves its input and fails the test.
fn fuzz(name: &str, seeds: &[Vec<u8>], iters: usize, mut target: impl FnMut(&[u8])) {
    let mut rng = rng();
    for seed in seeds {
        target(seed);
    }
    for i in 0..iters {
        let seed = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, seed, seeds);
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("fuzz-crash-{name}.bin"));
            let _ = std::fs::write(&path, &input);
            panic!("{name}: iteration {i} panicked; input saved to {}", path.display());
        }
    }
    eprintln!("{name}: {iters} mutated inputs, no panic");
}

fn bytes(value: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap()
}

#[test]
fn response_parsers_and_sse_never_panic() {
    let openai_stream = b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n".to_vec();
    let anthropic_stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":2}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n".to_vec();
    let responses_stream = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"output_index\":0,\"delta\":\"Hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":9,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n".to_vec();
    let ollama = b"{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"prompt_eval_count\":9,\"eval_count\":1}\n".to_vec();
    let chat = bytes(
        json!({"choices": [{"message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}),
    );
    let error = bytes(json!({"error": {"message": "maximum context length is 512 tokens", "code": "context_length_exceeded"}}));
    let seeds = vec![openai_stream, anthropic_stream, responses_stream, ollama, chat, error];
    fuzz("responses", &seeds, iterations(4000), |body| {
        let _ = parse::sse::events(body);
        let _ = parse::sse::ndjson(body);
        for endpoint in ENDPOINTS {
            for (content_type, streaming) in
                [(Some("text/event-stream"), true), (Some("application/json"), false), (Some("application/x-ndjson"), true), (None, false)]
            {
                let _ = parse::response(endpoint, content_type, 200, body, streaming);
            }
            let _ = parse::response(endpoint, Some("application/json"), 400, body, false);
        }
    });
}

#[test]
fn request_parsers_never_panic() {
    let seeds = vec![
        bytes(
            json!({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "ok"}], "tools": [{"type": "function", "function": {"name": "f"}}], "stream": true, "max_tokens": 8}),
        ),
        bytes(json!({"model": "m", "prompt": "once upon", "max_tokens": 8})),
        bytes(
            json!({"model": "m", "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}], "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}], "max_tokens": 8}),
        ),
        bytes(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}], "stream": false, "options": {"num_ctx": 2048}}),
        ),
        bytes(
            json!({"model": "m", "instructions": "be brief", "previous_response_id": "resp_1", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "ok"}, {"type": "reasoning", "id": "r", "summary": []}], "truncation": "auto", "store": true}),
        ),
    ];
    fuzz("requests", &seeds, iterations(4000), |body| {
        for endpoint in ENDPOINTS {
            let _ = parse::request(endpoint, body);
        }
    });
}

/// A request that extends a remembered one is parsed from the bytes it adds (capture::known): for any
/// mutation of such a request, that parse must equal the whole parse (or fail as it does), and the
/// hashes it reuses must be those of the messages it returns.
#[test]
fn reusing_a_known_request_parses_like_the_whole_request() {
    use ctxscope_proxy::capture::known::KnownRequests;
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "hi \"there\" ]}"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\":[1]}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "user", "content": "and then?"}
    ]);
    let all = messages.as_array().unwrap();
    let request = |n: usize| {
        bytes(json!({"model": "m", "messages": all[..n], "stream": true, "tools": [{"type": "function", "function": {"name": "f"}}]}))
    };
    let seeds = vec![request(5), request(4)];
    let mut known = KnownRequests::default();
    for prime in [request(2), request(3)] {
        let body = bytes::Bytes::from(prime);
        let parsed = known.parse(Endpoint::ChatCompletions, &body).unwrap();
        let hashes: Vec<_> = parsed.request.messages.iter().map(|m| message_hash(m).0).collect();
        let mut chain = Vec::new();
        ctxscope_store::extend_chain(&mut chain, &hashes);
        known.remember(&body, &parsed, &hashes, &chain);
    }
    let mut reused = 0;
    fuzz("known_requests", &seeds, iterations(4000), |body| {
        let whole = parse::request(Endpoint::ChatCompletions, body);
        let fast = known.parse(Endpoint::ChatCompletions, &bytes::Bytes::copy_from_slice(body));
        match (&whole, &fast) {
            (Ok(whole), Ok(fast)) => {
                assert_eq!(&fast.request, whole, "{}", String::from_utf8_lossy(body));
                let expected: Vec<_> = whole.messages.iter().take(fast.hashes.len()).map(|m| message_hash(m).0).collect();
                assert_eq!(fast.hashes, expected, "{}", String::from_utf8_lossy(body));
                reused += usize::from(!fast.hashes.is_empty());
            }
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("whole {:?} against reused {:?} on {}", whole.is_ok(), fast.is_ok(), String::from_utf8_lossy(body)),
        }
    });
    // Most mutations break the JSON; 94 of the 4,000 of the default seed keep a known prefix and parse.
    assert!(reused >= 50, "only {reused} mutations took the reuse path");
}

#[test]
fn import_of_an_export_file_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let source = Store::open(&dir.path().join("source"), &StoreOptions::default()).unwrap();
    let message = |role: &str, text: &str| {
        let (hash, bytes) = message_hash(&json!({"role": role, "content": text}));
        source.put_message(&hash, &bytes).unwrap();
        to_hex(&hash)
    };
    let (u1, r1, u2) = (message("user", "one"), message("assistant", "uno"), message("user", "two"));
    let hash = |hex: &str| ctxscope_store::from_hex(hex).unwrap();
    let mut t1 = store_test_turn(1, 5, vec![hash(&u1)]);
    t1.reply = Some(r1);
    let mut t2 = store_test_turn(2, 5, vec![hash(&u2)]);
    t2.base = Some(BaseRef { turn: 1, len: 2 });
    t2.index = 1;
    source.put_turn(&t1).unwrap();
    source.put_turn(&t2).unwrap();
    let conversation = ConversationRecord {
        id: 5,
        name: Some("n".into()),
        created_unix_ms: 1,
        updated_unix_ms: 2,
        upstream: "u".into(),
        model: Some("m".into()),
        turns: 2,
        last_turn: 2,
        last_head: String::new(),
        last_message_count: 3,
        last_tail: None,
        branch_of: None,
        last_reply: None,
        capture: Default::default(),
    };
    source.put_conversation(&conversation).unwrap();
    let mut export = Vec::new();
    source.export_conversation(5, &mut export).unwrap();
    let target = Store::open(&dir.path().join("target"), &StoreOptions::default()).unwrap();
    fuzz("import", &[export], iterations(600), |file| {
        let _ = target.import_conversation(&mut Cursor::new(file));
    });
    // The store took every accepted import whole: each conversation it lists reads back.
    for c in target.conversations().unwrap() {
        target.conversation_detail(c.id).unwrap_or_else(|e| panic!("imported conversation {} unreadable: {e}", c.id));
    }
}

/// A GGUF file with a small byte-level vocabulary and one f32 tensor.
fn tiny_gguf() -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    let tokens = ["<s>", "</s>", "a", "b", "ab", "\u{120}a"];
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes()); // tensors
    out.extend_from_slice(&5u64.to_le_bytes()); // key-value pairs
    string(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes());
    string(&mut out, "llama");
    string(&mut out, "tokenizer.ggml.model");
    out.extend_from_slice(&8u32.to_le_bytes());
    string(&mut out, "gpt2");
    string(&mut out, "tokenizer.ggml.tokens");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        string(&mut out, t);
    }
    string(&mut out, "tokenizer.ggml.token_type");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&5u32.to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    for kind in [3i32, 3, 1, 1, 1, 1] {
        out.extend_from_slice(&kind.to_le_bytes());
    }
    string(&mut out, "tokenizer.ggml.merges");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    string(&mut out, "a b");
    string(&mut out, "w");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&4u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // f32
    out.extend_from_slice(&0u64.to_le_bytes());
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend_from_slice(&[0u8; 16]);
    out
}

#[test]
fn gguf_reader_and_its_tokenizer_never_panic() {
    let seed = tiny_gguf();
    let parsed = Gguf::read_from(Cursor::new(&seed), seed.len() as u64).expect("the seed is a valid GGUF");
    assert!(Tokenizer::from_gguf(&parsed).is_ok(), "the seed's vocabulary builds a tokenizer");
    fuzz("gguf", &[seed], iterations(3000), |file| {
        if let Ok(gguf) = Gguf::read_from(Cursor::new(file), file.len() as u64) {
            if let Ok(tokenizer) = Tokenizer::from_gguf(&gguf) {
                let _ = tokenizer.encode("ab a<s>", true);
            }
        }
    });
}

#[test]
fn safetensors_and_tokenizer_json_readers_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#;
    let mut tensors = (header.len() as u64).to_le_bytes().to_vec();
    tensors.extend_from_slice(header);
    tensors.extend_from_slice(&[0u8; 8]);
    let path = dir.path().join("model.safetensors");
    fuzz("safetensors", &[tensors], iterations(300), |file| {
        std::fs::write(&path, file).unwrap();
        let mut checkpoint = SafeTensors::default();
        if checkpoint.add_file(&path).is_ok() {
            let _ = checkpoint.f32("w");
        }
    });
    let tokenizer = bytes(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3}, "merges": [["a", "b"]]}
    }));
    let path = dir.path().join("tokenizer.json");
    fuzz("tokenizer_json", &[tokenizer], iterations(300), |file| {
        std::fs::write(&path, file).unwrap();
        if let Ok(tokenizer) = Tokenizer::from_tokenizer_json(&path, None) {
            let _ = tokenizer.encode("ab ba <s>", true);
        }
    });
}

#[test]
#[should_panic(expected = "selftest: iteration")]
fn the_harness_fails_on_a_panicking_input() {
    let seed = b"0123456789".to_vec();
    fuzz("selftest", std::slice::from_ref(&seed), 200, |input| assert_eq!(input.len(), seed.len(), "a mutation changed the length"));
}
