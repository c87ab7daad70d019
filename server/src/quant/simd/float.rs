//! The float formats' dot order (F32, F16, BF16; one element per block).

use std::arch::x86_64::*;

use super::hsum;
use crate::quant::blocks::Block;

/// Float dot product, 32 values per iteration into four accumulators; `load8` converts the eight
/// elements at a pointer to f32 and `load1` one element (for the tail).
#[inline(always)]
pub unsafe fn dot<B: Block>(
    w: &[B],
    a: &[B],
    load8: impl Fn(*const B) -> __m256,
    load1: impl Fn(&B) -> f32,
) -> f32 {
    let n = w.len().min(a.len());
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let off = i + 8 * k;
            *acc = _mm256_fmadd_ps(load8(wp.add(off)), load8(ap.add(off)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load8(wp.add(i)), load8(ap.add(i)), acc[0]);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += load1(&w[j]) * load1(&a[j]);
    }
    sum
}
