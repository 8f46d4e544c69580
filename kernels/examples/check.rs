//! Device check of the kernels: random inputs in the SmolLM2-135M shapes, each kernel on the GPU against
//! a plain CPU reference (f32, the statistics in f32 and RoPE angles in f64, as the CPU engine does),
//! a short table printed last. Build with `--features cuda`; run where a GPU is.

use ctxscope_kernels::blas::{Blas, Compute};
use ctxscope_kernels::device::{AttentionShape, Device};

/// A small deterministic generator (xorshift), values in [-scale, scale).
struct Rng(u64);

impl Rng {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
            })
            .collect()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    let abs = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let scale = a.iter().map(|x| x.abs()).fold(0.0, f32::max).max(1e-30);
    (abs, abs / scale)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = std::time::Instant::now();
    let device = Device::new(0)?;
    println!("device ready (NVRTC compile included) in {:.2} s", started.elapsed().as_secs_f64());
    let s = &device.stream;
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let (rows, dim, heads, head_dim, ffn) = (37, 576, 9, 64, 1536);
    let mut rows_out = Vec::new();

    // RMSNorm.
    let (x, w) = (rng.vec(rows * dim, 2.0), rng.vec(dim, 1.0));
    let mut want = vec![0f32; rows * dim];
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let scale = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / dim as f32 + 1e-5).sqrt();
        for i in 0..dim {
            want[r * dim + i] = row[i] * scale * w[i];
        }
    }
    let (dx, dw) = (s.clone_htod(&x)?, s.clone_htod(&w)?);
    let mut dout = s.alloc_zeros::<f32>(rows * dim)?;
    device.rmsnorm(&dx, &dw, &mut dout, rows, dim, 1e-5)?;
    rows_out.push(("rmsnorm_f32", rows * dim, max_diff(&want, &s.clone_dtoh(&dout)?)));

    // RoPE (adjacent pairs), positions 0..rows plus far ones.
    let q = rng.vec(rows * heads * head_dim, 1.0);
    let positions: Vec<i32> = (0..rows as i32).map(|p| if p % 5 == 0 { p * 211 } else { p }).collect();
    let mut want = q.clone();
    for (t, &pos) in positions.iter().enumerate() {
        for p in 0..heads * head_dim / 2 {
            let j = p % (head_dim / 2);
            let angle = pos as f64 * 100000f64.powf(-2.0 * j as f64 / head_dim as f64);
            let (c, sn) = (angle.cos() as f32, angle.sin() as f32);
            let i = t * heads * head_dim + 2 * p;
            let (a, b) = (q[i], q[i + 1]);
            want[i] = a * c - b * sn;
            want[i + 1] = a * sn + b * c;
        }
    }
    let mut dq = s.clone_htod(&q)?;
    let dpos = s.clone_htod(&positions)?;
    device.rope(&mut dq, &dpos, heads, head_dim, 100000.0)?;
    rows_out.push(("rope_f32", q.len(), max_diff(&want, &s.clone_dtoh(&dq)?)));

    // SwiGLU and the residual add.
    let (g, u) = (rng.vec(rows * ffn, 4.0), rng.vec(rows * ffn, 1.0));
    let want: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    let (dg, du) = (s.clone_htod(&g)?, s.clone_htod(&u)?);
    let mut dout = s.alloc_zeros::<f32>(g.len())?;
    device.swiglu(&dg, &du, &mut dout)?;
    rows_out.push(("swiglu_f32", g.len(), max_diff(&want, &s.clone_dtoh(&dout)?)));
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
    let mut dsum = s.clone_htod(&g)?;
    device.add(&mut dsum, &du)?;
    rows_out.push(("add_f32", g.len(), max_diff(&want, &s.clone_dtoh(&dsum)?)));

    // Attention: 5 new tokens over a 300-position cache (prefill tail), and 1 over 2000 (decode).
    for (tokens, len) in [(5usize, 300usize), (1, 2000)] {
        let kv_heads = 3;
        let (q, k, v) = (rng.vec(tokens * heads * head_dim, 1.0), rng.vec(len * kv_heads * head_dim, 1.0), rng.vec(len * kv_heads * head_dim, 1.0));
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut want = vec![0f32; q.len()];
        for t in 0..tokens {
            let pos = len - tokens + t;
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let qv = &q[(t * heads + h) * head_dim..][..head_dim];
                let scores: Vec<f32> = (0..=pos).map(|j| qv.iter().zip(&k[(j * kv_heads + kvh) * head_dim..][..head_dim]).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f32 = e.iter().sum();
                for d in 0..head_dim {
                    want[(t * heads + h) * head_dim + d] = (0..=pos).map(|j| e[j] * v[(j * kv_heads + kvh) * head_dim + d]).sum::<f32>() / total;
                }
            }
        }
        let (dq, dk, dv) = (s.clone_htod(&q)?, s.clone_htod(&k)?, s.clone_htod(&v)?);
        let mut dout = s.alloc_zeros::<f32>(q.len())?;
        device.attention(&dq, &dk, &dv, &mut dout, AttentionShape { tokens, len, heads, kv_heads, head_dim })?;
        let name = if tokens == 1 { "attention_f32 (decode, 2000)" } else { "attention_f32 (5 over 300)" };
        rows_out.push((name, q.len(), max_diff(&want, &s.clone_dtoh(&dout)?)));
    }

    // Embedding gather.
    let (vocab, ids) = (1000, vec![3i32, 999, 0, 3, 517]);
    let table = rng.vec(vocab * dim, 1.0);
    let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].to_vec()).collect();
    let (dt, di) = (s.clone_htod(&table)?, s.clone_htod(&ids)?);
    let mut dout = s.alloc_zeros::<f32>(ids.len() * dim)?;
    device.embed(&dt, &di, &mut dout, dim)?;
    rows_out.push(("embed_f32", want.len(), max_diff(&want, &s.clone_dtoh(&dout)?)));

    // GEMM through cuBLAS: the FFN up projection shape, 37 tokens; f32 and the bf16 fast mode.
    let blas = Blas::new(s.clone())?;
    let (rows, cols, n) = (ffn, dim, 37);
    let (w, x) = (rng.vec(rows * cols, 0.1), rng.vec(n * cols, 1.0));
    let mut want = vec![0f32; n * rows];
    for t in 0..n {
        for r in 0..rows {
            want[t * rows + r] = (0..cols).map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64).sum::<f64>() as f32;
        }
    }
    let (dw, dx) = (s.clone_htod(&w)?, s.clone_htod(&x)?);
    for (compute, name) in [(Compute::F32, "gemm 32F (cuBLAS)"), (Compute::F32Fast16Bf, "gemm 32F_FAST_16BF (cuBLAS)")] {
        let mut dy = s.alloc_zeros::<f32>(n * rows)?;
        blas.matmul(&dw, &dx, &mut dy, (rows, cols, n), compute)?;
        rows_out.push((name, n * rows, max_diff(&want, &s.clone_dtoh(&dy)?)));
    }

    println!("| kernel | elements | max abs diff vs CPU | relative |");
    println!("|---|---|---|---|");
    let mut worst = 0f32;
    for (name, n, (abs, rel)) in &rows_out {
        println!("| {name} | {n} | {abs:.2e} | {rel:.2e} |");
        // The bf16 mode is meant to differ (~1e-2 relative); it is reported, not held to f32.
        if !name.contains("16BF") {
            worst = worst.max(*rel);
        }
    }
    // f32 kernels against an f32 reference: differences are reduction order and fast intrinsics only.
    if worst > 1e-5 {
        return Err(format!("a kernel is off by {worst:.2e} relative").into());
    }
    Ok(())
}
