//! Dequantization of ggml tensor data to f32: F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants
//! Q4_K, Q5_K, Q6_K, bit-for-bit as ggml's reference `dequantize_row_*` functions compute them.

use super::GgmlType;

/// Why tensor data could not be dequantized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DequantError {
    #[error("tensor {tensor} is not in the model file")]
    Missing { tensor: String },
    #[error(
        "tensor {tensor}: element type {ggml_type} cannot be dequantized (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)"
    )]
    Unsupported { tensor: String, ggml_type: GgmlType },
    #[error("tensor {tensor}: {elements} elements of {ggml_type} need {expected} bytes, have {actual}")]
    Size { tensor: String, ggml_type: GgmlType, elements: u64, expected: u64, actual: u64 },
}

/// Converts IEEE half bits to f32.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = (bits as u32 & 0x8000) << 16;
    let exp = (bits >> 10) & 0x1f;
    let mant = bits as u32 & 0x3ff;
    let value = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: renormalise.
            let mut e = -14i32;
            let mut m = mant;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (((e + 127) as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (mant << 13),
        _ => sign | (((exp as u32) + 112) << 23) | (mant << 13),
    };
    f32::from_bits(value)
}

/// bfloat16 bits to f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

fn half(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Dequantizes `elements` values of `ggml_type` from `data`; `tensor` names it in errors.
pub fn dequantize(tensor: &str, ggml_type: GgmlType, data: &[u8], elements: u64) -> Result<Vec<f32>, DequantError> {
    let expected = ggml_type.byte_size(elements).ok_or_else(|| unsupported(tensor, ggml_type))?;
    if (data.len() as u64) < expected {
        return Err(DequantError::Size { tensor: tensor.into(), ggml_type, elements, expected, actual: data.len() as u64 });
    }
    let data = &data[..expected as usize];
    let n = elements as usize;
    let mut out = Vec::with_capacity(n);
    match ggml_type.0 {
        0 => out.extend(data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        1 => out.extend(data.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))),
        30 => out.extend(data.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))),
        2 => data.chunks_exact(18).for_each(|b| q4_0(b, &mut out)),
        3 => data.chunks_exact(20).for_each(|b| q4_1(b, &mut out)),
        8 => data.chunks_exact(34).for_each(|b| q8_0(b, &mut out)),
        12 => data.chunks_exact(144).for_each(|b| q4_k(b, &mut out)),
        13 => data.chunks_exact(176).for_each(|b| q5_k(b, &mut out)),
        14 => data.chunks_exact(210).for_each(|b| q6_k(b, &mut out)),
        _ => return Err(unsupported(tensor, ggml_type)),
    }
    debug_assert_eq!(out.len(), n);
    Ok(out)
}

fn unsupported(tensor: &str, ggml_type: GgmlType) -> DequantError {
    DequantError::Unsupported { tensor: tensor.into(), ggml_type }
}

/// d (f16), 16 bytes of nibbles; low nibbles are elements 0..16, high nibbles 16..32; offset 8.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|q| ((q & 0x0f) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|q| ((q >> 4) as i32 - 8) as f32 * d));
}

/// d, m (f16), nibbles as Q4_0 but unsigned: x = q*d + m.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|q| (q & 0x0f) as f32 * d + m));
    out.extend(qs.iter().map(|q| (q >> 4) as f32 * d + m));
}

/// d (f16), 32 signed bytes.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half(b, 0);
    out.extend(b[2..34].iter().map(|q| (*q as i8) as f32 * d));
}

/// The 6-bit scale and min of sub-block `j` packed in K-quant `scales[12]`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q4_K: d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32 with 6-bit scales and mins.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let q = &qs[j * 32..j * 32 + 32];
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(q.iter().map(|v| d1 * (v & 0x0f) as f32 - min1));
        out.extend(q.iter().map(|v| d2 * (v >> 4) as f32 - min2));
    }
}

/// Q5_K: d, dmin, scales[12], qh[32] (fifth bits), qs[128].
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let ql = &qs[j * 32..j * 32 + 32];
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let hi = if qh[l] & u1 != 0 { 16 } else { 0 };
            out.push(d1 * ((ql[l] & 0x0f) + hi) as f32 - min1);
        }
        for l in 0..32 {
            let hi = if qh[l] & u2 != 0 { 16 } else { 0 };
            out.push(d2 * ((ql[l] >> 4) + hi) as f32 - min2);
        }
    }
}

/// Q6_K: ql[128], qh[64], scales[16] (i8), d (f16); 16 sub-blocks of 16, values in -32..31.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let d = half(b, 208);
    let start = out.len();
    out.resize(start + 256, 0.0);
    let y = &mut out[start..];
    for half_block in 0..2 {
        let ql = &b[half_block * 64..half_block * 64 + 64];
        let qh = &b[128 + half_block * 32..128 + half_block * 32 + 32];
        let sc = &b[192 + half_block * 8..192 + half_block * 8 + 8];
        let y = &mut y[half_block * 128..half_block * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| sc[k] as i8 as f32;
            y[l] = d * s(is) * q1 as f32;
            y[l + 32] = d * s(is + 2) * q2 as f32;
            y[l + 64] = d * s(is + 4) * q3 as f32;
            y[l + 96] = d * s(is + 6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn q4_1_block_layout() {
        // d = 0.5, m = -1.0; nibble j low = j%16, high = 15 - j%16.
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes());
        b[2..4].copy_from_slice(&0xbc00u16.to_le_bytes());
        for j in 0..16 {
            b[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let x = dequantize("t", GgmlType(3), &b, 32).unwrap();
        assert_eq!(x[0], -1.0);
        assert_eq!(x[15], 15.0 * 0.5 - 1.0);
        assert_eq!(x[16], 15.0 * 0.5 - 1.0);
        assert_eq!(x[31], -1.0);
    }

    #[test]
    fn q8_0_and_q4_0_blocks() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2
        b[2] = (-3i8) as u8;
        b[33] = 7;
        let x = dequantize("t", GgmlType(8), &b, 32).unwrap();
        assert_eq!((x[0], x[31]), (-6.0, 14.0));
        let mut q = vec![0u8; 18];
        q[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        q[2] = 0x9f; // low 15 -> 7, high 9 -> 1
        let y = dequantize("t", GgmlType(2), &q, 32).unwrap();
        assert_eq!((y[0], y[16]), (7.0, 1.0));
    }

    #[test]
    fn q6_k_constant_block() {
        // All 6-bit values 32 (zero after the offset) except element 0 = 33 (ql low nibble 1).
        let mut b = vec![0u8; 210];
        b[..64].fill(0); // ql
        b[128..192].fill(0b1010_1010); // qh: every 2-bit group = 2 -> high bits 32
        b[192..208].fill(1); // scales
        b[208..210].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[0] = 1;
        let x = dequantize("t", GgmlType(14), &b, 256).unwrap();
        assert_eq!(x[0], 1.0);
        assert!(x[1..].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn errors_name_the_tensor() {
        let e = dequantize("blk.0.attn_q.weight", GgmlType(3), &[0u8; 10], 32).unwrap_err();
        assert!(e.to_string().contains("blk.0.attn_q.weight"));
        let e = dequantize("x", GgmlType(99), &[0u8; 10], 32).unwrap_err();
        assert!(matches!(e, DequantError::Unsupported { .. }));
    }
}
