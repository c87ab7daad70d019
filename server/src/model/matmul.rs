//! Matrix × activations: activations are quantised once into the weight type's dot format,
//! then output rows are spread over the pool; each weight row is read once per batch.

use std::marker::PhantomData;

use super::kv_cache::UBATCH;
use super::session::Grouping;
use super::weights::Mat;
use smallvec::SmallVec;

use crate::quant::{
    dot_rows_batch, dot_rows_multi, quantize_row_for, vec_dot_type, DotOrder, GgmlType,
    STREAM_GROUP,
};
use crate::threads::{Pool, SharedMut};

/// Quantised copies of the current input, one per activation format of the type table (a matmul's
/// weights take [`vec_dot_type`]), so one input can feed weights of several types. Allocated
/// once: the formats no matrix uses get no buffer.
pub struct Acts {
    bufs: [Vec<u8>; GgmlType::ALL.len()],
    valid: [bool; GgmlType::ALL.len()],
}

impl Acts {
    /// Buffers large enough for `n_tokens` rows of the widest input of every matrix.
    pub fn new<'a>(mats: impl Iterator<Item = &'a Mat>, n_tokens: usize) -> Acts {
        Acts {
            bufs: sizes(mats, n_tokens).map(|n| super::scratch::resident(0u8, n)),
            valid: [false; GgmlType::ALL.len()],
        }
    }

    /// Bytes [`Acts::new`] allocates.
    pub fn bytes_for<'a>(mats: impl Iterator<Item = &'a Mat>, n_tokens: usize) -> usize {
        sizes(mats, n_tokens).iter().sum()
    }

    /// Marks the buffers stale: the next [`Acts::get`] quantises the new input.
    pub fn invalidate(&mut self) {
        self.valid = [false; GgmlType::ALL.len()];
    }

    /// `x` (n rows of `cols`) in the dot format of weights of type `w`, its rows quantised on
    /// every thread of `pool` (prefill's micro-batch; one row stays on the caller).
    pub fn get(&mut self, pool: &Pool, w: GgmlType, x: &[f32], n: usize, cols: usize) -> &[u8] {
        let s = vec_dot_type(w) as usize;
        let row = act_row_bytes(w, cols);
        let buf = &mut self.bufs[s][..row * n];
        if !self.valid[s] {
            let x = &x[..n * cols];
            pool.for_rows_mut(buf, row, ROW_STEP_VALUES, &|first, out| {
                let rows = x[first * cols..].chunks_exact(cols);
                for (xr, out) in rows.zip(out.chunks_exact_mut(row)) {
                    quantize_row_for(w, xr, out);
                }
            });
            self.valid[s] = true;
        }
        &self.bufs[s][..row * n]
    }
}

/// The fewest values of a per-token step (a row's quantisation, the gated unit) that one
/// [`Pool::for_rows_mut`] chunk takes: a few microseconds of work, so that handing a chunk to
/// another thread costs little beside it.
pub const ROW_STEP_VALUES: usize = 8 << 10;

/// Bytes of one activation row of `cols` values for weights of type `w`.
fn act_row_bytes(w: GgmlType, cols: usize) -> usize {
    vec_dot_type(w)
        .row_bytes(cols)
        .expect("matrix widths are whole blocks")
}

fn sizes<'a>(mats: impl Iterator<Item = &'a Mat>, n_tokens: usize) -> [usize; GgmlType::ALL.len()] {
    let mut sizes = [0usize; GgmlType::ALL.len()];
    for m in mats {
        let s = &mut sizes[vec_dot_type(m.ty) as usize];
        *s = (*s).max(act_row_bytes(m.ty, m.cols) * n_tokens);
    }
    sizes
}

/// Where a matmul writes: for each of its activation rows, a buffer of at least `w.rows`
/// outputs — rows of one matrix, or (a batch of sessions) each session's own logits.
pub struct Outs<'a> {
    /// Each row's buffer, shared by the matmul's tasks: each writes its own rows of every one.
    rows: [SharedMut<f32>; UBATCH],
    n: usize,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

impl<'a> Outs<'a> {
    /// The first `n` rows of `len` of `out`.
    pub fn contiguous(out: &'a mut [f32], n: usize, len: usize) -> Outs<'a> {
        assert!(out.len() >= n * len, "output buffer too small");
        Self::rows(out.chunks_exact_mut(len).take(n), len)
    }

    /// One buffer per activation row, each of at least `len`.
    pub fn rows(rows: impl IntoIterator<Item = &'a mut [f32]>, len: usize) -> Outs<'a> {
        let mut outs = Outs {
            rows: [SharedMut::new(std::ptr::null_mut()); UBATCH],
            n: 0,
            len,
            _borrow: PhantomData,
        };
        for row in rows {
            assert!(row.len() >= len, "output row too short");
            assert!(outs.n < UBATCH, "at most {UBATCH} output rows");
            outs.rows[outs.n] = SharedMut::new(row.as_mut_ptr());
            outs.n += 1;
        }
        outs
    }
}

/// Weight bytes a matmul over rows each alone ([`Grouping::Alone`]) reads per block of rows,
/// for every activation row in turn: small enough to stay in L1/L2 for the next row, so the
/// weights come from memory once for the whole batch.
const ALONE_BLOCK_BYTES: usize = 16 << 10;

/// `out[t][r] = dot(w.row(r), act_t)` for the activation rows in `acts` (one per output row of
/// `out`), summed in `order`: llama.cpp's for a matmul that sees `llama_rows` activation rows at
/// once is `DotOrder::of(w.ty, w.rows, llama_rows)`; rows grouped as `grouping` says.
pub fn matmul(
    pool: &Pool,
    file: &[u8],
    w: &Mat,
    acts: &[u8],
    out: Outs,
    order: DotOrder,
    grouping: Grouping,
) {
    let n = out.n;
    assert!(out.len >= w.rows, "output rows too short for {}", w.name);
    let act_row = acts.len() / n;
    let data = w.data(file);
    let rows = w.rows;
    // Enough chunks for dynamic balancing (four per thread), few enough that the shared
    // counter stays cold and each chunk's stream of weights, whose first lines no earlier
    // request has asked for, runs long: sixteen per thread decoded measurably slower at two
    // threads on 1B shapes, prefill unchanged. At least 64 KiB of weights each: smaller
    // matrices run on the calling thread, where waking a worker would cost more than it saves. A
    // multiple of 8 rows, so every row but a matrix's last few goes through the four-row
    // kernels, and prefill's GEMM (quant/simd/panel.rs) gets whole panels of eight.
    let chunk = (rows / (pool.threads() * 4))
        .clamp(16, 4096)
        .max((64 << 10) / w.row_bytes)
        .next_multiple_of(8);
    let out = &out;
    pool.for_chunks(rows, chunk, &|_, range| {
        let act = |t: usize| &acts[t * act_row..(t + 1) * act_row];
        // SAFETY: this chunk owns rows `range` of every activation row's output, disjoint from
        // the other chunks', and range.end <= w.rows <= out.len.
        let out_of = |t: usize, rows: &std::ops::Range<usize>| unsafe {
            out.rows[t].slice_mut(rows.start, rows.len())
        };
        let weights_of =
            |rows: &std::ops::Range<usize>| &data[rows.start * w.row_bytes..rows.end * w.row_bytes];
        match grouping {
            Grouping::Llama => {
                // llama.cpp's grouping of the micro-batch (dot_rows_batch): its repacked matmul
                // (`forward_mul_mat`) splits the batch into groups of 4 from the first row, and
                // where its gemm and gemv sum differently the groups must coincide.
                let acts: SmallVec<[&[u8]; UBATCH]> = (0..n).map(act).collect();
                let mut outs: SmallVec<[&mut [f32]; UBATCH]> =
                    (0..n).map(|t| out_of(t, &range)).collect();
                dot_rows_batch(w.ty, order, w.cols, weights_of(&range), &acts, &mut outs);
            }
            Grouping::Alone => {
                // Blocks a multiple of 4 rows from the chunk's start, so that each weight row
                // meets the same (four-row or single) kernel as in a one-row matmul. Up to
                // STREAM_GROUP activation rows are one group that reads each block once anyway:
                // then the whole chunk is one block (a call per 16 KiB and a prefetch stopping
                // at every block's end made the server's one-stream decode ~30 % slower than
                // `bench`).
                let block = if n <= STREAM_GROUP {
                    range.len()
                } else {
                    (ALONE_BLOCK_BYTES / w.row_bytes).max(4).next_multiple_of(4)
                };
                let mut start = range.start;
                while start < range.end {
                    let rows = start..(start + block).min(range.end);
                    let weights = weights_of(&rows);
                    // Up to STREAM_GROUP activation rows share each unpacked weight block.
                    for t0 in (0..n).step_by(STREAM_GROUP) {
                        let ts = t0..(t0 + STREAM_GROUP).min(n);
                        let acts: SmallVec<[&[u8]; 4]> = ts.clone().map(act).collect();
                        let mut outs: SmallVec<[&mut [f32]; 4]> =
                            ts.map(|t| out_of(t, &rows)).collect();
                        dot_rows_multi(w.ty, order, w.cols, weights, &acts, &mut outs);
                    }
                    start = rows.end;
                }
            }
        }
    });
}
