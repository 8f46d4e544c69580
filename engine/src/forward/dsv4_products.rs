//! Products of a golden f32 weight matrix with many input rows at once (a chunk of a DeepSeek-V4
//! prompt, the tokens routed to one expert): output `[t][r]` is `dot(w_r, x_t)`, the fixed-order
//! dot product a single row gets, so batching and threads move no bit. Weight rows are taken in tiles
//! that stay in cache while blocks of input rows pass over them, so a chunk of `n` rows reads the
//! weights once instead of `n` times, with the golden path's AVX2 kernels where the CPU has them;
//! tiles go to the thread pool when the product is large.

use std::ops::Range;

use ctxscope_numerics::round::bf16;
use rayon::prelude::*;

use super::golden;

/// Multiply-adds from which a product is split over the thread pool.
const PARALLEL_MACS: usize = 1 << 18;

/// Bytes of weight rows in one tile (a thread's unit of work; they stay in L2 while the input rows
/// pass over them).
const TILE_BYTES: usize = 64 << 10;

/// Input rows taken against a tile at a time (64 rows of DeepSeek-V4 `small`'s width: 256 KB).
const INPUT_BLOCK: usize = 64;

/// Where a DeepSeek-V4 pass computes its weight products: the host ([`Host`], bit for bit the
/// golden dot products) or a GPU (`crate::device::Dsv4Products`, feature `cuda`). A pass hands it the
/// model's own weight slices, so a device executor knows each matrix by its address.
pub trait Products: Send + Sync {
    /// The rows of `xs` (each `k` long) times the rows of `w` (each `k` long), row-major.
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32>;

    /// Several products at once, each `(matrix, rows)` as [`Products::products`] (a device takes
    /// them in one trip; the host on its thread pool).
    fn products_each(&self, jobs: &[(&[f32], &[f32])], k: usize) -> Vec<Vec<f32>> {
        jobs.par_iter().map(|(w, xs)| self.products(w, xs, k)).collect()
    }

    /// Gets ready for these matrices (each with its row length), as a pass will hand them over: a
    /// device uploads them now, so that a pass does not wait for a first use (nor runs out of memory
    /// halfway). The host needs nothing.
    fn prepare(&self, _matrices: &[(&[f32], usize)]) -> Result<(), String> {
        Ok(())
    }

    /// Several matrices times the same rows.
    fn products_of(&self, ws: &[&[f32]], xs: &[f32], k: usize) -> Vec<Vec<f32>> {
        let jobs: Vec<(&[f32], &[f32])> = ws.iter().map(|w| (*w, xs)).collect();
        self.products_each(&jobs, k)
    }
}

/// The host's golden products ([`products`]).
pub struct Host;

impl Products for Host {
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
        products(w, xs, k)
    }
}

/// The fast path's numbers on the host ([`products_bf16`]): what a GPU's bf16 products compute, up to
/// the order of the f32 sums.
pub struct HostBf16;

impl Products for HostBf16 {
    fn products(&self, w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
        products_bf16(w, xs, k)
    }
}

/// The rows of `xs` (each `k` long) times the rows of `w` (each `k` long): `xs.len() / k` rows of
/// `w.len() / k` outputs, row-major. Each output is `dot(w_r, x_t)` (the golden kernels', which
/// have [`ctxscope_numerics::dot`]'s bits).
pub fn products(w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
    tiled(w, xs, k, false)
}

/// [`products`] of the weights and input rows rounded to bf16 (the fast path's products: bf16
/// operands, f32 sums). Each tile is rounded as it is taken, so no rounded copy of the model is kept.
pub fn products_bf16(w: &[f32], xs: &[f32], k: usize) -> Vec<f32> {
    let rounded: Vec<f32> = xs.iter().map(|&v| bf16(v)).collect();
    tiled(w, &rounded, k, true)
}

/// The tiled products, each tile's weight rows rounded to bf16 first when `round`.
fn tiled(w: &[f32], xs: &[f32], k: usize, round: bool) -> Vec<f32> {
    let (outs, n) = (w.len() / k.max(1), xs.len() / k.max(1));
    if n == 0 || outs == 0 {
        return Vec::new();
    }
    let tile = (TILE_BYTES / (4 * k)).max(1);
    // One tile's outputs, [t][row of the tile].
    let tile_products = |rows: Range<usize>| -> Vec<f32> {
        let rounded: Vec<f32>;
        let (w, rows) = if round {
            rounded = w[rows.start * k..rows.end * k].iter().map(|&v| bf16(v)).collect();
            (rounded.as_slice(), 0..rows.len())
        } else {
            (w, rows)
        };
        let mut part = vec![0f32; n * rows.len()];
        let mut block = vec![0f32; rows.len() * INPUT_BLOCK.min(n)];
        for start in (0..n).step_by(INPUT_BLOCK) {
            let tokens = start..(start + INPUT_BLOCK).min(n);
            let block = &mut block[..rows.len() * tokens.len()];
            golden::block_f32(w, k, xs, rows.clone(), tokens.clone(), block);
            for (i, values) in block.chunks(tokens.len()).enumerate() {
                for (j, v) in values.iter().enumerate() {
                    part[(start + j) * rows.len() + i] = *v;
                }
            }
        }
        part
    };
    let ranges: Vec<Range<usize>> = (0..outs).step_by(tile).map(|r| r..(r + tile).min(outs)).collect();
    let tiles: Vec<Vec<f32>> = if w.len() * n >= PARALLEL_MACS {
        ranges.par_iter().cloned().map(tile_products).collect()
    } else {
        ranges.iter().cloned().map(tile_products).collect()
    };
    let mut out = vec![0f32; n * outs];
    for (range, part) in ranges.iter().zip(&tiles) {
        for (t, values) in part.chunks_exact(range.len()).enumerate() {
            out[t * outs + range.start..][..range.len()].copy_from_slice(values);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxscope_numerics::dot;

    #[test]
    fn batched_and_threaded_products_keep_every_bit() {
        // Whole blocks of 32 (the AVX2 kernels) and not (the scalar dot).
        for cols in [1024, 1000] {
            let rows = PARALLEL_MACS / cols + 7;
            let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 2_654_435_761) % 1000) as f32 / 997.0 - 0.5).collect();
            for n in [1, 3, 17, INPUT_BLOCK + 6] {
                let xs: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.37).sin()).collect();
                let one_by_one: Vec<u32> = xs.chunks(cols).flat_map(|x| w.chunks(cols).map(move |row| dot(row, x).to_bits())).collect();
                let batched: Vec<u32> = products(&w, &xs, cols).iter().map(|v| v.to_bits()).collect();
                assert_eq!(batched.len(), n * rows);
                assert_eq!(batched, one_by_one, "{n} rows of {cols}");
            }
            assert!(products(&w, &[], cols).is_empty());
        }
    }

    #[test]
    fn bf16_products_are_the_products_of_rounded_operands() {
        let (rows, cols, n) = (PARALLEL_MACS / 512 + 3, 512, 5);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.011).cos() * 0.37).collect();
        let xs: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.29).sin()).collect();
        let round = |v: &[f32]| v.iter().map(|&x| bf16(x)).collect::<Vec<f32>>();
        let want: Vec<u32> = products(&round(&w), &round(&xs), cols).iter().map(|v| v.to_bits()).collect();
        let got: Vec<u32> = products_bf16(&w, &xs, cols).iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
        assert_ne!(got, products(&w, &xs, cols).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "rounding moved nothing");
    }
}
