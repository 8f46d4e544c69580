//! The persistent decode step (`Device::decode_step`, one launch per batch-1 decode step) computes
//! what the kernel-per-op pass computes, bit for bit: the same products in the same order, the same
//! norms, attention in the same spans merged in the same order. Checked on both paths over a short
//! prompt and one long enough that each attention span takes several tiles, against the same backend with
//! the step turned off. Needs `--features cuda` and a GPU; without a GPU it says so and checks nothing.
#![cfg(feature = "cuda")]

use ctxscope_engine::{PatchSet, Path};

mod common;
use common::device::{device_run, gpu_backend};

#[test]
fn persistent_step_matches_the_kernel_per_op_pass_bit_for_bit() {
    let Some((model, mut backend)) = gpu_backend("device_step", 2400) else { return };
    let vocab = model.config.vocab as u32;
    let mut failures = Vec::new();
    // 16 spans of 2,100+ positions: 132 per span, five tiles of 32.
    for len in [40u32, 2100] {
        let prompt: Vec<u32> = (0..len).map(|i| (i * 7919 + 13) % vocab).collect();
        let feed: Vec<u32> = (0..6u32).map(|i| (i * 104_729 + 11) % vocab).collect();
        for path in [Path::Fast, Path::Golden] {
            backend.set_persistent(false);
            assert!(!backend.takes_step(path));
            let per_op = device_run(&mut backend, path, &PatchSet::default(), &prompt, &feed);
            backend.set_persistent(true);
            assert!(backend.takes_step(path), "the step kernel does not take this model on {}", path.as_str());
            let step = device_run(&mut backend, path, &PatchSet::default(), &prompt, &feed);
            // Row 0 is the prefill (never the step); rows 1.. are one-row decode passes.
            for (i, (a, b)) in per_op.iter().zip(&step).enumerate().skip(1) {
                let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                eprintln!("{} prompt {len} step {i}: {differ} of {} logits differ (largest {worst:.3e})", path.as_str(), a.len());
                if differ > 0 {
                    failures.push(format!("{} prompt {len} step {i}: {differ} logits differ, largest by {worst:.3e}", path.as_str()));
                }
            }
            assert_eq!(per_op[0], step[0], "the prefill rows must not change");
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
