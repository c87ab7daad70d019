//! The tensor types of GGUF files: ids as `ggml.h` numbers them, and the block facts every
//! other module derives sizes from (one table, as ggml's `type_traits`).

use std::fmt;

/// A tensor element type, numbered as in ggml's `enum ggml_type`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q5_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    /// Activation-only format (never stored in model files we accept).
    Q8_K,
}

/// Names of ggml types we recognise but do not implement, so errors can say what a file holds.
const KNOWN_UNSUPPORTED: &[(u32, &str)] = &[
    (3, "q4_1"),
    (7, "q5_1"),
    (9, "q8_1"),
    (10, "q2_K"),
    (11, "q3_K"),
    (16, "iq2_xxs"),
    (17, "iq2_xs"),
    (18, "iq3_xxs"),
    (19, "iq1_s"),
    (21, "iq3_s"),
    (22, "iq2_s"),
    (24, "i8"),
    (25, "i16"),
    (26, "i32"),
    (27, "i64"),
    (28, "f64"),
    (29, "iq1_m"),
    (34, "tq1_0"),
    (35, "tq2_0"),
    (39, "mxfp4"),
];

impl GgmlType {
    /// Every type a model tensor may have.
    pub const SUPPORTED: [GgmlType; 11] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];

    /// The type with ggml id `id`, if it is one a model tensor may have.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::SUPPORTED.into_iter().find(|t| t.id() == id)
    }

    /// ggml's name of an id we do not support (for error messages), if it is a known one.
    pub fn unsupported_name(id: u32) -> Option<&'static str> {
        KNOWN_UNSUPPORTED
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, n)| *n)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q5_0 => 6,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::Q8_K => "q8_K",
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => 32,
            GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS
            | GgmlType::Q8_K => 256,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q5_0 => 22,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::IQ4_NL => 18,
            GgmlType::IQ4_XS => 136,
            GgmlType::Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not a whole number of blocks or the
    /// byte count overflows `usize` (`n` can come from a hostile file).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        (n % self.block_len() == 0)
            .then_some(n / self.block_len())?
            .checked_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_match_ggml() {
        for t in GgmlType::SUPPORTED {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert!(GgmlType::unsupported_name(t.id()).is_none());
        }
        // bits per weight from ggml-common.h
        assert_eq!(GgmlType::Q4_K.row_bytes(256), Some(144));
        assert_eq!(GgmlType::Q6_K.row_bytes(512), Some(420));
        assert_eq!(GgmlType::Q8_0.row_bytes(640), Some(680));
        assert_eq!(GgmlType::Q4_K.row_bytes(640), None);
        assert_eq!(GgmlType::from_id(3), None);
        assert_eq!(GgmlType::unsupported_name(3), Some("q4_1"));
    }
}
