//! The type of a tensor as the file states it: any ggml type, whether or not this engine reads
//! it. `inspect` and `tokenize` need only the header, so the reader accepts every type whose
//! block size it knows; only taking a tensor's typed view for inference ([`super::Gguf::tensor`])
//! refuses a type the kernels lack.

use std::fmt;

use crate::quant::GgmlType;

/// ggml's name, values per block and bytes per block of every tensor type a GGUF file may hold
/// (`type_traits` in ggml/src/ggml.c; ids 4, 5 and 31..33, 36..38 are retired). The sizes of the
/// types this engine reads come from the kernels' own table; a test checks that both agree.
const GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "f32", 1, 4),
    (1, "f16", 1, 2),
    (2, "q4_0", 32, 18),
    (3, "q4_1", 32, 20),
    (6, "q5_0", 32, 22),
    (7, "q5_1", 32, 24),
    (8, "q8_0", 32, 34),
    (9, "q8_1", 32, 36),
    (10, "q2_K", 256, 84),
    (11, "q3_K", 256, 110),
    (12, "q4_K", 256, 144),
    (13, "q5_K", 256, 176),
    (14, "q6_K", 256, 210),
    (15, "q8_K", 256, 292),
    (16, "iq2_xxs", 256, 66),
    (17, "iq2_xs", 256, 74),
    (18, "iq3_xxs", 256, 98),
    (19, "iq1_s", 256, 50),
    (20, "iq4_nl", 32, 18),
    (21, "iq3_s", 256, 110),
    (22, "iq2_s", 256, 82),
    (23, "iq4_xs", 256, 136),
    (24, "i8", 1, 1),
    (25, "i16", 1, 2),
    (26, "i32", 1, 4),
    (27, "i64", 1, 8),
    (28, "f64", 1, 8),
    (29, "iq1_m", 256, 56),
    (30, "bf16", 1, 2),
    (34, "tq1_0", 256, 54),
    (35, "tq2_0", 256, 66),
    (39, "mxfp4", 32, 17),
];

/// A tensor's ggml type: one this engine reads ([`TensorType::ggml`]) or one it only lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    Read(GgmlType),
    /// A ggml type the kernels do not implement; the index of its row in `GGML_TYPES`.
    Listed(u8),
}

impl TensorType {
    /// The type with ggml id `id`, if ggml has one (else the file is damaged or newer than us).
    pub fn from_id(id: u32) -> Option<TensorType> {
        if let Some(t) = GgmlType::from_id(id) {
            return Some(TensorType::Read(t));
        }
        let row = GGML_TYPES.iter().position(|r| r.0 == id)?;
        Some(TensorType::Listed(row as u8))
    }

    /// ggml's name of `id`, if it has one (for errors about types it does not know).
    pub fn name_of_id(id: u32) -> Option<&'static str> {
        GGML_TYPES.iter().find(|r| r.0 == id).map(|r| r.1)
    }

    /// The type the kernels read, or `None` for one this engine can only list.
    pub fn ggml(self) -> Option<GgmlType> {
        match self {
            TensorType::Read(t) => Some(t),
            TensorType::Listed(_) => None,
        }
    }

    pub fn id(self) -> u32 {
        match self {
            TensorType::Read(t) => t.id(),
            TensorType::Listed(row) => GGML_TYPES[row as usize].0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TensorType::Read(t) => t.name(),
            TensorType::Listed(row) => GGML_TYPES[row as usize].1,
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            TensorType::Read(t) => t.block_len(),
            TensorType::Listed(row) => GGML_TYPES[row as usize].2,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            TensorType::Read(t) => t.block_bytes(),
            TensorType::Listed(row) => GGML_TYPES[row as usize].3,
        }
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not a whole number of blocks or the
    /// byte count overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_len())
            .then_some(n / self.block_len())?
            .checked_mul(self.block_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq<GgmlType> for TensorType {
    fn eq(&self, other: &GgmlType) -> bool {
        self.ggml() == Some(*other)
    }
}

impl PartialEq<TensorType> for GgmlType {
    fn eq(&self, other: &TensorType) -> bool {
        other == self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the kernels' table and ggml's list both know a type, they agree on its facts.
    #[test]
    fn read_types_agree_with_ggml_list() {
        for t in GgmlType::SUPPORTED {
            let row = GGML_TYPES
                .iter()
                .find(|r| r.0 == t.id())
                .unwrap_or_else(|| panic!("{t} is missing from GGML_TYPES"));
            assert_eq!(
                (row.1, row.2, row.3),
                (t.name(), t.block_len(), t.block_bytes()),
                "{t}"
            );
        }
        for r in GGML_TYPES {
            let t = TensorType::from_id(r.0).expect("listed");
            assert_eq!((t.id(), t.name(), t.block_len()), (r.0, r.1, r.2));
        }
        assert_eq!(TensorType::from_id(99), None);
        assert_eq!(TensorType::from_id(4), None);
    }
}
