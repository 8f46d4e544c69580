//! The CUDA forward pass against the CPU golden path on the same model file (a GGUF or a Hugging Face
//! directory): a chat prompt's prefill and 8 greedy decode steps fed the CPU's tokens, max |Δlogit| and
//! argmax agreement per step, with the GEMMs in cuBLAS 32F and then 32F_FAST_16BF. Build with
//! `--features cuda`; run where a GPU is: `device_check MODEL`.

use ctxscope_engine::device::DeviceModel;
use ctxscope_engine::forward::{forward, Segment};
use ctxscope_engine::kv::KvCache;
use ctxscope_engine::{Model, Path};
use ctxscope_formats::RenderOptions;
use ctxscope_kernels::blas::Compute;

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |b, (i, x)| if *x > v[b] { i } else { b })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: device_check MODEL (GGUF file or Hugging Face directory)")?;
    let model = Model::load(std::path::Path::new(&path))?;
    let opts = RenderOptions { add_generation_prompt: true, bos_token: "", eos_token: "", tools: None };
    let messages = [serde_json::json!({"role": "user", "content": "The secret word is banana. What fruit is yellow and curved?"})];
    let prompt = model.tokenizer.encode(&model.template.render(&messages, &opts)?, true);
    // CPU golden: prefill, then 8 greedy steps.
    let mut kv = KvCache::new(model.config.n_layers, model.config.kv_dim());
    let (mut cpu, mut fed) = (Vec::new(), vec![prompt.clone()]);
    let mut input = prompt.clone();
    let started = std::time::Instant::now();
    for _ in 0..9 {
        let logits = forward(&model, Path::Golden, &mut [Segment { tokens: &input, kv: &mut kv }]).remove(0);
        input = vec![argmax(&logits) as u32];
        fed.push(input.clone());
        cpu.push(logits);
    }
    let cpu_s = started.elapsed().as_secs_f64();
    println!("model {} ({} layers, width {}), prompt {} tokens; CPU golden {:.2} s", model.id, model.config.n_layers, model.config.dim, prompt.len(), cpu_s);
    let max_logit = cpu.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    println!("| compute | step | max abs Δlogit | relative | argmax agrees |");
    println!("|---|---|---|---|---|");
    let mut worst_f32 = 0f32;
    for compute in [Compute::F32, Compute::F32Fast16Bf] {
        let device = DeviceModel::upload(&model, 0, compute)?;
        let mut dkv = device.new_kv(prompt.len() + 16)?;
        let mut agree = 0;
        for (step, want) in cpu.iter().enumerate() {
            let got = device.forward(&fed[step], &mut dkv)?;
            let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let same = argmax(&got) == argmax(want);
            agree += usize::from(same);
            if compute == Compute::F32 {
                worst_f32 = worst_f32.max(diff / max_logit);
            }
            if step == 0 || step == 8 {
                println!("| {compute:?} | {} | {diff:.3e} | {:.2e} | {same} |", if step == 0 { "prefill".to_string() } else { format!("decode {step}") }, diff / max_logit);
            }
        }
        println!("| {compute:?} | all 9 | | | {agree}/9 |");
    }
    if worst_f32 > 1e-4 {
        return Err(format!("CUDA 32F differs from the CPU golden path by {worst_f32:.2e} relative").into());
    }
    Ok(())
}
