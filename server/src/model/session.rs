//! A session: one conversation's KV cache and scratch, allocated once, and the forward pass.
//! Nothing here allocates after [`Session::new`] (except [`Session::eval_all`], a diagnostic).

use half::f16;

use super::config::Config;
use super::config::RopeStyle;
use super::kv_cache::{KvCache, LLAMA_BATCH, UBATCH};
use super::matmul::{matmul, Acts};
use super::ops;
use super::weights::Weights;
use super::{Model, ModelError};
use crate::quant::dequantize_row;

/// Per-token working memory for one micro-batch of up to [`UBATCH`] tokens.
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    acts: Acts,
    logits: Vec<f32>,
    /// Per thread: attention scores over the context, and the f16-rounded query head.
    scores: Vec<f32>,
    qh: Vec<f32>,
    /// Per token: RoPE (cos, sin) for global and for sliding-window layers.
    rope_global: Vec<(f32, f32)>,
    rope_local: Vec<(f32, f32)>,
}

/// Lengths (in f32) of the per-micro-batch and per-thread buffers: one source for both the
/// allocation and the memory planner.
struct Lens {
    embd: usize,
    q: usize,
    kv: usize,
    ff: usize,
    logits: usize,
    scores: usize,
    qh: usize,
    rope: usize,
}

impl Lens {
    fn new(c: &Config, threads: usize, n_ctx: usize) -> Lens {
        let b = UBATCH;
        Lens {
            embd: b * c.n_embd,
            q: b * c.q_dim(),
            kv: b * c.kv_dim(),
            ff: b * c.n_ff,
            logits: c.n_vocab,
            // Scores of one query, padded to whole groups of 8 positions.
            scores: threads * (n_ctx + F16Dot::MAX_LANES),
            // The f16-rounded query head and 8 lanes of value accumulators.
            qh: threads * (1 + F16Dot::MAX_LANES) * c.head_dim,
            rope: b * c.n_rot / 2,
        }
    }

    fn bytes(&self) -> usize {
        4 * (4 * self.embd
            + 3 * self.q
            + 2 * self.kv
            + 2 * self.ff
            + self.logits
            + self.scores
            + self.qh)
            + 2 * 8 * self.rope
    }
}

impl Scratch {
    fn new(c: &Config, w: &Weights, threads: usize, n_ctx: usize) -> Scratch {
        let n = Lens::new(c, threads, n_ctx);
        let z = |len| vec![0f32; len];
        Scratch {
            x: z(n.embd),
            xn: z(n.embd),
            q: z(n.q),
            k: z(n.kv),
            v: z(n.kv),
            attn: z(n.q),
            o: z(n.embd),
            gate: z(n.ff),
            up: z(n.ff),
            acts: Acts::new(w.matrices(), UBATCH),
            logits: z(n.logits),
            scores: z(n.scores),
            qh: z(n.qh),
            rope_global: vec![(0.0, 0.0); n.rope],
            rope_local: vec![(0.0, 0.0); n.rope],
        }
    }
}

/// Receives the logits after each token when all of them are wanted.
type LogitsSink<'a> = &'a mut dyn FnMut(usize, &[f32]);

pub struct Session {
    n_ctx: usize,
    n_past: usize,
    kv: KvCache,
    s: Scratch,
}

/// A raw pointer shared by attention tasks that write disjoint (token, head) slices.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: each task writes only its own (token, head) output slice and its own thread's scratch.
unsafe impl Sync for SharedMut {}
unsafe impl Send for SharedMut {}

impl Session {
    pub(super) fn new(m: &Model, n_ctx: usize) -> Session {
        let n_ctx = n_ctx.max(1);
        let s = Scratch::new(&m.config, &m.weights, m.pool.threads(), n_ctx);
        Session {
            n_ctx,
            n_past: 0,
            kv: KvCache::new(&m.config, n_ctx),
            s,
        }
    }

    /// Bytes of scratch a session of `n_ctx` allocates besides its KV cache (for the planner).
    pub fn scratch_bytes(c: &Config, w: &Weights, threads: usize, n_ctx: usize) -> u64 {
        (Lens::new(c, threads, n_ctx).bytes() + Acts::bytes_for(w.matrices(), UBATCH)) as u64
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
        let c = &m.config;
        let w = &m.weights;
        let file = m.gguf.bytes();
        let pool = &m.pool;
        let n = tokens.len();
        let d = c.n_embd;
        let s = &mut self.s;
        let pos0 = self.n_past;

        for (t, &id) in tokens.iter().enumerate() {
            let x = &mut s.x[t * d..(t + 1) * d];
            dequantize_row(w.tok_embd.ty, w.tok_embd.row(file, id as usize), x);
            if let Some(scale) = c.embed_scale {
                x.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let half = c.n_rot / 2;
        for t in 0..n {
            let ff = w.rope_freqs.as_deref();
            let pos = pos0 + t;
            ops::rope_cache(
                pos,
                c.n_rot,
                c.rope_base,
                ff,
                &mut s.rope_global[t * half..(t + 1) * half],
            );
            ops::rope_cache(
                pos,
                c.n_rot,
                c.rope_base_swa,
                ff,
                &mut s.rope_local[t * half..(t + 1) * half],
            );
        }

        let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
        for (il, l) in w.layers.iter().enumerate() {
            // Attention block.
            for t in 0..n {
                ops::rms_norm(
                    &s.x[t * d..(t + 1) * d],
                    &l.attn_norm,
                    c.norm_eps,
                    &mut s.xn[t * d..(t + 1) * d],
                );
            }
            s.acts.invalidate();
            for (mat, out, bias) in [
                (&l.wq, &mut s.q, &l.bq),
                (&l.wk, &mut s.k, &l.bk),
                (&l.wv, &mut s.v, &l.bv),
            ] {
                let a = s.acts.get(mat.ty, &s.xn, n, d);
                matmul(pool, file, mat, a, n, out, rows.layers);
                if let Some(b) = bias {
                    for row in out[..n * mat.rows].chunks_exact_mut(mat.rows) {
                        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                    }
                }
            }
            let local = c.is_local(il);
            let rope = if local { &s.rope_local } else { &s.rope_global };
            let rotate = match c.rope_style {
                RopeStyle::Neox => ops::rope_neox,
                RopeStyle::Normal => ops::rope_normal,
            };
            for t in 0..n {
                let cs = &rope[t * half..(t + 1) * half];
                for head in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                    if let Some(qn) = &l.q_norm {
                        ops::rms_norm_inplace(head, qn, c.norm_eps);
                    }
                    rotate(head, c.n_rot, cs);
                }
                for head in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                    if let Some(kn) = &l.k_norm {
                        ops::rms_norm_inplace(head, kn, c.norm_eps);
                    }
                    rotate(head, c.n_rot, cs);
                }
            }
            let lkv = &mut self.kv.layers[il];
            for t in 0..n {
                let cell = lkv.cell(pos0 + t);
                let (k, v) = (&s.k[t * kvd..(t + 1) * kvd], &s.v[t * kvd..(t + 1) * kvd]);
                for (dst, &x) in lkv.k[cell * kvd..(cell + 1) * kvd].iter_mut().zip(k) {
                    *dst = f16::from_f32(x);
                }
                for (dst, &x) in lkv.v[cell * kvd..(cell + 1) * kvd].iter_mut().zip(v) {
                    *dst = f16::from_f32(x);
                }
            }
            let window = if local { c.sliding_window } else { None };
            attention(
                m,
                lkv,
                &s.q,
                &mut s.attn,
                &mut s.scores,
                &mut s.qh,
                pos0,
                n,
                window,
                self.n_ctx,
                F16Dot::for_tokens(rows.layers),
            );

            s.acts.invalidate();
            let a = s.acts.get(l.wo.ty, &s.attn, n, qd);
            matmul(pool, file, &l.wo, a, n, &mut s.o, rows.layers);
            for t in 0..n {
                let o = &mut s.o[t * d..(t + 1) * d];
                if let Some(pn) = &l.post_attn_norm {
                    ops::rms_norm_inplace(o, pn, c.norm_eps);
                }
                s.x[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(o.iter())
                    .for_each(|(x, o)| *x += o);
            }

            // Feed-forward block. llama.cpp runs the last layer's on the output rows only.
            let ffn_rows = if il + 1 == w.layers.len() {
                rows.outputs
            } else {
                rows.layers
            };
            for t in 0..n {
                ops::rms_norm(
                    &s.x[t * d..(t + 1) * d],
                    &l.ffn_norm,
                    c.norm_eps,
                    &mut s.xn[t * d..(t + 1) * d],
                );
            }
            s.acts.invalidate();
            let a = s.acts.get(l.w_gate.ty, &s.xn, n, d);
            matmul(pool, file, &l.w_gate, a, n, &mut s.gate, ffn_rows);
            let a = s.acts.get(l.w_up.ty, &s.xn, n, d);
            matmul(pool, file, &l.w_up, a, n, &mut s.up, ffn_rows);
            let ff = c.n_ff;
            let (gate, up) = (&mut s.gate[..n * ff], &s.up[..n * ff]);
            match c.activation {
                super::config::Activation::GeGlu => ops::geglu(gate, up),
                super::config::Activation::SwiGlu => ops::swiglu(gate, up),
            }
            s.acts.invalidate();
            let a = s.acts.get(l.w_down.ty, &s.gate, n, ff);
            matmul(pool, file, &l.w_down, a, n, &mut s.o, ffn_rows);
            for t in 0..n {
                let o = &mut s.o[t * d..(t + 1) * d];
                if let Some(pn) = &l.post_ffn_norm {
                    ops::rms_norm_inplace(o, pn, c.norm_eps);
                }
                s.x[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(o.iter())
                    .for_each(|(x, o)| *x += o);
            }
        }
        self.n_past += n;
    }
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
    matmul(&m.pool, m.gguf.bytes(), w, a, n, out, llama_rows);
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

/// Causal attention of the n queries at positions `pos0..pos0+n` over the cache, parallel over
/// (token, head), in llama.cpp's arithmetic (its default, non-flash path): Q is rounded to f16;
/// each score is an FMA chain per lane over the head, summed in the horizontal order of `f16`'s
/// kernel; the softmax is ggml's ([`ops::softmax_ggml`]) over rows aligned to the lanes; the
/// probabilities are rounded to f16 and the values accumulated in the same lanes by cell.
/// Quantised models amplify any last-bit difference here.
#[allow(clippy::too_many_arguments)]
fn attention(
    m: &Model,
    lkv: &super::kv_cache::LayerKv,
    q: &[f32],
    out: &mut [f32],
    scores: &mut [f32],
    qh: &mut [f32],
    pos0: usize,
    n: usize,
    window: Option<usize>,
    n_ctx: usize,
    f16: F16Dot,
) {
    let c = &m.config;
    let (hd, qd, kvd) = (c.head_dim, c.q_dim(), c.kv_dim());
    let group = c.n_head / c.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let row = n_ctx + F16Dot::MAX_LANES;
    let lanes = f16.lanes();
    let per_thread = (1 + F16Dot::MAX_LANES) * hd;
    let (out_p, scores_p, qh_p) = (
        SharedMut(out.as_mut_ptr()),
        SharedMut(scores.as_mut_ptr()),
        SharedMut(qh.as_mut_ptr()),
    );
    // Each chunk gets at least ~32k multiply-adds, so short contexts stay on the calling thread
    // instead of paying a worker's wake-up.
    let chunk = (32 << 10) / ((pos0 + n) * hd).max(1);
    m.pool
        .for_chunks(n * c.n_head, chunk.max(1), &|thread, range| {
            let (out_p, scores_p, qh_p) = (out_p, scores_p, qh_p);
            for task in range {
                let (t, h) = (task / c.n_head, task % c.n_head);
                let pos = pos0 + t;
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                // Rows start on a multiple of the lanes so softmax groups and value lanes fall on
                // the same cells as llama.cpp's; entries outside [first, pos] are masked.
                let base = first - first % lanes;
                let len = (pos + 1 - base).div_ceil(lanes) * lanes;
                // SAFETY: per-thread scratch regions and per-(t, h) output slices are disjoint.
                let (sc, qv, acc, o) = unsafe {
                    let scratch = qh_p.0.add(thread * per_thread);
                    (
                        std::slice::from_raw_parts_mut(scores_p.0.add(thread * row), len),
                        std::slice::from_raw_parts_mut(scratch, hd),
                        std::slice::from_raw_parts_mut(scratch.add(hd), lanes * hd),
                        std::slice::from_raw_parts_mut(out_p.0.add(t * qd + h * hd), hd),
                    )
                };
                let qsrc = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                let pre = if c.q_prescale { scale } else { 1.0 };
                for (d, &x) in qv.iter_mut().zip(qsrc) {
                    *d = f16::from_f32(x * pre).to_f32();
                }
                let post = if c.q_prescale { 1.0 } else { scale };
                let kh = h / group;
                for (i, s) in sc.iter_mut().enumerate() {
                    let p = base + i;
                    *s = if p < first || p > pos {
                        f32::NEG_INFINITY
                    } else {
                        let cell = lkv.cell(p);
                        f16.dot(qv, &lkv.k[cell * kvd + kh * hd..cell * kvd + (kh + 1) * hd]) * post
                    };
                }
                ops::softmax_ggml(sc);
                acc.iter_mut().for_each(|v| *v = 0.0);
                for (i, &p) in sc.iter().enumerate() {
                    let at = base + i;
                    if at < first || at > pos {
                        continue; // a zero probability adds exactly nothing
                    }
                    let p = f16::from_f32(p).to_f32();
                    let cell = lkv.cell(at);
                    let v = &lkv.v[cell * kvd + kh * hd..cell * kvd + (kh + 1) * hd];
                    let lane = &mut acc[(i % lanes) * hd..(i % lanes + 1) * hd];
                    for (a, &v) in lane.iter_mut().zip(v) {
                        *a = p.mul_add(v.to_f32(), *a);
                    }
                }
                for (d, o) in o.iter_mut().enumerate() {
                    *o = f16.reduce(|r| acc[r * hd + d]);
                }
            }
        });
}

/// How llama.cpp's non-flash attention multiplies its f16 matrices (K·Q and V·P): through
/// tinyBLAS, which declines single-column products (`n < 2`), or else ggml's `ggml_vec_dot_f16`.
/// Both chain FMAs per lane (lane r takes elements r, r + lanes, …) but with different lane
/// counts and horizontal sums, so the last bits of every score depend on which one runs.
#[derive(Clone, Copy)]
enum F16Dot {
    /// tinyBLAS: 8 lanes, ggml's `hsum` order.
    TinyBlas,
    /// `ggml_vec_dot_f16`: four 8-lane accumulators over steps of 32, i.e. 32 lanes.
    VecDot,
}

impl F16Dot {
    const MAX_LANES: usize = 32;

    /// The kernel for a llama.cpp batch of `tokens` tokens (one query column per token).
    fn for_tokens(tokens: usize) -> F16Dot {
        if tokens < 2 {
            F16Dot::VecDot
        } else {
            F16Dot::TinyBlas
        }
    }

    fn lanes(self) -> usize {
        match self {
            F16Dot::TinyBlas => 8,
            F16Dot::VecDot => 32,
        }
    }

    /// The horizontal sum of lanes `lane(0..self.lanes())`.
    #[inline]
    fn reduce(self, lane: impl Fn(usize) -> f32) -> f32 {
        match self {
            F16Dot::TinyBlas => ops::hsum8(&std::array::from_fn(lane)),
            F16Dot::VecDot => ops::hsum32_f16_vec(&std::array::from_fn(lane)),
        }
    }

    /// `q · k`, on values already rounded to f16.
    fn dot(self, q: &[f32], k: &[f16]) -> f32 {
        // A constant lane count per kernel, so each chain compiles to vector FMAs.
        let (sum, tail) = match self {
            F16Dot::TinyBlas => {
                let (lanes, tail) = lane_sums::<8>(q, k);
                (self.reduce(|r| lanes[r]), tail)
            }
            F16Dot::VecDot => {
                let (lanes, tail) = lane_sums::<32>(q, k);
                (self.reduce(|r| lanes[r]), tail)
            }
        };
        // Heads of a multiple of 32 (every supported model) have no tail; ggml adds one in f64.
        (f64::from(sum) + tail) as f32
    }
}

/// FMA chains of `q · k` in N lanes (lane r takes elements r, r + N, …), and the products of the
/// elements past the last whole group of N summed in f64.
fn lane_sums<const N: usize>(q: &[f32], k: &[f16]) -> ([f32; N], f64) {
    let mut lanes = [0f32; N];
    let (qs, ks) = (q.chunks_exact(N), k.chunks_exact(N));
    let tail = qs
        .remainder()
        .iter()
        .zip(ks.remainder())
        .map(|(&q, k)| f64::from(q * k.to_f32()))
        .sum();
    for (qc, kc) in qs.zip(ks) {
        for r in 0..N {
            lanes[r] = qc[r].mul_add(kc[r].to_f32(), lanes[r]);
        }
    }
    (lanes, tail)
}
