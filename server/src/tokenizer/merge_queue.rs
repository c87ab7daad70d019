//! The order both merge tokenizers take candidate merges in: the best first and, among equals,
//! the leftmost pair (llama.cpp's tie rule, the same for SPM and BPE).

use std::cmp::Ordering;

/// A queued merge of the symbol at `left` with its right neighbour. `key` ranks it (greater
/// first); `pair` holds what the tokenizer needs to check and apply it.
pub struct Candidate<K, T> {
    pub key: K,
    pub left: i32,
    pub pair: T,
}

impl<K: PartialOrd, T> Ord for Candidate<K, T> {
    /// Max-heap order. Incomparable keys (NaN scores) compare equal, as under C++'s `<`.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .partial_cmp(&other.key)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl<K: PartialOrd, T> PartialOrd for Candidate<K, T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: PartialOrd, T> PartialEq for Candidate<K, T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K: PartialOrd, T> Eq for Candidate<K, T> {}
