"""A random-weight f16 GGUF of Llama 3.2 1B shapes (2.5 GB; embedding tied to the output), with
the Llama 3 BPE vocabulary of a vocabulary GGUF, for speed comparisons (bench/compare.sh) on
1B-shaped models; bench/quantize.py then makes Q4_0 / Q4_K_M of it with llama.cpp's quantiser.
Needs gguf-py (the tests' virtualenv has it):
    python bench/llama_1b_random.py testdata/vocab/ggml-vocab-llama-bpe.gguf OUT.gguf"""
import sys, numpy as np, gguf
vocab_path, out = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(vocab_path)
w = gguf.GGUFWriter(out, "llama")
E, L, H, KV, FF = 2048, 16, 32, 8, 8192
w.add_name("llama-1b-shapes-random")
w.add_block_count(L); w.add_context_length(8192); w.add_embedding_length(E)
w.add_feed_forward_length(FF); w.add_head_count(H); w.add_head_count_kv(KV)
w.add_rope_freq_base(500000.0); w.add_layer_norm_rms_eps(1e-5); w.add_rope_dimension_count(E // H)
for name, f in r.fields.items():
    if not name.startswith("tokenizer."):
        continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[1]
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
        else:
            vals = [f.parts[i].tolist()[0] for i in f.data]
        w.add_array(name, vals)
    elif t == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(f.parts[f.data[0]]).decode())
    else:
        w.add_key_value(name, f.parts[f.data[0]].tolist()[0], t)
n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
rng = np.random.default_rng(7)
def t(name, *shape):
    w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))
def ones(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))
t("token_embd.weight", n_vocab, E)
ones("output_norm.weight", E)
for i in range(L):
    p = f"blk.{i}."
    ones(p + "attn_norm.weight", E); ones(p + "ffn_norm.weight", E)
    t(p + "attn_q.weight", E, E); t(p + "attn_k.weight", KV * E // H, E)
    t(p + "attn_v.weight", KV * E // H, E); t(p + "attn_output.weight", E, E)
    t(p + "ffn_gate.weight", FF, E); t(p + "ffn_up.weight", FF, E); t(p + "ffn_down.weight", E, FF)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
