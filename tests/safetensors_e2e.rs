//! Hugging Face checkpoints on the CPU backend: the real default model exported from its GGUF file as a
//! Hugging Face directory (config.json, F32 safetensors with Q and K in rotate-half order, the same
//! tokenizer and chat template), loaded back through the safetensors path, computes the same golden
//! logits bit for bit, and `ctxscope engine --model DIR` serves it with the same replies as the GGUF.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use ctxscope_engine::forward::{forward, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::model::hf::permute_rows;
use ctxscope_engine::{Model, Path as ComputePath};
use ctxscope_formats::RenderOptions;
use serde_json::{json, Value};
use support::*;

/// Writes `model` as a Hugging Face Llama checkpoint in `dir` (what llama.cpp's converter reads back).
fn export_hf(model: &Model, gguf: &Path, dir: &Path) {
    let c = &model.config;
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.dim,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.ffn_dim, "vocab_size": c.vocab, "max_position_embeddings": c.ctx_len,
        "rope_theta": c.rope_base, "rms_norm_eps": c.rms_eps, "tie_word_embeddings": model.weights.output.is_none(),
        "hidden_act": "silu", "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, data: Vec<f32>| {
        tensors.insert(name, (shape, data));
    };
    let w = &model.weights;
    put("model.embed_tokens.weight".into(), vec![c.vocab, c.dim], w.token_embd.f32.clone());
    put("model.norm.weight".into(), vec![c.dim], w.output_norm.clone());
    if let Some(out) = &w.output {
        put("lm_head.weight".into(), vec![out.rows, out.cols], out.f32.clone());
    }
    for (i, l) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("model.layers.{i}.{s}.weight");
        let m = |x: &ctxscope_engine::model::Matrix| (vec![x.rows, x.cols], x.f32.clone());
        let rotate_half = |x: &ctxscope_engine::model::Matrix, heads: usize| permute_rows(&x.f32, x.rows, x.cols, heads, true);
        put(n("input_layernorm"), vec![c.dim], l.attn_norm.clone());
        put(n("post_attention_layernorm"), vec![c.dim], l.ffn_norm.clone());
        put(n("self_attn.q_proj"), vec![l.wq.rows, l.wq.cols], rotate_half(&l.wq, c.n_heads));
        put(n("self_attn.k_proj"), vec![l.wk.rows, l.wk.cols], rotate_half(&l.wk, c.n_kv_heads));
        for (name, x) in [
            ("self_attn.v_proj", &l.wv),
            ("self_attn.o_proj", &l.wo),
            ("mlp.gate_proj", &l.w_gate),
            ("mlp.up_proj", &l.w_up),
            ("mlp.down_proj", &l.w_down),
        ] {
            let (shape, data) = m(x);
            put(n(name), shape, data);
        }
    }
    ctxscope_formats::safetensors::write_f32(&dir.join("model.safetensors"), &tensors).unwrap();
    write_bare_tokenizer_json(gguf, &dir.join("tokenizer.json"));
    let tokenizer_config = json!({"chat_template": model.template.template().expect("a Jinja template").source(), "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"});
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_vec(&tokenizer_config).unwrap()).unwrap();
}

/// Golden logits of a chat prompt's last position and two greedy steps.
fn logits(model: &Model, path: ComputePath) -> (Vec<u32>, Vec<Vec<f32>>) {
    let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
    let messages = [json!({"role": "user", "content": "The secret word is banana. What fruit is yellow and curved?"})];
    let text = model.template.render(&messages, &opts).unwrap();
    let prompt = model.tokenizer.encode(&text, true);
    let mut input = prompt.clone();
    let mut kv = KvCache::new(model.config.n_layers, model.config.kv_dim());
    let mut all = Vec::new();
    for _ in 0..3 {
        let row = forward(model, path, &mut [Segment { tokens: &input, kv: &mut kv }]).remove(0);
        let next = row.iter().enumerate().fold(0, |b, (i, v)| if *v > row[b] { i } else { b }) as u32;
        all.push(row);
        input = vec![next];
    }
    (prompt, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hugging_face_export_of_the_model_computes_the_same_logits_and_replies() {
    let gguf_path = ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"));
    let gguf = Model::load(&gguf_path).expect("GGUF loads");
    let dir = tempfile::tempdir().unwrap();
    let hf_dir = dir.path().join("SmolLM2-135M-Instruct-hf");
    std::fs::create_dir(&hf_dir).unwrap();
    export_hf(&gguf, &gguf_path, &hf_dir);

    let hf = Model::load(&hf_dir).expect("the Hugging Face checkpoint loads");
    let mut expected = gguf.config.clone();
    expected.architecture = "llama".into();
    assert_eq!(hf.config, expected);
    assert_eq!(hf.weights.layers[0].wq.f32, gguf.weights.layers[0].wq.f32, "Q permuted back to adjacent pairs");
    assert_eq!(hf.weights.layers[3].wk.f32, gguf.weights.layers[3].wk.f32, "K permuted back to adjacent pairs");
    assert_eq!(hf.stop_tokens, gguf.stop_tokens);
    let (prompt_gguf, golden_gguf) = logits(&gguf, ComputePath::Golden);
    let (prompt_hf, golden_hf) = logits(&hf, ComputePath::Golden);
    assert_eq!(prompt_hf, prompt_gguf, "same tokenizer and template");
    assert!(golden_hf == golden_gguf, "golden logits differ between the GGUF and its Hugging Face export");
    // The fast path has no integer kernel for f32 weights: it takes the golden dot, bit for bit.
    let (_, fast_hf) = logits(&hf, ComputePath::Fast);
    assert!(fast_hf == golden_hf);

    // Served: the same greedy reply from `ctxscope engine --model DIR` as from the GGUF.
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12, "temperature": 0});
    let mut replies = Vec::new();
    for model in [gguf_path.as_path(), hf_dir.as_path()] {
        let port = free_port();
        let mut child = std::process::Command::new(bin())
            .args(["engine", "--listen", &format!("127.0.0.1:{port}"), "--model"])
            .arg(model)
            .env("CTXSCOPE_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn ctxscope engine");
        let url = format!("http://127.0.0.1:{port}");
        wait_http_ok(&format!("{url}/health"), std::time::Duration::from_secs(60)).await;
        let raw = post_json(&format!("{url}/v1/chat/completions"), &[], &body).await;
        assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
        let reply: Value = raw.json();
        replies.push(reply["choices"][0]["message"]["content"].as_str().unwrap().to_string());
        terminate(&mut child, "ctxscope engine");
    }
    assert_eq!(replies[0], replies[1]);
    assert!(replies[0].contains("Paris"), "{replies:?}");
}
