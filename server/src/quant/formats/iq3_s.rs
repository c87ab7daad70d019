//! IQ3_S: super-blocks of 256 values in eight sub-blocks of 32, each value a byte of a 512-entry
//! grid of four-value groups (magnitudes 1, 3, .., 15) with its own sign bit, and a 4-bit odd
//! scale per sub-block, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, f16_to_f32, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Sub-block s (32 values) is eight groups of four: group k is grid entry
    /// `qs[8s+k] | (bit k of qh[s]) << 8`; value 8b+j of the sub-block is negative when bit j
    /// of `signs[4s+b]` is set; the scale is `1 + 2·nibble s of scales` (low nibble first).
    BlockIq3S, bytes 110,
    { d: [u8; 2], qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4] }
);

impl BlockIq3S {
    /// Grid index of group k (0..8) of sub-block s.
    #[inline(always)]
    fn grid_index(&self, s: usize, k: usize) -> usize {
        self.qs[8 * s + k] as usize | ((self.qh[s] as usize >> k) & 1) << 8
    }

    /// The signed grid values (-15..15), in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            let (s, i) = (e / 32, e % 32);
            let g = IQ3S_GRID[self.grid_index(s, i / 4)].to_le_bytes()[i % 4] as i8;
            let negative = (self.signs[4 * s + i / 8] >> (i % 8)) & 1 == 1;
            *v = if negative { -g } else { g };
        }
        v
    }

    /// The scale of sub-block s (1..31, odd).
    #[inline(always)]
    pub fn scale(&self, s: usize) -> i32 {
        1 + 2 * ((self.scales[s / 2] >> (4 * (s % 2))) & 0xF) as i32
    }
}

pub struct Iq3S;

impl Format for Iq3S {
    type Block = BlockIq3S;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq3S, d))];

    fn dequantize(b: &BlockIq3S, out: &mut [f32]) {
        let d = f16_to_f32(b.d);
        for (s, (ys, qs)) in out.chunks_exact_mut(32).zip(b.values().chunks(32)).enumerate() {
            let db = d * b.scale(s) as f32;
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = db * q as f32;
            }
        }
    }
}

impl Weight for Iq3S {
    fn dot_ref(w: &[BlockIq3S], a: &[BlockQ8K]) -> f32 {
        scalar::dot_k(w, a, |b, y| {
            let values = b.values();
            let sumi: i32 = (0..8)
                .map(|s| {
                    b.scale(s) * scalar::dot_i8(&values[32 * s..32 * s + 32], &y.qs[32 * s..])
                })
                .sum();
            f16_to_f32(b.d) * y.d() * sumi as f32
        })
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::isa::Isa;
    use crate::quant::simd::grid::{self, grid_kernels, Acc, GridBlock, Sub, Sums};
    use crate::quant::simd::super_block::{scaled_dot, ScaledBlock};
    use crate::quant::simd::{bytes_from_bits_32, load256};
    use crate::quant::DotOrder;

    /// The multi-row kernels' unpacking ([`grid`]): the same magnitudes and signs as
    /// [`ScaledBlock::sumi`], the signs as ±1 bytes for `_mm256_sign_epi8`.
    impl GridBlock for BlockIq3S {
        #[inline(always)]
        fn d_f32(&self) -> f32 {
            f16_to_f32(self.d)
        }

        #[inline(always)]
        unsafe fn sub(&self, s: usize) -> Sub {
            let qh = self.qh[s] as usize;
            let qs = &self.qs[8 * s..8 * s + 8];
            let g = |k: usize| IQ3S_GRID[(qs[k] as usize | ((qh >> k) & 1) << 8) & 511] as i32;
            let signs = u32::from_le_bytes(self.signs[4 * s..4 * s + 4].try_into().unwrap());
            Sub {
                mag: _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)),
                sign: grid::signs_from_bits(signs),
                scale: _mm256_set1_epi16(self.scale(s) as i16),
                shift: _mm256_setzero_si256(),
            }
        }

        /// As `scaled_dot`: vec_dot's eight lanes, or the tiled order's scalar chain.
        #[inline(always)]
        unsafe fn step(&self, acc: &mut Acc, sums: Sums, y: &BlockQ8K, order: DotOrder) {
            let d_w = self.d_f32();
            match order {
                DotOrder::Tiled => grid::tiled_step(acc, d_w, sums.sumi, y),
                _ => grid::vec_dot_step(acc, d_w, sums.sumi, y),
            }
        }

        #[inline(always)]
        unsafe fn finish(acc: &Acc, order: DotOrder) -> f32 {
            match order {
                DotOrder::Tiled => acc.s,
                _ => grid::lanes_total(acc),
            }
        }
    }

    impl ScaledBlock for BlockIq3S {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// As ggml's AVX2 `ggml_vec_dot_iq3_s_q8_K`: the grid magnitudes (unsigned) are
        /// maddubs' first operand and the signs go onto the activations. The grid entries are
        /// looked up one by one (no gather: it is slower on the AMD cores this runs on).
        #[inline(always)]
        unsafe fn sumi(&self, y: &BlockQ8K) -> __m256i {
            let mut sumi = _mm256_setzero_si256();
            for s in 0..8 {
                let g = |k: usize| IQ3S_GRID[self.grid_index(s, k)] as i32;
                let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
                let signs = u32::from_le_bytes(self.signs[4 * s..4 * s + 4].try_into().unwrap());
                let negative = bytes_from_bits_32(signs);
                let act = load256(y.qs.as_ptr().add(32 * s).cast());
                let act = _mm256_sub_epi8(_mm256_xor_si256(act, negative), negative);
                let products = _mm256_maddubs_epi16(grid, act);
                let scale = _mm256_set1_epi16(self.scale(s) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(products, scale));
            }
            sumi
        }
    }

    impl<I: Isa> Kernels<I> for Iq3S {
        #[inline]
        fn dot_1x1(w: &[BlockIq3S], a: &[BlockQ8K], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            unsafe { scaled_dot(w, a, order) }
        }

        grid_kernels!(I);
    }
}

/// The grid (`iq3s_grid` in ggml/src/ggml-common.h; gguf-py's `IQ3_S.grid` decodes to the same
/// table): entry i holds four magnitudes, byte j (little-endian) the group's value j.
#[rustfmt::skip]
static IQ3S_GRID: [u32; 512] = [
    0x01010101, 0x01010103, 0x01010105, 0x0101010b, 0x0101010f, 0x01010301, 0x01010303, 0x01010305,
    0x01010309, 0x0101030d, 0x01010501, 0x01010503, 0x0101050b, 0x01010707, 0x01010901, 0x01010905,
    0x0101090b, 0x0101090f, 0x01010b03, 0x01010b07, 0x01010d01, 0x01010d05, 0x01010f03, 0x01010f09,
    0x01010f0f, 0x01030101, 0x01030103, 0x01030105, 0x01030109, 0x01030301, 0x01030303, 0x0103030b,
    0x01030501, 0x01030507, 0x0103050f, 0x01030703, 0x0103070b, 0x01030909, 0x01030d03, 0x01030d0b,
    0x01030f05, 0x01050101, 0x01050103, 0x0105010b, 0x0105010f, 0x01050301, 0x01050307, 0x0105030d,
    0x01050503, 0x0105050b, 0x01050701, 0x01050709, 0x01050905, 0x0105090b, 0x0105090f, 0x01050b03,
    0x01050b07, 0x01050f01, 0x01050f07, 0x01070107, 0x01070303, 0x0107030b, 0x01070501, 0x01070505,
    0x01070703, 0x01070707, 0x0107070d, 0x01070909, 0x01070b01, 0x01070b05, 0x01070d0f, 0x01070f03,
    0x01070f0b, 0x01090101, 0x01090307, 0x0109030f, 0x01090503, 0x01090509, 0x01090705, 0x01090901,
    0x01090907, 0x01090b03, 0x01090f01, 0x010b0105, 0x010b0109, 0x010b0501, 0x010b0505, 0x010b050d,
    0x010b0707, 0x010b0903, 0x010b090b, 0x010b090f, 0x010b0d0d, 0x010b0f07, 0x010d010d, 0x010d0303,
    0x010d0307, 0x010d0703, 0x010d0b05, 0x010d0f03, 0x010f0101, 0x010f0105, 0x010f0109, 0x010f0501,
    0x010f0505, 0x010f050d, 0x010f0707, 0x010f0b01, 0x010f0b09, 0x03010101, 0x03010103, 0x03010105,
    0x03010109, 0x03010301, 0x03010303, 0x03010307, 0x0301030b, 0x0301030f, 0x03010501, 0x03010505,
    0x03010703, 0x03010709, 0x0301070d, 0x03010b09, 0x03010b0d, 0x03010d03, 0x03010f05, 0x03030101,
    0x03030103, 0x03030107, 0x0303010d, 0x03030301, 0x03030309, 0x03030503, 0x03030701, 0x03030707,
    0x03030903, 0x03030b01, 0x03030b05, 0x03030f01, 0x03030f0d, 0x03050101, 0x03050305, 0x0305030b,
    0x0305030f, 0x03050501, 0x03050509, 0x03050705, 0x03050901, 0x03050907, 0x03050b0b, 0x03050d01,
    0x03050f05, 0x03070103, 0x03070109, 0x0307010f, 0x03070301, 0x03070307, 0x03070503, 0x0307050f,
    0x03070701, 0x03070709, 0x03070903, 0x03070d05, 0x03070f01, 0x03090107, 0x0309010b, 0x03090305,
    0x03090309, 0x03090703, 0x03090707, 0x03090905, 0x0309090d, 0x03090b01, 0x03090b09, 0x030b0103,
    0x030b0301, 0x030b0307, 0x030b0503, 0x030b0701, 0x030b0705, 0x030b0b03, 0x030d0501, 0x030d0509,
    0x030d050f, 0x030d0909, 0x030d090d, 0x030f0103, 0x030f0107, 0x030f0301, 0x030f0305, 0x030f0503,
    0x030f070b, 0x030f0903, 0x030f0d05, 0x030f0f01, 0x05010101, 0x05010103, 0x05010107, 0x0501010b,
    0x0501010f, 0x05010301, 0x05010305, 0x05010309, 0x0501030d, 0x05010503, 0x05010507, 0x0501050f,
    0x05010701, 0x05010705, 0x05010903, 0x05010907, 0x0501090b, 0x05010b01, 0x05010b05, 0x05010d0f,
    0x05010f01, 0x05010f07, 0x05010f0b, 0x05030101, 0x05030105, 0x05030301, 0x05030307, 0x0503030f,
    0x05030505, 0x0503050b, 0x05030703, 0x05030709, 0x05030905, 0x05030b03, 0x05050103, 0x05050109,
    0x0505010f, 0x05050503, 0x05050507, 0x05050701, 0x0505070f, 0x05050903, 0x05050b07, 0x05050b0f,
    0x05050f03, 0x05050f09, 0x05070101, 0x05070105, 0x0507010b, 0x05070303, 0x05070505, 0x05070509,
    0x05070703, 0x05070707, 0x05070905, 0x05070b01, 0x05070d0d, 0x05090103, 0x0509010f, 0x05090501,
    0x05090507, 0x05090705, 0x0509070b, 0x05090903, 0x05090f05, 0x05090f0b, 0x050b0109, 0x050b0303,
    0x050b0505, 0x050b070f, 0x050b0901, 0x050b0b07, 0x050b0f01, 0x050d0101, 0x050d0105, 0x050d010f,
    0x050d0503, 0x050d0b0b, 0x050d0d03, 0x050f010b, 0x050f0303, 0x050f050d, 0x050f0701, 0x050f0907,
    0x050f0b01, 0x07010105, 0x07010303, 0x07010307, 0x0701030b, 0x0701030f, 0x07010505, 0x07010703,
    0x07010707, 0x0701070b, 0x07010905, 0x07010909, 0x0701090f, 0x07010b03, 0x07010d07, 0x07010f03,
    0x07030103, 0x07030107, 0x0703010b, 0x07030309, 0x07030503, 0x07030507, 0x07030901, 0x07030d01,
    0x07030f05, 0x07030f0d, 0x07050101, 0x07050305, 0x07050501, 0x07050705, 0x07050709, 0x07050b01,
    0x07070103, 0x07070301, 0x07070309, 0x07070503, 0x07070507, 0x0707050f, 0x07070701, 0x07070903,
    0x07070907, 0x0707090f, 0x07070b0b, 0x07070f07, 0x07090107, 0x07090303, 0x0709030d, 0x07090505,
    0x07090703, 0x07090b05, 0x07090d01, 0x07090d09, 0x070b0103, 0x070b0301, 0x070b0305, 0x070b050b,
    0x070b0705, 0x070b0909, 0x070b0b0d, 0x070b0f07, 0x070d030d, 0x070d0903, 0x070f0103, 0x070f0107,
    0x070f0501, 0x070f0505, 0x070f070b, 0x09010101, 0x09010109, 0x09010305, 0x09010501, 0x09010509,
    0x0901050f, 0x09010705, 0x09010903, 0x09010b01, 0x09010f01, 0x09030105, 0x0903010f, 0x09030303,
    0x09030307, 0x09030505, 0x09030701, 0x0903070b, 0x09030907, 0x09030b03, 0x09030b0b, 0x09050103,
    0x09050107, 0x09050301, 0x0905030b, 0x09050503, 0x09050707, 0x09050901, 0x09050b0f, 0x09050d05,
    0x09050f01, 0x09070109, 0x09070303, 0x09070307, 0x09070501, 0x09070505, 0x09070703, 0x0907070b,
    0x09090101, 0x09090105, 0x09090509, 0x0909070f, 0x09090901, 0x09090f03, 0x090b010b, 0x090b010f,
    0x090b0503, 0x090b0d05, 0x090d0307, 0x090d0709, 0x090d0d01, 0x090f0301, 0x090f030b, 0x090f0701,
    0x090f0907, 0x090f0b03, 0x0b010105, 0x0b010301, 0x0b010309, 0x0b010505, 0x0b010901, 0x0b010909,
    0x0b01090f, 0x0b010b05, 0x0b010d0d, 0x0b010f09, 0x0b030103, 0x0b030107, 0x0b03010b, 0x0b030305,
    0x0b030503, 0x0b030705, 0x0b030f05, 0x0b050101, 0x0b050303, 0x0b050507, 0x0b050701, 0x0b05070d,
    0x0b050b07, 0x0b070105, 0x0b07010f, 0x0b070301, 0x0b07050f, 0x0b070909, 0x0b070b03, 0x0b070d0b,
    0x0b070f07, 0x0b090103, 0x0b090109, 0x0b090501, 0x0b090705, 0x0b09090d, 0x0b0b0305, 0x0b0b050d,
    0x0b0b0b03, 0x0b0b0b07, 0x0b0d0905, 0x0b0f0105, 0x0b0f0109, 0x0b0f0505, 0x0d010303, 0x0d010307,
    0x0d01030b, 0x0d010703, 0x0d010707, 0x0d010d01, 0x0d030101, 0x0d030501, 0x0d03050f, 0x0d030d09,
    0x0d050305, 0x0d050709, 0x0d050905, 0x0d050b0b, 0x0d050d05, 0x0d050f01, 0x0d070101, 0x0d070309,
    0x0d070503, 0x0d070901, 0x0d09050b, 0x0d090907, 0x0d090d05, 0x0d0b0101, 0x0d0b0107, 0x0d0b0709,
    0x0d0b0d01, 0x0d0d010b, 0x0d0d0901, 0x0d0f0303, 0x0d0f0307, 0x0f010101, 0x0f010109, 0x0f01010f,
    0x0f010501, 0x0f010505, 0x0f01070d, 0x0f010901, 0x0f010b09, 0x0f010d05, 0x0f030105, 0x0f030303,
    0x0f030509, 0x0f030907, 0x0f03090b, 0x0f050103, 0x0f050109, 0x0f050301, 0x0f05030d, 0x0f050503,
    0x0f050701, 0x0f050b03, 0x0f070105, 0x0f070705, 0x0f07070b, 0x0f070b07, 0x0f090103, 0x0f09010b,
    0x0f090307, 0x0f090501, 0x0f090b01, 0x0f0b0505, 0x0f0b0905, 0x0f0d0105, 0x0f0d0703, 0x0f0f0101,
];
