//! rmsnorm (f32 statistics against f64, bf16 statistics against an exact emulation of the CPU
//! engine's `rmsnorm_rows_bf16`), with and without a row map.

use ctxscope_kernels::device::Device;

use crate::report::{compare, nan_buf, read, to_f64, Report, Res, Row, F32_LIMIT, TAIL};
use crate::rng::Rng;

/// rmsnorm in f64 of one row.
fn rmsnorm_f64(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter().zip(w).map(|(&v, &w)| f64::from(v) * scale * f64::from(w)).collect()
}

/// The rmsnorm_bf16 patch on one row, as the engine computes it (`ctxscope_numerics::mean_square_bf16`).
fn rmsnorm_bf16_row(row: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mean = ctxscope_numerics::mean_square_bf16(row);
    let scale = 1.0 / (mean + eps).sqrt();
    row.iter().zip(weight).map(|(x, w)| x * scale * w).collect()
}

pub(crate) fn check_rmsnorm(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (n, src_rows, eps) = (37usize, 50usize, 1e-5f32);
    for dim in [576usize, 2048] {
        let mut x = Vec::with_capacity(src_rows * dim);
        for _ in 0..src_rows {
            let scale = 0.05 + 3.0 * rng.unit() as f32;
            x.extend(rng.vec(dim, scale));
        }
        let w: Vec<f32> = (0..dim).map(|_| 1.0 + rng.sym(0.5)).collect();
        let map: Vec<i32> = (0..n).map(|_| rng.below(src_rows) as i32).collect();
        let (dx, dw, dmap) = (s.clone_htod(&x)?, s.clone_htod(&w)?, s.clone_htod(&map)?);
        for bf16_stats in [false, true] {
            let mut row = if bf16_stats {
                Row::new(format!("rmsnorm bf16 stats (emulation) dim {dim}"), 1e-6)
            } else {
                Row::new(format!("rmsnorm f32 stats dim {dim}"), F32_LIMIT)
            };
            for with_map in [false, true] {
                let mut out = nan_buf(s, n * dim + TAIL)?;
                let map_view = dmap.as_view();
                dev.rmsnorm(&dx.as_view(), with_map.then_some(&map_view), &dw.as_view(), &mut out.as_view_mut(), n, dim, eps, bf16_stats)?;
                let got = read(s, &out)?;
                let src = |r: usize| if with_map { map[r] as usize } else { r };
                let mut want = Vec::with_capacity(n * dim);
                let mut differ = 0;
                for r in 0..n {
                    let xr = &x[src(r) * dim..(src(r) + 1) * dim];
                    if bf16_stats {
                        let e = rmsnorm_bf16_row(xr, &w, eps);
                        differ += e.iter().zip(&got[r * dim..]).filter(|(a, b)| a != b).count();
                        want.extend(to_f64(&e));
                    } else {
                        want.extend(rmsnorm_f64(xr, &w, eps));
                    }
                }
                let label = if with_map { "row map" } else { "plain" };
                let label = if bf16_stats { format!("{label}, {differ} not bit-equal") } else { label.to_string() };
                row.add(&label, compare(&got[..n * dim], &want).tail(&got[n * dim..]));
            }
            rep.rows.push(row);
        }
    }
    Ok(())
}
