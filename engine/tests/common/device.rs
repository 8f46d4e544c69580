//! Device test helpers (`--features cuda`): whether a GPU is here, and a prefill + decode run on the
//! CUDA backend that returns every step's logits.

use std::sync::Arc;

use ctxscope_engine::backend::{Backend, Output, Step, Want};
use ctxscope_engine::device::DeviceBackend;
use ctxscope_engine::scheduler::EngineOptions;
use ctxscope_engine::{Model, PatchSet, Path};
use ctxscope_kernels::cudarc::driver::CudaContext;

pub fn gpu_present() -> bool {
    // SAFETY: only probes whether libcuda can be opened.
    let driver = unsafe { ctxscope_kernels::cudarc::driver::sys::is_culib_present() };
    driver && CudaContext::device_count().is_ok_and(|n| n > 0)
}

/// The test model (`CTXSCOPE_MODEL`) and the CUDA backend over it with caches of `ctx` positions;
/// `None`, saying that `test` checks nothing, when this machine has no GPU.
pub fn gpu_backend(test: &str, ctx: usize) -> Option<(Arc<Model>, DeviceBackend)> {
    if !gpu_present() {
        eprintln!("no CUDA device here: {test} checks nothing");
        return None;
    }
    let model = Arc::new(Model::load(&ctxscope_formats::test_model_path().unwrap_or_else(|e| panic!("{e}"))).expect("model loads"));
    let options = EngineOptions { ctx, device: ctxscope_engine::tuning::DeviceTuning::from_env(), ..EngineOptions::for_model(&model) };
    let backend = DeviceBackend::new(model.clone(), 0, &options).expect("a GPU is present, so the backend must start");
    Some((model, backend))
}

/// Prefill of `prompt`, then one decode step per token of `feed`; the logits of every step.
pub fn device_run(backend: &mut DeviceBackend, path: Path, patches: &PatchSet, prompt: &[u32], feed: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = backend.new_kv().expect("kv");
    let mut inputs = vec![prompt.to_vec()];
    inputs.extend(feed.iter().map(|t| vec![*t]));
    inputs
        .iter()
        .enumerate()
        .map(|(i, tokens)| {
            match backend
                .forward(path, patches, &mut [Step { tokens, kv: &mut kv, want: Want::Logits }])
                .unwrap_or_else(|e| panic!("device forward of input {i} ({} tokens): {e}", tokens.len()))
                .remove(0)
            {
                Output::Logits(l) => l,
                other => panic!("asked for logits, got {other:?}"),
            }
        })
        .collect()
}
