//! Splitting special tokens out of raw text before the model tokenizer runs
//! (llama.cpp's `tokenizer_st_partition`).
//!
//! llama.cpp takes the special tokens one at a time, longest text first, and carves every
//! leftmost non-overlapping occurrence out of each remaining text fragment. That order matters:
//! it is not a leftmost-longest scan (with tokens `abcd` and `xab`, "xabcd" gives `x`,`abcd`).
//! Running that loop over thousands of tokens costs O(tokens × text); here one trie pass finds
//! which tokens occur at all, and only those are carved, in the same order, with the same result.

use std::ops::Range;

use super::vocab::{Attr, Vocab};

/// A piece of the input: raw text (byte range) still to tokenize, or a special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// Byte trie over special-token texts. The root is a direct 256-way table because almost
/// every text position fails there.
struct Trie {
    root: [u32; 256],
    /// Per node: sorted (byte, child) edges and the token ending here, if any.
    nodes: Vec<Node>,
}

#[derive(Default)]
struct Node {
    edges: Vec<(u8, u32)>,
    token: Option<u32>,
}

impl Trie {
    fn new() -> Trie {
        Trie {
            root: [0; 256],
            // Node 0 is a sentinel so that 0 can mean "no child" in `root`.
            nodes: vec![Node::default()],
        }
    }

    fn insert(&mut self, text: &[u8], id: u32) {
        let Some((&first, rest)) = text.split_first() else {
            return;
        };
        let mut node = match self.root[first as usize] {
            0 => {
                self.nodes.push(Node::default());
                let n = self.nodes.len() as u32 - 1;
                self.root[first as usize] = n;
                n
            }
            n => n,
        };
        for &b in rest {
            let edges = &self.nodes[node as usize].edges;
            node = match edges.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => edges[i].1,
                Err(i) => {
                    let child = self.nodes.len() as u32;
                    self.nodes.push(Node::default());
                    self.nodes[node as usize].edges.insert(i, (b, child));
                    child
                }
            };
        }
        self.nodes[node as usize].token = Some(id);
    }

    /// Calls `f(id)` for every token whose text starts at `text[0]`.
    fn matches_at(&self, text: &[u8], mut f: impl FnMut(u32)) {
        let Some((&first, rest)) = text.split_first() else {
            return;
        };
        let mut node = match self.root[first as usize] {
            0 => return,
            n => &self.nodes[n as usize],
        };
        if let Some(id) = node.token {
            f(id);
        }
        for &b in rest {
            match node.edges.binary_search_by_key(&b, |e| e.0) {
                Ok(i) => node = &self.nodes[node.edges[i].1 as usize],
                Err(_) => return,
            }
            if let Some(id) = node.token {
                f(id);
            }
        }
    }
}

/// The special tokens of a vocabulary (CONTROL, USER_DEFINED and UNKNOWN), in matching order.
pub struct SpecialTokens {
    trie: Trie,
    /// `priority[id]`: position in llama.cpp's order (longest text first); only meaningful for
    /// special tokens.
    priority: Vec<u32>,
    /// `(id, text length)` of the special tokens, in priority order.
    len_by_priority: Vec<(u32, usize)>,
}

const SPECIAL: Attr = Attr::CONTROL.or(Attr::USER_DEFINED).or(Attr::UNKNOWN);

/// CONTROL and UNKNOWN tokens only count as text when the caller asks to parse specials;
/// USER_DEFINED ones always do (as in Hugging Face tokenizers and llama.cpp).
const ONLY_WITH_PARSE_SPECIAL: Attr = Attr::CONTROL.or(Attr::UNKNOWN);

impl SpecialTokens {
    pub fn new(vocab: &Vocab) -> SpecialTokens {
        let mut ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attr(id).has(SPECIAL))
            .collect();
        // llama.cpp sorts by length with an unstable sort; ties are ordered by id here, which
        // only matters for two equal-length tokens overlapping in the same text.
        ids.sort_by_key(|&id| (std::cmp::Reverse(vocab.text(id).len()), id));
        let mut trie = Trie::new();
        let mut priority = vec![u32::MAX; vocab.len()];
        let mut len_by_priority = Vec::with_capacity(ids.len());
        for (rank, &id) in ids.iter().enumerate() {
            trie.insert(vocab.text(id), id);
            priority[id as usize] = rank as u32;
            len_by_priority.push((id, vocab.text(id).len()));
        }
        SpecialTokens {
            trie,
            priority,
            len_by_priority,
        }
    }

    /// Byte offsets in `text` where the text of a token that is split out only with
    /// `parse_special` (CONTROL, UNKNOWN) starts.
    pub fn control_starts(&self, vocab: &Vocab, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut starts = Vec::new();
        for start in 0..bytes.len() {
            let mut found = false;
            self.trie.matches_at(&bytes[start..], |id| {
                found |= vocab.attr(id).has(ONLY_WITH_PARSE_SPECIAL);
            });
            if found {
                starts.push(start);
            }
        }
        starts
    }

    /// Splits `text` into raw-text fragments and special tokens, exactly as llama.cpp does.
    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        // (priority, start) of every occurrence of every eligible special token.
        let mut hits: Vec<(u32, u32)> = Vec::new();
        for start in 0..bytes.len() {
            self.trie.matches_at(&bytes[start..], |id| {
                if parse_special || !vocab.attr(id).has(ONLY_WITH_PARSE_SPECIAL) {
                    hits.push((self.priority[id as usize], start as u32));
                }
            });
        }
        let mut fragments = vec![Fragment::Text(0..bytes.len())];
        if hits.is_empty() {
            return fragments;
        }
        hits.sort_unstable();
        let mut next = Vec::with_capacity(fragments.len());
        for group in hits.chunk_by(|a, b| a.0 == b.0) {
            let (id, len) = self.len_by_priority[group[0].0 as usize];
            let starts: Vec<usize> = group.iter().map(|h| h.1 as usize).collect();
            next.clear();
            for fragment in fragments.drain(..) {
                match fragment {
                    Fragment::Text(range) => carve(range, &starts, len, id, &mut next),
                    token => next.push(token),
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}

/// Replaces, left to right, each non-overlapping occurrence (starting at one of `starts`,
/// sorted) of a `len`-byte token inside `range` by the token.
fn carve(range: Range<usize>, starts: &[usize], len: usize, id: u32, out: &mut Vec<Fragment>) {
    let mut cursor = range.start;
    let first = starts.partition_point(|&s| s < range.start);
    for &s in &starts[first..] {
        if s + len > range.end {
            break;
        }
        if s < cursor {
            continue;
        }
        if s > cursor {
            out.push(Fragment::Text(cursor..s));
        }
        out.push(Fragment::Token(id));
        cursor = s + len;
    }
    if cursor < range.end {
        out.push(Fragment::Text(cursor..range.end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_takes_leftmost_non_overlapping_occurrences() {
        // "aaaa" with token "aa" at every start: 0 and 2 are taken, 1 and 3 overlap.
        let mut out = Vec::new();
        carve(0..5, &[0, 1, 2, 3], 2, 7, &mut out);
        assert_eq!(
            out,
            vec![Fragment::Token(7), Fragment::Token(7), Fragment::Text(4..5)]
        );
    }

    #[test]
    fn carve_respects_fragment_bounds() {
        let mut out = Vec::new();
        carve(3..9, &[1, 4, 8], 2, 1, &mut out);
        assert_eq!(
            out,
            vec![
                Fragment::Text(3..4),
                Fragment::Token(1),
                Fragment::Text(6..9)
            ]
        );
    }
}
