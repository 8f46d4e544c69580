//! The element-wise kernels, each exact or against f64: embed (a row gather), swiglu, add, to_bf16,
//! in-place rounding to bf16 and FP8, Q8_0 blocks.

use ctxscope_kernels::device::{f32_to_bf16_bits, Device, Matrix};

use crate::reference::{bf16, fp8_scaled, q8_blocks};
use crate::report::{compare, exact, nan_buf, read, Report, Res, TAIL};
use crate::rng::Rng;

pub(crate) fn check_embed(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (vocab, dim) = (1000usize, 576usize);
    let table = rng.vec(vocab * dim, 1.0);
    let ids: Vec<i32> = vec![0, 999, 3, 3, 517, 998, 1, 250, 0];
    let n = ids.len();
    let dids = s.clone_htod(&ids)?;
    for as_bf16 in [false, true] {
        let m = Matrix::upload(s, &table, vocab, dim, as_bf16)?;
        let mut out = nan_buf(s, n * dim + TAIL)?;
        dev.embed(&m, &dids.as_view(), &mut out.as_view_mut(), n)?;
        let got = read(s, &out)?;
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].iter().map(|&v| if as_bf16 { bf16(v) } else { v }))
            .collect();
        let name = if as_bf16 { "embed_bf16 (exact)" } else { "embed_f32 (exact)" };
        rep.single(name, 0.0, exact(&got[..n * dim], &want).tail(&got[n * dim..]));
    }
    Ok(())
}

pub(crate) fn check_elementwise(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;

    // SwiGLU of fused gate|up rows.
    let (n, ffn) = (37usize, 1536usize);
    let gu = rng.vec(n * 2 * ffn, 4.0);
    let dgu = s.clone_htod(&gu)?;
    let mut out = nan_buf(s, n * ffn + TAIL)?;
    dev.swiglu(&dgu.as_view(), &mut out.as_view_mut(), n, ffn)?;
    let got = read(s, &out)?;
    let want: Vec<f64> = (0..n * ffn)
        .map(|i| {
            let (r, c) = (i / ffn, i % ffn);
            let (g, u) = (f64::from(gu[r * 2 * ffn + c]), f64::from(gu[r * 2 * ffn + ffn + c]));
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    rep.single("swiglu_f32 37x1536", 1e-6, compare(&got[..n * ffn], &want).tail(&got[n * ffn..]));

    // Residual add in place; the tail past n must keep its values.
    let n = 37 * 576 + 13;
    let (x, y) = (rng.vec(n + TAIL, 3.0), rng.vec(n, 3.0));
    let (mut dx, dy) = (s.clone_htod(&x)?, s.clone_htod(&y)?);
    dev.add(&mut dx.as_view_mut(), &dy.as_view(), n)?;
    let got = read(s, &dx)?;
    let want: Vec<f32> = (0..n + TAIL).map(|i| if i < n { x[i] + y[i] } else { x[i] }).collect();
    rep.single("add_f32 (exact, tail kept)", 0.0, exact(&got, &want));

    // f32 -> bf16 bits: ties, overflow, subnormals, infinities, then random bit patterns and values.
    let mut x = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -(1.0 + 2f32.powi(-8)),
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
        -3e-39,
        f32::INFINITY,
        f32::NEG_INFINITY,
        65504.0,
        3.0e38,
    ];
    while x.len() < 4099 {
        let v = if x.len() % 2 == 0 { f32::from_bits(rng.bits() as u32) } else { rng.wide(1e-6, 1e6) };
        if !v.is_nan() {
            x.push(v);
        }
    }
    let n = x.len();
    let dx = s.clone_htod(&x)?;
    let mut out = s.clone_htod(&vec![0xffffu16; n + TAIL])?;
    dev.to_bf16(&dx.as_view(), &mut out.as_view_mut(), n)?;
    let got = read(s, &out)?;
    let differ = x.iter().zip(&got).filter(|(v, g)| f32_to_bf16_bits(**v) != **g).count();
    let finite: Vec<usize> = (0..n).filter(|&i| x[i].is_finite() && bf16(x[i]).is_finite()).collect();
    let got_f: Vec<f32> = finite.iter().map(|&i| f32::from_bits(u32::from(got[i]) << 16)).collect();
    let want_f: Vec<f64> = finite.iter().map(|&i| f64::from(bf16(x[i]))).collect();
    let tail = got[n..].iter().filter(|&&b| b != 0xffff).count();
    rep.single(
        "to_bf16 (bits vs f32_to_bf16_bits)",
        0.0,
        compare(&got_f, &want_f).flag(differ, "bit patterns differ").flag(tail, "written past the end"),
    );

    // In-place rounding: bf16, and FP8 e4m3 with a per-tensor scale.
    let specials = [
        1.0625,
        1.1,
        1.1875,
        0.0,
        -0.0,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-10),
        2f32.powi(-11),
        232.0,
        240.0,
        448.0,
        460.0,
        464.0,
        480.0,
        1000.0,
        -1000.0,
        -0.3,
    ];
    let mut x: Vec<f32> = specials.to_vec();
    while x.len() < 4099 {
        x.push(rng.wide(1e-4, 2000.0));
    }
    let n = x.len();
    let sentinel = rng.vec(TAIL, 1.0);
    for (mode, scale) in [(None, 1.0f32), (Some(1.0f32), 1.0), (Some(0.5), 0.5), (Some(0.1), 0.1)] {
        let mut dx = s.clone_htod(&[x.as_slice(), &sentinel].concat())?;
        dev.round(&mut dx.as_view_mut(), n, mode)?;
        let got = read(s, &dx)?;
        let mut want: Vec<f32> = x.iter().map(|&v| if mode.is_some() { fp8_scaled(v, scale) } else { bf16(v) }).collect();
        want.extend_from_slice(&sentinel);
        let name = match mode {
            None => "round_f32 bf16 (exact)".to_string(),
            Some(scale) => format!("round_f32 fp8 scale {scale} (exact)"),
        };
        rep.single(name, 0.0, exact(&got, &want));
    }

    // Q8_0 blocks in place: rows of different scales, an all-zero block and a one-value block.
    let (rows, cols) = (37usize, 576usize);
    let mut x = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let scale = rng.wide(1e-3, 50.0).abs();
        x.extend(rng.vec(cols, scale));
    }
    x[32..64].fill(0.0);
    x[64..96].fill(0.0);
    x[70] = -0.37;
    let n = x.len();
    let mut dx = s.clone_htod(&[x.as_slice(), &sentinel].concat())?;
    dev.q8_blocks(&mut dx.as_view_mut(), n)?;
    let got = read(s, &dx)?;
    let mut want = x.clone();
    q8_blocks(&mut want);
    want.extend_from_slice(&sentinel);
    rep.single("q8_blocks (exact, f16 d)", 0.0, exact(&got, &want));
    Ok(())
}
