//! IQ4_NL: Q4_0's nibble order, each nibble indexing a non-uniform grid, dotted against Q8_0.

use std::mem::offset_of;

use crate::quant::blocks::{block, KVALUES_IQ4NL, QK};
use crate::quant::format::{Float, Format, Weight};
use crate::quant::formats::q8_0::BlockQ8_0;
use crate::quant::scalar;

block!(
    /// Q4_0's nibble order, each nibble indexing [`KVALUES_IQ4NL`].
    BlockIq4Nl, bytes 18, { d: [u8; 2], qs: [u8; 16] }
);

impl BlockIq4Nl {
    /// The quants looked up in the grid, in element order.
    pub fn values(&self) -> [i8; QK] {
        let mut v = [0i8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            v[j] = KVALUES_IQ4NL[(q & 0xF) as usize];
            v[j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
        }
        v
    }
}

pub struct Iq4Nl;

impl Format for Iq4Nl {
    type Block = BlockIq4Nl;
    const LEN: usize = QK;
    const FLOATS: &'static [Float] = &[Float::F16(offset_of!(BlockIq4Nl, d))];

    fn dequantize(b: &BlockIq4Nl, out: &mut [f32]) {
        scalar::dequantize_32(b.d, b.values(), out);
    }
}

impl Weight for Iq4Nl {
    fn dot_ref(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
        scalar::dot_32(w, a, |b| (b.d, b.values()))
    }
}

avx2! {
    use std::arch::x86_64::*;

    use crate::quant::format::Kernels;
    use crate::quant::simd::block32::{self, SignedBlock32};
    use crate::quant::simd::{iq4nl_grid, nibbles_32};
    use crate::quant::DotOrder;

    impl SignedBlock32 for BlockIq4Nl {
        #[inline(always)]
        fn d(&self) -> [u8; 2] {
            self.d
        }

        #[inline(always)]
        unsafe fn quants(&self) -> __m256i {
            _mm256_shuffle_epi8(iq4nl_grid(), nibbles_32(self.qs.as_ptr()))
        }
    }

    impl Kernels for Iq4Nl {
        // [`block32::dot_rows_tiled`] in the repacked order (the two-chain vec_dot goes row by row).
        block32::tiled_rows!(plain_vec_dot: false);

        /// vec_dot with ggml's two chains ([`block32::vec_dot_pairs`]), or the repacked chain.
        #[inline]
        fn dot(w: &[BlockIq4Nl], a: &[BlockQ8_0], order: DotOrder) -> f32 {
            // SAFETY: the target has AVX2/FMA/F16C (this impl is compiled only then); loads stay
            // inside the blocks borrowed from `w` and `a`.
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked(w, a),
                    _ => block32::vec_dot_pairs(w, a),
                }
            }
        }

        #[inline]
        fn dot_x4(w: &[BlockIq4Nl], a: [&[BlockQ8_0]; 4], order: DotOrder) -> [f32; 4] {
            match order {
                // SAFETY: as in `dot`; every activation row holds as many blocks as `w` (checked
                // by the caller).
                DotOrder::Repacked => unsafe { block32::repacked_n(w, a) },
                _ => Self::dot_n(w, a, order),
            }
        }

        /// Repacked, [`block32::repacked_4rows`]; otherwise four [`Kernels::dot`]s.
        #[inline]
        fn dot_4rows(w: [&[BlockIq4Nl]; 4], a: &[BlockQ8_0], order: DotOrder) -> [f32; 4] {
            match order {
                // SAFETY: as in `dot`; the kernel checks the rows' lengths.
                DotOrder::Repacked => unsafe { block32::repacked_4rows(w, a) },
                _ => w.map(|w| Self::dot(w, a, order)),
            }
        }

        #[inline]
        fn dot_n<const N: usize>(w: &[BlockIq4Nl], a: [&[BlockQ8_0]; N], order: DotOrder) -> [f32; N] {
            // SAFETY: as in `dot`; every activation row holds as many blocks as `w` (checked by
            // the caller).
            unsafe {
                match order {
                    DotOrder::Repacked => block32::repacked_n(w, a),
                    _ => block32::vec_dot_pairs_n(w, a),
                }
            }
        }
    }
}
