//! The chained decode GEMVs (`gemv_chain_*`): a chain of five products in the SmolLM2-135M shape (a
//! layer's output projection, gate/up with its norm, down, the next layer's QKV with RoPE and the K/V
//! store, an output head with the final norm) against the same products launched one by one with
//! `gemv_stream`, which compute each unit the same way: every output and every cache row must match
//! bit for bit, at 1 and 3 token rows, bf16 and f32.

use ctxscope_kernels::cudarc::driver::{CudaSlice, DevicePtr};
use ctxscope_kernels::device::{ChainStep, Device, GemvMode, Matrix, RopeShape, StreamOp};

use crate::report::{exact, nan_buf, read, Report, Res, Row};
use crate::rng::Rng;

const EPS: f32 = 1e-5;
const POSITIONS: [i32; 3] = [5, 63, 17];

/// One set of activation buffers (and a K/V cache per row), filled from the same host values.
struct Buffers {
    att: CudaSlice<f32>,
    x: CudaSlice<f32>,
    act: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    caches: Vec<CudaSlice<f32>>,
}

pub(crate) fn check_chain(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let (dim, ffn, heads, kv_heads, hd, vocab, n_layers, capacity) = (576usize, 1536usize, 9usize, 3usize, 64usize, 4096usize, 2usize, 64usize);
    let (q_dim, kv_dim) = (heads * hd, kv_heads * hd);
    let qkv_rows = q_dim + 2 * kv_dim;
    let shape = RopeShape { n_layers, heads, kv_heads, head_dim: hd, base: 100_000.0, flags: 0, kv_scale: 1.0 };
    let host = [rng.vec(dim * dim, 0.04), rng.vec(2 * ffn * dim, 0.04), rng.vec(dim * ffn, 0.025), rng.vec(qkv_rows * dim, 0.04), rng.vec(vocab * dim, 0.04)];
    let (att0, x0) = (rng.vec(3 * dim, 1.0), rng.vec(3 * dim, 1.0));
    let norms = [s.clone_htod(&rng.vec(dim, 1.0))?, s.clone_htod(&rng.vec(dim, 1.0))?, s.clone_htod(&rng.vec(dim, 1.0))?];
    let positions = s.clone_htod(&POSITIONS)?;
    let buffers = || -> Res<Buffers> {
        Ok(Buffers {
            att: s.clone_htod(&att0)?,
            x: s.clone_htod(&x0)?,
            act: nan_buf(s, 3 * ffn)?,
            qkv: nan_buf(s, 3 * qkv_rows)?,
            logits: nan_buf(s, 3 * vocab)?,
            caches: (0..3).map(|_| nan_buf(s, capacity * n_layers * 2 * kv_dim)).collect::<Res<Vec<_>>>()?,
        })
    };
    for as_bf16 in [true, false] {
        let [wo, w_gu, w_down, wqkv, head] = [(0, dim, dim), (1, 2 * ffn, dim), (2, dim, ffn), (3, qkv_rows, dim), (4, vocab, dim)].map(|(i, r, c)| Matrix::upload(s, &host[i], r, c, as_bf16));
        let (wo, w_gu, w_down, wqkv, head) = (wo?, w_gu?, w_down?, wqkv?, head?);
        let mut row = Row::new(format!("gemv_chain {} 5 steps vs gemv_stream one by one (bit for bit)", if as_bf16 { "bf16" } else { "f32" }), 0.0);
        for n in [1usize, 3] {
            // One by one.
            let mut a = buffers()?;
            let bases_a = s.clone_htod(&a.caches.iter().map(|c| c.device_ptr(s).0).collect::<Vec<u64>>())?;
            let (g0, g1, g2) = (norms[0].as_view(), norms[1].as_view(), norms[2].as_view());
            dev.gemv_stream(&wo, &a.att.slice(..n * dim), &mut a.x.slice_mut(..n * dim), n, GemvMode::Accumulate, as_bf16, None)?;
            dev.gemv_stream(&w_gu, &a.x.slice(..n * dim), &mut a.act.slice_mut(..n * ffn), n, GemvMode::SwiGlu, as_bf16, Some((&g0, EPS)))?;
            dev.gemv_stream(&w_down, &a.act.slice(..n * ffn), &mut a.x.slice_mut(..n * dim), n, GemvMode::Accumulate, as_bf16, None)?;
            dev.gemv_stream_qkv_rope(&wqkv, &a.x.slice(..n * dim), &mut a.qkv.slice_mut(..n * qkv_rows), n, as_bf16, Some((&g1, EPS)), &positions.as_view(), &bases_a.as_view(), 1, &shape)?;
            dev.gemv_stream(&head, &a.x.slice(..n * dim), &mut a.logits.slice_mut(..n * vocab), n, GemvMode::Store, as_bf16, Some((&g2, EPS)))?;

            // Chained.
            let b = buffers()?;
            let bases_b = s.clone_htod(&b.caches.iter().map(|c| c.device_ptr(s).0).collect::<Vec<u64>>())?;
            let steps = [
                ChainStep { w: &wo, op: StreamOp::Gemv(GemvMode::Accumulate), x: &b.att, y: &b.x, norm: None, layer: 0 },
                ChainStep { w: &w_gu, op: StreamOp::Gemv(GemvMode::SwiGlu), x: &b.x, y: &b.act, norm: Some(&norms[0]), layer: 0 },
                ChainStep { w: &w_down, op: StreamOp::Gemv(GemvMode::Accumulate), x: &b.act, y: &b.x, norm: None, layer: 0 },
                ChainStep { w: &wqkv, op: StreamOp::QkvRope, x: &b.x, y: &b.qkv, norm: Some(&norms[1]), layer: 1 },
                ChainStep { w: &head, op: StreamOp::Gemv(GemvMode::Store), x: &b.x, y: &b.logits, norm: Some(&norms[2]), layer: 1 },
            ];
            let table = dev.chain_table(&steps, 3)?;
            let plan = dev.chain_plan(&table, n).ok_or("no chain plan")?;
            dev.gemv_chain(&table, 0, table.len(), n, as_bf16, EPS, &positions.as_view(), &bases_b.as_view(), &shape)?;
            rep.info.push(format!("gemv_chain {} n={n}: {} blocks, {} bytes of shared memory each", if as_bf16 { "bf16" } else { "f32" }, plan.blocks, plan.smem));

            let mut cmp = exact(&read(s, &b.x)?[..n * dim], &read(s, &a.x)?[..n * dim]);
            for (got, want, len) in [(&b.act, &a.act, n * ffn), (&b.qkv, &a.qkv, n * qkv_rows), (&b.logits, &a.logits, n * vocab)] {
                cmp = cmp.merge(exact(&read(s, got)?[..len], &read(s, want)?[..len]));
            }
            for (t, &pos) in POSITIONS.iter().enumerate().take(n) {
                let at = ((pos as usize * n_layers + 1) * 2) * kv_dim;
                let (got, want) = (read(s, &b.caches[t])?, read(s, &a.caches[t])?);
                cmp = cmp.merge(exact(&got[at..at + 2 * kv_dim], &want[at..at + 2 * kv_dim]));
            }
            row.add(&format!("n={n}"), cmp);
        }
        rep.rows.push(row);
    }
    Ok(())
}
