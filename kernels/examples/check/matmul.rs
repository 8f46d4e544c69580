//! The cuBLAS matmul wrapper: f32, f32 with bf16 tensor-core compute and bf16 operands, storing and
//! accumulating, against f64 of the exact and of the bf16-rounded inputs.

use ctxscope_kernels::blas::{Activations, Blas, Compute};
use ctxscope_kernels::device::{f32_to_bf16_bits, Device, Matrix};

use crate::reference::dots;
use crate::report::{compare, nan_buf, read, Report, Res, Row, F32_LIMIT, TAIL};
use crate::rng::Rng;

pub(crate) fn check_matmul(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let blas = Blas::new(s.clone())?;
    let (rows, cols, n) = (1536usize, 576usize, 37usize);
    let w = rng.vec(rows * cols, 1.0 / (cols as f32).sqrt());
    let x = rng.vec(n * cols, 1.0);
    let y0 = rng.vec(n * rows, 1.0);
    let x_bits: Vec<u16> = x.iter().map(|&v| f32_to_bf16_bits(v)).collect();
    let (exact_ref, rounded_ref) = (dots(&w, false, &x, false, cols, n), dots(&w, true, &x, true, cols, n));
    let (mf, mb) = (Matrix::upload(s, &w, rows, cols, false)?, Matrix::upload(s, &w, rows, cols, true)?);
    let (dx, dxb) = (s.clone_htod(&x)?, s.clone_htod(&x_bits)?);
    // (label, bf16 operands, compute, limit, gate against the bf16-rounded-input reference)
    let cases = [
        ("f32 32F", false, Compute::F32, F32_LIMIT, false),
        ("f32 32F_FAST_16BF", false, Compute::F32Fast16Bf, 1e-2, false),
        ("bf16 x bf16 (vs rounded inputs)", true, Compute::F32, F32_LIMIT, true),
    ];
    for (label, bf16_operands, compute, limit, gate_rounded) in cases {
        let mut row = Row::new(format!("matmul {label} {rows}x{cols} n {n}"), limit);
        for accumulate in [false, true] {
            let mut y = nan_buf(s, n * rows + TAIL)?;
            if accumulate {
                s.memcpy_htod(&y0, &mut y.slice_mut(0..n * rows))?;
            }
            let (xv, xbv) = (dx.as_view(), dxb.as_view());
            let act = if bf16_operands { Activations::Bf16(&xbv) } else { Activations::F32(&xv) };
            blas.matmul(if bf16_operands { &mb } else { &mf }, act, &mut y.as_view_mut(), n, compute, accumulate)?;
            let got = read(s, &y)?;
            let want = |d: &[f64]| -> Vec<f64> {
                (0..n * rows).map(|i| d[(i % rows) * n + i / rows] + if accumulate { f64::from(y0[i]) } else { 0.0 }).collect()
            };
            let (gate, other) = if gate_rounded { (want(&rounded_ref), want(&exact_ref)) } else { (want(&exact_ref), want(&rounded_ref)) };
            let c = compare(&got[..n * rows], &gate).tail(&got[n * rows..]);
            let o = compare(&got[..n * rows], &other).rel;
            let vs = if gate_rounded { "vs exact inputs" } else { "vs bf16-rounded inputs" };
            row.add(&format!("accumulate={accumulate}, {vs} {o:.1e}"), c);
        }
        rep.rows.push(row);
    }
    Ok(())
}
