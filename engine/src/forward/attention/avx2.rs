//! One query head's attention on AVX2, `C * 8` values per head: the query in registers, four keys'
//! dots at a time (each with `ops::dot`'s 8 lanes, element order and final reduction), the softmax
//! of the parent module, then the output kept in registers while `p_j * v_j` is added in position
//! order (a multiply then an add, never fused). Every value has the scalar code's bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{softmax, HeadKv};

/// # Safety
/// The CPU must have AVX2 and FMA; `q` and `out` hold `C * 8` values (checked).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn head<const C: usize>(q: &[f32], kv: &HeadKv<'_>, span: Range<usize>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = C * 8;
    assert!(q.len() == hd && out.len() == hd, "head width");
    let mut qv = [_mm256_setzero_ps(); C];
    for (c, v) in qv.iter_mut().enumerate() {
        *v = _mm256_loadu_ps(q.as_ptr().add(c * 8));
    }
    scores.clear();
    let mut j = span.start;
    while j + 4 <= span.end {
        let k = [kv.key(j, hd), kv.key(j + 1, hd), kv.key(j + 2, hd), kv.key(j + 3, hd)];
        let mut acc = [_mm256_setzero_ps(); 4];
        for (c, qc) in qv.iter().enumerate() {
            for (a, k) in acc.iter_mut().zip(&k) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(*qc, _mm256_loadu_ps(k.as_ptr().add(c * 8))));
            }
        }
        for a in acc {
            scores.push(reduce(a) * scale);
        }
        j += 4;
    }
    while j < span.end {
        let k = kv.key(j, hd);
        let mut a = _mm256_setzero_ps();
        for (c, qc) in qv.iter().enumerate() {
            a = _mm256_add_ps(a, _mm256_mul_ps(*qc, _mm256_loadu_ps(k.as_ptr().add(c * 8))));
        }
        scores.push(reduce(a) * scale);
        j += 1;
    }
    softmax(scores);
    let mut o = [_mm256_setzero_ps(); C];
    for (j, p) in span.zip(scores.iter()) {
        let (v, p) = (kv.value(j, hd), _mm256_set1_ps(*p));
        for (c, o) in o.iter_mut().enumerate() {
            *o = _mm256_add_ps(*o, _mm256_mul_ps(p, _mm256_loadu_ps(v.as_ptr().add(c * 8))));
        }
    }
    for (c, o) in o.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(c * 8), *o);
    }
}

/// `ops::dot`'s reduction of its 8 lanes: ((a0+a4) + (a1+a5)) + ((a2+a6) + (a3+a7)) + 0.
#[inline(always)]
unsafe fn reduce(a: __m256) -> f32 {
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let pairs = _mm_add_ps(b, _mm_movehdup_ps(b));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs))) + 0.0
}
