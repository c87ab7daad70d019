//! A session: one conversation's KV cache and scratch, allocated once, and the forward pass,
//! which reads top to bottom: embed → RoPE tables → for each layer { attention block; FFN
//! block } → output. Nothing here allocates after [`Session::new`] (except
//! [`Session::eval_all`], a diagnostic).

use super::arch::Ffn;
use super::attention;
use super::kv_cache::{KvCache, LLAMA_BATCH, UBATCH};
use super::matmul::{matmul, Acts};
use super::ops;
use super::scratch::{Scratch, ScratchLayout};
use super::weights::{Layer, Mat, Weights};
use super::{Config, Model, ModelError};
use crate::quant::{dequantize_row, DotOrder};

/// Receives the logits after each token when all of them are wanted.
type LogitsSink<'a> = &'a mut dyn FnMut(usize, &[f32]);

pub struct Session {
    n_ctx: usize,
    n_past: usize,
    kv: KvCache,
    s: Scratch,
}

impl Session {
    pub(super) fn new(m: &Model, n_ctx: usize) -> Session {
        let n_ctx = n_ctx.max(1);
        let layout = ScratchLayout::new(&m.config, &m.weights, m.pool.threads(), n_ctx);
        Session {
            n_ctx,
            n_past: 0,
            kv: KvCache::new(&m.config, n_ctx),
            s: Scratch::new(layout, &m.weights),
        }
    }

    /// Bytes of scratch a session of `n_ctx` allocates besides its KV cache (for the planner).
    pub fn scratch_bytes(c: &Config, w: &Weights, threads: usize, n_ctx: usize) -> u64 {
        ScratchLayout::new(c, w, threads, n_ctx.max(1)).bytes()
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the conversation; the memory stays allocated.
    pub fn clear(&mut self) {
        self.n_past = 0;
    }

    /// Keeps the first `n` positions (for reusing a common prompt prefix).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Appends `tokens` at the current position and returns the logits after the last one.
    pub fn eval(&mut self, m: &Model, tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.forward(m, tokens, None)?;
        Ok(&self.s.logits)
    }

    /// Like [`Session::eval`], but computes the logits after every token and passes them to
    /// `each(index, logits)` (teacher forcing, perplexity). Allocates logits for 4 tokens.
    pub fn eval_all(
        &mut self,
        m: &Model,
        tokens: &[u32],
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.forward(m, tokens, Some(each))
    }

    fn forward(
        &mut self,
        m: &Model,
        tokens: &[u32],
        mut each: Option<LogitsSink>,
    ) -> Result<(), ModelError> {
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
        let mut group = if each.is_some() {
            vec![0f32; 4 * n_vocab]
        } else {
            Vec::new()
        };
        let mut done = 0;
        for batch in tokens.chunks(UBATCH) {
            let last_batch = done + batch.len() == tokens.len();
            let rows = llama_rows(tokens.len(), done, each.is_some());
            self.ubatch(m, batch, rows);
            match each.as_mut() {
                Some(f) => {
                    for t0 in (0..batch.len()).step_by(4) {
                        let ts = t0..(t0 + 4).min(batch.len());
                        logits(&mut self.s, m, ts.clone(), &mut group, rows.outputs);
                        for (logits, t) in group.chunks_exact(n_vocab).zip(ts) {
                            f(done + t, logits);
                        }
                    }
                }
                None if last_batch => {
                    let mut out = std::mem::take(&mut self.s.logits);
                    let last = batch.len() - 1;
                    logits(&mut self.s, m, last..last + 1, &mut out, rows.outputs);
                    self.s.logits = out;
                }
                None => {}
            }
            done += batch.len();
        }
        Ok(())
    }

    /// Runs the layers over one micro-batch, leaving the final hidden states in `s.x`.
    fn ubatch(&mut self, m: &Model, tokens: &[u32], rows: LlamaRows) {
        let b = Batch {
            m,
            n: tokens.len(),
            pos0: self.n_past,
            n_ctx: self.n_ctx,
            llama_rows: rows.layers,
        };
        let s = &mut self.s;
        embed(&b, tokens, s);
        rope_tables(&b, s);
        let last = m.weights.layers.len() - 1;
        for (il, l) in m.weights.layers.iter().enumerate() {
            attention::block(&b, il, l, &mut self.kv.layers[il], s);
            b.add_residual(s);
            // llama.cpp runs the last layer's feed-forward on the output rows only.
            let ffn_rows = if il == last {
                rows.outputs
            } else {
                rows.layers
            };
            ffn_block(&b, l, ffn_rows, s);
            b.add_residual(s);
        }
        self.n_past += b.n;
    }
}

/// One micro-batch of a forward pass: what every block of it reads.
pub(super) struct Batch<'a> {
    pub m: &'a Model,
    /// Tokens in the batch (at most [`UBATCH`]).
    pub n: usize,
    /// Position of its first token.
    pub pos0: usize,
    /// The session's context (the attention scratch's row length).
    pub n_ctx: usize,
    /// Activation rows llama.cpp's matmuls see for this batch ([`LlamaRows::layers`]).
    pub llama_rows: usize,
}

impl Batch<'_> {
    /// `out = x · matᵀ` for the batch's tokens: (n, mat.cols) → (n, mat.rows), summed in the
    /// float order of a llama.cpp matmul over `llama_rows` rows. `acts` holds `x` quantised, or
    /// was invalidated since the last input.
    pub fn matmul(&self, acts: &mut Acts, mat: &Mat, x: &[f32], out: &mut [f32], rows: usize) {
        let a = acts.get(mat.ty, x, self.n, mat.cols);
        let order = DotOrder::of(mat.ty, mat.rows, rows);
        matmul(
            &self.m.pool,
            self.m.gguf.bytes(),
            mat,
            a,
            self.n,
            out,
            order,
        );
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
        let pos = b.pos0 + t;
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
    let len = b.n * c.n_ff;
    let (gate, up) = (&mut s.gate[..len], &s.up[..len]);
    match c.spec.ffn {
        Ffn::GeGlu => ops::geglu(gate, up),
        Ffn::SwiGlu => ops::swiglu(gate, up),
    }
    s.acts.invalidate();
    b.matmul(&mut s.acts, &l.w_down, &s.gate, &mut s.o, rows);
    b.post_norm(l.post_ffn_norm.as_deref(), &mut s.o);
}

/// Logits of tokens `ts` (at most [`UBATCH`]) of the last micro-batch, one row of `out` each, as
/// llama.cpp's output matmul over `llama_rows` rows computes them.
fn logits(
    s: &mut Scratch,
    m: &Model,
    ts: std::ops::Range<usize>,
    out: &mut [f32],
    llama_rows: usize,
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
    let a = s.acts.get(w.ty, &s.xn[..n * d], n, d);
    // The logits are no matmul's input: they may sum in any order (see DotOrder::Free). With
    // several rows (teacher forcing) llama.cpp's order is kept, as the diagnostics compare it.
    let order = if n == 1 {
        DotOrder::Free
    } else {
        DotOrder::of(w.ty, w.rows, llama_rows)
    };
    matmul(&m.pool, m.gguf.bytes(), w, a, n, out, order);
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
