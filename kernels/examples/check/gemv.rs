//! The GEMV kernels: every mode (store, accumulate, fused SwiGLU) at n 1, 3, 8 against f64, and the
//! timing of gemv_bf16 at the 1B model's decode shapes (weights kept out of the L2), checked as well.

use std::sync::Arc;

use ctxscope_kernels::cudarc::driver::CudaStream;
use ctxscope_kernels::device::{Device, GemvMode, Matrix, MatrixData};

use crate::reference::{bf16, dots, par_rows};
use crate::report::{compare, nan_buf, read, Report, Res, Row, F32_LIMIT, TAIL};
use crate::rng::Rng;
use crate::timing::time_ms;

pub(crate) fn check_gemv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let shapes = [(576usize, 576usize, true), (1536, 576, true), (49152, 576, false), (3072, 2048, true), (2048, 8192, true)];
    for (rows, cols, with_f32) in shapes {
        // Gate rows then up rows (the SwiGLU layout); Store and Accumulate use the gate half.
        let w_all = rng.vec(2 * rows * cols, 1.0 / (cols as f32).sqrt());
        let x = rng.vec(8 * cols, 1.0);
        let y0 = rng.vec(8 * rows, 1.0);
        let dx = s.clone_htod(&x)?;
        for as_bf16 in [true, false] {
            if !as_bf16 && !with_f32 {
                continue;
            }
            let single = Matrix::upload(s, &w_all[..rows * cols], rows, cols, as_bf16)?;
            let fused = Matrix::upload(s, &w_all, 2 * rows, cols, as_bf16)?;
            let refs = [dots(&w_all, as_bf16, &x, false, cols, 8), dots(&w_all, as_bf16, &x, true, cols, 8)];
            let mut row =
                Row::new(format!("gemv_{} {rows}x{cols} n 1,3,8 x 3 modes x round_x", if as_bf16 { "bf16" } else { "f32" }), F32_LIMIT);
            for n in [1usize, 3, 8] {
                for mode in [GemvMode::Store, GemvMode::Accumulate, GemvMode::SwiGlu] {
                    for round_x in [false, true] {
                        let w = if mode == GemvMode::SwiGlu { &fused } else { &single };
                        let mut y = nan_buf(s, n * rows + TAIL)?;
                        if mode == GemvMode::Accumulate {
                            s.memcpy_htod(&y0[..n * rows], &mut y.slice_mut(0..n * rows))?;
                        }
                        dev.gemv(w, &dx.slice(0..n * cols), &mut y.as_view_mut(), n, mode, round_x)?;
                        let got = read(s, &y)?;
                        let want = gemv_want(&refs[usize::from(round_x)], &y0, rows, n, mode);
                        row.add(&format!("n={n} {mode:?} round_x={round_x}"), compare(&got[..n * rows], &want).tail(&got[n * rows..]));
                    }
                }
            }
            rep.rows.push(row);
        }
    }
    Ok(())
}

/// What a GEMV of `n` token rows writes in `mode`, from the f64 dot products `d` (`dots` over 8 token
/// rows of the gate rows then the up rows) and, for Accumulate, the output's prior values `y0`.
pub(crate) fn gemv_want(d: &[f64], y0: &[f32], rows: usize, n: usize, mode: GemvMode) -> Vec<f64> {
    (0..n * rows)
        .map(|i| {
            let (t, r) = (i / rows, i % rows);
            let g = d[r * 8 + t];
            match mode {
                GemvMode::Store => g,
                GemvMode::Accumulate => f64::from(y0[i]) + g,
                GemvMode::SwiGlu => g / (1.0 + (-g).exp()) * d[(r + rows) * 8 + t],
            }
        })
        .collect()
}

/// A bf16 matrix of random values (magnitudes 2^-8 .. 2^-1, random signs) built from bits directly,
/// and those bits.
fn random_bf16_matrix(s: &Arc<CudaStream>, rng: &mut Rng, rows: usize, cols: usize) -> Res<(Matrix, Vec<u16>)> {
    let n = rows * cols;
    let mut bits = Vec::with_capacity(n + 3);
    while bits.len() < n {
        let r = rng.bits();
        for k in 0..4 {
            let b = (r >> (16 * k)) as u16;
            bits.push((b & 0x807f) | ((119 + ((b >> 7) & 7)) << 7));
        }
    }
    bits.truncate(n);
    Ok((Matrix { data: MatrixData::Bf16(s.clone_htod(&bits)?), rows, cols }, bits))
}

/// Times gemv_bf16 at the 1B model's decode shapes (informative), and checks the last timed launch's
/// output against f64 (these shapes are not covered above).
pub(crate) fn time_gemv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let runs = 50usize;
    let mut row = Row::new("gemv_bf16 timed shapes, last run (n=1, round_x)", F32_LIMIT);
    // The SwiGLU matrix (64 MiB) is near the L2 size: two copies, alternated, so the L2 cannot serve it.
    for (rows, cols, mode, copies) in [(2 * 8192usize, 2048usize, GemvMode::SwiGlu, 2usize), (128_256, 2048, GemvMode::Store, 1)] {
        let (mats, bits): (Vec<Matrix>, Vec<Vec<u16>>) =
            (0..copies).map(|_| random_bf16_matrix(s, rng, rows, cols)).collect::<Res<Vec<_>>>()?.into_iter().unzip();
        let out_rows = mode.outputs(rows);
        let x = rng.vec(cols, 1.0);
        let dx = s.clone_htod(&x)?;
        let mut y = nan_buf(s, out_rows + TAIL)?;
        // Launches alternate over the copies; `launches` counts them, so the last one's copy is known.
        let mut launches = 0usize;
        let (median, min) = time_ms(dev, runs, || {
            launches += 1;
            Ok(dev.gemv(&mats[(launches - 1) % copies], &dx.as_view(), &mut y.as_view_mut(), 1, mode, true)?)
        })?;
        let bytes = mats[0].bytes() as f64;
        rep.info.push(format!(
            "gemv_bf16 {mode:?} {rows}x{cols} n=1: median {:.1} us (min {:.1}) over {runs} launches: {:.0} GB/s of weights",
            median * 1e3,
            min * 1e3,
            bytes / (median * 1e-3) / 1e9
        ));

        let got = read(s, &y)?;
        let last = &bits[(launches - 1) % copies];
        let xs: Vec<f64> = x.iter().map(|&v| f64::from(bf16(v))).collect();
        let mut d = vec![0f64; rows];
        par_rows(&mut d, 1, |r, o| {
            o[0] = last[r * cols..(r + 1) * cols].iter().zip(&xs).map(|(&b, &x)| f64::from(f32::from_bits(u32::from(b) << 16)) * x).sum();
        });
        let want: Vec<f64> = (0..out_rows)
            .map(|r| {
                let g = d[r];
                if mode == GemvMode::SwiGlu {
                    g / (1.0 + (-g).exp()) * d[r + out_rows]
                } else {
                    g
                }
            })
            .collect();
        row.add(&format!("{mode:?} {rows}x{cols}"), compare(&got[..out_rows], &want).tail(&got[out_rows..]));
    }
    rep.rows.push(row);
    Ok(())
}
