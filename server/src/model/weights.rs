//! The model's tensors, located in the map and checked against the config. Matrices stay in
//! the map (zero-copy); the small f32 vectors (norms, biases; a few KiB) are read out once.

use super::config::Config;
use super::ModelError;
use crate::gguf::Gguf;
use crate::quant::{dequantize_row, DotOrder, GgmlType};

/// A weight matrix of `rows` outputs by `cols` inputs, stored row-major in the map.
#[derive(Clone, Debug)]
pub struct Mat {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// The float order llama.cpp computes this matrix's products in.
    pub order: DotOrder,
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
            order: DotOrder::of_matrix(t.ty(), rows),
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

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Mat,
    pub wk: Mat,
    pub wv: Mat,
    pub wo: Mat,
    /// Qwen2 (and any model that has them): biases added after the projections.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Gemma 3: per-head RMSNorm weights for Q and K (shared by all heads).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Mat,
    pub w_up: Mat,
    pub w_down: Mat,
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    pub tok_embd: Mat,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or the embedding when the model ties them (Gemma, small Llama/Qwen).
    pub output: Mat,
    /// Llama 3 RoPE frequency factors, one per rotary pair.
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<Layer>,
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
                let gemma = c.sandwich_norms;
                let needed = |s: &str, len| vector(g, &n(s), len).map(Some);
                Ok(Layer {
                    attn_norm: vector(g, &n("attn_norm.weight"), d)?,
                    wq: Mat::load(g, &n("attn_q.weight"), d, q)?,
                    wk: Mat::load(g, &n("attn_k.weight"), d, kv)?,
                    wv: Mat::load(g, &n("attn_v.weight"), d, kv)?,
                    wo: Mat::load(g, &n("attn_output.weight"), q, d)?,
                    bq: opt_vector(g, &n("attn_q.bias"), q)?,
                    bk: opt_vector(g, &n("attn_k.bias"), kv)?,
                    bv: opt_vector(g, &n("attn_v.bias"), kv)?,
                    q_norm: if gemma {
                        needed("attn_q_norm.weight", c.head_dim)?
                    } else {
                        None
                    },
                    k_norm: if gemma {
                        needed("attn_k_norm.weight", c.head_dim)?
                    } else {
                        None
                    },
                    post_attn_norm: if gemma {
                        needed("post_attention_norm.weight", d)?
                    } else {
                        None
                    },
                    ffn_norm: vector(g, &n("ffn_norm.weight"), d)?,
                    w_gate: Mat::load(g, &n("ffn_gate.weight"), d, ff)?,
                    w_up: Mat::load(g, &n("ffn_up.weight"), d, ff)?,
                    w_down: Mat::load(g, &n("ffn_down.weight"), ff, d)?,
                    post_ffn_norm: if gemma {
                        needed("post_ffw_norm.weight", d)?
                    } else {
                        None
                    },
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
