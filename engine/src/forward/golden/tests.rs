//! The golden kernels give `ops::dot`'s bits for every source, tile shape and input count.

use super::*;
use crate::forward::testutil::{matrix, Rng};
use crate::model::QuantMatrix;
use ctxscope_formats::gguf::GgmlType;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// `ops::dot` over every (row, input) pair, row-major.
fn reference(w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for r in 0..w.rows {
        for t in 0..n {
            out.push(ops::dot(&w.f32[r * w.cols..(r + 1) * w.cols], &x[t * w.cols..(t + 1) * w.cols]));
        }
    }
    out
}

#[test]
fn every_source_and_tile_gives_the_dot_bits() {
    for ggml_type in [3, 2, 8] {
        for (rows, cols, n) in [(7, 64, 1), (9, 96, 3), (12, 576, 8), (5, 32, 9), (66, 160, 70), (13, 128, 1)] {
            let w = matrix(ggml_type, rows, cols, 31 + rows as u64);
            let mut x = Rng(9 + n as u64).vec(n * cols, 2.0);
            x[..32].fill(0.0);
            x[40] = -0.0;
            let want = bits(&reference(&w, &x, n));
            let mut got = vec![0f32; rows * n];
            block(&w, &x, 0..rows, 0..n, &mut got);
            assert_eq!(want, bits(&got), "type {ggml_type} {rows}x{cols} n={n}");
            // A sub-tile: rows 1.., inputs 1.. (quantized source for few inputs, f32 for many).
            if rows > 2 && n > 1 {
                let mut sub = vec![0f32; (rows - 1) * (n - 1)];
                block(&w, &x, 1..rows, 1..n, &mut sub);
                for r in 1..rows {
                    for t in 1..n {
                        assert_eq!(sub[(r - 1) * (n - 1) + t - 1].to_bits(), want[r * n + t], "sub-tile {r},{t}");
                    }
                }
            }
        }
    }
}

#[test]
fn f32_weights_and_a_zero_row_give_the_dot_bits() {
    let (rows, cols, n) = (6, 96, 5);
    let mut f32 = Rng(4).vec(rows * cols, 1.0);
    f32[..cols].fill(0.0);
    let bytes: Vec<u8> = f32.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = Matrix { name: "w".into(), rows, cols, f32, quant: QuantMatrix { ggml_type: GgmlType(0), row_bytes: cols * 4, bytes } };
    let mut x = Rng(8).vec(n * cols, 1.0);
    x[..cols].iter_mut().for_each(|v| *v = -*v);
    let mut got = vec![0f32; rows * n];
    block(&w, &x, 0..rows, 0..n, &mut got);
    assert_eq!(bits(&reference(&w, &x, n)), bits(&got));
    assert_eq!(got[0].to_bits(), 0, "a zero row's dot is +0, as ops::dot's tail makes it");
}
