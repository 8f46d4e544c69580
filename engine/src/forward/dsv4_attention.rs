//! DeepSeek-V4's attention, golden f32, over a whole sequence or through a per-layer cache: the
//! sliding-window branch every layer has, and the heavily compressed blocks (HCA) some add. Queries
//! through a low-rank path (`wq_a`, weighted RMS norm, `wq_b`, then
//! an unweighted RMS norm per head), one shared key-and-value head (`wkv`, RMS norm), interleaved RoPE
//! on the trailing `rope_dim` channels of each head, a learned sink logit per head, the window of the
//! last `window` positions, RoPE undone on the output at the query's position, and the grouped
//! low-rank output projection (`wo_a` per group of heads, then `wo_b`). An HCA layer's compressor
//! turns each closed block of `rate` tokens into one more key-and-value entry (a per-channel softmax
//! of the gates, plus a per-slot bias, over the block; RMS norm; RoPE at the block's first position),
//! which a query sees once the block has closed by its position. A compressed sparse attention (CSA)
//! layer's entries each span two blocks (the previous block's first series and this block's second,
//! `2 * rate` slots in one softmax), and a lightning indexer (a smaller compressor of its own, queries
//! from the low-rank query path, a score `sum_h w_h * ReLU(q_h . k)`) keeps the `topk` closed entries
//! each query scores highest. As transformers' `DeepseekV4Attention`, `DeepseekV4HCACompressor`,
//! `DeepseekV4CSACompressor` and `DeepseekV4Indexer` compute them. The patches it consults
//! (`kv_fp8`, `indexer_fp8`, `index_topk`, `swa_window`) arrive as fields of the weights and shape.

use ctxscope_numerics::dot;
use ctxscope_numerics::round::{fp8_e4m3_blocks, fp8_scaled_slice};

use super::dsv4_products::Products;
use crate::model::deepseek_v4::{plain_inv_freq, AttentionKind, DeepseekV4Config, Yarn, MAX_ROPE_PAIRS};
use crate::patch::{INDEXER_FP8_BLOCK, KV_FP8_SCALE};

/// How an entry is stored once it is made: as computed, or rounded to FP8 e4m3 with the per-tensor
/// scale of `kv_fp8` or the per-block scale of `indexer_fp8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    #[default]
    F32,
    /// `kv_fp8`: x ≈ fp8(x / KV_FP8_SCALE) · KV_FP8_SCALE.
    Fp8Tensor,
    /// `indexer_fp8`: per block of [`INDEXER_FP8_BLOCK`] channels, scale amax/448.
    Fp8Blocks,
}

impl Storage {
    fn apply(self, entry: &mut [f32]) {
        match self {
            Storage::F32 => {}
            Storage::Fp8Tensor => fp8_scaled_slice(entry, KV_FP8_SCALE),
            Storage::Fp8Blocks => fp8_e4m3_blocks(entry, INDEXER_FP8_BLOCK),
        }
    }
}

/// One attention layer's weights (row-major, rows as the checkpoint stores them).
pub struct AttentionWeights<'a> {
    pub wq_a: &'a [f32],
    pub q_norm: &'a [f32],
    pub wq_b: &'a [f32],
    pub wkv: &'a [f32],
    pub kv_norm: &'a [f32],
    pub wo_a: &'a [f32],
    pub wo_b: &'a [f32],
    pub sinks: &'a [f32],
}

/// A heavily compressed attention layer's compressor.
pub struct Compressor<'a> {
    pub wkv: &'a [f32],
    pub wgate: &'a [f32],
    /// `rate` rows of per-slot gate biases (`ape`).
    pub ape: &'a [f32],
    pub norm: &'a [f32],
    pub rate: usize,
    /// How each entry is stored once made (after its norm and RoPE).
    pub storage: Storage,
}

/// A compressed sparse attention layer's lightning indexer.
pub struct Indexer<'a> {
    /// Its compressor (two series of `head_dim` channels, like the layer's own).
    pub compressor: Compressor<'a>,
    pub wq_b: &'a [f32],
    pub weights_proj: &'a [f32],
    pub heads: usize,
    pub head_dim: usize,
    /// Entries kept per query (`index_topk`, or the `index_topk` patch).
    pub topk: usize,
    /// `indexer_fp8`: each query head rounded per block as its keys are (their compressor's storage).
    pub fp8: bool,
}

/// The attention's shape and constants.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub o_groups: usize,
    /// Raw entries a query sees (`sliding_window`, or the `swa_window` patch).
    pub window: usize,
    pub rope: RopeTable,
    pub eps: f32,
    /// `kv_fp8`: each raw entry stored as [`Storage::Fp8Tensor`] once projected.
    pub kv_fp8: bool,
}

impl AttentionShape {
    /// A layer of `kind` in model `c`: sliding layers turn by the main RoPE base, compressed ones
    /// (and their blocks) by the compress one.
    pub fn for_layer(c: &DeepseekV4Config, kind: AttentionKind) -> AttentionShape {
        let rope = match kind {
            AttentionKind::Sliding => RopeTable::plain(c.rope_theta, c.rope_dim),
            _ => match &c.compress_yarn {
                Some(yarn) => RopeTable::yarn(yarn, c.compress_rope_theta, c.rope_dim),
                None => RopeTable::plain(c.compress_rope_theta, c.rope_dim),
            },
        };
        AttentionShape {
            heads: c.num_heads,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            o_groups: c.o_groups,
            window: c.sliding_window,
            rope,
            eps: c.rms_norm_eps,
            kv_fp8: false,
        }
    }
}

/// RMS norm of `x`, times `weight` when given (transformers' `DeepseekV4RMSNorm` and
/// `DeepseekV4UnweightedRMSNorm`).
pub(super) fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let scale = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt();
    match weight {
        Some(w) => x.iter().zip(w).map(|(v, w)| w * (v * scale)).collect(),
        None => x.iter().map(|v| v * scale).collect(),
    }
}

/// The frequency of each RoPE pair and the scale on cos and sin (1 but under YaRN), fixed per layer.
#[derive(Debug, Clone, Copy)]
pub struct RopeTable {
    inv_freq: [f32; MAX_ROPE_PAIRS],
    scale: f32,
}

impl RopeTable {
    /// Plain RoPE at base `theta` over `dim` channels: `1 / theta^(2i / dim)` in f32, as transformers.
    pub fn plain(theta: f64, dim: usize) -> RopeTable {
        Self::from_freqs(plain_inv_freq(theta, dim).into_iter(), 1.0)
    }

    /// YaRN-scaled RoPE (DeepSeek-V4's compressed layers).
    pub fn yarn(yarn: &Yarn, theta: f64, dim: usize) -> RopeTable {
        Self::from_freqs(yarn.inv_freq(theta, dim).into_iter(), yarn.attention_factor as f32)
    }

    fn from_freqs(freqs: impl Iterator<Item = f32>, scale: f32) -> RopeTable {
        let mut inv_freq = [0.0; MAX_ROPE_PAIRS];
        // The config check keeps the RoPE part within MAX_ROPE_PAIRS pairs.
        inv_freq.iter_mut().zip(freqs).for_each(|(slot, f)| *slot = f);
        RopeTable { inv_freq, scale }
    }
}

/// Turns the trailing `rope_dim` channels of `head` by position `pos` (interleaved pairs), or back
/// when `inverse` (transformers' conjugate: the same scaled cos, the sine negated).
fn rope(head: &mut [f32], pos: usize, s: &AttentionShape, inverse: bool) {
    let start = head.len() - s.rope_dim;
    for (i, pair) in head[start..].chunks_mut(2).enumerate() {
        let angle = pos as f32 * s.rope.inv_freq[i];
        let (cos, sin) = (angle.cos() * s.rope.scale, angle.sin() * s.rope.scale);
        let sin = if inverse { -sin } else { sin };
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * cos - b * sin;
        pair[1] = b * cos + a * sin;
    }
}

/// One row's projection through a compressor: its kv and its gate plus its slot's bias, each
/// `series * hd` wide.
#[derive(Clone)]
struct Projection {
    kv: Vec<f32>,
    gate: Vec<f32>,
}

/// A compressor's state: the projected rows of the blocks still needed (the last closed one, whose
/// first series the next overlapping entry takes, and the open one) and the entries made so far.
#[derive(Default, Clone)]
struct Blocks {
    rows: Vec<Projection>,
    entries: Vec<Vec<f32>>,
}

impl Blocks {
    /// Takes rows at positions `pos0..` (after every earlier position), as `c.wkv` and `c.wgate`
    /// project them (`kvs`, `gates`), and makes one entry of `hd` channels for every block of `c.rate`
    /// rows that closes among them. With `overlap` (CSA) each row projects to two series of `hd`;
    /// without (HCA), to one.
    #[allow(clippy::too_many_arguments)]
    fn extend(&mut self, kvs: &[f32], gates: &[f32], pos0: usize, c: &Compressor<'_>, hd: usize, overlap: bool, s: &AttentionShape) {
        let series = if overlap { 2 * hd } else { hd };
        let first = pos0 - self.rows.len();
        for (i, (kv, gate)) in kvs.chunks(series).zip(gates.chunks(series)).enumerate() {
            let pos = pos0 + i;
            let bias = &c.ape[(pos % c.rate) * series..][..series];
            self.rows.push(Projection { kv: kv.to_vec(), gate: gate.iter().zip(bias).map(|(g, b)| g + b).collect() });
            if (pos + 1).is_multiple_of(c.rate) {
                let b = pos / c.rate;
                let own = b * c.rate - first;
                let previous = (overlap && b > 0).then(|| &self.rows[own - c.rate..own]);
                let entry = compress_block(previous, &self.rows[own..own + c.rate], b, c, hd, overlap, s);
                self.entries.push(entry);
            }
        }
        // Keep the last closed block's rows and the open block's.
        let end = pos0 + kvs.len() / series;
        let keep_from = (end / c.rate).saturating_sub(1) * c.rate;
        self.rows.drain(..keep_from.saturating_sub(first).min(self.rows.len()));
    }
}

/// Entry `b` from its block's projected rows (and, with `overlap`, the previous block's): channel by
/// channel, a softmax of the gates over the slots weighting the kv values (with `overlap`, the
/// previous block's first series and this block's second, `2 * rate` slots; without, this block's
/// one series), then RMS norm and RoPE at the block's first position.
fn compress_block(
    previous: Option<&[Projection]>,
    own: &[Projection],
    b: usize,
    c: &Compressor<'_>,
    hd: usize,
    overlap: bool,
    s: &AttentionShape,
) -> Vec<f32> {
    // (kv, gate) slices of hd channels taking part in the entry.
    let mut slots: Vec<(&[f32], &[f32])> = previous.into_iter().flatten().map(|p| (&p.kv[..hd], &p.gate[..hd])).collect();
    let range = if overlap { hd..2 * hd } else { 0..hd };
    slots.extend(own.iter().map(|p| (&p.kv[range.clone()], &p.gate[range.clone()])));
    let mut entry = vec![0f32; hd];
    for (ch, e) in entry.iter_mut().enumerate() {
        let max = slots.iter().map(|(_, g)| g[ch]).fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = slots.iter().map(|(_, g)| (g[ch] - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        *e = exps.iter().zip(&slots).map(|(p, (kv, _))| p / sum * kv[ch]).sum();
    }
    let mut entry = rms_norm(&entry, Some(c.norm), s.eps);
    rope(&mut entry, b * c.rate, s, false);
    c.storage.apply(&mut entry);
    entry
}

/// The closed entries the indexer keeps for the query at `t` (`q`: its indexer query before RoPE,
/// `weights`: `weights_proj` times its input): the `topk` highest `sum_h w_h * ReLU(q_h . k) /
/// sqrt(head_dim)`, `w = weights / sqrt(heads)`; ties (exact zeros from ReLU) to the lower index.
fn select(
    t: usize,
    mut q: Vec<f32>,
    weights: &[f32],
    keys: &[Vec<f32>],
    closed: usize,
    ix: &Indexer<'_>,
    s: &AttentionShape,
) -> Vec<usize> {
    for head in q.chunks_mut(ix.head_dim) {
        rope(head, t, s, false);
        if ix.fp8 {
            fp8_e4m3_blocks(head, INDEXER_FP8_BLOCK);
        }
    }
    let weights: Vec<f32> = weights.iter().map(|w| w * (ix.heads as f32).powf(-0.5)).collect();
    let scale = (ix.head_dim as f32).powf(-0.5);
    let scores: Vec<f32> =
        keys[..closed].iter().map(|k| q.chunks(ix.head_dim).zip(&weights).map(|(qh, w)| dot(qh, k).max(0.0) * scale * w).sum()).collect();
    let mut order: Vec<usize> = (0..closed).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(ix.topk);
    order
}

/// What a layer attends to beside its window.
pub enum Long<'a> {
    /// Nothing (`sliding_attention`).
    None,
    /// Every closed block (`heavily_compressed_attention`).
    Heavy(Compressor<'a>),
    /// The closed overlapping entries the indexer keeps (`compressed_sparse_attention`).
    Sparse(Compressor<'a>, Indexer<'a>),
}

/// The sliding-window attention of `x` (`seq` rows of the model width, at positions `0..seq`).
pub fn sliding_attention(p: &dyn Products, x: &[f32], width: usize, w: &AttentionWeights<'_>, s: &AttentionShape) -> Vec<f32> {
    attention(p, x, width, w, s, &Long::None)
}

/// A layer's attention of `x` (`seq` rows of the model width, at positions `0..seq`): the window
/// plus what `long` adds. The same computation as feeding the rows through a fresh [`LayerCache`].
pub fn attention(p: &dyn Products, x: &[f32], width: usize, w: &AttentionWeights<'_>, s: &AttentionShape, long: &Long<'_>) -> Vec<f32> {
    LayerCache::default().extend(p, x, width, 0, w, s, long)
}

/// The projections of a chunk of rows: queries (RoPE'd, per-head normed), low-rank queries and
/// key-and-value entries (RoPE'd, stored as `kv_fp8` says).
struct Projected {
    q: Vec<f32>,
    /// The indexer's queries (CSA layers), before RoPE.
    index_q: Option<Vec<f32>>,
    kv: Vec<Vec<f32>>,
}

/// The projections of `n` rows from their `wq_a` and `wkv` products (`a`, `kv`); with `index_wq_b`,
/// also the indexer's queries (from the same low-rank queries, in the same call as `wq_b`).
#[allow(clippy::too_many_arguments)]
fn project(
    p: &dyn Products,
    a: &[f32],
    kv: &[f32],
    n: usize,
    pos0: usize,
    w: &AttentionWeights<'_>,
    s: &AttentionShape,
    index_wq_b: Option<&[f32]>,
) -> Projected {
    let rank = a.len() / n;
    let q_res: Vec<f32> = a.chunks(rank).flat_map(|a| rms_norm(a, Some(w.q_norm), s.eps)).collect();
    let matrices: Vec<&[f32]> = std::iter::once(w.wq_b).chain(index_wq_b).collect();
    let mut queries = p.products_of(&matrices, &q_res, rank).into_iter();
    let mut q = queries.next().expect("wq_b's product");
    let index_q = queries.next();
    let per_row = q.len() / n;
    for (i, row) in q.chunks_mut(per_row).enumerate() {
        for head in row.chunks_mut(s.head_dim) {
            let normed = rms_norm(head, None, s.eps);
            head.copy_from_slice(&normed);
            rope(head, pos0 + i, s, false);
        }
    }
    let kv = kv
        .chunks(kv.len() / n)
        .enumerate()
        .map(|(i, raw)| {
            let mut kv = rms_norm(raw, Some(w.kv_norm), s.eps);
            rope(&mut kv, pos0 + i, s, false);
            if s.kv_fp8 {
                Storage::Fp8Tensor.apply(&mut kv);
            }
            kv
        })
        .collect();
    Projected { q, index_q, kv }
}

/// The heads' outputs at position `t` (query `q`): attention over the `window` raw entries and the
/// `picked` compressed ones, the sink in the softmax, RoPE undone.
fn attend<'k>(
    t: usize,
    q: &[f32],
    window: &'k [Vec<f32>],
    picked: impl Iterator<Item = &'k [f32]>,
    sinks: &[f32],
    s: &AttentionShape,
) -> Vec<f32> {
    let hd = s.head_dim;
    let keys: Vec<&[f32]> = window.iter().map(Vec::as_slice).chain(picked).collect();
    let scale = (hd as f32).powf(-0.5);
    let mut heads = vec![0f32; s.heads * hd];
    // Each head alone; on the thread pool when the keys are many (a decoded token's one position).
    let head = |(h, (qh, oh)): (usize, (&[f32], &mut [f32]))| {
        let logits: Vec<f32> = keys.iter().map(|k| dot(qh, k) * scale).collect();
        // The sink joins the softmax and takes its share, then is dropped.
        let max = logits.iter().copied().fold(sinks[h], f32::max);
        let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f32 = exps.iter().sum::<f32>() + (sinks[h] - max).exp();
        for (e, k) in exps.iter().zip(&keys) {
            let p = e / total;
            for (o, v) in oh.iter_mut().zip(k.iter()) {
                *o += p * v;
            }
        }
        rope(oh, t, s, true);
    };
    if keys.len() * q.len() >= PARALLEL_ATTEND {
        use rayon::prelude::*;
        q.par_chunks(hd).zip(heads.par_chunks_mut(hd)).enumerate().for_each(head);
    } else {
        q.chunks(hd).zip(heads.chunks_mut(hd)).enumerate().for_each(head);
    }
    heads
}

/// Multiply-adds (keys times query width) from which one position's heads are attended on the
/// thread pool.
const PARALLEL_ATTEND: usize = 1 << 16;

/// Each group's block of `wo_a` rows and its input width (the group's heads side by side).
pub fn wo_a_groups<'a>(wo_a: &'a [f32], s: &AttentionShape) -> impl Iterator<Item = (&'a [f32], usize)> {
    let group_in = s.heads * s.head_dim / s.o_groups;
    wo_a.chunks(wo_a.len() / s.o_groups).map(move |block| (block, group_in))
}

/// The grouped low-rank output projection of `n` rows of heads: each group of heads through its
/// block of `wo_a` rows, the groups' outputs side by side through `wo_b`.
fn output_projection(p: &dyn Products, heads: &[f32], n: usize, w: &AttentionWeights<'_>, s: &AttentionShape) -> Vec<f32> {
    let (all, group_in) = (s.heads * s.head_dim, s.heads * s.head_dim / s.o_groups);
    let rank = w.wo_a.len() / s.o_groups / group_in;
    let inputs: Vec<Vec<f32>> =
        (0..s.o_groups).map(|g| heads.chunks(all).flat_map(|h| &h[g * group_in..(g + 1) * group_in]).copied().collect()).collect();
    let jobs: Vec<(&[f32], &[f32])> = wo_a_groups(w.wo_a, s).zip(&inputs).map(|((block, _), x)| (block, x.as_slice())).collect();
    let per_group = p.products_each(&jobs, group_in);
    let low: Vec<f32> = (0..n).flat_map(|t| per_group.iter().flat_map(move |p| &p[t * rank..(t + 1) * rank])).copied().collect();
    p.products(w.wo_b, &low, s.o_groups * rank)
}

/// One layer's attention state: the window's raw entries (at most `window`, oldest first) and each
/// compressor's rows still needed and entries (the layer's own, and the indexer's keys).
#[derive(Default, Clone)]
pub struct LayerCache {
    window: Vec<Vec<f32>>,
    blocks: Blocks,
    index: Blocks,
}

impl LayerCache {
    /// The attention outputs of `x` (rows of `width` at positions `pos0..`), after every earlier
    /// position went through this cache in order; the cache moves on past them. The rows' products
    /// are taken together and their positions attended on the thread pool, each exactly as one row
    /// at a time would be.
    #[allow(clippy::too_many_arguments)]
    pub fn extend(
        &mut self,
        products: &dyn Products,
        x: &[f32],
        width: usize,
        pos0: usize,
        w: &AttentionWeights<'_>,
        s: &AttentionShape,
        long: &Long<'_>,
    ) -> Vec<f32> {
        use rayon::prelude::*;
        let n = x.len() / width;
        // Every product of the rows themselves in one call: the queries' and entries' projections,
        // each compressor's, and the indexer's head weights.
        let (compressors, indexer): (Vec<&Compressor<'_>>, _) = match long {
            Long::None => (vec![], None),
            Long::Heavy(c) => (vec![c], None),
            Long::Sparse(c, ix) => (vec![c, &ix.compressor], Some(ix)),
        };
        let matrices: Vec<&[f32]> = [w.wq_a, w.wkv]
            .into_iter()
            .chain(compressors.iter().flat_map(|c| [c.wkv, c.wgate]))
            .chain(indexer.map(|ix| ix.weights_proj))
            .collect();
        let mut outputs = products.products_of(&matrices, x, width).into_iter();
        let mut next = || outputs.next().expect("one output per matrix");
        let (a, kv) = (next(), next());
        match long {
            Long::None => {}
            Long::Heavy(c) => self.blocks.extend(&next(), &next(), pos0, c, s.head_dim, false, s),
            Long::Sparse(c, ix) => {
                self.blocks.extend(&next(), &next(), pos0, c, s.head_dim, true, s);
                self.index.extend(&next(), &next(), pos0, &ix.compressor, ix.head_dim, true, s);
            }
        }
        let index_weights = indexer.map(|_| next());
        let mut p = project(products, &a, &kv, n, pos0, w, s, indexer.map(|ix| ix.wq_b));
        let rate = compressors.first().map_or(usize::MAX, |c| c.rate);
        // The indexer's queries and head weights, before RoPE.
        let index = match (indexer, p.index_q.take(), index_weights) {
            (Some(ix), Some(queries), Some(weights)) => Some((queries, weights, ix)),
            _ => None,
        };
        let before = self.window.len();
        self.window.append(&mut p.kv);
        let (window, blocks, keys) = (&self.window, &self.blocks.entries, &self.index.entries);
        let q_width = p.q.len() / n;
        let heads: Vec<Vec<f32>> = (0..n)
            .into_par_iter()
            .map(|i| {
                let (t, at) = (pos0 + i, before + i);
                let seen = &window[(at + 1).saturating_sub(s.window)..=at];
                let closed = ((t + 1) / rate).min(blocks.len());
                let q = &p.q[i * q_width..(i + 1) * q_width];
                match &index {
                    Some((queries, weights, ix)) => {
                        let (qw, ww) = (queries.len() / n, weights.len() / n);
                        let query = queries[i * qw..(i + 1) * qw].to_vec();
                        let picked = select(t, query, &weights[i * ww..(i + 1) * ww], keys, closed, ix, s);
                        attend(t, q, seen, picked.iter().map(|&b| blocks[b].as_slice()), w.sinks, s)
                    }
                    None => attend(t, q, seen, blocks[..closed].iter().map(Vec::as_slice), w.sinks, s),
                }
            })
            .collect();
        self.window.drain(..self.window.len().saturating_sub(s.window));
        output_projection(products, &heads.concat(), n, w, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::dsv4_products::Host;
    use crate::forward::testutil::tiny::{self, floats};

    fn check(fixture_name: &str) {
        let (fixture, c, st) = (tiny::json(fixture_name), tiny::config(), tiny::tensors());
        let layer = fixture["layer"].as_u64().unwrap() as usize;
        let t = |name: &str| st.f32(&format!("model.layers.{layer}.attn.{name}")).unwrap();
        let (wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sinks) = (
            t("wq_a.weight"),
            t("q_norm.weight"),
            t("wq_b.weight"),
            t("wkv.weight"),
            t("norm.weight"),
            t("wo_a.weight"),
            t("wo_b.weight"),
            t("attn_sink"),
        );
        let w = AttentionWeights {
            wq_a: &wq_a,
            q_norm: &q_norm,
            wq_b: &wq_b,
            wkv: &wkv,
            kv_norm: &kv_norm,
            wo_a: &wo_a,
            wo_b: &wo_b,
            sinks: &sinks,
        };
        let kind = c.layers[layer].0;
        let s = AttentionShape::for_layer(&c, kind);
        let x = floats(&fixture["x_normed"]);
        // Compressor tensors, read once and kept for the borrow.
        let names = ["compressor", "indexer.compressor"];
        let owned: Vec<[Vec<f32>; 4]> = names
            .iter()
            .map(|p| {
                ["wkv.weight", "wgate.weight", "ape", "norm.weight"]
                    .map(|n| st.f32(&format!("model.layers.{layer}.attn.{p}.{n}")).unwrap_or_default())
            })
            .collect();
        let compressor = |prefix: &str, rate: usize| {
            let [wkv, wgate, ape, norm] = &owned[names.iter().position(|p| *p == prefix).unwrap()];
            Compressor { wkv, wgate, ape, norm, rate, storage: Storage::F32 }
        };
        let ours = match kind {
            AttentionKind::Sliding => sliding_attention(&Host, &x, c.hidden_size, &w, &s),
            AttentionKind::HeavilyCompressed => {
                let comp = compressor("compressor", c.hca_rate);
                attention(&Host, &x, c.hidden_size, &w, &s, &Long::Heavy(comp))
            }
            AttentionKind::CompressedSparse => {
                let (iwq_b, iweights) = (t("indexer.wq_b.weight"), t("indexer.weights_proj.weight"));
                let ix = Indexer {
                    compressor: compressor("indexer.compressor", c.csa_rate),
                    wq_b: &iwq_b,
                    weights_proj: &iweights,
                    heads: c.index_heads,
                    head_dim: c.index_head_dim,
                    topk: c.index_topk,
                    fp8: false,
                };
                attention(&Host, &x, c.hidden_size, &w, &s, &Long::Sparse(compressor("compressor", c.csa_rate), ix))
            }
        };
        let reference = floats(&fixture["out"]);
        let rows = reference.len() / c.hidden_size;
        for (i, (a, b)) in ours.chunks(c.hidden_size).zip(reference.chunks(c.hidden_size)).enumerate() {
            let err = tiny::rel_l2(a, b);
            assert!(err < 1e-5, "{fixture_name}: position {i} of {rows}: rel L2 {err:e}");
        }
        eprintln!("{fixture_name}: rel L2 {:.1e} against transformers", tiny::rel_l2(&ours, &reference));
    }

    #[test]
    fn sliding_layer_matches_transformers_on_the_tiny_checkpoint() {
        check("attention_sliding.json");
    }

    #[test]
    fn heavily_compressed_layer_matches_transformers_on_the_tiny_checkpoint() {
        check("attention_hca.json");
    }

    #[test]
    fn compressed_sparse_layer_matches_transformers_on_the_tiny_checkpoint() {
        check("attention_csa.json");
    }
}
