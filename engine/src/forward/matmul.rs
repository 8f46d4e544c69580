//! Weight matmuls, `out[t][r] = W[r] . x[t]` for `n` input rows, written in place in `[n][rows]`
//! order. Products that read the same input (Q, K and V; gate and up) run as one group: the input is
//! prepared once (quantized, on the fast path) and one parallel region covers all their rows. The
//! work is cut into tiles of (weight rows, input rows): rows when there are few inputs (decode), input
//! rows when there are many (prefill), so each thread writes its own part of the outputs. Every
//! output is one kernel call whatever the cut, so the result does not depend on the thread count.

use std::ops::Range;

use rayon::prelude::*;

use super::fast::{self, Kernel, QuantRows};
use super::{golden, ops, Path};
use crate::model::Matrix;

/// Input rows from which tiles cut the inputs rather than the weight rows.
const SPLIT_INPUTS_FROM: usize = 32;
/// Tiles per thread (more than one, so that a thread slowed by others' work is covered).
const TILES_PER_THREAD: usize = 8;
/// Multiply-adds below which a group runs on the calling thread alone.
const SERIAL_MACS: usize = 1 << 16;
/// Outputs per kernel call within a tile (a stack buffer), and input rows per call at most.
const BLOCK_OUTPUTS: usize = 1024;
const BLOCK_INPUTS: usize = 64;

/// What a product does with `W x`.
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// out = W x.
    Store,
    /// out += W x (a residual add: the same bits as storing, then `ops::add_assign`).
    Add,
    /// out = silu(W x) * (up x) (`ops::silu_mul`); `up` has `W`'s shape.
    SwiGlu { up: &'a Matrix },
}

/// One weight matrix of a group, and where its result goes (`[n][w.rows]`).
pub struct Product<'a> {
    pub w: &'a Matrix,
    pub epilogue: Epilogue<'a>,
    pub out: &'a mut [f32],
}

/// `out = W x` for one matrix.
pub fn matmul(path: Path, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    products(path, x, n, vec![Product { w, epilogue: Epilogue::Store, out }]);
}

/// Runs a group of products over the same `n` input rows `x`.
pub fn products(path: Path, x: &[f32], n: usize, group: Vec<Product<'_>>) {
    let Some(first) = group.first() else { return };
    let cols = first.w.cols;
    for p in &group {
        assert!(p.w.cols == cols && x.len() == n * cols && p.out.len() == n * p.w.rows, "matmul {}: shapes disagree", p.w.name);
        if let Epilogue::SwiGlu { up } = p.epilogue {
            assert!(up.rows == p.w.rows && up.cols == cols, "matmul {}: up shape", up.name);
        }
    }
    let kernel = Kernel::detect();
    let quantize = path == Path::Fast && group.iter().any(|p| fast::integer_format(p.w).is_some());
    let acts = quantize.then(|| QuantRows::new(x, n, cols, kernel != Kernel::Scalar));
    let input = Input { path, kernel, x, acts: acts.as_ref() };
    let macs: usize = group.iter().map(|p| p.w.rows * cols * n).sum();
    let tiles = cut(group, n, macs < SERIAL_MACS);
    if tiles.len() == 1 || macs < SERIAL_MACS {
        tiles.into_iter().for_each(|tile| tile.run(&input));
    } else {
        tiles.into_par_iter().for_each(|tile| tile.run(&input));
    }
}

/// The input rows as each kernel reads them.
struct Input<'x> {
    path: Path,
    kernel: Kernel,
    x: &'x [f32],
    acts: Option<&'x QuantRows>,
}

impl Input<'_> {
    /// `res[i][j] = W[rows.start + i] . x[tokens.start + j]` on this path.
    fn block(&self, w: &Matrix, rows: Range<usize>, tokens: Range<usize>, res: &mut [f32]) {
        if self.path == Path::Fast {
            if let (Some(format), Some(acts)) = (fast::integer_format(w), self.acts) {
                return fast::block(self.kernel, format, w, acts, rows, tokens, res);
            }
        }
        golden::block(w, self.x, rows, tokens, res);
    }
}

/// A part of one product's output: weight rows `rows` for input rows `tokens`; `pieces[j]` is
/// `out[tokens.start + j][rows]`.
struct Tile<'a> {
    w: &'a Matrix,
    epilogue: Epilogue<'a>,
    rows: Range<usize>,
    tokens: Range<usize>,
    pieces: Vec<&'a mut [f32]>,
}

/// Cuts the group into tiles: one per product when `serial`.
fn cut(group: Vec<Product<'_>>, n: usize, serial: bool) -> Vec<Tile<'_>> {
    let threads = rayon::current_num_threads().max(1);
    let total_rows: usize = group.iter().map(|p| p.w.rows).sum();
    let (row_chunk, token_chunk) = if serial {
        (usize::MAX, n.max(1))
    } else if n >= SPLIT_INPUTS_FROM {
        (usize::MAX, n.div_ceil(TILES_PER_THREAD * threads).clamp(16, BLOCK_INPUTS))
    } else {
        (total_rows.div_ceil(TILES_PER_THREAD * threads).next_multiple_of(4).max(16), n.max(1))
    };
    let mut tiles = Vec::new();
    for p in group {
        let rows = p.w.rows;
        let row_chunk = row_chunk.min(rows).max(1);
        let row_parts = rows.div_ceil(row_chunk);
        let base = tiles.len();
        for t0 in (0..n).step_by(token_chunk) {
            for r0 in (0..rows).step_by(row_chunk) {
                let (rows, tokens) = (r0..(r0 + row_chunk).min(rows), t0..(t0 + token_chunk).min(n));
                tiles.push(Tile { w: p.w, epilogue: p.epilogue, rows, tokens, pieces: Vec::new() });
            }
        }
        for (t, out_row) in p.out.chunks_mut(rows).enumerate() {
            for (part, piece) in out_row.chunks_mut(row_chunk).enumerate() {
                tiles[base + (t / token_chunk) * row_parts + part].pieces.push(piece);
            }
        }
    }
    tiles
}

impl Tile<'_> {
    /// Computes the tile in blocks of at most [`BLOCK_OUTPUTS`] and writes them through the epilogue.
    fn run(mut self, input: &Input<'_>) {
        let mut res = [0f32; BLOCK_OUTPUTS];
        let mut up_res = [0f32; BLOCK_OUTPUTS];
        for t0 in self.tokens.clone().step_by(BLOCK_INPUTS) {
            let tt = t0..(t0 + BLOCK_INPUTS).min(self.tokens.end);
            let block_rows = (BLOCK_OUTPUTS / tt.len() / 4 * 4).max(1);
            for r0 in self.rows.clone().step_by(block_rows) {
                let rr = r0..(r0 + block_rows).min(self.rows.end);
                let res = &mut res[..rr.len() * tt.len()];
                input.block(self.w, rr.clone(), tt.clone(), res);
                match self.epilogue {
                    Epilogue::Store => self.write(&rr, &tt, |_, k| res[k]),
                    Epilogue::Add => self.write(&rr, &tt, |o, k| o + res[k]),
                    Epilogue::SwiGlu { up } => {
                        let up_res = &mut up_res[..rr.len() * tt.len()];
                        input.block(up, rr.clone(), tt.clone(), up_res);
                        self.write(&rr, &tt, |_, k| ops::silu_mul(res[k], up_res[k]));
                    }
                }
            }
        }
    }

    /// `out[t][r] = f(out[t][r], k)` over a block, `k` the block's row-major index of (r, t).
    #[inline(always)]
    fn write(&mut self, rr: &Range<usize>, tt: &Range<usize>, f: impl Fn(f32, usize) -> f32) {
        let tn = tt.len();
        for (j, t) in tt.clone().enumerate() {
            let piece = &mut self.pieces[t - self.tokens.start][rr.start - self.rows.start..rr.end - self.rows.start];
            for (i, o) in piece.iter_mut().enumerate() {
                *o = f(*o, i * tn + j);
            }
        }
    }
}
