//! IQ3_XXS: super-blocks of 256 values in eight sub-blocks of 32, each group of four values a
//! byte index into a 256-entry grid of magnitudes (4, 12, .., 62), signs by 7-bit patterns
//! ([`KSIGNS`]) per eight values, and a 4-bit scale per sub-block, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, KSIGNS, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Group k (four values) of sub-block s is grid entry `qs[8s+k]`; the little-endian u32
    /// `s` of `signs_scales` holds in bits `7l..7l+7` the sign pattern of values `8l..8l+8` and
    /// in its top four bits the scale `ls` (the sub-block's factor `d·(0.5 + ls)/2`).
    BlockIq3Xxs, bytes 98,
    { d: [u8; 2], qs: [u8; 64], signs_scales: [u8; 32] }
);

impl BlockIq3Xxs {
    /// The u32 of signs and scale of sub-block s.
    #[inline(always)]
    fn aux(&self, s: usize) -> u32 {
        u32::from_le_bytes(self.signs_scales[4 * s..4 * s + 4].try_into().unwrap())
    }

    /// The grid magnitudes of group k (0..8) of sub-block s, byte j the group's value j.
    #[inline(always)]
    fn grid(&self, s: usize, k: usize) -> u32 {
        IQ3XXS_GRID[self.qs[8 * s + k] as usize]
    }

    /// The 32 sign bits of sub-block s, bit i set when value i is negative.
    #[inline(always)]
    fn signs(&self, s: usize) -> u32 {
        let aux = self.aux(s);
        (0..4).fold(0, |m, l| m | (KSIGNS[(aux >> (7 * l)) as usize & 127] as u32) << (8 * l))
    }

    /// The scale nibble `ls` of sub-block s.
    #[inline(always)]
    fn ls(&self, s: usize) -> u32 {
        self.aux(s) >> 28
    }

    /// The signed grid values, in element order.
    pub fn values(&self) -> [i8; QK_K] {
        let mut v = [0i8; QK_K];
        for (e, v) in v.iter_mut().enumerate() {
            let (s, i) = (e / 32, e % 32);
            let g = self.grid(s, i / 4).to_le_bytes()[i % 4] as i8;
            *v = if (self.signs(s) >> i) & 1 == 1 { -g } else { g };
        }
        v
    }
}

pub struct Iq3Xxs;

impl Format for Iq3Xxs {
    type Block = BlockIq3Xxs;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq3Xxs, d))];

    fn dequantize(b: &BlockIq3Xxs, out: &mut [f32]) {
        // ggml's order: d·(0.5 + ls)·0.5, then ·grid·sign.
        scalar::dequantize_grid(b.d, b.values(), 32, 0.5, |s| b.ls(s), out);
    }
}

impl Weight for Iq3Xxs {
    /// As ggml: the integer sum of `(2·ls + 1)·(q·a)` over the sub-blocks, times `d·d_a/4`.
    fn dot_ref(w: &[BlockIq3Xxs], a: &[BlockQ8K]) -> f32 {
        scalar::dot_grid(w, a, 32, 0.25, |b| (b.d, b.values()), |b, s| b.ls(s))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::simd::grid::{self, grid_kernels, GridBlock, Sub};
    use crate::quant::blocks::f16_to_f32;
    use crate::quant::isa::Isa;
    use crate::quant::simd::super_block::{scaled_dot, ScaledBlock};
    use crate::quant::simd::{bytes_from_bits_32, load256};
    use crate::quant::DotOrder;

    /// The multi-row kernels' unpacking ([`grid`]): the magnitudes and signs of
    /// [`ScaledBlock::sumi`], the signs as ±1 bytes straight from a table.
    impl GridBlock for BlockIq3Xxs {
        #[inline(always)]
        unsafe fn sub(&self, s: usize) -> Sub {
            let aux = self.aux(s);
            let g = |k: usize| self.grid(s, k) as i32;
            Sub {
                mag: _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)),
                sign: grid::ksigns_x4(aux),
                scale: _mm256_set1_epi16(2 * (aux >> 28) as i16 + 1),
                shift: _mm256_setzero_si256(),
            }
        }

        /// vec_dot's eight lanes whatever the order, times 0.25 at the end, as `dot_1x1`.
        const LANES_SCALE: f32 = 0.25;

        #[inline(always)]
        fn d_f32(&self) -> f32 {
            f16_to_f32(self.d)
        }
    }

    impl ScaledBlock for BlockIq3Xxs {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// As ggml's AVX2 `ggml_vec_dot_iq3_xxs_q8_K`: the grid magnitudes (unsigned) are
        /// maddubs' first operand, the signs go onto the activations, and each sub-block's
        /// products are weighted by `2·ls + 1`.
        #[inline(always)]
        unsafe fn sumi(&self, y: &BlockQ8K) -> __m256i {
            let mut sumi = _mm256_setzero_si256();
            for s in 0..8 {
                let g = |k: usize| self.grid(s, k) as i32;
                let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
                let negative = bytes_from_bits_32(self.signs(s));
                let act = load256(y.qs.as_ptr().add(32 * s).cast());
                let act = _mm256_sub_epi8(_mm256_xor_si256(act, negative), negative);
                let products = _mm256_maddubs_epi16(grid, act);
                let scale = _mm256_set1_epi16(2 * self.ls(s) as i16 + 1);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(products, scale));
            }
            sumi
        }
    }

    impl<I: Isa> Kernels<I> for Iq3Xxs {
        /// ggml's vec_dot order (the only one the table lists for this type), with its final
        /// `·0.25`.
        #[inline]
        fn dot_1x1(w: &[BlockIq3Xxs], a: &[BlockQ8K], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            0.25 * unsafe { scaled_dot(w, a, DotOrder::VecDot) }
        }

        grid_kernels!(I);
    }
}

/// The grid (`iq3xxs_grid` in ggml/src/ggml-common.h; generated from gguf-py's `IQ3_XXS.grid`,
/// which decodes to the same table): entry i holds four magnitudes, byte j (little-endian) the
/// group's value j.
#[rustfmt::skip]
static IQ3XXS_GRID: [u32; 256] = [
    0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414,
    0x04041c0c, 0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14,
    0x040c140c, 0x040c142c, 0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404,
    0x04140414, 0x04140424, 0x04140c0c, 0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e,
    0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c, 0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c,
    0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e, 0x04243e1c, 0x04243e2c, 0x042c040c,
    0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04, 0x043e0c24, 0x043e0c34,
    0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c, 0x0c04141c,
    0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c,
    0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04,
    0x0c143e14, 0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c,
    0x0c24042c, 0x0c242c04, 0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414,
    0x0c3e2404, 0x14040404, 0x14040414, 0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434,
    0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c, 0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c,
    0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404, 0x14140414, 0x14140c0c, 0x14140c3e,
    0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c, 0x141c0c04, 0x141c0c24,
    0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c, 0x142c3e24,
    0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c,
    0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c,
    0x1c0c2424, 0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14,
    0x1c1c0c0c, 0x1c1c1c1c, 0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414,
    0x1c2c2c2c, 0x1c340c24, 0x1c341c34, 0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e,
    0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e, 0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404,
    0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424, 0x24242c0c, 0x24243424, 0x242c142c,
    0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04, 0x2c040c14, 0x2c04240c,
    0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14, 0x2c143e14,
    0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c,
    0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c,
    0x340c340c, 0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14,
    0x34341c1c, 0x343e041c, 0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14,
    0x3e042c14, 0x3e0c1434, 0x3e0c2404, 0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c,
    0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c, 0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries and a checksum of the table as gguf-py 0.19 decodes `IQ3_XXS.grid`.
    #[test]
    fn grid_is_ggml_s() {
        assert_eq!(IQ3XXS_GRID[0], 0x04040404);
        assert_eq!(IQ3XXS_GRID[1], 0x04040414);
        assert_eq!(IQ3XXS_GRID[255], 0x3e341c04);
        let sum: u64 = IQ3XXS_GRID.iter().map(|&e| e as u64).sum();
        assert_eq!(sum, 108356387642);
    }
}
