//! Synthetic GGUF files of a real model's shapes and tensor types, with deterministic
//! pseudo-random weights (`llm-server synth`): for measuring memory and speed where the real
//! weights cannot be fetched. The block layouts and float fields come from the engine's own
//! quant table (`quant::random_row`), and the file is written by [`super::write`].

use std::fs;
use std::io::BufWriter;
use std::path::Path;

use super::write::{self, TensorSpec};
use super::{Gguf, Value};
use crate::quant::{dequantize_row, random_row, GgmlType};

/// Writes the file through a `.partial` name, so a cut run never leaves a short GGUF behind.
pub fn write_file(
    out: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    seed: u64,
) -> Result<u64, String> {
    let partial = out.with_extension("gguf.partial");
    let file = fs::File::create(&partial)
        .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut weights = Weights::new(seed);
    let n = write::write(&mut w, metadata, tensors, |t, r, row| {
        weights.fill(t, r, row)
    })
    .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
    drop(w);
    fs::rename(&partial, out).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok(n)
}

/// An architecture's shapes. Presets are Gemma 3 (the only architecture the appliance's 1 GB
/// proof needs); the keys and tensor names are the ones llama.cpp's converter writes.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub sliding_window: usize,
    pub n_ctx_train: usize,
}

pub const PRESETS: [Preset; 2] = [
    // google/gemma-3-1b-it's config.json (every 6th layer global: the engine's gemma3 row).
    Preset {
        name: "gemma3-1b",
        n_layer: 26,
        n_embd: 1152,
        n_ff: 6912,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_vocab: 262_144,
        sliding_window: 512,
        n_ctx_train: 32_768,
    },
    // Small enough for unit tests, with rows of 288 and 576 values that, like 1B's 1152, are
    // not whole 256-value blocks; the vocabulary of testdata's synth-gemma3 files.
    Preset {
        name: "gemma3-tiny",
        n_layer: 6,
        n_embd: 288,
        n_ff: 576,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 64,
        n_vocab: 512,
        sliding_window: 8,
        n_ctx_train: 512,
    },
];

impl Preset {
    pub fn named(name: &str) -> Result<Preset, String> {
        PRESETS.into_iter().find(|p| p.name == name).ok_or_else(|| {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            format!("no preset `{name}`; presets: {}", names.join(", "))
        })
    }

    /// The architecture's keys, and the tokenizer of `vocab` (whose size must be the preset's).
    pub fn metadata(&self, vocab: &Path) -> Result<MetadataList, String> {
        let g = Gguf::open(vocab).map_err(|e| e.to_string())?;
        let tokens = match g.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(a)) => a.len(),
            _ => return Err(format!("{} has no tokenizer.ggml.tokens", vocab.display())),
        };
        if tokens != self.n_vocab {
            return Err(format!(
                "{} has {tokens} tokens but {} has a vocabulary of {}: give a GGUF of that \
                 model family (the default model for gemma3-1b)",
                vocab.display(),
                self.name,
                self.n_vocab
            ));
        }
        let a = "gemma3";
        let u32v = |n: usize| Value::U32(n as u32);
        let mut md = vec![
            ("general.architecture".into(), Value::String(a.into())),
            (
                "general.name".into(),
                Value::String(format!("synthetic {} (pseudo-random weights)", self.name)),
            ),
            ("general.quantization_version".into(), Value::U32(2)),
            (format!("{a}.block_count"), u32v(self.n_layer)),
            (format!("{a}.context_length"), u32v(self.n_ctx_train)),
            (format!("{a}.embedding_length"), u32v(self.n_embd)),
            (format!("{a}.feed_forward_length"), u32v(self.n_ff)),
            (format!("{a}.attention.head_count"), u32v(self.n_head)),
            (format!("{a}.attention.head_count_kv"), u32v(self.n_head_kv)),
            (format!("{a}.attention.key_length"), u32v(self.head_dim)),
            (format!("{a}.attention.value_length"), u32v(self.head_dim)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
            (
                format!("{a}.attention.sliding_window"),
                u32v(self.sliding_window),
            ),
            (format!("{a}.rope.freq_base"), Value::F32(1e6)),
        ];
        md.extend(
            g.metadata
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .map(|(k, v)| (k.to_owned(), v.clone())),
        );
        Ok(md)
    }

    /// Every tensor of the architecture, typed by `mix`.
    pub fn tensors(&self, mix: Mix) -> Vec<TensorSpec> {
        let (e, q, kv) = (
            self.n_embd,
            self.n_head * self.head_dim,
            self.n_head_kv * self.head_dim,
        );
        let mut t = vec![
            mix.tensor("token_embd.weight", Role::Embedding, &[e, self.n_vocab]),
            TensorSpec::new("output_norm.weight", GgmlType::F32, &[e]),
        ];
        for i in 0..self.n_layer {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            for (n, len) in [
                ("attn_norm", e),
                ("attn_q_norm", self.head_dim),
                ("attn_k_norm", self.head_dim),
                ("post_attention_norm", e),
                ("ffn_norm", e),
                ("post_ffw_norm", e),
            ] {
                t.push(TensorSpec::new(name(n), GgmlType::F32, &[len]));
            }
            for (n, role, dims) in [
                ("attn_q", Role::Matrix, [e, q]),
                ("attn_k", Role::Matrix, [e, kv]),
                ("attn_v", Role::AttnV, [e, kv]),
                ("attn_output", Role::Matrix, [q, e]),
                ("ffn_gate", Role::Matrix, [e, self.n_ff]),
                ("ffn_up", Role::Matrix, [e, self.n_ff]),
                ("ffn_down", Role::Matrix, [self.n_ff, e]),
            ] {
                t.push(mix.tensor(&name(n), role, &dims));
            }
        }
        t
    }
}

/// What a matrix is, for the type a quantisation gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Embedding,
    AttnV,
    Matrix,
}

/// A file type's choice of tensor types, as llama.cpp's quantiser makes it for Gemma 3
/// (`llama_tensor_get_type`, src/llama-quant.cpp): a wanted type per role, then, where a row is
/// not whole blocks of it, the same fallback llama.cpp takes (IQ/Q2_K/Q3_K/IQ4_XS -> IQ4_NL,
/// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). Gemma 3 1B's 1152-wide rows make its IQ4_XS file
/// Q8_0 (embedding), Q5_1 (attn_v), IQ4_NL (q, k, gate, up) and IQ4_XS (attn_output,
/// ffn_down; llama.cpp gives 3 of these 52 a higher type that is not modelled here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Iq4Xs,
    /// Q4_0 everywhere but the embedding (Q6_K wanted, Q8_0 for 1152-wide rows).
    Q4_0,
    /// One of the grid types (IQ3_S, IQ3_XXS, IQ2_*, IQ1_*) for every matrix but the embedding,
    /// IQ4_NL where rows are not whole super-blocks: for measuring that type's kernels. Written
    /// by synth because llama.cpp's quantiser refuses most of them without an importance matrix.
    Grid(GgmlType),
}

/// The types [`Mix::Grid`] takes, by their mix names (ggml's type names).
const GRID_TYPES: [GgmlType; 7] = [
    GgmlType::IQ3_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ2_S,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ1_M,
    GgmlType::IQ1_S,
];

impl Mix {
    pub fn named(name: &str) -> Result<Mix, String> {
        match name {
            "iq4_xs" => Ok(Mix::Iq4Xs),
            "q4_0" => Ok(Mix::Q4_0),
            _ => GRID_TYPES
                .into_iter()
                .find(|t| t.name() == name)
                .map(Mix::Grid)
                .ok_or_else(|| {
                    let grids: Vec<&str> = GRID_TYPES.iter().map(|t| t.name()).collect();
                    format!("no mix `{name}`; mixes: iq4_xs, q4_0, {}", grids.join(", "))
                }),
        }
    }

    fn wanted(self, role: Role) -> GgmlType {
        match (self, role) {
            (_, Role::Embedding) => GgmlType::Q6_K,
            (Mix::Iq4Xs, Role::AttnV) => GgmlType::Q5_K,
            (Mix::Iq4Xs, Role::Matrix) => GgmlType::IQ4_XS,
            (Mix::Q4_0, _) => GgmlType::Q4_0,
            (Mix::Grid(ty), _) => ty,
        }
    }

    pub fn tensor(self, name: &str, role: Role, dims: &[usize]) -> TensorSpec {
        let wanted = self.wanted(role);
        let ty = if dims[0].is_multiple_of(wanted.block_len()) {
            wanted
        } else {
            fallback(wanted)
        };
        TensorSpec::new(name, ty, dims)
    }
}

/// llama.cpp's type for a tensor whose rows are not whole blocks of `ty`.
fn fallback(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => GgmlType::IQ4_NL,
    }
}

/// Metadata in the order it is written.
pub type MetadataList = Vec<(String, Value)>;

/// A real file's metadata and tensor table, for `--like`.
pub fn like_header(path: &Path) -> Result<(MetadataList, Vec<TensorSpec>), String> {
    let g = Gguf::open(path).map_err(|e| e.to_string())?;
    let md = g
        .metadata
        .iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    let mut tensors = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let ty = t.ty.ggml().ok_or_else(|| {
            format!(
                "tensor `{}` of {} has type {}, which the engine has no block layout for",
                t.name,
                path.display(),
                t.ty.name()
            )
        })?;
        tensors.push(TensorSpec::new(&t.name, ty, &t.dims));
    }
    Ok((md, tensors))
}

/// Deterministic weights: each row from its own generator (seed, tensor, row), so a file does
/// not depend on the order it is written in. Norm weights are near 1 (Gemma's converter stores
/// them with the 1 added); a matrix's float fields are scaled so its values have an RMS of
/// 1/sqrt(row length), the scale that keeps a product's RMS that of its input, layer after layer.
struct Weights {
    seed: u64,
    /// Per type: the RMS of a row whose float fields are drawn from [-1, 1).
    unit_rms: std::collections::HashMap<GgmlType, f32>,
}

impl Weights {
    fn new(seed: u64) -> Weights {
        Weights {
            seed,
            unit_rms: Default::default(),
        }
    }

    fn fill(&mut self, t: &TensorSpec, row: usize, out: &mut [u8]) {
        let mut next = splitmix(self.seed ^ fnv(&t.name) ^ (row as u64).wrapping_mul(0x9e37));
        let n = t.dims[0];
        if t.dims.len() == 1 {
            // A norm (F32): 1 ± 0.1.
            for v in out.chunks_exact_mut(4) {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                v.copy_from_slice(&(0.9 + 0.2 * u).to_le_bytes());
            }
            return;
        }
        let unit = *self
            .unit_rms
            .entry(t.ty)
            .or_insert_with(|| unit_rms(t.ty, self.seed));
        let scale = 1.0 / (n as f32).sqrt() / unit;
        out.copy_from_slice(&random_row(t.ty, n, scale, &mut next));
    }
}

/// The RMS of 64 blocks of `ty` whose float fields are uniform in [-1, 1).
fn unit_rms(ty: GgmlType, seed: u64) -> f32 {
    let n = ty.block_len() * 64;
    let mut next = splitmix(seed ^ 0x5eed);
    let row = random_row(ty, n, 1.0, &mut next);
    let mut values = vec![0f32; n];
    dequantize_row(ty, &row, &mut values);
    let mean_square = values.iter().map(|v| f64::from(v * v)).sum::<f64>() / n as f64;
    (mean_square.sqrt() as f32).max(f32::MIN_POSITIVE)
}

fn splitmix(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LoadOptions, Model};
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("synth-{name}-{}.gguf", std::process::id()))
    }

    fn count(tensors: &[TensorSpec], ty: GgmlType) -> usize {
        tensors.iter().filter(|t| t.ty == ty).count()
    }

    #[test]
    fn gemma3_1b_has_the_real_files_shapes_and_iq4_xs_mix() {
        let p = Preset::named("gemma3-1b").unwrap();
        let t = p.tensors(Mix::Iq4Xs);
        assert_eq!(t.len(), 2 + 26 * 13);
        // As llama.cpp's IQ4_XS file of Gemma 3 1B: 26 Q5_1, 104 IQ4_NL, IQ4_XS for the rest.
        assert_eq!(count(&t, GgmlType::Q5_1), 26);
        assert_eq!(count(&t, GgmlType::IQ4_NL), 104);
        assert_eq!(count(&t, GgmlType::IQ4_XS), 52);
        assert_eq!(count(&t, GgmlType::Q8_0), 1);
        let bytes: usize = t.iter().map(|t| t.bytes().unwrap()).sum();
        // The published IQ4_XS file is about 714 MB.
        assert!((680e6..730e6).contains(&(bytes as f64)), "{bytes}");
        let q4 = p.tensors(Mix::Q4_0);
        assert_eq!(count(&q4, GgmlType::Q4_0), 26 * 7);
        // The grid mixes: attn_output and ffn_down (1024 and 6912 wide) of the type, the
        // 1152-wide rest IQ4_NL.
        let iq2 = p.tensors(Mix::named("iq2_xxs").unwrap());
        assert_eq!(count(&iq2, GgmlType::IQ2_XXS), 52);
        assert_eq!(count(&iq2, GgmlType::IQ4_NL), 26 * 5);
        let e = Mix::named("iq5").unwrap_err();
        assert!(e.contains("iq1_m") && e.contains("q4_0"), "{e}");
        let e = Preset::named("gemma3-2b").unwrap_err();
        assert!(e.contains("gemma3-1b"), "{e}");
    }

    #[test]
    fn a_tiny_preset_file_loads_and_its_forward_pass_is_finite() {
        let vocab = test_support::synth("synth-gemma3-f32.gguf");
        for mix in [Mix::Iq4Xs, Mix::Q4_0] {
            let p = Preset::named("gemma3-tiny").unwrap();
            let tensors = p.tensors(mix);
            let out = scratch(&format!("tiny-{mix:?}"));
            let n = write_file(&out, &p.metadata(&vocab).unwrap(), &tensors, 7).unwrap();
            assert_eq!(std::fs::metadata(&out).unwrap().len(), n);

            let g = Gguf::open(&out).unwrap();
            for t in &tensors {
                let info = g.tensor_info(&t.name).unwrap();
                assert_eq!(
                    (&info.dims, info.ty.ggml(), info.size),
                    (&t.dims, Some(t.ty), t.bytes().unwrap())
                );
            }
            drop(g);
            let model = Model::load(&out, &LoadOptions::default()).unwrap();
            let mut session = model.new_session(32);
            let tokens: Vec<u32> = (2..14).collect();
            let logits = session.eval(&model, &tokens).unwrap().to_vec();
            assert_eq!(logits.len(), 512);
            assert!(logits.iter().all(|l| l.is_finite()), "{mix:?}: {logits:?}");
            let spread = logits.iter().fold(0f32, |m, l| m.max(l.abs()));
            assert!(
                spread > 1e-3 && spread < 1e3,
                "{mix:?}: logits up to {spread}"
            );

            // The same seed writes the same bytes.
            let again = scratch(&format!("tiny-{mix:?}-again"));
            write_file(&again, &p.metadata(&vocab).unwrap(), &tensors, 7).unwrap();
            assert!(std::fs::read(&out).unwrap() == std::fs::read(&again).unwrap());
            std::fs::remove_file(&out).unwrap();
            std::fs::remove_file(&again).unwrap();
        }
    }

    #[test]
    fn a_real_size_gemma3_1b_file_loads_and_gives_finite_logits() {
        let p = Preset::named("gemma3-1b").unwrap();
        let out = scratch("1b");
        let md = p.metadata(&test_support::default_model()).unwrap();
        let n = write_file(&out, &md, &p.tensors(Mix::Iq4Xs), 1).unwrap();
        assert_eq!(n, 714_433_024);
        let model = Model::load(&out, &LoadOptions::default()).unwrap();
        let mut session = model.new_session(8);
        let logits = session.eval(&model, &[2, 9259]).unwrap().to_vec();
        assert_eq!(logits.len(), 262_144);
        assert!(logits.iter().all(|l| l.is_finite()));
        drop(model);
        std::fs::remove_file(&out).unwrap();
    }

    #[test]
    fn like_copies_a_real_header_and_refuses_a_wrong_vocabulary() {
        let real = test_support::synth("synth-gemma3-q4_k_m.gguf");
        let (md, tensors) = like_header(&real).unwrap();
        let out = scratch("like");
        write_file(&out, &md, &tensors, 1).unwrap();
        let (a, b) = (Gguf::open(&real).unwrap(), Gguf::open(&out).unwrap());
        let pairs = |g: &Gguf| -> Vec<_> {
            g.metadata
                .iter()
                .map(|(k, v)| (k.to_owned(), v.clone()))
                .collect()
        };
        assert_eq!(pairs(&a), pairs(&b));
        let shape = |g: &Gguf| -> Vec<_> {
            g.tensors
                .iter()
                .map(|t| (t.name.clone(), t.ty, t.dims.clone(), t.size))
                .collect()
        };
        assert_eq!(shape(&a), shape(&b));
        let logits = {
            let model = Model::load(&out, &LoadOptions::default()).unwrap();
            let mut s = model.new_session(8);
            s.eval(&model, &[2, 3, 4]).unwrap().to_vec()
        };
        assert!(logits.iter().all(|l| l.is_finite()));
        std::fs::remove_file(&out).unwrap();

        let e = Preset::named("gemma3-1b")
            .unwrap()
            .metadata(&real)
            .unwrap_err();
        assert!(e.contains("262144") && e.contains("tokens"), "{e}");
    }
}
