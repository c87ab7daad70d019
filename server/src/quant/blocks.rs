//! What block layouts share: the [`Block`] trait and the `block!` macro that declares one (each
//! format's file declares its own, as in `ggml/src/ggml-common.h`), zero-copy views of rows as
//! blocks, and the decoders several formats use.
//!
//! Blocks are `#[repr(C)]` structs made only of byte arrays. Every field is a byte array, so every block has alignment 1: a tensor row at any address in the
//! memory-mapped file (GGUF only aligns tensors, not rows) can be viewed as a slice of blocks
//! without copying. Multi-byte fields are little-endian; the accessors decode them.

use half::{bf16, f16};

/// Values in a K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Values in a Q4_0/Q5_0/Q8_0/IQ4_NL block (`QK4_0`, `QK8_0`, ...).
pub const QK: usize = 32;

/// The non-uniform 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl` in ggml-common.h).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The IQ2/IQ3 sign patterns (`ksigns_iq2xs` in ggml-common.h): a 7-bit index gives eight sign
/// bits, the eighth making the count of negative values even.
pub const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

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
        bytes.len().is_multiple_of(size),
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
        bytes.len().is_multiple_of(size),
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

/// Declares a block struct of byte-array fields and checks at compile time that it has ggml's
/// size (`sizeof(block_*)`) and alignment 1.
macro_rules! block {
    ($(#[$doc:meta])* $name:ident, bytes $bytes:expr, { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $name { $(pub $field: $ty),* }
        const _: () = assert!(size_of::<$name>() == $bytes && align_of::<$name>() == 1);
        // SAFETY: byte arrays only, checked above to have no padding and alignment 1.
        unsafe impl $crate::quant::blocks::Block for $name {}
    };
}
pub(crate) use block;

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

    block!(Pair, bytes 2, { v: [u8; 2] });

    #[test]
    fn views_reject_partial_blocks() {
        let bytes = [0u8; 68];
        assert_eq!(blocks::<Pair>(&bytes).len(), 34);
        let caught = std::panic::catch_unwind(|| blocks::<Pair>(&bytes[..67]).len());
        assert!(caught.is_err());
    }
}
