//! Picks the kernel instance for a (kernel, format, tile shape): the one place the fast path calls
//! into `unsafe` SIMD code.

use super::quantize::QuantRows;
use super::{scalar, Format, Kernel, Q4_0, Q4_1};

/// `out[r][t] = W[r] . x[t0 + t]` for a tile of `R` rows by `T` activation rows; the SIMD kernels
/// prefetch the weights `ahead` bytes past each block they read (none when 0).
#[inline]
pub fn run<const R: usize, const T: usize>(
    kernel: Kernel,
    format: Format,
    rows: [&[u8]; R],
    acts: &QuantRows,
    t0: usize,
    ahead: usize,
) -> [[f32; T]; R] {
    assert!(t0 + T <= acts.d.len() / acts.nb.max(1), "activation rows out of range");
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::Avx2` comes from `Kernel::detect` (or a test that checked
        // `avx2::available()`), so the CPU has AVX2, FMA and F16C; rows hold `nb` blocks of `format`
        // (checked by `integer_format` and asserted in the kernel) and `t0 + T` is in range (above).
        Kernel::Avx2 => unsafe {
            match format {
                Q4_1 => super::avx2::tile::<Q4_1, R, T>(rows, acts, t0, ahead),
                Q4_0 => super::avx2::tile::<Q4_0, R, T>(rows, acts, t0, ahead),
                _ => super::avx2::tile::<{ super::Q8_0 }, R, T>(rows, acts, t0, ahead),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX-512 VNNI and VL detected by `avx2::vnni_available`.
        Kernel::Vnni => unsafe {
            match format {
                Q4_1 => super::avx2::tile_vnni::<Q4_1, R, T>(rows, acts, t0, ahead),
                Q4_0 => super::avx2::tile_vnni::<Q4_0, R, T>(rows, acts, t0, ahead),
                _ => super::avx2::tile_vnni::<{ super::Q8_0 }, R, T>(rows, acts, t0, ahead),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX-512 F, BW, DQ, VL and VNNI detected by `avx512::available`;
        // the 512-bit kernel takes an even number of activation rows, the others go to `Vnni`'s.
        Kernel::Avx512 => unsafe {
            match (format, T.is_multiple_of(2)) {
                (Q4_1, true) => super::avx512::tile::<Q4_1, R, T>(rows, acts, t0, ahead),
                (Q4_0, true) => super::avx512::tile::<Q4_0, R, T>(rows, acts, t0, ahead),
                (_, true) => super::avx512::tile::<{ super::Q8_0 }, R, T>(rows, acts, t0, ahead),
                (Q4_1, false) => super::avx2::tile_vnni::<Q4_1, R, T>(rows, acts, t0, ahead),
                (Q4_0, false) => super::avx2::tile_vnni::<Q4_0, R, T>(rows, acts, t0, ahead),
                (_, false) => super::avx2::tile_vnni::<{ super::Q8_0 }, R, T>(rows, acts, t0, ahead),
            }
        },
        _ => match (format, ahead).0 {
            Q4_1 => scalar::tile::<Q4_1, R, T>(rows, acts, t0),
            Q4_0 => scalar::tile::<Q4_0, R, T>(rows, acts, t0),
            _ => scalar::tile::<{ super::Q8_0 }, R, T>(rows, acts, t0),
        },
    }
}
