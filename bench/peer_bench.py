"""llama.cpp (llama-cpp-python, x86-64-v3 build) on the workload of `llm-server bench`:
ppN prefills N prompt tokens into an empty context in one call; tgN decodes N tokens greedily
one at a time after a BOS token. Prints one JSON document of the same shape as
`llm-server bench --json`, CPU time per token included (user + system time of this process,
llama.cpp's threads and the Python host's, from getrusage around each repetition).

    peer_bench.py -m MODEL [-p 128,2048] [-n 128] [-t 1,2] [-r 5]
"""
import argparse
import json
import resource
import statistics
import time

import numpy as np
import llama_cpp

TEXT = b"The quick brown fox jumps over the lazy dog while the memory of a small server stays free. "


def ints(s):
    return [int(v) for v in s.split(",")]


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def cpu_secs():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


class Timer:
    """Wall and CPU clocks around one repetition, as `llm-server bench` takes them."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), cpu_secs()
        return self

    def __exit__(self, *_):
        self.secs = time.perf_counter() - self.wall
        self.cpu_secs = cpu_secs() - self.cpu


def result(test, threads, tokens, runs):
    samples = [tokens / r.secs for r in runs]
    s = sorted(samples)
    med = statistics.median(s)
    return {"test": test, "threads": threads, "tokens": tokens,
            "samples": [round(v, 1) for v in samples], "median": round(med, 1),
            "min": round(s[0], 1), "max": round(s[-1], 1),
            "spread": round((s[-1] - s[0]) / med, 3),
            "cpu_ms_per_token": round(statistics.median(r.cpu_secs * 1e3 / tokens for r in runs), 3),
            "cpu_utilisation": round(statistics.median(r.cpu_secs / r.secs for r in runs), 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", type=ints, default=[128])
    ap.add_argument("-n", "--n-gen", type=ints, default=[128])
    ap.add_argument("-t", "--threads", type=ints, default=[1])
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    a = ap.parse_args()
    n_ctx = max(a.n_prompt + a.n_gen) + 1
    results, anon, file_, name = [], 0, 0, ""
    for threads in a.threads:
        # Llama.eval feeds a prompt in calls of n_batch tokens, each one micro-batch: 512, as
        # llama.cpp's default n_ubatch is.
        llm = llama_cpp.Llama(model_path=a.model, n_ctx=max(n_ctx, 8), n_batch=512,
                              n_threads=threads, n_threads_batch=threads, verbose=False)
        name = llm.metadata.get("general.name", "")
        ids = llm.tokenize(TEXT, add_bos=False, special=False)
        prompt = [llm.token_bos()] + [ids[i % len(ids)] for i in range(n_ctx - 1)]
        llm.eval(prompt[:8])
        for n in [n for n in a.n_prompt if n > 0]:
            samples = []
            for _ in range(a.repetitions):
                llm.reset()
                with Timer() as t:
                    llm.eval(prompt[:n])
                samples.append(t)
                anon, file_ = max(anon, status_kb("RssAnon:")), max(file_, status_kb("RssFile:"))
            results.append(result(f"pp{n}", threads, n, samples))
        for n in [n for n in a.n_gen if n > 0]:
            samples = []
            for _ in range(a.repetitions):
                llm.reset()
                llm.eval(prompt[:1])
                with Timer() as t:
                    for _ in range(n):
                        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                        llm.eval([nxt])
                samples.append(t)
                anon, file_ = max(anon, status_kb("RssAnon:")), max(file_, status_kb("RssFile:"))
            results.append(result(f"tg{n}", threads, n, samples))
        del llm
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "unknown CPU")
    print(json.dumps({"engine": "llama.cpp", "model": name, "cpu": cpu, "results": results,
                      "rss_anon_peak_kb": anon, "rss_file_peak_kb": file_,
                      "vm_hwm_kb": status_kb("VmHWM:")}))


main()
