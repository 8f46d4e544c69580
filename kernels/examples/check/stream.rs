//! The streamed decode GEMV (`gemv_stream_*`): every mode at n 1, 3, 8, with and without the folded
//! RMSNorm and the bf16 input rounding, against f64 over the device's own `rmsnorm` output (the folded
//! norm is meant to reproduce it bit for bit, so a bf16 rounding flip would show), including a shape
//! whose last stage is partial; the QKV + RoPE mode against `gemv_qkv_rope` (qkv rows and the K/V cache
//! rows); a shape too large for shared memory refused; and timings beside `gemv_bf16` at the 1B shapes.

use ctxscope_kernels::cudarc::driver::DevicePtr;
use ctxscope_kernels::device::{Device, GemvMode, Matrix, RopeShape, StreamOp};

use crate::gemv::gemv_want;
use crate::reference::dots;
use crate::report::{compare, nan_buf, read, to_f64, Report, Res, Row, F32_LIMIT, TAIL};
use crate::rng::Rng;
use crate::timing::time_ms;

const EPS: f32 = 1e-5;

pub(crate) fn check_stream(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let shapes =
        [(576usize, 576usize, true), (1536, 576, true), (1003, 584, true), (3072, 2048, true), (2048, 8192, true), (49152, 576, false)];
    for (rows, cols, with_f32) in shapes {
        // Gate rows then up rows (the SwiGLU layout); Store and Accumulate use the gate half.
        let w_all = rng.vec(2 * rows * cols, 1.0 / (cols as f32).sqrt());
        let x = rng.vec(8 * cols, 1.0);
        let g = rng.vec(cols, 1.0);
        let y0 = rng.vec(8 * rows, 1.0);
        let (dx, dg) = (s.clone_htod(&x)?, s.clone_htod(&g)?);
        let mut dh = nan_buf(s, 8 * cols)?;
        dev.rmsnorm(&dx.as_view(), None, &dg.as_view(), &mut dh.as_view_mut(), 8, cols, EPS, false)?;
        let h = read(s, &dh)?;
        for as_bf16 in [true, false] {
            if !as_bf16 && !with_f32 {
                continue;
            }
            let single = Matrix::upload(s, &w_all[..rows * cols], rows, cols, as_bf16)?;
            let fused = Matrix::upload(s, &w_all, 2 * rows, cols, as_bf16)?;
            // refs[norm][round_x]
            let refs = [
                [dots(&w_all, as_bf16, &x, false, cols, 8), dots(&w_all, as_bf16, &x, true, cols, 8)],
                [dots(&w_all, as_bf16, &h, false, cols, 8), dots(&w_all, as_bf16, &h, true, cols, 8)],
            ];
            let kind = if as_bf16 { "bf16" } else { "f32" };
            let mut row = Row::new(format!("gemv_stream_{kind} {rows}x{cols} n 1,3,8 x 3 modes x norm x round_x"), F32_LIMIT);
            let mut refused = Vec::new();
            for n in [1usize, 3, 8] {
                for mode in [GemvMode::Store, GemvMode::Accumulate, GemvMode::SwiGlu] {
                    let w = if mode == GemvMode::SwiGlu { &fused } else { &single };
                    for norm in [false, true] {
                        let gv = dg.as_view();
                        if dev.stream_plan(w, n, StreamOp::Gemv(mode), norm).is_none() {
                            // Too large for a block's shared memory: the wrapper must say so, not launch.
                            let mut y = nan_buf(s, n * rows + TAIL)?;
                            let accepted = dev
                                .gemv_stream(w, &dx.slice(0..n * cols), &mut y.as_view_mut(), n, mode, false, norm.then_some((&gv, EPS)))
                                .is_ok();
                            row.add(
                                &format!("n={n} {mode:?} norm={norm} refused"),
                                compare(&[], &[]).flag(usize::from(accepted), "launched without a plan"),
                            );
                            refused.push(format!("n={n} {mode:?} norm={norm}"));
                            continue;
                        }
                        for round_x in [false, true] {
                            let mut y = nan_buf(s, n * rows + TAIL)?;
                            if mode == GemvMode::Accumulate {
                                s.memcpy_htod(&y0[..n * rows], &mut y.slice_mut(0..n * rows))?;
                            }
                            dev.gemv_stream(w, &dx.slice(0..n * cols), &mut y.as_view_mut(), n, mode, round_x, norm.then_some((&gv, EPS)))?;
                            let got = read(s, &y)?;
                            let want = gemv_want(&refs[usize::from(norm)][usize::from(round_x)], &y0, rows, n, mode);
                            row.add(
                                &format!("n={n} {mode:?} norm={norm} round_x={round_x}"),
                                compare(&got[..n * rows], &want).tail(&got[n * rows..]),
                            );
                        }
                    }
                }
            }
            if !refused.is_empty() {
                rep.info.push(format!(
                    "gemv_stream_{kind} {rows}x{cols}: no plan (shared memory) for {}; refused as expected",
                    refused.join(", ")
                ));
            }
            rep.rows.push(row);
        }
    }
    check_qkv_rope(dev, rng, rep)
}

/// The QKV + RoPE mode (RMSNorm folded) against `rmsnorm` + `gemv_qkv_rope` on the same rows.
fn check_qkv_rope(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (n_layers, layer, capacity) = (2usize, 1usize, 64usize);
    for (heads, kv_heads, hd, cols, base) in [(9usize, 3usize, 64usize, 576usize, 100_000.0f32), (32, 8, 64, 2048, 500_000.0)] {
        let (q_dim, kv_dim) = (heads * hd, kv_heads * hd);
        let rows = q_dim + 2 * kv_dim;
        let shape = RopeShape { n_layers, heads, kv_heads, head_dim: hd, base, flags: 0, kv_scale: 1.0 };
        let w_host = rng.vec(rows * cols, 1.0 / (cols as f32).sqrt());
        let x = rng.vec(3 * cols, 1.0);
        let g = rng.vec(cols, 1.0);
        let (dx, dg) = (s.clone_htod(&x)?, s.clone_htod(&g)?);
        let positions = s.clone_htod(&[5i32, 63, 17])?;
        let inv_freq = dev.rope_table(base, hd)?;
        let off = |pos: usize, kind: usize| ((pos * n_layers + layer) * 2 + kind) * kv_dim;
        for as_bf16 in [true, false] {
            let w = Matrix::upload(s, &w_host, rows, cols, as_bf16)?;
            let mut row = Row::new(
                format!("gemv_stream qkv+rope {} h{heads}/{kv_heads} vs rmsnorm+gemv_qkv_rope", if as_bf16 { "bf16" } else { "f32" }),
                F32_LIMIT,
            );
            for n in [1usize, 3] {
                for round_x in [false, true] {
                    // [stream, stream with the inverse-frequency table, reference] outputs: qkv rows and one cache per row.
                    let mut outs = Vec::new();
                    for (streamed, table) in [(true, None), (true, Some(&inv_freq)), (false, None)] {
                        let mut qkv = nan_buf(s, n * rows + TAIL)?;
                        let caches = (0..n).map(|_| nan_buf(s, capacity * n_layers * 2 * kv_dim)).collect::<Res<Vec<_>>>()?;
                        let bases = s.clone_htod(&caches.iter().map(|c| c.device_ptr(s).0).collect::<Vec<u64>>())?;
                        if streamed {
                            let gv = dg.as_view();
                            dev.gemv_stream_qkv_rope(
                                &w,
                                &dx.slice(0..n * cols),
                                &mut qkv.as_view_mut(),
                                n,
                                round_x,
                                Some((&gv, EPS)),
                                &positions.as_view(),
                                &bases.as_view(),
                                layer,
                                &shape,
                                table,
                            )?;
                        } else {
                            let mut h = nan_buf(s, n * cols)?;
                            dev.rmsnorm(&dx.slice(0..n * cols), None, &dg.as_view(), &mut h.as_view_mut(), n, cols, EPS, false)?;
                            dev.gemv_qkv_rope(
                                &w,
                                &h.as_view(),
                                &mut qkv.as_view_mut(),
                                n,
                                round_x,
                                &positions.as_view(),
                                &bases.as_view(),
                                layer,
                                &shape,
                            )?;
                        }
                        outs.push((read(s, &qkv)?, caches.iter().map(|c| read(s, c)).collect::<Res<Vec<_>>>()?));
                    }
                    let ((got, got_caches), (tabled, tabled_caches), (want, want_caches)) = (&outs[0], &outs[1], &outs[2]);
                    // The table holds the values each launch would compute: the same outputs bit for bit.
                    let differ = tabled
                        .iter()
                        .zip(got)
                        .chain(tabled_caches.iter().flatten().zip(got_caches.iter().flatten()))
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    let mut cmp = compare(&got[..n * rows], &to_f64(&want[..n * rows])).tail(&got[n * rows..]);
                    for (t, (gc, wc)) in got_caches.iter().zip(want_caches).enumerate() {
                        let pos = [5usize, 63, 17][t];
                        let span = off(pos, 0)..off(pos, 0) + 2 * kv_dim;
                        let stray = gc.iter().filter(|v| !v.is_nan()).count() - gc[span.clone()].iter().filter(|v| !v.is_nan()).count();
                        cmp = cmp.merge(
                            compare(&gc[span.clone()], &to_f64(&wc[span])).flag(stray, "cache values written outside the row's position"),
                        );
                    }
                    row.add(&format!("n={n} round_x={round_x}"), cmp.flag(differ, "outputs with the inverse-frequency table differ"));
                }
            }
            rep.rows.push(row);
        }
    }
    Ok(())
}

/// Times `gemv_stream_bf16` beside `gemv_bf16` at the 1B model's decode shapes (n=1, bf16 input
/// rounding; informative), each matrix copied until the copies exceed the L2 so that the weights come
/// from memory.
pub(crate) fn time_stream(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    for (name, rows, cols, mode) in [
        ("qkv", 3072usize, 2048usize, GemvMode::Store),
        ("o", 2048, 2048, GemvMode::Accumulate),
        ("gate/up", 2 * 8192, 2048, GemvMode::SwiGlu),
        ("down", 2048, 8192, GemvMode::Accumulate),
        ("lm head", 128_256, 2048, GemvMode::Store),
    ] {
        let bytes = rows * cols * 2;
        let copies = (200usize << 20).div_ceil(bytes).max(1);
        let mats = (0..copies).map(|_| Matrix::upload(s, &rng.vec(rows * cols, 0.05), rows, cols, true)).collect::<Result<Vec<_>, _>>()?;
        let out_rows = mode.outputs(rows);
        let dx = s.clone_htod(&rng.vec(cols, 1.0))?;
        let mut y = nan_buf(s, out_rows)?;
        let (mut i, mut j) = (0usize, 0usize);
        let (warp, _) = time_ms(dev, 50, || {
            i += 1;
            Ok(dev.gemv(&mats[i % copies], &dx.as_view(), &mut y.as_view_mut(), 1, mode, true)?)
        })?;
        let (streamed, _) = time_ms(dev, 50, || {
            j += 1;
            Ok(dev.gemv_stream(&mats[j % copies], &dx.as_view(), &mut y.as_view_mut(), 1, mode, true, None)?)
        })?;
        let gbps = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
        rep.info.push(format!(
            "{name} {rows}x{cols} bf16 n=1 (median of 50, {copies} copies): gemv_bf16 {:.1} us = {:.0} GB/s; gemv_stream_bf16 {:.1} us = {:.0} GB/s",
            warp * 1e3,
            gbps(warp),
            streamed * 1e3,
            gbps(streamed)
        ));
    }
    Ok(())
}
