//! Scalar and AVX2 kernels agree bit for bit; the fast matmul stays within the activation
//! quantization error of the golden f32 matmul.

use super::quantize::{f32_to_f16, QuantRows};
use super::*;
use crate::forward::matmul;
use crate::forward::testutil::{matrix, Rng};
use crate::forward::Path;
use crate::model::QuantMatrix;
use ctxscope_formats::gguf::{f16_to_f32, GgmlType};

fn run(kernel: Kernel, w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let acts = QuantRows::new(x, n, w.cols, kernel != Kernel::Scalar);
    let mut by_row = vec![0f32; w.rows * n];
    block(kernel, integer_format(w).expect("an integer format"), w, &acts, 0..w.rows, 0..n, &mut by_row);
    by_row
}

#[test]
fn f16_rounding_matches_the_hardware() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") {
        let mut rng = Rng(7);
        for i in 0..200_000u32 {
            let v = match i % 4 {
                0 => rng.next() * 70_000.0,
                1 => rng.next() * 1e-4,
                2 => rng.next() * 1e-7,
                _ => f32::from_bits(rng.0 as u32),
            };
            // SAFETY: F16C detected above.
            let hw = unsafe {
                use std::arch::x86_64::*;
                _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set1_ps(v))) as u16
            };
            if v.is_nan() {
                assert!(f16_to_f32(f32_to_f16(v)).is_nan());
            } else {
                assert_eq!(f32_to_f16(v), hw, "{v:e}");
            }
        }
    }
    assert_eq!(f32_to_f16(1.0), 0x3c00);
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
}

#[test]
fn activation_quantization_is_the_same_scalar_and_simd() {
    if Kernel::detect() == Kernel::Scalar {
        return;
    }
    let mut x = Rng(3).vec(9 * 96, 3.0);
    x[32..64].fill(0.0);
    x[100] = 1e-30;
    x[200] = f32::NAN;
    x[300] = f32::INFINITY;
    x[400] = -0.0;
    let (a, b) = (QuantRows::new(&x, 9, 96, false), QuantRows::new(&x, 9, 96, true));
    assert_eq!(a.qs, b.qs);
    assert_eq!(a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    assert_eq!(a.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    assert_eq!(a.d[1], 0.0);
    // Round half to even, as vroundps: 0.5 * 127/127 ... a block whose values land on .5 exactly.
    let mut y = vec![0f32; 32];
    y[0] = 127.0;
    y[1] = 2.5;
    y[2] = -3.5;
    let q = QuantRows::new(&y, 1, 32, false);
    assert_eq!(&q.qs[..3], &[127, 2, -4]);
}

#[test]
fn scalar_and_simd_kernels_agree_exactly() {
    let kernels = Kernel::available();
    eprintln!("kernels on this CPU: {kernels:?}");
    for ggml_type in [3, 2, 8] {
        for (rows, cols, n) in [(7, 64, 1), (9, 96, 3), (12, 576, 8), (5, 32, 9), (66, 160, 70)] {
            let w = matrix(ggml_type, rows, cols, 11 + rows as u64);
            let mut x = Rng(5 + n as u64).vec(n * cols, 2.0);
            x[..32].fill(0.0);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let scalar = bits(&run(Kernel::Scalar, &w, &x, n));
            for kernel in &kernels[1..] {
                assert_eq!(scalar, bits(&run(*kernel, &w, &x, n)), "{kernel:?} type {ggml_type} {rows}x{cols} n={n}");
            }
        }
    }
}

#[test]
fn tile_shape_does_not_change_results() {
    // Row t of a batch equals the same row computed alone (n = 1 uses 4-row tiles, n > 1 2x4).
    let w = matrix(3, 13, 128, 1);
    let x = Rng(2).vec(6 * 128, 1.0);
    let batch = run(Kernel::detect(), &w, &x, 6);
    for t in 0..6 {
        let one = run(Kernel::detect(), &w, &x[t * 128..(t + 1) * 128], 1);
        for r in 0..13 {
            assert_eq!(batch[r * 6 + t].to_bits(), one[r].to_bits());
        }
    }
}

#[test]
fn fast_matmul_is_within_the_activation_quantization_error_of_golden() {
    for ggml_type in [3, 2, 8] {
        let (rows, cols, n) = (40, 576, 5);
        let w = matrix(ggml_type, rows, cols, 17);
        let x = Rng(19).vec(n * cols, 4.0);
        let mut golden = vec![0f32; rows * n];
        matmul(Path::Golden, &w, &x, n, &mut golden);
        let mut fast = vec![0f32; rows * n];
        matmul(Path::Fast, &w, &x, n, &mut fast);
        let (mut worst, mut sum_err) = (0f32, 0f32);
        for t in 0..n {
            for r in 0..rows {
                let (wr, xr) = (&w.f32[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                // Per block: |w| . |dx| with |dx| <= d/2 + 127 * |d - d16|, plus f16 rounding of s
                // times |m| (Q4_1), plus f32 summation slack.
                let mut bound = 0f32;
                for b in 0..cols / 32 {
                    let xb = &xr[b * 32..(b + 1) * 32];
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let wsum: f32 = wr[b * 32..(b + 1) * 32].iter().map(|v| v.abs()).sum();
                    bound += wsum * d * (0.5 + 127.0 / 2048.0) + wsum * amax / 2048.0;
                }
                let mag: f32 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                bound += 1e-5 * mag;
                let err = (fast[t * rows + r] - golden[t * rows + r]).abs();
                assert!(err <= bound, "type {ggml_type} row {r} tok {t}: err {err} > bound {bound}");
                worst = worst.max(err / bound);
                sum_err += err;
            }
        }
        eprintln!("type {ggml_type}: worst err/bound {worst:.3}, mean abs err {:.2e}", sum_err / (rows * n) as f32);
        assert!(worst > 0.0, "fast path should differ from golden somewhere");
    }
}

#[test]
fn other_types_fall_back_to_the_golden_dot() {
    let (rows, cols) = (3, 40);
    let f32: Vec<f32> = Rng(4).vec(rows * cols, 1.0);
    let bytes: Vec<u8> = f32.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = Matrix {
        name: "w".into(),
        rows,
        cols,
        f32: f32.clone(),
        quant: QuantMatrix { ggml_type: GgmlType(0), row_bytes: cols * 4, bytes },
    };
    let x = Rng(8).vec(2 * cols, 1.0);
    let (mut golden, mut fast) = (vec![0f32; rows * 2], vec![0f32; rows * 2]);
    matmul(Path::Golden, &w, &x, 2, &mut golden);
    matmul(Path::Fast, &w, &x, 2, &mut fast);
    assert_eq!(golden, fast);
}
