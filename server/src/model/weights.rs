//! The model's tensors, located in the map and checked against the config. Matrices stay in
//! the map (zero-copy); the small f32 vectors (norms, biases; a few KiB) are read out once.

#[cfg(doc)]
use super::arch::ArchSpec;
use super::config::Config;
use super::ModelError;
use crate::gguf::Gguf;
use crate::quant::{dequantize_row, GgmlType};

/// A weight matrix of `rows` outputs by `cols` inputs, stored row-major in the map.
#[derive(Clone, Debug)]
pub struct Mat {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    offset: usize,
}

impl Mat {
    fn load(g: &Gguf, name: &str, cols: usize, rows: usize) -> Result<Mat, ModelError> {
        let t = g.tensor(name)?;
        let dims = &t.info.dims;
        if dims.len() > 2 || dims[0] != cols || t.info.n_rows() != rows {
            return Err(ModelError::Shape {
                tensor: name.to_string(),
                want: format!("[{cols}, {rows}]"),
                got: format!("{dims:?}"),
            });
        }
        Ok(Mat {
            name: name.to_string(),
            ty: t.ty(),
            rows,
            cols,
            row_bytes: t.row_bytes(),
            offset: t.info.offset,
        })
    }

    /// All rows, given the model file's bytes.
    pub fn data<'a>(&self, file: &'a [u8]) -> &'a [u8] {
        &file[self.offset..self.offset + self.rows * self.row_bytes]
    }

    pub fn row<'a>(&self, file: &'a [u8], r: usize) -> &'a [u8] {
        let start = self.offset + r * self.row_bytes;
        &file[start..start + self.row_bytes]
    }
}

fn vector(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = g.tensor(name)?;
    if t.info.dims.iter().product::<usize>() != len || t.info.dims[0] != len {
        return Err(ModelError::Shape {
            tensor: name.to_string(),
            want: format!("[{len}]"),
            got: format!("{:?}", t.info.dims),
        });
    }
    let mut out = vec![0f32; len];
    dequantize_row(t.ty(), t.data, &mut out);
    Ok(out)
}

fn opt_vector(g: &Gguf, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
    if g.tensor_info(name).is_some() {
        vector(g, name, len).map(Some)
    } else {
        Ok(None)
    }
}

/// One layer's tensors. Shapes as (rows, cols) = (outputs, inputs) for matrices; q_dim is
/// n_head * head_dim, kv_dim n_head_kv * head_dim.
pub struct Layer {
    pub attn_norm: Vec<f32>, // (n_embd)
    pub wq: Mat,             // (q_dim, n_embd)
    pub wk: Mat,             // (kv_dim, n_embd)
    pub wv: Mat,             // (kv_dim, n_embd)
    pub wo: Mat,             // (n_embd, q_dim)
    /// Biases added after the projections, where the file has them (Qwen2).
    pub bq: Option<Vec<f32>>, // (q_dim)
    pub bk: Option<Vec<f32>>, // (kv_dim)
    pub bv: Option<Vec<f32>>, // (kv_dim)
    /// Per-head RMSNorm of Q and K, one weight shared by all heads ([`ArchSpec::qk_norm`]).
    pub q_norm: Option<Vec<f32>>, // (head_dim)
    pub k_norm: Option<Vec<f32>>, // (head_dim)
    /// RMSNorm of the attention output ([`ArchSpec::post_norms`]).
    pub post_attn_norm: Option<Vec<f32>>, // (n_embd)
    pub ffn_norm: Vec<f32>,  // (n_embd)
    pub w_gate: Mat,         // (n_ff, n_embd)
    pub w_up: Mat,           // (n_ff, n_embd)
    pub w_down: Mat,         // (n_embd, n_ff)
    /// RMSNorm of the FFN output ([`ArchSpec::post_norms`]).
    pub post_ffn_norm: Option<Vec<f32>>, // (n_embd)
}

pub struct Weights {
    pub tok_embd: Mat,         // (n_vocab, n_embd)
    pub output_norm: Vec<f32>, // (n_embd)
    /// `output.weight`, or the embedding when the model ties them (Gemma, small Llama/Qwen).
    pub output: Mat, // (n_vocab, n_embd)
    /// Llama 3 RoPE frequency factors, one per rotary pair.
    pub rope_freqs: Option<Vec<f32>>, // (n_rot / 2)
    pub layers: Vec<Layer>,    // (n_layer)
}

impl Weights {
    pub fn load(g: &Gguf, c: &Config) -> Result<Weights, ModelError> {
        let (d, q, kv, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let tok_embd = Mat::load(g, "token_embd.weight", d, c.n_vocab)?;
        let output = match g.tensor_info("output.weight") {
            Some(_) => Mat::load(g, "output.weight", d, c.n_vocab)?,
            None => tok_embd.clone(),
        };
        let layers = (0..c.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                // A tensor the architecture has: required then, absent otherwise.
                let when = |has: bool, s: &str, len| {
                    if has {
                        vector(g, &n(s), len).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let spec = c.spec;
                Ok(Layer {
                    attn_norm: vector(g, &n("attn_norm.weight"), d)?,
                    wq: Mat::load(g, &n("attn_q.weight"), d, q)?,
                    wk: Mat::load(g, &n("attn_k.weight"), d, kv)?,
                    wv: Mat::load(g, &n("attn_v.weight"), d, kv)?,
                    wo: Mat::load(g, &n("attn_output.weight"), q, d)?,
                    bq: opt_vector(g, &n("attn_q.bias"), q)?,
                    bk: opt_vector(g, &n("attn_k.bias"), kv)?,
                    bv: opt_vector(g, &n("attn_v.bias"), kv)?,
                    q_norm: when(spec.qk_norm, "attn_q_norm.weight", c.head_dim)?,
                    k_norm: when(spec.qk_norm, "attn_k_norm.weight", c.head_dim)?,
                    post_attn_norm: when(spec.post_norms, "post_attention_norm.weight", d)?,
                    ffn_norm: vector(g, &n("ffn_norm.weight"), d)?,
                    w_gate: Mat::load(g, &n("ffn_gate.weight"), d, ff)?,
                    w_up: Mat::load(g, &n("ffn_up.weight"), d, ff)?,
                    w_down: Mat::load(g, &n("ffn_down.weight"), ff, d)?,
                    post_ffn_norm: when(spec.post_norms, "post_ffw_norm.weight", d)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Weights {
            tok_embd,
            output_norm: vector(g, "output_norm.weight", d)?,
            output,
            rope_freqs: opt_vector(g, "rope_freqs.weight", c.n_rot / 2)?,
            layers,
        })
    }

    /// Every matrix, for sizing activation buffers and reporting.
    pub fn matrices(&self) -> impl Iterator<Item = &Mat> {
        [&self.tok_embd, &self.output].into_iter().chain(
            self.layers
                .iter()
                .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]),
        )
    }
}
