//! What [`GgmlType`] derives from the table's rows: sizes, the lookup by ggml id, and the names of
//! the ggml types we do not implement.

use std::fmt;

use super::format::Format;
use super::GgmlType;

/// Names of ggml types we recognise but do not implement, so errors can say what a file holds.
const KNOWN_UNSUPPORTED: &[(u32, &str)] = &[
    (24, "i8"),
    (25, "i16"),
    (26, "i32"),
    (27, "i64"),
    (28, "f64"),
    (39, "mxfp4"),
];

impl GgmlType {
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

    /// Values per block.
    pub fn block_len(self) -> usize {
        with_format!(self, F => F::LEN)
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub fn block_bytes(self) -> usize {
        with_format!(self, F => size_of::<<F as Format>::Block>())
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not a whole number of blocks or the
    /// byte count overflows `usize` (`n` can come from a hostile file).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_len())
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
        assert_eq!(GgmlType::from_id(39), None);
        assert_eq!(GgmlType::unsupported_name(39), Some("mxfp4"));
    }

    /// The table's rows are distinct types: one id and one name each, none also listed as
    /// unsupported, and activation-only types never accepted from a file.
    #[test]
    fn table_rows_are_distinct_and_only_weights_load() {
        for (i, a) in GgmlType::ALL.into_iter().enumerate() {
            assert_eq!(a as usize, i);
            assert!(GgmlType::unsupported_name(a.id()).is_none(), "{a}");
            for b in &GgmlType::ALL[i + 1..] {
                assert!(a.id() != b.id() && a.name() != b.name(), "{a} and {b}");
            }
            let weight = GgmlType::SUPPORTED.contains(&a);
            assert_eq!(GgmlType::from_id(a.id()).is_some(), weight, "{a}");
        }
    }
}
