#!/usr/bin/env python3
"""Position-by-position logit parity with llama.cpp.

    bench/parity.py MODEL ID,ID,...
    bench/parity.py MODEL GOLDEN.json [PROMPT_NAME]
    ONE_BY_ONE=1 bench/parity.py ...   (both engines evaluate one token at a time, as in decoding)

Evaluates the ids in one batch with llama.cpp (llama-cpp-python, all logits, 1 thread, the
golden files' settings) and with `server/examples/dump_logits.rs`, then prints per position the
largest and mean |difference| over the whole vocabulary. Exact engines print 0.0 everywhere; the
first non-zero position points at the operation that differs. Run it from the peer's
virtualenv (see testdata/README.md), after
`cargo build --release -p llm-server --example dump_logits`.
"""
import json
import os
import subprocess
import sys

import numpy as np
import llama_cpp


def golden_ids(path, name=None):
    """The sequence a golden file's teacher-forced logits cover: prompt + greedy minus the last."""
    prompts = json.load(open(path))["prompts"]
    p = next(p for p in prompts if name in (None, p["name"]))
    return p["prompt_tokens"] + p["greedy_tokens"][:-1]


def main():
    model = sys.argv[1]
    if sys.argv[2].endswith(".json"):
        tokens = golden_ids(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        tokens = [int(x) for x in sys.argv[2].split(",")]
    ids = ",".join(map(str, tokens))
    llm = llama_cpp.Llama(model_path=model, n_ctx=max(64, len(tokens)), n_batch=512,
                          logits_all=True, verbose=False, n_threads=1)
    one_by_one = os.environ.get("ONE_BY_ONE") == "1"
    if one_by_one:
        for t in tokens:
            llm.eval([t])
    else:
        llm.eval(tokens)
    ref = np.array(llm.scores[: len(tokens)])
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    exe = os.path.join(target, "release", "examples", "dump_logits")
    cmd = [exe, model, ids] + (["--one-by-one"] if one_by_one else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    ours = np.array([json.loads(line) for line in out.splitlines() if line])
    for i in range(len(tokens)):
        d = np.abs(ours[i] - ref[i])
        print(f"{i:4} max {d.max():.5f} mean {d.mean():.6f} top1 {'=' if ours[i].argmax() == ref[i].argmax() else 'DIFF'}")


if __name__ == "__main__":
    main()
