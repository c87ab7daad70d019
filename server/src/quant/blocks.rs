//! Block layouts of ggml's quantised formats (`ggml/src/ggml-common.h`), as `#[repr(C)]` structs
//! made only of byte arrays.
//!
//! Every field is a byte array, so every block has alignment 1: a tensor row at any address in the
//! memory-mapped file (GGUF only aligns tensors, not rows) can be viewed as a slice of blocks
//! without copying. Multi-byte fields are little-endian; the accessors decode them.

use half::{bf16, f16};

/// Values in a K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Values in a Q4_0/Q5_0/Q8_0/IQ4_NL block.
pub const QK: usize = 32;

/// The non-uniform 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl` in ggml-common.h).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// A block type whose every bit pattern is valid and whose alignment is 1.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs of `u8`/`i8` arrays only (no padding, align 1), so
/// that any byte slice of the right length is a valid slice of them.
pub unsafe trait Block: Copy {}

/// Views `bytes` as blocks. Panics (a caller bug, not bad input: tensor shapes are validated when
/// the model is loaded) if `bytes` is not a whole number of blocks.
#[inline(always)]
pub fn blocks<T: Block>(bytes: &[u8]) -> &[T] {
    let size = size_of::<T>();
    assert!(
        bytes.len() % size == 0,
        "{} bytes is not a whole number of {}-byte blocks",
        bytes.len(),
        size
    );
    // SAFETY: `T: Block` has alignment 1 and accepts any bit pattern; the length is a multiple
    // of its size, and the lifetime is carried over from `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}

/// Mutable counterpart of [`blocks`].
#[inline(always)]
pub fn blocks_mut<T: Block>(bytes: &mut [u8]) -> &mut [T] {
    let size = size_of::<T>();
    assert!(
        bytes.len() % size == 0,
        "{} bytes is not a whole number of {}-byte blocks",
        bytes.len(),
        size
    );
    // SAFETY: as in `blocks`; the exclusive borrow is carried over from `bytes`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size) }
}

#[inline(always)]
pub fn f16_to_f32(bits: [u8; 2]) -> f32 {
    f16::from_le_bytes(bits).to_f32()
}

#[inline(always)]
pub fn bf16_to_f32(bits: [u8; 2]) -> f32 {
    bf16::from_le_bytes(bits).to_f32()
}

macro_rules! block {
    ($(#[$doc:meta])* $name:ident, bytes $bytes:expr, { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $name { $(pub $field: $ty),* }
        const _: () = assert!(size_of::<$name>() == $bytes && align_of::<$name>() == 1);
        // SAFETY: byte arrays only, checked above to have no padding and alignment 1.
        unsafe impl Block for $name {}
    };
}

block!(
    /// `d: f16; qs: [u8; 16]`: value j is `(qs[j] & 15) - 8`, value j+16 is `(qs[j] >> 4) - 8`.
    BlockQ4_0, bytes 18, { d: [u8; 2], qs: [u8; 16] }
);
block!(
    /// Q4_0's nibbles plus a fifth bit per value in `qh` (a little-endian u32, bit i for value i);
    /// values are `q - 16`.
    BlockQ5_0, bytes 22, { d: [u8; 2], qh: [u8; 4], qs: [u8; 16] }
);
block!(
    /// `d: f16; qs: [i8; 32]`; also the activation format for 32-blocks.
    BlockQ8_0, bytes 34, { d: [u8; 2], qs: [i8; 32] }
);
block!(
    /// Q4_0's nibble order, each nibble indexing [`KVALUES_IQ4NL`].
    BlockIq4Nl, bytes 18, { d: [u8; 2], qs: [u8; 16] }
);
block!(
    /// Eight sub-blocks of 32 with 6-bit scales and mins packed in `scales` (see
    /// [`scales_mins_k4`]); each 64 values use 32 bytes of `qs`, low nibbles first.
    BlockQ4K, bytes 144, { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qs: [u8; 128] }
);
block!(
    /// Q4_K plus a fifth bit per value: chunk c (64 values) takes bit 2c of `qh[l]` for value l
    /// and bit 2c+1 for value 32+l.
    BlockQ5K, bytes 176,
    { d: [u8; 2], dmin: [u8; 2], scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
);
block!(
    /// Sixteen sub-blocks of 16 with signed 8-bit scales; 6-bit quants offset by 32; `d` last.
    BlockQ6K, bytes 210, { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: [u8; 2] }
);
block!(
    /// Eight sub-blocks of 32 with 6-bit scales (low 4 bits in `scales_l`, high 2 in the
    /// little-endian u16 `scales_h`), offset by 32; nibbles as in IQ4_NL.
    BlockIq4Xs, bytes 136,
    { d: [u8; 2], scales_h: [u8; 2], scales_l: [u8; 4], qs: [u8; 128] }
);
block!(
    /// Activation format for K-quants: f32 `d`, and `bsums[k]` (i16) = sum of `qs[16k..16k+16]`.
    BlockQ8K, bytes 292, { d: [u8; 4], qs: [i8; 256], bsums: [u8; 32] }
);

impl BlockQ8K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    #[inline(always)]
    pub fn bsum(&self, k: usize) -> i32 {
        i16::from_le_bytes([self.bsums[2 * k], self.bsums[2 * k + 1]]) as i32
    }
}

impl BlockIq4Xs {
    /// The signed scale (`ls - 32`) of sub-block `ib` (0..8).
    #[inline(always)]
    pub fn scale(&self, ib: usize) -> i32 {
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = (u16::from_le_bytes(self.scales_h) >> (2 * ib)) & 3;
        (low as i32 | (high as i32) << 4) - 32
    }
}

/// Unpacks the twelve Q4_K/Q5_K scale bytes into 8 six-bit scales followed by 8 six-bit mins.
///
/// Sub-blocks 0..4 keep scale and min in the low 6 bits of bytes 0..4 and 4..8; sub-blocks 4..8
/// have their low 4 bits in the nibbles of bytes 8..12 and their top 2 bits in the spare top bits
/// of bytes 0..8 (ggml's `get_scale_min_k4`). Done on u32 words, as the x86 kernels do, because it
/// runs once per super-block in the hot loop.
#[inline(always)]
pub fn scales_mins_k4(packed: &[u8; 12]) -> [u8; 16] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let scales_lo = w0 & LOW6;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_lo = w1 & LOW6;
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let mut out = [0u8; 16];
    for (i, word) in [scales_lo, scales_hi, mins_lo, mins_hi]
        .into_iter()
        .enumerate()
    {
        out[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// ggml's `get_scale_min_k4` (llama.cpp, `ggml/src/ggml-quants.c`), written out per sub-block.
    fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    proptest! {
        #[test]
        fn word_unpacking_matches_get_scale_min_k4(packed in any::<[u8; 12]>()) {
            let out = scales_mins_k4(&packed);
            for j in 0..8 {
                prop_assert_eq!((out[j], out[8 + j]), get_scale_min_k4(j, &packed));
            }
        }
    }

    #[test]
    fn views_reject_partial_blocks() {
        let bytes = [0u8; 68];
        assert_eq!(blocks::<BlockQ8_0>(&bytes).len(), 2);
        let caught = std::panic::catch_unwind(|| blocks::<BlockQ8_0>(&bytes[..67]).len());
        assert!(caught.is_err());
    }
}
