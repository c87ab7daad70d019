//! Token sampling: penalties, top-k, top-p, min-p and temperature, in llama.cpp's order,
//! from buffers allocated once. The same seed gives the same tokens.

use llguidance::toktrie::SimpleVob;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smallvec::SmallVec;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 (or less) samples greedily.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recent tokens; 1.0 disables.
    pub repeat_penalty: f32,
    /// Subtracted once from every recent token's logit (OpenAI `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted per occurrence (OpenAI `frequency_penalty`).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

/// Alternatives a [`TokenLogprob`] holds in place: OpenAI's limit on `top_logprobs`, so that
/// no request's log-probabilities allocate per token.
pub const TOP_LOGPROBS_INLINE: usize = 20;

/// A sampled token's log-probability and the most likely tokens with theirs, highest first:
/// log-softmax over the whole vocabulary of the logits after the penalties, divided by the
/// temperature (1 when sampling greedily), before top-k/top-p/min-p and any grammar mask.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: Candidate,
    pub top: SmallVec<[Candidate; TOP_LOGPROBS_INLINE]>,
}

/// A token and its log-probability. Its text is the vocabulary's
/// ([`Tokenizer::piece`](crate::tokenizer::Tokenizer::piece)), looked up where it is written
/// out rather than copied for every token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logprob: f32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Self::default()
        }
    }
}

pub struct Sampler {
    params: SamplerParams,
    rng: ChaCha8Rng,
    /// (token, logit) candidates, and per-token occurrence counts for the penalties.
    cand: Vec<(u32, f32)>,
    counts: Vec<u32>,
    /// Whether [`Sampler::sample_allowed`] is to fill `processed`.
    keep_processed: bool,
    /// Every token's logit after the penalties, kept for log-probabilities (allocated at the
    /// first request for them, then reused).
    processed: Vec<f32>,
}

impl Sampler {
    /// Heap bytes a sampler over `n_vocab` tokens holds (the memory planner's figure): one
    /// candidate and one count per token, allocated once in [`Sampler::new`].
    pub fn bytes(n_vocab: usize) -> u64 {
        (n_vocab * (size_of::<(u32, f32)>() + size_of::<u32>())) as u64
    }

    /// A sampler choosing among the first `n_vocab` logits (the tokenizer's vocabulary).
    pub fn new(params: SamplerParams, n_vocab: usize) -> Sampler {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            cand: Vec::with_capacity(n_vocab),
            counts: vec![0; n_vocab],
            keep_processed: false,
            processed: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Restarts the random stream (same seed, same output).
    pub fn reset(&mut self) {
        self.rng = ChaCha8Rng::seed_from_u64(self.params.seed);
    }

    /// Picks the next token from `logits`, given the tokens so far (`history`).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_allowed(logits, history, None)
    }

    /// As [`Sampler::sample_allowed`], and the chosen token's [`TokenLogprob`] with the `top_n`
    /// most likely alternatives (held in place up to [`TOP_LOGPROBS_INLINE`]).
    pub fn sample_logprobs(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<&SimpleVob>,
        top_n: usize,
    ) -> (u32, TokenLogprob) {
        self.keep_processed = true;
        let token = self.sample_allowed(logits, history, allowed);
        self.keep_processed = false;
        let t = if self.params.temperature > 0.0 {
            self.params.temperature
        } else {
            1.0
        };
        let l = &self.processed;
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = l.iter().map(|&x| (((x - max) / t) as f64).exp()).sum();
        let lse = max / t + sum.ln() as f32;
        let logprob = |x: f32| x / t - lse;
        // The top_n by a running insertion: one pass, no sort of the vocabulary, and no more
        // than top_n held at any time (so up to TOP_LOGPROBS_INLINE nothing is allocated).
        let mut top: SmallVec<[Candidate; TOP_LOGPROBS_INLINE]> = SmallVec::new();
        if top_n > 0 {
            for (i, &x) in l.iter().enumerate() {
                if top.len() == top_n {
                    if x <= top[top_n - 1].logprob {
                        continue;
                    }
                    top.pop();
                }
                let at = top.partition_point(|c| c.logprob >= x);
                top.insert(
                    at,
                    Candidate {
                        id: i as u32,
                        logprob: x,
                    },
                );
            }
        }
        for c in &mut top {
            c.logprob = logprob(c.logprob);
        }
        let chosen = TokenLogprob {
            token: Candidate {
                id: token,
                logprob: logprob(l[token as usize]),
            },
            top,
        };
        (token, chosen)
    }

    /// As [`Sampler::sample`], among the tokens `allowed` only (a grammar's mask). The mask is
    /// applied after the penalties and before top-k/top-p/min-p, as llama.cpp applies its
    /// grammar, so that the truncations keep only tokens that may be chosen. The mask must
    /// allow at least one token.
    pub fn sample_allowed(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<&SimpleVob>,
    ) -> u32 {
        // Only the tokenizer's tokens may be chosen: an embedding padded to a round number of
        // rows has logits past the vocabulary, and such an id would index past the grammar's
        // mask (a panic on the decode thread) and has no text.
        let logits = &logits[..logits.len().min(self.counts.len())];
        let p = &self.params;
        let recent = &history[history.len().saturating_sub(p.repeat_last_n)..];
        let penalise = !recent.is_empty()
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0);
        if p.temperature <= 0.0 && !penalise && allowed.is_none() && !self.keep_processed {
            // Nothing changes the logits: their argmax, without first copying the vocabulary
            // into candidates (2 MiB per token for Gemma's 262k tokens).
            return argmax_logits(logits);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if penalise {
            for &t in recent {
                if let Some(c) = self.counts.get_mut(t as usize) {
                    *c += 1;
                }
            }
            for &t in recent {
                let Some(count) = self.counts.get_mut(t as usize) else {
                    continue;
                };
                if *count == 0 {
                    continue; // already applied for an earlier occurrence
                }
                let l = &mut self.cand[t as usize].1;
                *l = if *l > 0.0 {
                    *l / p.repeat_penalty
                } else {
                    *l * p.repeat_penalty
                };
                *l -= *count as f32 * p.frequency_penalty + p.presence_penalty;
                *count = 0;
            }
        }
        if self.keep_processed {
            self.processed.clear();
            self.processed.extend(self.cand.iter().map(|c| c.1));
        }
        if let Some(mask) = allowed {
            self.cand
                .retain(|c| (c.0 as usize) < mask.len() && mask.is_allowed(c.0));
            if self.cand.is_empty() {
                // Nothing allowed is the grammar's bug; end-of-generation is the safe answer.
                return mask.first_bit_set().map_or(0, |t| t as u32);
            }
        }
        if p.temperature <= 0.0 {
            return argmax(&self.cand);
        }
        let mut cand = &mut self.cand[..];
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cand = &mut cand[..p.top_k];
        }
        // Sorted from here on: top-p needs the order, and after top-k this is cheap.
        if p.top_p < 1.0 || p.min_p > 0.0 {
            cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        }
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        if p.min_p > 0.0 {
            // Keep tokens whose probability is at least min_p × the top one's.
            let cut = max + p.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= cut).count().max(1);
            cand = &mut cand[..keep];
        }
        if p.top_p < 1.0 {
            let total: f64 = cand.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += ((c.1 - max) as f64).exp() / total;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand = &mut cand[..keep];
        }
        let t = p.temperature;
        let total: f64 = cand.iter().map(|c| (((c.1 - max) / t) as f64).exp()).sum();
        let mut r = self.rng.random::<f64>() * total;
        for c in cand.iter() {
            r -= (((c.1 - max) / t) as f64).exp();
            if r <= 0.0 {
                return c.0;
            }
        }
        cand[cand.len() - 1].0
    }
}

/// The id of the highest logit, as [`argmax`] picks it (ties go to the lowest id; NaN is
/// never the highest). The maximum is taken in independent lanes, which the compiler keeps in
/// vector registers, then its first occurrence is looked up.
fn argmax_logits(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&x| x == max).unwrap_or(0) as u32
}

/// The highest logit; ties go to the lowest id, as llama.cpp's greedy sampler.
fn argmax(cand: &[(u32, f32)]) -> u32 {
    let mut best = 0;
    for (i, c) in cand.iter().enumerate() {
        if c.1 > cand[best].1 {
            best = i;
        }
    }
    cand[best].0
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_what_new_allocates() {
        let s = Sampler::new(SamplerParams::default(), 1000);
        let held =
            s.cand.capacity() * size_of::<(u32, f32)>() + s.counts.capacity() * size_of::<u32>();
        assert_eq!(Sampler::bytes(1000), held as u64);
    }

    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let l = logits();
        let best = l
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        assert_eq!(
            Sampler::new(SamplerParams::greedy(), 100).sample(&l, &[]),
            best
        );
    }

    #[test]
    fn greedy_without_adjustments_matches_the_candidates_argmax() {
        // Ties (the lowest id wins), a maximum in the tail after the last full lane chunk,
        // at the very start, and negative infinities.
        let cases: [Vec<f32>; 5] = [
            vec![1.0, 3.0, 3.0, 2.0],
            (0..37).map(|i| (i % 5) as f32).collect(),
            (0..35).map(|i| if i == 33 { 9.0 } else { 0.5 }).collect(),
            (0..40)
                .map(|i| if i == 0 { 1.0 } else { -(i as f32) })
                .collect(),
            vec![f32::NEG_INFINITY; 20],
        ];
        for l in cases {
            let cand: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
            let mut s = Sampler::new(SamplerParams::greedy(), l.len());
            assert_eq!(s.sample(&l, &[1, 2]), argmax(&cand), "{l:?}");
        }
    }

    #[test]
    fn same_seed_same_tokens_and_different_seed_differs() {
        let l: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.1).collect();
        let params = SamplerParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let run = |p: SamplerParams| {
            let mut s = Sampler::new(p, 100);
            (0..50).map(|_| s.sample(&l, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(params.clone()), run(params.clone()));
        assert_ne!(
            run(params.clone()),
            run(SamplerParams { seed: 8, ..params })
        );
    }

    #[test]
    fn top_k_one_is_greedy_and_penalties_move_the_choice() {
        let mut l = vec![0.0f32; 10];
        l[3] = 5.0;
        l[4] = 4.9;
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        assert_eq!(Sampler::new(p.clone(), 10).sample(&l, &[]), 3);
        let p = SamplerParams {
            presence_penalty: 1.0,
            ..p
        };
        assert_eq!(Sampler::new(p, 10).sample(&l, &[3, 3]), 4);
        let g = SamplerParams {
            frequency_penalty: 0.06,
            ..SamplerParams::greedy()
        };
        assert_eq!(
            Sampler::new(g.clone(), 10).sample(&l, &[3]),
            3,
            "one occurrence: 4.94 > 4.9"
        );
        assert_eq!(
            Sampler::new(g, 10).sample(&l, &[3, 3]),
            4,
            "two: 4.88 < 4.9"
        );
    }

    #[test]
    fn logprobs_are_log_softmax_after_penalties_and_temperature() {
        let l = vec![1.0f32, 3.0, 2.0, 0.5];
        let p = SamplerParams {
            temperature: 0.5,
            presence_penalty: 1.0,
            ..SamplerParams::greedy()
        };
        let mut s = Sampler::new(
            SamplerParams {
                temperature: 0.0,
                ..p.clone()
            },
            4,
        );
        let (t, lp) = s.sample_logprobs(&l, &[1], None, 3);
        // Token 1 is penalised to 2.0, a tie with token 2: the lower id wins, as greedy does.
        assert_eq!(t, 1);
        let z: f32 = [1.0f32, 2.0, 2.0, 0.5].iter().map(|x| x.exp()).sum();
        assert_eq!(lp.token.id, 1);
        assert!((lp.token.logprob - (2.0 - z.ln())).abs() < 1e-5, "{lp:?}");
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].id, 1);
        assert_eq!(lp.top[2].id, 0);
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        let mut s = Sampler::new(p, 4);
        let (_, lp) = s.sample_logprobs(&l, &[], None, 1);
        let z: f32 = l.iter().map(|x| (x / 0.5).exp()).sum();
        assert!(
            (lp.top[0].logprob - (3.0 / 0.5 - z.ln())).abs() < 1e-5,
            "{lp:?}"
        );
    }

    #[test]
    fn the_most_alternatives_asked_for_are_held_in_place() {
        let l: Vec<f32> = (0..100).map(|i| ((i * 37) % 100) as f32).collect();
        let mut s = Sampler::new(SamplerParams::greedy(), l.len());
        let (_, lp) = s.sample_logprobs(&l, &[], None, TOP_LOGPROBS_INLINE);
        assert!(!lp.top.spilled());
        assert_eq!(lp.top.len(), TOP_LOGPROBS_INLINE);
        // The 20 highest logits are 99 down to 80, in that order.
        let logit = |id: u32| l[id as usize];
        let logits: Vec<f32> = lp.top.iter().map(|c| logit(c.id)).collect();
        let expected: Vec<f32> = (80..100).rev().map(|x| x as f32).collect();
        assert_eq!(logits, expected);
        assert_eq!(lp.token, lp.top[0]);
    }

    #[test]
    /// Logits of padded embedding rows (past the tokenizer's vocabulary) are never chosen,
    /// with or without a grammar's mask (issue 42: such an id indexed past the mask).
    fn padded_rows_are_never_chosen() {
        // A vocabulary of 3 in an embedding of 8 rows; the padding has the largest logits.
        let l = [0.1, 0.5, 0.2, 9.0, 9.0, 9.0, 9.0, 9.0];
        let mut mask = SimpleVob::alloc(3);
        mask.allow_token(0);
        mask.allow_token(2);
        for params in [SamplerParams::greedy(), SamplerParams::default()] {
            let mut s = Sampler::new(params, 3);
            for _ in 0..50 {
                assert!(s.sample(&l, &[]) < 3);
                assert!(matches!(s.sample_allowed(&l, &[1], Some(&mask)), 0 | 2));
                let (t, lp) = s.sample_logprobs(&l, &[], Some(&mask), 5);
                assert!(matches!(t, 0 | 2));
                assert!(lp.top.iter().all(|c| c.id < 3), "{lp:?}");
            }
        }
    }

    #[test]
    fn a_mask_keeps_the_choice_among_allowed_tokens() {
        let l = vec![5.0f32, 1.0, 4.0, 0.0];
        let mut mask = SimpleVob::alloc(4);
        mask.allow_token(2);
        mask.allow_token(3);
        let mut s = Sampler::new(SamplerParams::greedy(), 4);
        assert_eq!(s.sample_allowed(&l, &[], Some(&mask)), 2);
        let mut s = Sampler::new(
            SamplerParams {
                temperature: 1.0,
                top_k: 0,
                ..Default::default()
            },
            4,
        );
        for _ in 0..100 {
            assert!(matches!(s.sample_allowed(&l, &[], Some(&mask)), 2 | 3));
        }
    }

    #[test]
    fn min_p_and_top_p_never_pick_unlikely_tokens() {
        let mut l = vec![-20.0f32; 50];
        l[10] = 3.0;
        l[11] = 2.9;
        for p in [
            SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.5,
                ..Default::default()
            },
            SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.9,
                min_p: 0.0,
                ..Default::default()
            },
        ] {
            let mut s = Sampler::new(p, 50);
            for _ in 0..200 {
                assert!(matches!(s.sample(&l, &[]), 10 | 11));
            }
        }
    }
}
