//! Random but valid rows of any type, for the property tests and the kernel bench: random bits
//! everywhere except the block's float fields ([`Format::FLOATS`]), which get finite values.

use half::{bf16, f16};

use super::format::{Float, Format};
use super::GgmlType;

/// A row of `n` values of `ty` (`n` a whole number of blocks) drawn from `next`: every float
/// field uniform in [-`scale`, `scale`), every other bit random.
pub fn random_row(ty: GgmlType, n: usize, scale: f32, next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let Some(bytes) = ty.row_bytes(n) else {
        panic!("random_row: {n} values are not whole {ty} blocks");
    };
    let mut row = vec![0u8; bytes];
    for chunk in row.chunks_mut(8) {
        chunk.copy_from_slice(&next().to_le_bytes()[..chunk.len()]);
    }
    let floats = with_format!(ty, F => F::FLOATS);
    for block in row.chunks_exact_mut(ty.block_bytes()) {
        for &field in floats {
            let v = ((next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale;
            match field {
                Float::F16(at) => {
                    block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes())
                }
                Float::Bf16(at) => {
                    block[at..at + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes())
                }
                Float::F32(at) => block[at..at + 4].copy_from_slice(&v.to_le_bytes()),
                Float::F16Nibbles(at) => {
                    let bits = f16::from_f32(v).to_bits();
                    for k in 0..4 {
                        let byte = &mut block[at + 2 * k + 1];
                        *byte = (*byte & 0x0F) | (((bits >> (4 * k)) & 0xF) as u8) << 4;
                    }
                }
            }
        }
    }
    row
}
