//! What one forward pass reads from the mapped weights: the figure decode's memory bandwidth
//! is measured against (`llm-server bench` reports bytes per token × tokens per second).

use super::weights::{Mat, Weights};

impl Mat {
    /// The matrix's bytes in the file.
    pub fn bytes(&self) -> u64 {
        (self.rows * self.row_bytes) as u64
    }
}

/// Bytes of weights one token's forward pass streams from the map: every layer's seven
/// matrices, the output matrix (the embedding itself when the model ties them) and the one
/// embedding row the token looks up. An untied embedding table is not counted whole: only its
/// row is read. The norms and biases are copied out at load (a few KiB) and not counted.
///
/// A batched step of S sessions reads these bytes once for its S tokens.
pub fn weight_bytes_per_token(w: &Weights) -> u64 {
    let layers: u64 = w
        .layers
        .iter()
        .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
        .map(Mat::bytes)
        .sum();
    layers + w.output.bytes() + w.tok_embd.row_bytes as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Gguf;
    use crate::model::Config;

    /// The figure, summed here independently from the file's own tensor table (sizes as the
    /// GGUF header records them), for a tied model (Gemma 3: no `output.weight`) and an untied
    /// one (the synthetic Llama has its own `output.weight`).
    #[test]
    fn bytes_per_token_are_the_streamed_tensors_of_the_table() {
        const LAYER: [&str; 7] = [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ];
        for (name, tied) in [
            ("synth-gemma3-q8_0.gguf", true),
            ("synth-llama-q4_k_m.gguf", false),
        ] {
            let g = Gguf::open(&test_support::synth(name)).unwrap();
            let c = Config::from_gguf(&g).unwrap();
            let w = Weights::load(&g, &c).unwrap();
            let size = |n: &str| g.tensor_info(n).map(|t| t.size as u64);
            let mut want = 0;
            for i in 0..c.n_layer {
                for m in LAYER {
                    want += size(&format!("blk.{i}.{m}.weight")).unwrap();
                }
            }
            let embd = size("token_embd.weight").unwrap();
            assert_eq!(size("output.weight").is_none(), tied, "{name}");
            want += size("output.weight").unwrap_or(embd);
            want += embd / c.n_vocab as u64;
            assert_eq!(weight_bytes_per_token(&w), want, "{name}");
            // Less than the whole file: an untied table is read one row a token.
            let all: u64 = g.tensors.iter().map(|t| t.size as u64).sum();
            assert!(want < all, "{name}: {want} of {all}");
        }
    }
}
