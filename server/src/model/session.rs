//! A session: one conversation's KV cache and scratch, allocated once, and the forward pass,
//! which reads top to bottom: embed → RoPE tables → for each layer { attention block; FFN
//! block } → output. Nothing here allocates after [`Session::new`] (except
//! [`Session::eval_all`], a diagnostic).

use std::ops::Range;

use smallvec::SmallVec;

use super::arch::Ffn;
use super::attention;
use super::kv_cache::{KvCache, LLAMA_BATCH, MAX_DRAFT, REWIND, UBATCH};
use super::matmul::{matmul, Acts, Outs, ROW_STEP_VALUES};
use super::ops;
use super::scratch::{Scratch, ScratchLayout};
use super::weights::{Layer, Mat, Weights};
use super::{Config, Model, ModelError};
use crate::quant::{dequantize_row, DotOrder};

/// Which logits a [`Session`] evaluation computes.
enum Logits<'a> {
    /// After the last token, into the session's buffer.
    Last,
    /// After every token, each passed to the sink with its index.
    Each(&'a mut dyn FnMut(usize, &[f32])),
    None,
}

pub struct Session {
    pub(super) n_ctx: usize,
    pub(super) n_past: usize,
    /// The tokens at positions `0..n_past`: what the KV cache holds.
    pub(super) tokens: Vec<u32>,
    /// One past the highest position written since the session was cleared. A rewind (a
    /// rejected draft) leaves it above `n_past`, and a sliding-window ring has lost the
    /// positions those writes overwrote: its intact positions are `written - cells..n_past`.
    pub(super) written: usize,
    /// Positions below this hold their keys and values already, though past `n_past`: a prompt
    /// the cache holds whole is resumed one token early, for its logits, and that token's keys
    /// and values are not written again ([`Session::resume`]).
    pub(super) kept: usize,
    pub(super) kv: KvCache,
    s: Scratch,
}

impl Session {
    pub(super) fn new(m: &Model, n_ctx: usize) -> Session {
        let n_ctx = n_ctx.max(1);
        let layout = ScratchLayout::new(&m.config, &m.weights, m.pool.threads(), n_ctx);
        Session {
            n_ctx,
            n_past: 0,
            tokens: Vec::with_capacity(n_ctx),
            written: 0,
            kept: 0,
            kv: KvCache::new(&m.config, n_ctx),
            s: Scratch::new(layout, &m.weights),
        }
    }

    /// Bytes of scratch a session of `n_ctx` allocates besides its KV cache (for the planner),
    /// counting the list of its cached tokens.
    pub fn scratch_bytes(c: &Config, w: &Weights, threads: usize, n_ctx: usize) -> u64 {
        let n_ctx = n_ctx.max(1);
        let tokens = (n_ctx * std::mem::size_of::<u32>()) as u64;
        ScratchLayout::new(c, w, threads, n_ctx).bytes() + tokens
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The logits after the last token evaluated.
    pub fn logits(&self) -> &[f32] {
        self.logits_row(0)
    }

    /// The logits after row `i` of the last [`decode_batch`] input of this session.
    pub fn logits_row(&self, i: usize) -> &[f32] {
        let n = self.s.logits.len() / (1 + MAX_DRAFT);
        &self.s.logits[i * n..(i + 1) * n]
    }

    /// Forgets every position from `n` on: what a pass over rejected draft tokens wrote
    /// (within [`REWIND`] of the end, so a sliding window can resume there).
    pub fn forget_from(&mut self, n: usize) {
        debug_assert!(n + REWIND >= self.n_past);
        self.truncate(n);
    }

    /// The tokens the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets the conversation; the memory stays allocated.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `n` positions.
    pub(super) fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
        if self.n_past == 0 {
            self.written = 0;
        }
        self.tokens.truncate(self.n_past);
        self.kept = 0;
    }

    /// How many of `prompt`'s first tokens the cache can stand for: the prefix it shares with
    /// the cached tokens, at most all but the last token (whose logits must be computed), or 0
    /// when a sliding-window layer has overwritten what resuming there needs
    /// ([`kv_cache::REWIND`](super::kv_cache::REWIND)).
    pub fn reusable(&self, m: &Model, prompt: &[u32]) -> usize {
        let shared = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        if self
            .kv
            .can_resume(&m.config, self.n_past.max(self.written), shared)
        {
            shared
        } else {
            0
        }
    }

    /// Keeps the [`Session::reusable`] prefix of `prompt` and returns its length: the next
    /// evaluation continues from there. A prompt the cache holds whole is resumed at its last
    /// token, whose keys and values stay as they are: re-evaluated in another float order (a
    /// one-row pass, not the batch that first read it) they would differ in their last bits, and
    /// on small quantised models such a difference grows into logit changes of ~0.8 a few tokens
    /// later. So a repeated request continues exactly as the first one did.
    pub fn resume(&mut self, m: &Model, prompt: &[u32]) -> usize {
        let n = self.reusable(m, prompt);
        let whole = n > 0 && self.tokens.get(n) == prompt.get(n);
        self.truncate(n);
        if whole {
            self.kept = n + 1;
        }
        n
    }

    /// Appends `tokens` at the current position and returns the logits after the last one.
    pub fn eval(&mut self, m: &Model, tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.forward(m, tokens, Logits::Last)?;
        Ok(self.logits())
    }

    /// Appends `tokens` at the current position and computes no logits (a prompt's chunk before
    /// its last): [`Session::logits`] is stale until the next [`Session::eval`]. It saves the
    /// output matrix's pass, on the default model the largest matrix (262144 rows).
    pub fn extend(&mut self, m: &Model, tokens: &[u32]) -> Result<(), ModelError> {
        self.forward(m, tokens, Logits::None)
    }

    /// Like [`Session::eval`], but computes the logits after every token and passes them to
    /// `each(index, logits)` (teacher forcing, perplexity). Allocates logits for 4 tokens.
    pub fn eval_all(
        &mut self,
        m: &Model,
        tokens: &[u32],
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.forward(m, tokens, Logits::Each(each))
    }

    fn forward(&mut self, m: &Model, tokens: &[u32], mut want: Logits) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let need = self.n_past + tokens.len();
        if need > self.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx,
                need,
            });
        }
        let n_vocab = m.config.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken { id: bad, n_vocab });
        }
        // llama.cpp computes all of a batch's logits in one matmul, whose repacked kernels sum
        // groups of 4 tokens in another order than single ones (see `matmul`): so do we.
        let each = matches!(want, Logits::Each(_));
        let mut group = if each {
            vec![0f32; 4 * n_vocab]
        } else {
            Vec::new()
        };
        let mut done = 0;
        for batch in tokens.chunks(UBATCH) {
            let last_batch = done + batch.len() == tokens.len();
            let rows = llama_rows(tokens.len(), done, each);
            // The rows whose final hidden states anything reads: every row's logits, the last
            // token's, or none.
            let wanted = match want {
                Logits::Each(_) => 0..batch.len(),
                Logits::Last if last_batch => batch.len() - 1..batch.len(),
                _ => 0..0,
            };
            self.ubatch(m, batch, rows, wanted);
            match &mut want {
                Logits::Each(f) => {
                    for t0 in (0..batch.len()).step_by(4) {
                        let ts = t0..(t0 + 4).min(batch.len());
                        let out = Outs::contiguous(&mut group, ts.len(), n_vocab);
                        logits(
                            &mut self.s,
                            m,
                            ts.clone(),
                            out,
                            rows.outputs,
                            Grouping::Llama,
                        );
                        for (logits, t) in group.chunks_exact(n_vocab).zip(ts) {
                            f(done + t, logits);
                        }
                    }
                }
                Logits::Last if last_batch => {
                    let mut out = std::mem::take(&mut self.s.logits);
                    let last = batch.len() - 1;
                    let outs = Outs::contiguous(&mut out, 1, n_vocab);
                    logits(&mut self.s, m, last..last + 1, outs, 1, Grouping::Llama);
                    self.s.logits = out;
                }
                _ => {}
            }
            done += batch.len();
        }
        Ok(())
    }

    /// Runs the layers over one micro-batch, leaving the final hidden states of rows `wanted`
    /// in `s.x` (see [`layers`]).
    fn ubatch(&mut self, m: &Model, tokens: &[u32], rows: LlamaRows, wanted: Range<usize>) {
        let segment = [Segment {
            row0: 0,
            n: tokens.len(),
            pos0: self.n_past,
            kept: self.kept,
        }];
        let b = Batch {
            m,
            n: tokens.len(),
            n_ctx: self.n_ctx,
            llama_rows: rows.layers,
            grouping: Grouping::Llama,
            segments: &segment,
        };
        layers(
            &b,
            tokens,
            rows.outputs,
            wanted,
            &mut [&mut self.kv],
            &mut self.s,
        );
        self.n_past += b.n;
        self.written = self.written.max(self.n_past);
        self.kept = 0;
        self.tokens.extend_from_slice(tokens);
    }
}

/// Appends `inputs[i]` (one token, or one and the tokens drafted after it: at most
/// 1 + [`MAX_DRAFT`]) to `sessions[i]`, all in one forward pass over the weights, and leaves each
/// session's logits after each of its tokens ([`Session::logits_row`]). Every output is the one
/// [`Session::eval`] of those tokens one at a time would give, bit for bit: the rows go through
/// the matmuls each in the order of a single row ([`Grouping::Alone`]), and each attends over its
/// own cache. Uses the first session's scratch. Allocates nothing.
pub fn decode_batch(
    m: &Model,
    sessions: &mut [&mut Session],
    inputs: &[&[u32]],
) -> Result<(), ModelError> {
    assert_eq!(sessions.len(), inputs.len(), "one input per session");
    let n: usize = inputs.iter().map(|t| t.len()).sum();
    if inputs.iter().any(|t| t.is_empty()) || n == 0 {
        return Err(ModelError::EmptyInput);
    }
    assert!(n <= UBATCH, "at most {UBATCH} rows in one batch");
    assert!(inputs.iter().all(|t| t.len() <= 1 + MAX_DRAFT));
    let n_vocab = m.config.n_vocab;
    let mut segments = [Segment {
        row0: 0,
        n: 1,
        pos0: 0,
        kept: 0,
    }; UBATCH];
    let mut tokens = [0u32; UBATCH];
    let mut row = 0;
    for ((seg, session), input) in segments.iter_mut().zip(sessions.iter()).zip(inputs) {
        let need = session.n_past + input.len();
        if need > session.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: session.n_ctx,
                need,
            });
        }
        if let Some(&bad) = input.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken { id: bad, n_vocab });
        }
        *seg = Segment {
            row0: row,
            n: input.len(),
            pos0: session.n_past,
            kept: session.kept,
        };
        tokens[row..row + input.len()].copy_from_slice(input);
        row += input.len();
    }
    let segments = &segments[..inputs.len()];
    let (first, rest) = sessions.split_first_mut().expect("inputs are not empty");
    let s = &mut first.s;
    let mut kvs: SmallVec<[&mut KvCache; 8]> = std::iter::once(&mut first.kv)
        .chain(rest.iter_mut().map(|r| &mut r.kv))
        .collect();
    let b = Batch {
        m,
        n,
        n_ctx: first.n_ctx,
        llama_rows: 1,
        grouping: Grouping::Alone,
        segments,
    };
    layers(&b, &tokens[..n], 1, 0..n, &mut kvs, s);
    drop(kvs);
    // The logits of every row, each session's into its own buffer.
    let mut own = std::mem::take(&mut s.logits);
    let buffers = std::iter::once(&mut own[..]).chain(rest.iter_mut().map(|r| &mut r.s.logits[..]));
    let rows = buffers
        .zip(segments)
        .flat_map(|(buf, seg)| buf.chunks_exact_mut(n_vocab).take(seg.n));
    logits(s, m, 0..n, Outs::rows(rows, n_vocab), 1, Grouping::Alone);
    s.logits = own;
    for (session, input) in sessions.iter_mut().zip(inputs) {
        session.n_past += input.len();
        session.written = session.written.max(session.n_past);
        session.kept = 0;
        session.tokens.extend_from_slice(input);
    }
    Ok(())
}

/// embed → RoPE tables → for each layer { attention block; FFN block }, leaving the final
/// hidden states of rows `wanted` in `s.x` (the other rows' are left unfinished). `outputs`: the
/// rows llama.cpp's last feed-forward sees.
fn layers(
    b: &Batch,
    tokens: &[u32],
    outputs: usize,
    wanted: Range<usize>,
    kvs: &mut [&mut KvCache],
    s: &mut Scratch,
) {
    let m = b.m;
    embed(b, tokens, s);
    rope_tables(b, s);
    let last = m.weights.layers.len() - 1;
    for (il, l) in m.weights.layers.iter().enumerate() {
        attention::block(b, il, l, kvs, s);
        b.add_residual(s);
        if il == last {
            last_ffn(b, l, outputs, wanted.clone(), s);
        } else {
            ffn_block(b, l, b.llama_rows, s);
            b.add_residual(s);
        }
    }
}

/// The last layer's feed-forward on rows `wanted` only: nothing after it reads another row (its
/// keys and values are in the cache already). llama.cpp too selects the output rows before it
/// (`inp_out_ids`) and runs it on those, gathered at the front of the batch: so the rows move to
/// the front of `s.x`, take a batch of their own, and move back.
fn last_ffn(b: &Batch, l: &Layer, outputs: usize, wanted: Range<usize>, s: &mut Scratch) {
    if wanted == (0..b.n) {
        ffn_block(b, l, outputs, s);
        b.add_residual(s);
        return;
    }
    if wanted.is_empty() {
        return;
    }
    let d = b.m.config.n_embd;
    let rows = wanted.start * d..wanted.end * d;
    s.x.copy_within(rows.clone(), 0);
    let gathered = Batch {
        m: b.m,
        n: wanted.len(),
        n_ctx: b.n_ctx,
        llama_rows: b.llama_rows,
        grouping: b.grouping,
        // The feed-forward asks no row its position.
        segments: &[],
    };
    ffn_block(&gathered, l, outputs, s);
    gathered.add_residual(s);
    s.x.copy_within(0..rows.len(), rows.start);
}

/// A run of consecutive rows of a batch that belong to one session.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    /// The segment's first row in the batch.
    pub row0: usize,
    pub n: usize,
    /// The session's position of that row.
    pub pos0: usize,
    /// Positions below this keep the keys and values they hold ([`Session::resume`]).
    pub kept: usize,
}

/// How a matmul groups a batch's activation rows ([`matmul`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// As llama.cpp's matmul over its batch does (groups of 4): for parity with it.
    Llama,
    /// Each row as if it were alone (rows of different sessions), so that a batched row gives
    /// what the same row evaluated by itself gives.
    Alone,
}

/// One micro-batch of a forward pass: what every block of it reads. Its rows come in segments,
/// one per session (a session's own evaluation has one).
pub(super) struct Batch<'a> {
    pub m: &'a Model,
    /// Rows in the batch (at most [`UBATCH`]).
    pub n: usize,
    /// The sessions' context (the attention scratch's row length).
    pub n_ctx: usize,
    /// Activation rows llama.cpp's matmuls see for this batch ([`LlamaRows::layers`]).
    pub llama_rows: usize,
    pub grouping: Grouping,
    pub segments: &'a [Segment],
}

impl Batch<'_> {
    /// `out = x · matᵀ` for the batch's tokens: (n, mat.cols) → (n, mat.rows), summed in the
    /// float order of a llama.cpp matmul over `llama_rows` rows. `acts` holds `x` quantised, or
    /// was invalidated since the last input.
    pub fn matmul(&self, acts: &mut Acts, mat: &Mat, x: &[f32], out: &mut [f32], rows: usize) {
        let a = acts.get(&self.m.pool, mat.ty, x, self.n, mat.cols);
        let order = DotOrder::of(mat.ty, mat.rows, rows);
        let file = self.m.gguf.bytes();
        let outs = Outs::contiguous(out, self.n, mat.rows);
        matmul(&self.m.pool, file, mat, a, outs, order, self.grouping);
    }

    /// The position of row `t`.
    pub fn pos(&self, t: usize) -> usize {
        let seg = self
            .segments
            .iter()
            .find(|s| (s.row0..s.row0 + s.n).contains(&t))
            .expect("every row is in a segment");
        seg.pos0 + t - seg.row0
    }

    /// `out = rms_norm(x) * w` per token, over rows of `w.len()`.
    pub fn rms_norm(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let d = w.len();
        for (x, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)).take(self.n) {
            ops::rms_norm(x, w, self.m.config.norm_eps, out);
        }
    }

    /// A block output's RMSNorm before its residual add, where the layer has one (Gemma 3).
    pub fn post_norm(&self, w: Option<&[f32]>, o: &mut [f32]) {
        if let Some(w) = w {
            for o in o.chunks_exact_mut(w.len()).take(self.n) {
                ops::rms_norm_inplace(o, w, self.m.config.norm_eps);
            }
        }
    }

    /// `x += o`: a block's output into the residual stream.
    fn add_residual(&self, s: &mut Scratch) {
        let len = self.n * self.m.config.n_embd;
        s.x[..len]
            .iter_mut()
            .zip(&s.o[..len])
            .for_each(|(x, o)| *x += o);
    }
}

/// `s.x = tok_embd[tokens]`, scaled where the architecture says so.
fn embed(b: &Batch, tokens: &[u32], s: &mut Scratch) {
    let (c, w) = (&b.m.config, &b.m.weights);
    let file = b.m.gguf.bytes();
    for (&id, x) in tokens.iter().zip(s.x.chunks_exact_mut(c.n_embd)) {
        dequantize_row(w.tok_embd.ty, w.tok_embd.row(file, id as usize), x);
        if let Some(scale) = c.embed_scale() {
            x.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// RoPE's (cos, sin) for each token's position: at the global base, and at the sliding-window
/// base where there are local layers.
fn rope_tables(b: &Batch, s: &mut Scratch) {
    let c = &b.m.config;
    let freqs = b.m.weights.rope_freqs.as_deref();
    let half = c.n_rot / 2;
    for t in 0..b.n {
        let pos = b.pos(t);
        let at = t * half..(t + 1) * half;
        ops::rope_cache(
            pos,
            c.n_rot,
            c.rope_base,
            freqs,
            &mut s.rope_global[at.clone()],
        );
        if let Some(base) = c.local_rope_base() {
            ops::rope_cache(pos, c.n_rot, base, freqs, &mut s.rope_local[at]);
        }
    }
}

/// `s.o = post_norm(w_down · act(w_gate · norm(s.x), w_up · norm(s.x)))`, in the float order
/// of llama.cpp's matmuls over `rows` rows.
fn ffn_block(b: &Batch, l: &Layer, rows: usize, s: &mut Scratch) {
    let c = &b.m.config;
    b.rms_norm(&s.x, &l.ffn_norm, &mut s.xn);
    s.acts.invalidate();
    b.matmul(&mut s.acts, &l.w_gate, &s.xn, &mut s.gate, rows);
    b.matmul(&mut s.acts, &l.w_up, &s.xn, &mut s.up, rows);
    let (len, n_ff, ffn) = (b.n * c.n_ff, c.n_ff, c.spec.ffn);
    let up = &s.up[..len];
    b.m.pool
        .for_rows_mut(&mut s.gate[..len], n_ff, ROW_STEP_VALUES, &|first, gate| {
            let up = &up[first * n_ff..first * n_ff + gate.len()];
            match ffn {
                Ffn::GeGlu => ops::geglu(gate, up),
                // Row by row: ggml's vector groups start at each row's start.
                Ffn::SwiGlu => gate
                    .chunks_mut(n_ff)
                    .zip(up.chunks(n_ff))
                    .for_each(|(g, u)| ops::swiglu(g, u)),
            }
        });
    s.acts.invalidate();
    b.matmul(&mut s.acts, &l.w_down, &s.gate, &mut s.o, rows);
    b.post_norm(l.post_ffn_norm.as_deref(), &mut s.o);
}

/// Logits of tokens `ts` (at most [`UBATCH`]) of the last micro-batch, one row of `out` each, as
/// llama.cpp's output matmul over `llama_rows` rows computes them; with [`Grouping::Alone`],
/// each as the logits of a one-row evaluation.
fn logits(
    s: &mut Scratch,
    m: &Model,
    ts: std::ops::Range<usize>,
    out: Outs,
    llama_rows: usize,
    grouping: Grouping,
) {
    let c = &m.config;
    let d = c.n_embd;
    let n = ts.len();
    for (t, xn) in ts.zip(s.xn.chunks_exact_mut(d)) {
        ops::rms_norm(
            &s.x[t * d..(t + 1) * d],
            &m.weights.output_norm,
            c.norm_eps,
            xn,
        );
    }
    s.acts.invalidate();
    let w = &m.weights.output;
    let a = s.acts.get(&m.pool, w.ty, &s.xn[..n * d], n, d);
    // The logits are no matmul's input: they may sum in any order (see DotOrder::Free). With
    // several rows (teacher forcing) llama.cpp's order is kept, as the diagnostics compare it.
    let order = if n == 1 || grouping == Grouping::Alone {
        DotOrder::Free
    } else {
        DotOrder::of(w.ty, w.rows, llama_rows)
    };
    matmul(&m.pool, m.gguf.bytes(), w, a, out, order, grouping);
}

/// How many activation rows llama.cpp's matmuls see in the llama.cpp batch holding token `done`
/// of an n-token evaluation: that decides their float order
/// ([`DotOrder::of`](crate::quant::DotOrder::of)).
#[derive(Clone, Copy)]
struct LlamaRows {
    /// Every layer's matmuls but the last layer's feed-forward: one row per token of the batch.
    layers: usize,
    /// The last layer's feed-forward and the output matrix, which llama.cpp runs on the rows
    /// whose logits are wanted only: all of them when every position's logits are, else the
    /// last one.
    outputs: usize,
}

fn llama_rows(n: usize, done: usize, all_logits: bool) -> LlamaRows {
    let start = done / LLAMA_BATCH * LLAMA_BATCH;
    let rows = (n - start).min(LLAMA_BATCH);
    LlamaRows {
        layers: rows,
        outputs: if all_logits { rows } else { 1 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoadOptions;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|i| 4 + (i * 37 + seed * 11) % 500)
            .collect()
    }

    /// The synthetic test model `name`, loaded with the default options.
    pub(super) fn synth_model(name: &str) -> Model {
        Model::load(&test_support::synth(name), &LoadOptions::default()).unwrap()
    }

    /// Largest |Δ| between two logit rows.
    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn a_rewound_session_continues_as_one_that_read_it_all() {
        // The synthetic Gemma 3 has a sliding window of 8: its ring wraps many times here.
        let m = synth_model("synth-gemma3-q8_0.gguf");
        let shared = tokens(200, 1);
        let (old_tail, new_tail) = (tokens(60, 2), tokens(20, 3));
        let mut fresh = m.new_session(512);
        let whole = [&shared[..], &new_tail[..]].concat();
        let expected = fresh.eval(&m, &whole).unwrap().to_vec();

        let mut cached = m.new_session(512);
        cached
            .eval(&m, &[&shared[..], &old_tail[..]].concat())
            .unwrap();
        assert_eq!(cached.tokens().len(), 260);
        // The prompt shares 200 tokens with the cache, 60 back from its end: within REWIND.
        assert_eq!(cached.reusable(&m, &whole), 200);
        assert_eq!(cached.resume(&m, &whole), 200);
        let got = cached.eval(&m, &new_tail).unwrap();
        // Only the float order of the matmuls differs (other groupings of rows).
        let d = max_diff(got, &expected);
        assert!(d <= 0.05, "logits differ by {d}");
        assert_eq!(cached.tokens(), &whole[..]);

        // All of a prompt but its last token, whose logits must be computed.
        assert_eq!(cached.reusable(&m, &whole), whole.len() - 1);
        // Rewound further than the ring allows, a sliding layer lacks what position 10 reads
        // (positions 3..=10, overwritten: the ring holds the last `ring` of the 220 written).
        let ring = 8 + UBATCH - 1 + REWIND;
        assert!(3 + ring < whole.len());
        assert_eq!(cached.reusable(&m, &whole[..11]), 0);
        cached.clear();
        assert_eq!(cached.reusable(&m, &whole), 0);
    }

    /// A chunk evaluated without logits (whose last layer's feed-forward runs on no row) leaves
    /// the cache as one evaluated with them: the next chunk's logits are the same bits. Three
    /// micro-batches in the first chunk, so the skipped feed-forward covers whole ones too.
    #[test]
    fn a_chunk_extended_without_logits_leaves_the_same_cache() {
        let m = synth_model("synth-llama-q4_0.gguf");
        let (head, tail) = (tokens(2 * UBATCH + 9, 4), tokens(7, 5));
        let mut evaluated = m.new_session(256);
        evaluated.eval(&m, &head).unwrap();
        let want = evaluated.eval(&m, &tail).unwrap().to_vec();
        let mut extended = m.new_session(256);
        extended.extend(&m, &head).unwrap();
        assert_eq!(extended.n_past(), head.len());
        assert!(extended.eval(&m, &tail).unwrap() == &want[..]);
    }

    #[test]
    fn a_prompt_cached_whole_continues_exactly_as_the_first_time() {
        // The default model, where a last-bit difference in one position's keys grows into
        // logit changes of ~0.8 a token later (it flipped a greedy token here before `kept`).
        let m = Model::load(
            &test_support::default_model(),
            &LoadOptions {
                threads: 2,
                mlock: false,
            },
        )
        .unwrap();
        let text = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";
        let prompt = m.tokenizer().encode(text, true, true);
        let greedy =
            |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        let mut s = m.new_session(256);
        let first = greedy(s.eval(&m, &prompt).unwrap());
        let after_first = s.eval(&m, &[first]).unwrap().to_vec();
        s.eval(&m, &[greedy(&after_first)]).unwrap();

        assert_eq!(s.resume(&m, &prompt), prompt.len() - 1);
        assert_eq!(
            greedy(s.eval(&m, &prompt[prompt.len() - 1..]).unwrap()),
            first
        );
        assert!(s.eval(&m, &[first]).unwrap() == &after_first[..]);
    }
}

#[cfg(test)]
mod batch_tests {
    use super::tests::synth_model;
    use super::*;
    use crate::model::LoadOptions;

    #[test]
    fn a_batch_of_sessions_gives_each_exactly_its_own_logits() {
        // Q8_0 (vec_dot), Q4_0 (repacked order) and Q4_K_M (tiled and vec_dot) matrices.
        for name in [
            "synth-gemma3-q8_0.gguf",
            "synth-llama-q4_0.gguf",
            "synth-llama-q4_k_m.gguf",
        ] {
            let opts = LoadOptions {
                threads: 2,
                ..LoadOptions::default()
            };
            let m = Model::load(&test_support::synth(name), &opts).unwrap();
            let prompts: [Vec<u32>; 3] = [
                (5..40).collect(),
                (100..103).collect(),
                (7..77).rev().collect(),
            ];
            let next = [11u32, 12, 13];
            let mut alone = Vec::new();
            for (p, &t) in prompts.iter().zip(&next) {
                let mut s = m.new_session(128);
                s.eval(&m, p).unwrap();
                alone.push(s.eval(&m, &[t]).unwrap().to_vec());
            }
            let mut sessions: Vec<Session> = prompts
                .iter()
                .map(|p| {
                    let mut s = m.new_session(128);
                    s.eval(&m, p).unwrap();
                    s
                })
                .collect();
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            let inputs: Vec<&[u32]> = next.iter().map(std::slice::from_ref).collect();
            decode_batch(&m, &mut refs, &inputs).unwrap();
            for (i, (s, want)) in sessions.iter().zip(&alone).enumerate() {
                assert!(s.logits() == &want[..], "{name}: session {i} differs");
                assert_eq!(s.n_past(), prompts[i].len() + 1);
            }
            // And again, from where each now is.
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            decode_batch(&m, &mut refs, &[&[1], &[2, 3, 4], &[5, 6]]).unwrap();
            assert_eq!(sessions[1].n_past(), prompts[1].len() + 4);
        }
    }

    #[test]
    fn a_drafted_run_gives_the_logits_of_one_token_at_a_time() {
        let m = synth_model("synth-llama-q4_0.gguf");
        let prompt: Vec<u32> = (20..60).collect();
        let run = [7u32, 8, 9, 10, 11];
        let mut one = m.new_session(128);
        one.eval(&m, &prompt).unwrap();
        let each: Vec<Vec<f32>> = run
            .iter()
            .map(|&t| one.eval(&m, &[t]).unwrap().to_vec())
            .collect();
        let mut drafted = m.new_session(128);
        drafted.eval(&m, &prompt).unwrap();
        let mut other = m.new_session(128);
        other.eval(&m, &prompt[..9]).unwrap();
        decode_batch(&m, &mut [&mut drafted, &mut other], &[&run, &[3]]).unwrap();
        for (i, want) in each.iter().enumerate() {
            assert!(drafted.logits_row(i) == &want[..], "row {i}");
        }
        // Two drafted tokens rejected: the cache goes back to what it held after the third.
        drafted.forget_from(prompt.len() + 3);
        assert_eq!(drafted.tokens(), &[&prompt[..], &run[..3]].concat()[..]);
        assert!(drafted.eval(&m, &[run[3]]).unwrap() == &each[3][..]);
    }
}
