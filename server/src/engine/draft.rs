//! Prompt-lookup drafting for speculative decoding: the tokens that followed the last earlier
//! occurrence of the text's final n-gram, in the prompt or the output so far. Where the output
//! copies its input (extraction, summaries, code edits) those are usually the next tokens; the
//! scheduler verifies them all in one pass and keeps the prefix the model agrees with.

use smallvec::SmallVec;

use crate::model::MAX_DRAFT;

/// The n-gram lengths tried, longest (most specific) first.
const NGRAMS: [usize; 2] = [3, 2];

/// A draft is tried on the tokens of a task only while at least this share of its drafted
/// tokens are accepted, judged after [`JUDGE_AFTER`] of them: a rejected draft costs its rows in
/// the pass (free chat rarely repeats itself).
pub const MIN_ACCEPTANCE: f64 = 0.3;
pub const JUDGE_AFTER: usize = 16;

pub type Draft = SmallVec<[u32; MAX_DRAFT]>;

/// Up to `max` tokens that followed the latest earlier occurrence of `history`'s last n-gram.
pub fn ngram_draft(history: &[u32], max: usize) -> Draft {
    let max = max.min(MAX_DRAFT);
    let mut draft = Draft::new();
    if max == 0 {
        return draft;
    }
    for n in NGRAMS {
        if history.len() <= n {
            continue;
        }
        let suffix = &history[history.len() - n..];
        // Latest first: the most recent context is the likeliest to continue the same way.
        let found = (0..history.len() - n)
            .rev()
            .find(|&j| &history[j..j + n] == suffix);
        if let Some(j) = found {
            let next = &history[j + n..(j + n + max).min(history.len())];
            draft.extend_from_slice(next);
            return draft;
        }
    }
    draft
}

/// Whether a task that drafted `drafted` tokens and had `accepted` of them taken should draft on.
pub fn worth_drafting(drafted: usize, accepted: usize) -> bool {
    drafted < JUDGE_AFTER || accepted as f64 >= MIN_ACCEPTANCE * drafted as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_last_ngram() {
        // The 3-gram "1 2 3" occurred at the start: what followed it.
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
        assert_eq!(ngram_draft(&h, 4).as_slice(), &[4, 5, 6, 7]);
        assert_eq!(ngram_draft(&h, 2).as_slice(), &[4, 5]);
        // Only a 2-gram matches; the latest occurrence wins.
        let h = [7, 8, 1, 7, 8, 2, 9, 7, 8];
        assert_eq!(ngram_draft(&h, 4).as_slice(), &[2, 9, 7, 8]);
        // A draft may run into the text's own end.
        let h = [5, 6, 5, 6];
        assert_eq!(ngram_draft(&h, 4).as_slice(), &[5, 6]);
        assert!(ngram_draft(&[1, 2, 3, 4], 4).is_empty(), "nothing repeats");
        assert!(ngram_draft(&[1, 2], 4).is_empty());
        assert!(ngram_draft(&h, 0).is_empty());
    }

    #[test]
    fn drafting_stops_when_it_rarely_pays() {
        assert!(worth_drafting(0, 0));
        assert!(worth_drafting(JUDGE_AFTER - 1, 0));
        assert!(!worth_drafting(JUDGE_AFTER, 0));
        assert!(worth_drafting(20, 6));
        assert!(!worth_drafting(20, 5));
    }
}
