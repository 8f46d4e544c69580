//! rope_kv: q rotated in place, K (rotated) and V written to per-row KV caches, in f32 or FP8 with a
//! per-tensor scale, with f64 or bf16 RoPE tables; every cache value no row points at must stay poison.

use ctxscope_kernels::cudarc::driver::DevicePtr;
use ctxscope_kernels::device::{Device, RopeShape};

use crate::reference::{bf16, fp8_scaled};
use crate::report::{compare, exact, read, to_f64, Report, Res, TAIL};
use crate::rng::Rng;

/// cos and sin of one RoPE angle as rope_kv computes them: angle in f64, or under rope_bf16 position,
/// inverse frequency and angle rounded to bf16 and cos/sin of it (in f64) rounded to bf16.
fn rope_trig(pos: i32, inv: f64, bf16_tables: bool) -> (f32, f32) {
    if bf16_tables {
        let theta = bf16(bf16(pos as f32) * bf16(inv as f32));
        (bf16(f64::from(theta).cos() as f32), bf16(f64::from(theta).sin() as f32))
    } else {
        let theta = f64::from(pos) * inv;
        (theta.cos() as f32, theta.sin() as f32)
    }
}

/// Whether `got` is the FP8 rounding of an f32 computation whose exact value is `exact` within
/// `tol` (either side of a rounding boundary: the kernel may contract the multiply-adds into FMAs).
fn fp8_accepts(got: f32, exact: f64, tol: f64, scale: f32) -> bool {
    got == fp8_scaled((exact - tol) as f32, scale)
        || got == fp8_scaled((exact + tol) as f32, scale)
        || got == fp8_scaled(exact as f32, scale)
}

struct RopeCase {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    n_layers: usize,
    layer: usize,
    base: f32,
    buffers: usize,
}

pub(crate) fn check_rope_kv(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    // Distinct positions (rows sharing a cache must not share a position), some past 4000.
    let positions: Vec<i32> = vec![0, 1, 7, 31, 100, 1023, 2047, 4000, 4001, 4097];
    let n = positions.len();
    let capacity = 4100usize;
    let cases = [
        RopeCase { heads: 9, kv_heads: 3, hd: 64, n_layers: 3, layer: 2, base: 100_000.0, buffers: 3 },
        RopeCase { heads: 32, kv_heads: 8, hd: 128, n_layers: 2, layer: 1, base: 500_000.0, buffers: 2 },
    ];
    let dpos = s.clone_htod(&positions)?;
    for c in cases {
        let (q_dim, kv_dim, hd, half) = (c.heads * c.hd, c.kv_heads * c.hd, c.hd, c.hd / 2);
        let row_len = q_dim + 2 * kv_dim;
        let buffer_of = |t: usize| t % c.buffers;
        let off = |pos: usize, kind: usize| ((pos * c.n_layers + c.layer) * 2 + kind) * kv_dim;
        let poison = vec![f32::NAN; capacity * c.n_layers * 2 * kv_dim];
        let inv: Vec<f64> = (0..half).map(|j| f64::from(c.base).powf(-2.0 * j as f64 / hd as f64)).collect();
        for (flags, kv_scale) in [(0, 1.0f32), (1, 1.0), (2, 1.0), (2, 0.5), (3, 0.5)] {
            let mut qkv = rng.vec(n * row_len, 2.0);
            // Row 0 sits at position 0 (no rotation): FP8 edge cases in its K and V — past ±448
            // (saturating), a tie, values under the subnormal step.
            qkv[q_dim..q_dim + 2].copy_from_slice(&[300.0, -0.001]);
            let v0 = q_dim + kv_dim;
            qkv[v0..v0 + 6].copy_from_slice(&[500.0, -1000.0, 1e-3, 2f32.powi(-10), 3.0 * 2f32.powi(-10), 1.0625]);
            let mut dqkv = s.clone_htod(&[qkv.as_slice(), &[f32::NAN; TAIL]].concat())?;
            let caches = (0..c.buffers).map(|_| s.clone_htod(&poison)).collect::<Result<Vec<_>, _>>()?;
            let bases: Vec<u64> = (0..n).map(|t| caches[buffer_of(t)].device_ptr(s).0).collect();
            let dbase = s.clone_htod(&bases)?;
            let shape =
                RopeShape { n_layers: c.n_layers, heads: c.heads, kv_heads: c.kv_heads, head_dim: hd, base: c.base, flags, kv_scale };
            dev.rope_kv(&mut dqkv.as_view_mut(), &dpos.as_view(), &dbase.as_view(), n, c.layer, &shape)?;
            let got_qkv = read(s, &dqkv)?;
            let got_caches = caches.iter().map(|b| read(s, b)).collect::<Res<Vec<_>>>()?;

            // Reference: q rotated in place (k and v of the row untouched), K rotated (exact value and
            // its f32 error bound), V as is.
            let mut want_qkv = to_f64(&qkv);
            let (mut k_exact, mut k_tol) = (vec![0f64; n * kv_dim], vec![0f64; n * kv_dim]);
            for t in 0..n {
                let row = &qkv[t * row_len..(t + 1) * row_len];
                for p in 0..(q_dim + kv_dim) / 2 {
                    let (cs, sn) = rope_trig(positions[t], inv[p % half], flags & 1 != 0);
                    let (cs, sn) = (f64::from(cs), f64::from(sn));
                    let (a, b) = (f64::from(row[2 * p]), f64::from(row[2 * p + 1]));
                    let (ra, rb) = (a * cs - b * sn, a * sn + b * cs);
                    if 2 * p < q_dim {
                        want_qkv[t * row_len + 2 * p] = ra;
                        want_qkv[t * row_len + 2 * p + 1] = rb;
                    } else {
                        let i = t * kv_dim + 2 * p - q_dim;
                        let eps = 2.0 * f64::from(f32::EPSILON);
                        k_exact[i] = ra;
                        k_exact[i + 1] = rb;
                        k_tol[i] = eps * ((a * cs).abs() + (b * sn).abs());
                        k_tol[i + 1] = eps * ((a * sn).abs() + (b * cs).abs());
                    }
                }
            }
            let q_cmp = compare(&got_qkv[..n * row_len], &want_qkv).tail(&got_qkv[n * row_len..]);

            // What the caches hold at each row's position and layer; everything else must be poison.
            let (mut got_k, mut got_v, mut want_v) = (Vec::new(), Vec::new(), Vec::new());
            for t in 0..n {
                let (cache, pos) = (&got_caches[buffer_of(t)], positions[t] as usize);
                got_k.extend_from_slice(&cache[off(pos, 0)..off(pos, 0) + kv_dim]);
                got_v.extend_from_slice(&cache[off(pos, 1)..off(pos, 1) + kv_dim]);
                let v = &qkv[t * row_len + q_dim + kv_dim..(t + 1) * row_len];
                want_v.extend(v.iter().map(|&x| if flags & 2 != 0 { fp8_scaled(x, kv_scale) } else { x }));
            }
            let mut stray = 0;
            for (b, cache) in got_caches.iter().enumerate() {
                let written: usize = (0..n)
                    .filter(|&t| buffer_of(t) == b)
                    .map(|t| {
                        cache[off(positions[t] as usize, 0)..off(positions[t] as usize, 0) + 2 * kv_dim]
                            .iter()
                            .filter(|v| !v.is_nan())
                            .count()
                    })
                    .sum();
                stray += cache.iter().filter(|v| !v.is_nan()).count() - written;
            }
            let k_cmp = if flags & 2 != 0 {
                let mut rejected = 0;
                let want: Vec<f64> = (0..n * kv_dim)
                    .map(|i| {
                        if got_k[i].is_finite() && fp8_accepts(got_k[i], k_exact[i], k_tol[i], kv_scale) {
                            f64::from(got_k[i])
                        } else {
                            rejected += usize::from(got_k[i].is_finite());
                            f64::from(fp8_scaled(k_exact[i] as f32, kv_scale))
                        }
                    })
                    .collect();
                compare(&got_k, &want).flag(rejected, "K not the FP8 of the rotation")
            } else {
                compare(&got_k, &k_exact)
            };
            let v_cmp = exact(&got_v, &want_v);
            let name = format!("rope_kv h{}/{} hd{} L{}/{} flags={flags} s={kv_scale}", c.heads, c.kv_heads, hd, c.layer, c.n_layers);
            let label = format!("q {:.1e}, K {:.1e}, V {:.1e}", q_cmp.rel, k_cmp.rel, v_cmp.rel);
            rep.single(name, 1e-6, q_cmp.merge(k_cmp).merge(v_cmp).flag(stray, "cache values written where no row points"));
            if let Some(row) = rep.rows.last_mut() {
                row.worst = label;
            }
        }
    }
    Ok(())
}
