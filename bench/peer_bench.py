"""llama.cpp (llama-cpp-python, x86-64-v3 build) on the same workload as
server/examples/decode_bench.rs: prefill N prompt tokens in one batch, then greedy-decode M
tokens one at a time. Prints one JSON line.  Usage: peer_bench.py MODEL THREADS [N] [M]"""
import json, sys, time
import numpy as np
import llama_cpp

model, threads = sys.argv[1], int(sys.argv[2])
n_prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 128
n_decode = int(sys.argv[4]) if len(sys.argv) > 4 else 64
llm = llama_cpp.Llama(model_path=model, n_ctx=n_prompt + n_decode + 8, n_batch=512,
                      n_threads=threads, n_threads_batch=threads, verbose=False)
text = b"The quick brown fox jumps over the lazy dog while the memory of a small server stays free. "
ids = llm.tokenize(text, add_bos=False, special=False)
prompt = [llm.token_bos()] + [ids[i % len(ids)] for i in range(n_prompt - 1)]
llm.eval(prompt[:8]); llm.reset()
t = time.perf_counter(); llm.eval(prompt); prefill = time.perf_counter() - t
t = time.perf_counter()
for _ in range(n_decode):
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    llm.eval([nxt])
decode = time.perf_counter() - t
print(json.dumps({"engine": "llama.cpp", "threads": threads,
                  "prefill_tok_s": round(n_prompt / prefill, 1), "decode_tok_s": round(n_decode / decode, 1)}))
