//! The portable kernel: the AVX2 kernel's arithmetic written lane by lane, so both give the same
//! bits. Each of the 8 lanes holds the integer dot of 4 consecutive elements of a block, converted
//! to f32 and accumulated with a fused multiply-add by d_w * d_x; see the parent module for the order.

use super::quantize::{QuantRows, BLOCK};
use super::{Format, Q4_0, Q4_1, Q8_0};
use ctxscope_formats::gguf::f16_to_f32;

/// `out[r][t] = W[r] . x[t0 + t]` for the `R` weight rows `rows` (their quantized bytes).
pub fn tile<const F: Format, const R: usize, const T: usize>(rows: [&[u8]; R], acts: &QuantRows, t0: usize) -> [[f32; T]; R] {
    let nb = acts.nb;
    let mut acc = [[[0f32; 8]; T]; R];
    let mut summs = [[0f32; T]; R];
    let mut wq = [0i32; BLOCK];
    for b in 0..nb {
        for r in 0..R {
            let (dw, mw) = weight_block::<F>(rows[r], b, &mut wq);
            for t in 0..T {
                let y = acts.block(t0 + t, b);
                let dd = dw * acts.d[(t0 + t) * nb + b];
                for (k, lane) in acc[r][t].iter_mut().enumerate() {
                    let l: i32 = (4 * k..4 * k + 4).map(|j| wq[j] * y[j] as i32).sum();
                    *lane = dd.mul_add(l as f32, *lane);
                }
                if F == Q4_1 {
                    summs[r][t] += mw * acts.s[(t0 + t) * nb + b];
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum8(&acc[r][t]);
            if F == Q4_1 {
                out[r][t] += summs[r][t];
            }
        }
    }
    out
}

/// ggml's `hsum_float_8`: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
pub fn hsum8(a: &[f32; 8]) -> f32 {
    let h = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// Block `b` of a weight row: its 32 quants as integers (Q4_1 unsigned 0..15, Q4_0 q-8, Q8_0 as
/// stored), its scale d and (Q4_1) min m.
pub fn weight_block<const F: Format>(row: &[u8], b: usize, q: &mut [i32; BLOCK]) -> (f32, f32) {
    let half = |at: usize| f16_to_f32(u16::from_le_bytes([row[at], row[at + 1]]));
    match F {
        Q4_1 => {
            let at = b * 20;
            for (j, byte) in row[at + 4..at + 20].iter().enumerate() {
                q[j] = (byte & 0x0f) as i32;
                q[j + 16] = (byte >> 4) as i32;
            }
            (half(at), half(at + 2))
        }
        Q4_0 => {
            let at = b * 18;
            for (j, byte) in row[at + 2..at + 18].iter().enumerate() {
                q[j] = (byte & 0x0f) as i32 - 8;
                q[j + 16] = (byte >> 4) as i32 - 8;
            }
            (half(at), 0.0)
        }
        _ => {
            debug_assert_eq!(F, Q8_0);
            let at = b * 34;
            for (j, byte) in row[at + 2..at + 34].iter().enumerate() {
                q[j] = *byte as i8 as i32;
            }
            (half(at), 0.0)
        }
    }
}
