//! IQ2_XXS: super-blocks of 256 values in eight sub-blocks of 32, each group of eight values a
//! byte index into a 256-entry grid of magnitudes (8, 25, 43) with a 7-bit sign pattern
//! ([`KSIGNS`]), and a 4-bit scale per sub-block, dotted against Q8_K.

use std::mem::offset_of;

use crate::quant::blocks::{block, KSIGNS, QK_K};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_k::BlockQ8K;
use crate::quant::scalar;

block!(
    /// Sub-block s is bytes `8s..8s+8` of `qs`: four grid indices (groups 0..4 of eight values),
    /// then a little-endian u32 whose bits `7l..7l+7` index group l's signs and whose top four
    /// bits are the scale `ls` (the sub-block's factor is `d·(0.5 + ls)/4`).
    BlockIq2Xxs, bytes 66,
    { d: [u8; 2], qs: [u8; 64] }
);

impl BlockIq2Xxs {
    /// The u32 of signs and scale of sub-block s.
    #[inline(always)]
    fn aux(&self, s: usize) -> u32 {
        u32::from_le_bytes(self.qs[8 * s + 4..8 * s + 8].try_into().unwrap())
    }

    /// The grid magnitudes of group l (0..4) of sub-block s, byte j the group's value j.
    #[inline(always)]
    fn grid(&self, s: usize, l: usize) -> u64 {
        IQ2XXS_GRID[self.qs[8 * s + l] as usize]
    }

    /// The eight sign bits of sub-block s as a u32, bit i set when value i is negative.
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
            let g = self.grid(s, i / 8).to_le_bytes()[i % 8] as i8;
            *v = if (self.signs(s) >> i) & 1 == 1 { -g } else { g };
        }
        v
    }
}

pub struct Iq2Xxs;

impl Format for Iq2Xxs {
    type Block = BlockIq2Xxs;
    const LEN: usize = QK_K;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq2Xxs, d))];

    fn dequantize(b: &BlockIq2Xxs, out: &mut [f32]) {
        // ggml's order: d·(0.5 + ls)·0.25, then ·grid·sign.
        scalar::dequantize_grid(b.d, b.values(), 32, 0.25, |s| b.ls(s), out);
    }
}

impl Weight for Iq2Xxs {
    /// As ggml: the integer sum of `(2·ls + 1)·(q·a)` over the sub-blocks, times `d·d_a/8`.
    fn dot_ref(w: &[BlockIq2Xxs], a: &[BlockQ8K]) -> f32 {
        scalar::dot_grid(w, a, 32, 0.125, |b| (b.d, b.values()), |b, s| b.ls(s))
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
    impl GridBlock for BlockIq2Xxs {
        #[inline(always)]
        unsafe fn sub(&self, s: usize) -> Sub {
            let aux = self.aux(s);
            let g = |l: usize| self.grid(s, l) as i64;
            Sub {
                mag: _mm256_set_epi64x(g(3), g(2), g(1), g(0)),
                sign: grid::ksigns_x4(aux),
                scale: _mm256_set1_epi16(2 * (aux >> 28) as i16 + 1),
                shift: _mm256_setzero_si256(),
            }
        }

        /// vec_dot's eight lanes whatever the order, times 0.125 at the end, as `dot_1x1`.
        const LANES_SCALE: f32 = 0.125;

        #[inline(always)]
        fn d_f32(&self) -> f32 {
            f16_to_f32(self.d)
        }
    }

    impl ScaledBlock for BlockIq2Xxs {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        /// As ggml's AVX2 `ggml_vec_dot_iq2_xxs_q8_K`: the grid magnitudes (unsigned) are
        /// maddubs' first operand, the signs go onto the activations, and each sub-block's
        /// products are weighted by `2·ls + 1`.
        #[inline(always)]
        unsafe fn sumi(&self, y: &BlockQ8K) -> __m256i {
            let mut sumi = _mm256_setzero_si256();
            for s in 0..8 {
                let g = |l: usize| self.grid(s, l) as i64;
                let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
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

    impl<I: Isa> Kernels<I> for Iq2Xxs {
        /// ggml's vec_dot order (the only one the table lists for this type), with its final
        /// `·0.125`.
        #[inline]
        fn dot_1x1(w: &[BlockIq2Xxs], a: &[BlockQ8K], _order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); every load
            // stays inside the blocks borrowed from `w` and `a`.
            0.125 * unsafe { scaled_dot(w, a, DotOrder::VecDot) }
        }

        grid_kernels!(I);
    }
}

/// The grid (`iq2xxs_grid` in ggml/src/ggml-common.h; generated from gguf-py's `IQ2_XXS.grid`,
/// which decodes to the same table): entry i holds eight magnitudes, byte j (little-endian) the
/// group's value j.
#[rustfmt::skip]
static IQ2XXS_GRID: [u64; 256] = [
    0x0808080808080808, 0x080808080808082b, 0x0808080808081919, 0x0808080808082b08,
    0x0808080808082b2b, 0x0808080808190819, 0x0808080808191908, 0x08080808082b0808,
    0x08080808082b082b, 0x08080808082b2b08, 0x08080808082b2b2b, 0x0808080819080819,
    0x0808080819081908, 0x0808080819190808, 0x0808080819192b08, 0x08080808192b0819,
    0x08080808192b1908, 0x080808082b080808, 0x080808082b08082b, 0x080808082b082b2b,
    0x080808082b2b082b, 0x0808081908080819, 0x0808081908081908, 0x0808081908190808,
    0x0808081908191919, 0x0808081919080808, 0x080808192b081908, 0x080808192b192b08,
    0x0808082b08080808, 0x0808082b0808082b, 0x0808082b082b082b, 0x0808082b2b08082b,
    0x0808190808080819, 0x0808190808081908, 0x0808190808190808, 0x08081908082b0819,
    0x08081908082b1908, 0x0808190819080808, 0x080819081908082b, 0x0808190819082b08,
    0x08081908192b0808, 0x080819082b080819, 0x080819082b081908, 0x080819082b190808,
    0x080819082b2b1908, 0x0808191908080808, 0x080819190808082b, 0x0808191908082b08,
    0x08081919082b0808, 0x080819191908192b, 0x08081919192b2b19, 0x080819192b080808,
    0x080819192b190819, 0x0808192b08082b19, 0x0808192b08190808, 0x0808192b19080808,
    0x0808192b2b081908, 0x0808192b2b2b1908, 0x08082b0808080808, 0x08082b0808081919,
    0x08082b0808082b08, 0x08082b0808191908, 0x08082b08082b2b08, 0x08082b0819080819,
    0x08082b0819081908, 0x08082b0819190808, 0x08082b081919082b, 0x08082b082b082b08,
    0x08082b1908081908, 0x08082b1919080808, 0x08082b2b0808082b, 0x08082b2b08191908,
    0x0819080808080819, 0x0819080808081908, 0x0819080808190808, 0x08190808082b0819,
    0x0819080819080808, 0x08190808192b0808, 0x081908082b081908, 0x081908082b190808,
    0x081908082b191919, 0x0819081908080808, 0x0819081908082b08, 0x08190819082b0808,
    0x0819081919190808, 0x0819081919192b2b, 0x081908192b080808, 0x0819082b082b1908,
    0x0819082b19081919, 0x0819190808080808, 0x0819190808082b08, 0x08191908082b0808,
    0x08191908082b1919, 0x0819190819082b19, 0x081919082b080808, 0x0819191908192b08,
    0x08191919192b082b, 0x0819192b08080808, 0x0819192b0819192b, 0x08192b0808080819,
    0x08192b0808081908, 0x08192b0808190808, 0x08192b0819080808, 0x08192b082b080819,
    0x08192b1908080808, 0x08192b1908081919, 0x08192b192b2b0808, 0x08192b2b19190819,
    0x082b080808080808, 0x082b08080808082b, 0x082b080808082b2b, 0x082b080819081908,
    0x082b0808192b0819, 0x082b08082b080808, 0x082b08082b08082b, 0x082b0819082b2b19,
    0x082b081919082b08, 0x082b082b08080808, 0x082b082b0808082b, 0x082b190808080819,
    0x082b190808081908, 0x082b190808190808, 0x082b190819080808, 0x082b19081919192b,
    0x082b191908080808, 0x082b191919080819, 0x082b1919192b1908, 0x082b192b2b190808,
    0x082b2b0808082b08, 0x082b2b08082b0808, 0x082b2b082b191908, 0x082b2b2b19081908,
    0x1908080808080819, 0x1908080808081908, 0x1908080808190808, 0x1908080808192b08,
    0x19080808082b0819, 0x19080808082b1908, 0x1908080819080808, 0x1908080819082b08,
    0x190808081919192b, 0x19080808192b0808, 0x190808082b080819, 0x190808082b081908,
    0x190808082b190808, 0x1908081908080808, 0x19080819082b0808, 0x19080819192b0819,
    0x190808192b080808, 0x190808192b081919, 0x1908082b08080819, 0x1908082b08190808,
    0x1908082b19082b08, 0x1908082b1919192b, 0x1908082b192b2b08, 0x1908190808080808,
    0x1908190808082b08, 0x19081908082b0808, 0x190819082b080808, 0x190819082b192b19,
    0x190819190819082b, 0x19081919082b1908, 0x1908192b08080808, 0x19082b0808080819,
    0x19082b0808081908, 0x19082b0808190808, 0x19082b0819080808, 0x19082b0819081919,
    0x19082b1908080808, 0x19082b1919192b08, 0x19082b19192b0819, 0x19082b192b08082b,
    0x19082b2b19081919, 0x19082b2b2b190808, 0x1919080808080808, 0x1919080808082b08,
    0x1919080808190819, 0x1919080808192b19, 0x19190808082b0808, 0x191908082b080808,
    0x191908082b082b08, 0x1919081908081908, 0x191908191908082b, 0x191908192b2b1908,
    0x1919082b2b190819, 0x191919082b190808, 0x191919082b19082b, 0x1919191908082b2b,
    0x1919192b08080819, 0x1919192b19191908, 0x19192b0808080808, 0x19192b0808190819,
    0x19192b0808192b19, 0x19192b08192b1908, 0x19192b1919080808, 0x19192b2b08082b08,
    0x192b080808081908, 0x192b080808190808, 0x192b080819080808, 0x192b0808192b2b08,
    0x192b081908080808, 0x192b081919191919, 0x192b082b08192b08, 0x192b082b192b0808,
    0x192b190808080808, 0x192b190808081919, 0x192b191908190808, 0x192b19190819082b,
    0x192b19192b081908, 0x192b2b081908082b, 0x2b08080808080808, 0x2b0808080808082b,
    0x2b08080808082b2b, 0x2b08080819080819, 0x2b0808082b08082b, 0x2b08081908081908,
    0x2b08081908192b08, 0x2b08081919080808, 0x2b08082b08190819, 0x2b08190808080819,
    0x2b08190808081908, 0x2b08190808190808, 0x2b08190808191919, 0x2b08190819080808,
    0x2b081908192b0808, 0x2b08191908080808, 0x2b0819191908192b, 0x2b0819192b191908,
    0x2b08192b08082b19, 0x2b08192b19080808, 0x2b08192b192b0808, 0x2b082b080808082b,
    0x2b082b1908081908, 0x2b082b2b08190819, 0x2b19080808081908, 0x2b19080808190808,
    0x2b190808082b1908, 0x2b19080819080808, 0x2b1908082b2b0819, 0x2b1908190819192b,
    0x2b1908192b080808, 0x2b19082b19081919, 0x2b19190808080808, 0x2b191908082b082b,
    0x2b19190819081908, 0x2b19191919190819, 0x2b192b082b080819, 0x2b192b19082b0808,
    0x2b2b08080808082b, 0x2b2b080819190808, 0x2b2b08082b081919, 0x2b2b081908082b19,
    0x2b2b082b08080808, 0x2b2b190808192b08, 0x2b2b2b0819190808, 0x2b2b2b1908081908,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries and a checksum of the table as gguf-py 0.19 decodes `IQ2_XXS.grid`.
    #[test]
    fn grid_is_ggml_s() {
        assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
        assert_eq!(IQ2XXS_GRID[1], 0x080808080808082b);
        assert_eq!(IQ2XXS_GRID[255], 0x2b2b2b1908081908);
        let sum = IQ2XXS_GRID.iter().fold(0u64, |s, &e| s.wrapping_add(e));
        assert_eq!(sum, 10026840302681211747);
    }

    /// ggml's `ksigns_iq2xs` (as in gguf-py's `IQ2_XXS.ksigns`), entries 0..8 and 120..128.
    #[test]
    fn ksigns_are_ggml_s() {
        assert_eq!(KSIGNS[..8], [0, 129, 130, 3, 132, 5, 6, 135]);
        assert_eq!(KSIGNS[120..], [120, 249, 250, 123, 252, 125, 126, 255]);
    }
}
