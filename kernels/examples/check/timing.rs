//! Event timing of launches, and the informative timings of the small per-layer kernels of one decode
//! step (attention, rope, rmsnorm, argmax, a bare launch).

use ctxscope_kernels::cudarc::driver::{sys, DevicePtr};
use ctxscope_kernels::device::{AttentionShape, Device, RopeShape};

use crate::report::{nan_buf, Report, Res};
use crate::rng::Rng;

/// Median and minimum milliseconds of `runs` event-timed calls of `f` after 5 warm-ups.
pub(crate) fn time_ms(dev: &Device, runs: usize, mut f: impl FnMut() -> Res) -> Res<(f64, f64)> {
    let s = &dev.stream;
    for _ in 0..5 {
        f()?;
    }
    let mut events = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let end = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    s.synchronize()?;
    let mut ms = events.iter().map(|(a, b)| a.elapsed_ms(b)).collect::<Result<Vec<f32>, _>>()?;
    ms.sort_by(f32::total_cmp);
    Ok((f64::from(ms[runs / 2]), f64::from(ms[0])))
}

/// Times the small per-layer kernels of one decode step (informative: where a decode step's time
/// goes besides the weight GEMVs) in the 1B shape (32/8 heads of 64, 16 layers) at 600 positions, and
/// decode attention in clusters against split-K at 600 and 2,400.
pub(crate) fn time_small(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (heads, kv_heads, hd, layers, len, dim) = (32usize, 8usize, 64usize, 16usize, 600usize, 2048usize);
    let kv_dim = kv_heads * hd;
    let per_pos = layers * 2 * kv_dim;
    // Room for the longest context timed below.
    let cache = s.clone_htod(&rng.vec(4 * len * per_pos, 1.0))?;
    let base = cache.device_ptr(s).0;
    let bases = s.clone_htod(&[base])?;
    let positions = s.clone_htod(&[(len - 1) as i32])?;
    let q_stride = (heads + 2 * kv_heads) * hd;
    let mut qkv = s.clone_htod(&rng.vec(q_stride, 1.0))?;
    let mut out = nan_buf(s, heads * hd)?;
    let shape = AttentionShape { n_layers: layers, heads, kv_heads, head_dim: hd, window: 0 };
    let mut lines = Vec::new();
    // Split-K at 1, 8 and 32 partials and clusters of 8 and 16 at `len` positions; 32 partials and the
    // clusters at four times that.
    for (len, split_counts) in [(len, &[1usize, 8, 32][..]), (4 * len, &[32][..])] {
        let positions = s.clone_htod(&[(len - 1) as i32])?;
        for &splits in split_counts {
            let mut po = nan_buf(s, heads * splits * hd)?;
            let mut pml = nan_buf(s, heads * splits * 2)?;
            let (med, min) = time_ms(dev, 50, || {
                Ok(dev.attn_decode(
                    &qkv.as_view(),
                    &positions.as_view(),
                    &bases.as_view(),
                    3,
                    (&mut po.as_view_mut(), &mut pml.as_view_mut()),
                    &mut out.as_view_mut(),
                    1,
                    splits,
                    0,
                    &shape,
                )?)
            })?;
            lines.push(format!("attn_decode 1 row, {len} positions, {splits} splits: {:.1} us (min {:.1})", med * 1e3, min * 1e3));
        }
        for cluster in [8usize, 16].into_iter().filter(|&c| c <= dev.max_cluster) {
            let (med, min) = time_ms(dev, 50, || {
                Ok(dev.attn_decode_cluster(
                    &qkv.as_view(),
                    &positions.as_view(),
                    &bases.as_view(),
                    3,
                    &mut out.as_view_mut(),
                    1,
                    cluster,
                    &shape,
                )?)
            })?;
            lines.push(format!(
                "attn_decode_cluster 1 row, {len} positions, clusters of {cluster}: {:.1} us (min {:.1})",
                med * 1e3,
                min * 1e3
            ));
        }
    }
    let rope = RopeShape { n_layers: layers, heads, kv_heads, head_dim: hd, base: 500000.0, flags: 0, kv_scale: 1.0 };
    let (med, _) = time_ms(dev, 50, || Ok(dev.rope_kv(&mut qkv.as_view_mut(), &positions.as_view(), &bases.as_view(), 1, 3, &rope)?))?;
    lines.push(format!("rope_kv 1 row: {:.1} us", med * 1e3));
    let x = s.clone_htod(&rng.vec(dim, 1.0))?;
    let w = s.clone_htod(&rng.vec(dim, 1.0))?;
    let mut y = nan_buf(s, dim)?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.rmsnorm(&x.as_view(), None, &w.as_view(), &mut y.as_view_mut(), 1, dim, 1e-5, false)?))?;
    lines.push(format!("rmsnorm 1 row of {dim}: {:.1} us", med * 1e3));
    let vocab = 128_256usize;
    let logits = s.clone_htod(&rng.vec(vocab, 4.0))?;
    let mut tok = s.clone_htod(&[0i32])?;
    let mut lp = nan_buf(s, 1)?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.argmax(&logits.as_view(), 1, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut())?))?;
    lines.push(format!("argmax 1 row of {vocab}: {:.1} us", med * 1e3));
    let mut one = s.clone_htod(&[1.0f32])?;
    let other = s.clone_htod(&[1.0f32])?;
    let (med, _) = time_ms(dev, 50, || Ok(dev.add(&mut one.as_view_mut(), &other.as_view(), 1)?))?;
    lines.push(format!("add_f32 of 1 value (a launch): {:.1} us", med * 1e3));
    for line in lines {
        rep.info.push(line);
    }
    Ok(())
}
