//! IQ1_M: IQ1_S's grid of -1, 0, 1 with a shift of ±1/8 per group of eight values and a 3-bit
//! scale per sixteen values; the super-block's f16 scale is spread over the top nibbles of the
//! sub-block scales. Dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::iq1_s::IQ1S_GRID;
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

/// The shift of every value of a group (`IQ1M_DELTA` in ggml-common.h).
const DELTA: f32 = 0.125;

block!(
    /// Group l (eight values) of sub-block s is grid entry `qs[4s+l] | (n & 7) << 8`, n nibble
    /// l % 2 (low first) of `qh[2s + l/2]`, its bit 3 the sign of the group's shift. The
    /// little-endian u16 k of `scales` holds in bits `6h'..6h'+3` and `6h'+3..6h'+6` the scales of
    /// the two halves of sub-block `2k+h'`, and in its top nibble nibble k of the f16 `d`.
    BlockIq1M, bytes 56,
    { qs: [u8; 32], qh: [u8; 16], scales: [u8; 8] }
);

impl BlockIq1M {
    #[inline(always)]
    fn sc(&self, k: usize) -> u32 {
        u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]]) as u32
    }

    /// The super-block's scale, as f16 bits.
    #[inline(always)]
    fn d(&self) -> [u8; 2] {
        let bits = (0..4).fold(0, |d, k| d | (self.sc(k) >> 12) << (4 * k));
        (bits as u16).to_le_bytes()
    }

    /// The qh nibble of group l (0..4) of sub-block s.
    #[inline(always)]
    fn nibble(&self, s: usize, l: usize) -> usize {
        (self.qh[2 * s + l / 2] as usize >> (4 * (l % 2))) & 0xF
    }

    /// The grid values (-1, 0, 1 as bytes) of group l of sub-block s.
    #[inline(always)]
    fn grid(&self, s: usize, l: usize) -> u64 {
        IQ1S_GRID[self.qs[4 * s + l] as usize | (self.nibble(s, l) & 7) << 8]
    }

    /// The sign of the shift of group l of sub-block s.
    #[inline(always)]
    fn delta_sign(&self, s: usize, l: usize) -> i32 {
        if self.nibble(s, l) & 8 == 0 {
            1
        } else {
            -1
        }
    }

    /// The odd scale `2·ls + 1` of half h (values `16h..16h+16`) of sub-block s.
    #[inline(always)]
    fn scale(&self, s: usize, h: usize) -> i32 {
        2 * ((self.sc(s / 2) >> (6 * (s % 2) + 3 * h)) & 7) as i32 + 1
    }

    /// The grid values, in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            *v = self.grid(e / 32, e % 32 / 8).to_le_bytes()[e % 8] as i8;
        }
        v
    }
}

pub struct Iq1M;

impl Format for Iq1M {
    type Block = BlockIq1M;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16Nibbles(offset_of!(BlockIq1M, scales))];

    fn dequantize(b: &BlockIq1M, out: &mut [f32]) {
        let d = f16_to_f32(b.d());
        for (g, (ys, qs)) in out.chunks_exact_mut(8).zip(b.values().chunks(8)).enumerate() {
            let (s, l) = (g / 4, g % 4);
            // ggml's order: dl·(grid + delta).
            let dl = d * b.scale(s, l / 2) as f32;
            let delta = DELTA * b.delta_sign(s, l) as f32;
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = dl * (q as f32 + delta);
            }
        }
    }
}

impl Weight for Iq1M {
    /// As ggml: per super-block the integer sums `Σ scale·(q·a)` and `Σ scale·±Σa` (per group),
    /// the second times [`DELTA`].
    fn dot_ref(w: &[BlockIq1M], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let (sumi, sumd) = (0..32).fold((0, 0), |(sumi, sumd), g| {
                let (s, l) = (g / 4, g % 4);
                let a = &y.qs[8 * g..8 * g + 8];
                let q = scalar::dot_i8(&values[8 * g..8 * g + 8], a);
                let asum: i32 = a.iter().map(|&v| v as i32).sum();
                let scale = b.scale(s, l / 2);
                (sumi + scale * q, sumd + scale * b.delta_sign(s, l) * asum)
            });
            f16_to_f32(b.d()) * y.d() * (sumi as f32 + DELTA * sumd as f32)
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::simd::grid::{self, grid_kernels, Acc, GridBlock, Sub, Sums};
    use crate::quant::isa::Isa;
    use crate::quant::simd::{hsum, load256};
    use crate::quant::DotOrder;

    /// The multi-row kernels' unpacking ([`grid`]): the grid values are their own signs; each
    /// group's shift sign (±1 bytes) goes onto the activations in lanes of its own, as in
    /// `dot_1x1`.
    impl GridBlock for BlockIq1M {
        const SHIFT_LANES: bool = true;
        const UNIT_GRID: bool = true;
        #[inline(always)]
        fn d_f32(&self) -> f32 {
            f16_to_f32(self.d())
        }

        #[inline(always)]
        unsafe fn sub(&self, s: usize) -> Sub {
            let qh = u16::from_le_bytes([self.qh[2 * s], self.qh[2 * s + 1]]) as usize;
            let nibble = |l: usize| (qh >> (4 * l)) & 0xF;
            let g = |l: usize| {
                IQ1S_GRID[(self.qs[4 * s + l] as usize | (nibble(l) & 7) << 8) & 2047] as i64
            };
            let sign = |l: usize| match nibble(l) & 8 {
                0 => 0x0101_0101_0101_0101,
                _ => -1i64,
            };
            let sc = self.sc(s / 2) >> (6 * (s % 2));
            let scale = |h: usize| 2 * ((sc >> (3 * h)) & 7) as i16 + 1;
            let values = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            Sub {
                mag: _mm256_abs_epi8(values),
                sign: values,
                scale: grid::half_scales(scale(0), scale(1)),
                shift: _mm256_set_epi64x(sign(3), sign(2), sign(1), sign(0)),
            }
        }

        /// As `dot_1x1`: both parts into eight float lanes each, by one `d·d_a`.
        #[inline(always)]
        unsafe fn step(&self, acc: &mut Acc, sums: Sums, y: &BlockQ8K, _order: DotOrder) {
            let d = _mm256_set1_ps(y.d() * self.d_f32());
            acc.v = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums.sumi), acc.v);
            acc.x = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums.extra), acc.x);
        }

        #[inline(always)]
        unsafe fn finish(acc: &Acc, _order: DotOrder) -> f32 {
            grid::lanes_total(acc) + DELTA * grid::shift_lanes_total(acc)
        }
    }

    impl<I: Isa> Kernels<I> for Iq1M {
        /// As ggml's AVX2 `ggml_vec_dot_iq1_m_q8_K`: per super-block the grid part
        /// `Σ scale·(q·a)` and the shift part `Σ scale·(±1·a)` (both by maddubs of magnitudes
        /// with signed activations) go into eight i32 lanes each, and one FMA by `d·d_a` each
        /// into eight float lanes; the result is `hsum(grid lanes) + DELTA·hsum(shift lanes)`.
        /// The table lists no other order for this type.
        #[inline]
        fn dot_1x1(w: &[BlockIq1M], a: &[BlockQ8K], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe {
                let mut acc = _mm256_setzero_ps();
                let mut acc_delta = _mm256_setzero_ps();
                let ones = _mm256_set1_epi8(1);
                for (b, y) in w.iter().zip(a) {
                    let mut sumi = _mm256_setzero_si256();
                    let mut sumd = _mm256_setzero_si256();
                    for s in 0..8 {
                        // The sub-block's qh nibbles and scales read once: the per-group
                        // accessors are not hoisted.
                        let qh = u16::from_le_bytes([b.qh[2 * s], b.qh[2 * s + 1]]) as usize;
                        let nibble = |l: usize| (qh >> (4 * l)) & 0xF;
                        let g = |l: usize| {
                            IQ1S_GRID[b.qs[4 * s + l] as usize | (nibble(l) & 7) << 8] as i64
                        };
                        let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
                        // ±1 in every byte of a group, by the sign of its shift.
                        let sign = |l: usize| match nibble(l) & 8 {
                            0 => 0x0101_0101_0101_0101,
                            _ => -1i64,
                        };
                        let sc = b.sc(s / 2) >> (6 * (s % 2));
                        let delta = _mm256_set_epi64x(sign(3), sign(2), sign(1), sign(0));
                        let act = load256(y.qs.as_ptr().add(32 * s).cast());
                        let products = _mm256_maddubs_epi16(
                            _mm256_sign_epi8(grid, grid),
                            _mm256_sign_epi8(act, grid),
                        );
                        let shifts = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(act, delta));
                        let scale = |h: usize| _mm_set1_epi16(2 * ((sc >> (3 * h)) & 7) as i16 + 1);
                        let scales = _mm256_set_m128i(scale(1), scale(0));
                        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(products, scales));
                        sumd = _mm256_add_epi32(sumd, _mm256_madd_epi16(shifts, scales));
                    }
                    let d = _mm256_set1_ps(y.d() * f16_to_f32(b.d()));
                    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
                    acc_delta = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumd), acc_delta);
                }
                hsum(acc) + DELTA * hsum(acc_delta)
            }
        }

        grid_kernels!(I);
    }
}
