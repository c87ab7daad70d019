//! Matrix × activations: activations are quantised once into the weight type's dot format,
//! then output rows are spread over the pool; each weight row is read once per batch.

use super::weights::Mat;
use crate::quant::{dot_rows, dot_rows_x4, quantize_row_for, vec_dot_type, DotOrder, GgmlType};
use crate::threads::Pool;

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
            bufs: sizes(mats, n_tokens).map(|n| vec![0u8; n]),
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

    /// `x` (n rows of `cols`) in the dot format of weights of type `w`.
    pub fn get(&mut self, w: GgmlType, x: &[f32], n: usize, cols: usize) -> &[u8] {
        let s = vec_dot_type(w) as usize;
        let row = act_row_bytes(w, cols);
        let buf = &mut self.bufs[s][..row * n];
        if !self.valid[s] {
            for (xr, out) in x[..n * cols]
                .chunks_exact(cols)
                .zip(buf.chunks_exact_mut(row))
            {
                quantize_row_for(w, xr, out);
            }
            self.valid[s] = true;
        }
        &self.bufs[s][..row * n]
    }
}

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

/// A raw pointer that tasks writing disjoint elements may share.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: every task writes a disjoint set of indices (its own rows).
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// Through a method, so closures capture the whole (Sync) wrapper, not the raw pointer.
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers pass indices inside the buffer the pointer came from.
        unsafe { self.0.add(i) }
    }
}

/// `out[t * w.rows + r] = dot(w.row(r), act_t)` for the n activation rows in `acts`, summed in
/// `order`: llama.cpp's for a matmul that sees `llama_rows` activation rows at once is
/// `DotOrder::of(w.ty, w.rows, llama_rows)`.
pub fn matmul(
    pool: &Pool,
    file: &[u8],
    w: &Mat,
    acts: &[u8],
    n: usize,
    out: &mut [f32],
    order: DotOrder,
) {
    assert!(
        out.len() >= n * w.rows,
        "output buffer too small for {}",
        w.name
    );
    let act_row = acts.len() / n;
    let data = w.data(file);
    let dst = SharedOut(out.as_mut_ptr());
    let rows = w.rows;
    // Enough chunks for dynamic balancing, few enough that the shared counter stays cold, and
    // at least 64 KiB of weights each: smaller matrices run on the calling thread, where waking
    // a worker would cost more than it saves. A multiple of 4 rows, so every row but a matrix's
    // last few goes through the four-row kernels.
    let chunk = (rows / (pool.threads() * 16))
        .clamp(16, 4096)
        .max((64 << 10) / w.row_bytes)
        .next_multiple_of(4);
    pool.for_chunks(rows, chunk, &|_, range| {
        let weights = &data[range.start * w.row_bytes..range.end * w.row_bytes];
        let act = |t: usize| &acts[t * act_row..(t + 1) * act_row];
        // SAFETY: this chunk owns rows `range` of every token's output, disjoint from the other
        // chunks', and t * rows + range.end <= n * rows <= out.len().
        let out_of = |t: usize| unsafe {
            std::slice::from_raw_parts_mut(dst.at(t * rows + range.start), range.len())
        };
        // Groups of 4 from the first row, the rest one by one: llama.cpp's repacked matmul
        // (`forward_mul_mat`) splits its batch so, and with micro-batches a multiple of 4
        // long the groups coincide, which matters where its gemm and gemv sum differently.
        let mut t = 0;
        while t + 4 <= n {
            let outs = [out_of(t), out_of(t + 1), out_of(t + 2), out_of(t + 3)];
            dot_rows_x4(
                w.ty,
                order,
                w.cols,
                weights,
                [act(t), act(t + 1), act(t + 2), act(t + 3)],
                outs,
            );
            t += 4;
        }
        for t in t..n {
            dot_rows(w.ty, order, w.cols, weights, act(t), out_of(t));
        }
    });
}
