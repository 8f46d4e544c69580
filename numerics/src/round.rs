//! The low-precision number formats the numerical patches emulate on CPU: bf16 (round to nearest
//! even, keep the top 16 bits of the f32), FP8 e4m3 (3 mantissa bits, saturating at ±448; with a
//! per-tensor or a per-block scale) and llama.cpp's 8-bit activation blocks. Each function returns
//! the f32 value of the rounded number.

/// Rounds to the nearest bf16 (ties to even): add the rounding bias, keep the top 16 bits.
#[inline]
pub fn bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    f32::from_bits(rounded & 0xffff_0000)
}

/// Rounds every element to bf16 in place.
pub fn bf16_slice(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = bf16(*v);
    }
}

/// Largest finite FP8 e4m3 (the `fn` variant: no infinities), where conversion saturates.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// Rounds to the nearest FP8 e4m3 value (ties to even), saturating at ±448; subnormals below 2^-6
/// have a step of 2^-9.
#[inline]
pub fn fp8_e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs().min(FP8_E4M3_MAX);
    let step = if a < 2f32.powi(-6) {
        2f32.powi(-9)
    } else {
        // 2^(floor(log2 a) - 3): the exponent field of `a`, three mantissa bits below it.
        let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        2f32.powi(exp - 3)
    };
    let r = ((a / step).round_ties_even() * step).min(FP8_E4M3_MAX);
    r.copysign(x)
}

/// Stores `x` as FP8 e4m3 with a per-tensor `scale` (x ≈ fp8(x / scale) · scale), in place.
pub fn fp8_scaled_slice(x: &mut [f32], scale: f32) {
    for v in x.iter_mut() {
        *v = fp8_e4m3(*v / scale) * scale;
    }
}

/// DeepSeek's `act_quant` of one row, in place: per block of `block` elements, scale s = amax/448
/// (f32, not rounded), each element becomes fp8_e4m3(x / s) · s; an all-zero block stays zero.
pub fn fp8_e4m3_blocks(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            continue;
        }
        let scale = amax / FP8_E4M3_MAX;
        for v in chunk.iter_mut() {
            *v = fp8_e4m3(*v / scale) * scale;
        }
    }
}

/// llama.cpp's Q8_0 activation rounding of one row, in place: per block of 32, d = amax/127 stored
/// as f16, q = round_half_even(x · 127/amax), x becomes q · d. `f16` rounds an f32 to f16 precision.
pub fn q8_blocks(x: &mut [f32], f16: impl Fn(f32) -> f32) {
    for block in x.chunks_mut(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16(amax / 127.0);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for v in block.iter_mut() {
            *v = (*v * id).round_ties_even() * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2.0 * 2f32.powi(-7));
        // Integers past 256 are no longer distinct.
        assert_eq!(bf16(257.0), 256.0);
        assert_eq!(bf16(-std::f32::consts::PI), -3.140625);
    }

    #[test]
    fn fp8_e4m3_saturates_and_has_three_mantissa_bits() {
        assert_eq!(fp8_e4m3(1000.0), 448.0);
        assert_eq!(fp8_e4m3(-1000.0), -448.0);
        assert_eq!(fp8_e4m3(1.0625), 1.0); // halfway between 1 and 1.125: even
        assert_eq!(fp8_e4m3(1.1), 1.125);
        assert_eq!(fp8_e4m3(2f32.powi(-9)), 2f32.powi(-9));
        assert_eq!(fp8_e4m3(2f32.powi(-11)), 0.0);
        assert_eq!(fp8_e4m3(460.0), 448.0);
    }

    #[test]
    fn fp8_blocks_scale_each_block_to_its_maximum() {
        let mut x: Vec<f32> = (0..256).map(|i| if i < 128 { i as f32 / 1000.0 } else { (i - 128) as f32 * 10.0 }).collect();
        let before = x.clone();
        fp8_e4m3_blocks(&mut x, 128);
        // Each block's maximum maps to 448 (back to itself, up to the f32 scale), every element keeps
        // three mantissa bits.
        assert!([127, 255].iter().all(|&i| (x[i] - before[i]).abs() <= before[i] * 1e-6));
        assert!(x.iter().zip(&before).all(|(a, b)| (a - b).abs() <= b.abs() / 16.0 + 1e-9));
        assert_ne!(x, before);
        let mut zeros = [0f32; 4];
        fp8_e4m3_blocks(&mut zeros, 128);
        assert_eq!(zeros, [0.0; 4]);
    }

    #[test]
    fn q8_blocks_keeps_the_block_maximum() {
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 / 31.0).collect();
        q8_blocks(&mut x, |v| v);
        assert!((x[31] - 1.0).abs() < 1e-6);
        assert!(x.iter().enumerate().all(|(i, v)| (v - i as f32 / 31.0).abs() <= 0.5 / 127.0 + 1e-6));
    }
}
