//! The speculative next decode step (the CUDA backend launches a greedy decode pass's graph again
//! before the host has read its picks) answers exactly what the backend answers with it turned off:
//! the same tokens with the same log-probability bits, batch 1 and 2, on both paths, also when the
//! caller feeds a token other than the pick (the speculative step then runs unused); and each greedy
//! pick is the argmax of the logits that plain logits passes give for the same inputs. Needs
//! `--features cuda` and a GPU; without a GPU it says so and checks nothing.
#![cfg(feature = "cuda")]

use ctxscope_engine::backend::{Backend, Output, Step, Want};
use ctxscope_engine::device::DeviceBackend;
use ctxscope_engine::{PatchSet, Path};

mod common;
use common::device::{device_run, gpu_backend};

/// One sequence's greedy picks: (token, log-probability bits) per step, the prefill's first.
type Picks = Vec<(u32, u32)>;

fn picked(out: Output) -> (u32, u32) {
    match out {
        Output::Token { token, logprob } => (token, logprob.to_bits()),
        other => panic!("asked for a greedy token, got {other:?}"),
    }
}

/// Each prompt prefilled alone, then `steps` greedy decode steps of all of them together, each fed
/// its last pick — except at step `divert.0`, where the first sequence is fed `divert.1` instead.
fn greedy_decode(backend: &mut DeviceBackend, path: Path, prompts: &[Vec<u32>], steps: usize, divert: Option<(usize, u32)>) -> Vec<Picks> {
    let patches = PatchSet::default();
    let mut kvs = Vec::new();
    let mut picks: Vec<Picks> = Vec::new();
    for prompt in prompts {
        let mut kv = backend.new_kv().expect("kv");
        let out = backend.forward(path, &patches, &mut [Step { tokens: prompt, kv: &mut kv, want: Want::Greedy }]).expect("prefill");
        picks.push(vec![picked(out.into_iter().next().expect("one output"))]);
        kvs.push(kv);
    }
    for step in 0..steps {
        let mut fed: Vec<[u32; 1]> = picks.iter().map(|p| [p.last().expect("a pick").0]).collect();
        if let Some((_, token)) = divert.filter(|d| d.0 == step) {
            fed[0] = [token];
        }
        let mut batch: Vec<Step<'_, _>> =
            fed.iter().zip(kvs.iter_mut()).map(|(t, kv)| Step { tokens: t, kv, want: Want::Greedy }).collect();
        let outs = backend.forward(path, &patches, &mut batch).unwrap_or_else(|e| panic!("decode step {step}: {e}"));
        assert_eq!(outs.len(), prompts.len());
        for (p, out) in picks.iter_mut().zip(outs) {
            p.push(picked(out));
        }
    }
    picks
}

#[test]
fn speculative_decode_answers_what_plain_decode_answers() {
    let Some((model, mut backend)) = gpu_backend("device_speculate", 256) else { return };
    let vocab = model.config.vocab as u32;
    let prompt = |seed: u32, len: u32| -> Vec<u32> { (0..len).map(|i| (i * 7919 + seed) % vocab).collect() };
    let prompts = [prompt(13, 40), prompt(101, 23)];
    let steps = 24;
    let mut failures = Vec::new();
    for path in [Path::Fast, Path::Golden] {
        for rows in [1, 2] {
            for divert in [None, Some((9, 5 % vocab))] {
                backend.set_speculate(false);
                let plain = greedy_decode(&mut backend, path, &prompts[..rows], steps, divert);
                backend.set_speculate(true);
                let speculated = greedy_decode(&mut backend, path, &prompts[..rows], steps, divert);
                // And again straight after, so a speculative step left over from the last call is met.
                let again = greedy_decode(&mut backend, path, &prompts[..rows], steps, divert);
                let case = format!("{} rows {rows} divert {divert:?}", path.as_str());
                let distinct = plain[0].iter().map(|p| p.0).collect::<std::collections::BTreeSet<_>>().len();
                eprintln!("{case}: {distinct} distinct tokens in {} picks of sequence 0", plain[0].len());
                if speculated != plain {
                    failures.push(format!("{case}: speculated {speculated:?}\n  plain {plain:?}"));
                }
                if again != plain {
                    failures.push(format!("{case} (second run): {again:?}\n  plain {plain:?}"));
                }
            }
        }
        // The greedy picks are the argmax of plain logits passes over the same inputs.
        backend.set_speculate(true);
        let picks = greedy_decode(&mut backend, path, &prompts[..1], steps, None).remove(0);
        let fed: Vec<u32> = picks[..picks.len() - 1].iter().map(|p| p.0).collect();
        let rows = device_run(&mut backend, path, &PatchSet::default(), &prompts[0], &fed);
        for (i, (row, pick)) in rows.iter().zip(&picks).enumerate() {
            let best = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, _)| k as u32).expect("a row");
            if best != pick.0 {
                failures.push(format!("{} step {i}: greedy pick {} but the logits' argmax is {best}", path.as_str(), pick.0));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
