#!/usr/bin/env python3
"""What a user of the server feels, measured against one running OpenAI-compatible server.

chat:    replays a 10-turn conversation after a ~1.5k-token system prompt (greedy, 48 tokens per
         answer, each answer appended to the history as a client does) and prints per turn the
         time to the first streamed token and the total time.
streams: N concurrent streams of 128 greedy tokens from different short prompts, N = 1, 2, 4,
         and prints aggregate generated tokens per second (completion_tokens / wall time).
         These greedy stories repeat themselves, so prompt-lookup drafting takes most of its
         drafts (4-5 tokens per pass for one stream) and one stream is already a batch of
         rows: `--no-speculative` asks for one token per pass, as llama-server and
         `llm-server bench -s` decode, to see what batching the streams alone gives.

Standard library only. JSON on the last line for bench/serve_compare.sh.
  serve_bench.py chat|streams BASE_URL [--no-speculative]
"""
import json
import sys
import threading
import time
import urllib.request

TOPICS = ["the harbour", "the lighthouse", "the railway", "the old mill", "the orchard",
          "the market", "the observatory", "the bridge", "the library", "the river barges"]


def system_prompt():
    # ~1.5k tokens of varied, deterministic text: a made-up town guide the turns ask about.
    lines = []
    for i in range(60):
        t = TOPICS[i % len(TOPICS)]
        lines.append(f"Fact {i + 1}: {t} was rebuilt in {1700 + 7 * i}, and its keeper number "
                     f"{i * 13 % 97} records {i * 31 % 211} visitors on a calm day.")
    return "You are a guide to the town of Westhaven. Answer briefly.\n" + "\n".join(lines)


def post(base, path, body, stream):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def chat_turn(base, messages, max_tokens):
    """(seconds to the first content token, total seconds, answer text)"""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first, text = None, []
    with post(base, "/v1/chat/completions", body, True) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices"):
                continue
            piece = chunk["choices"][0].get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter() - start
                text.append(piece)
    return first, time.perf_counter() - start, "".join(text)


def chat(base):
    messages = [{"role": "system", "content": system_prompt()}]
    turns = []
    for i, topic in enumerate(TOPICS):
        messages.append({"role": "user", "content": f"Question {i + 1}: tell me about {topic}."})
        ttft, total, answer = chat_turn(base, messages, 48)
        messages.append({"role": "assistant", "content": answer})
        turns.append({"turn": i + 1, "ttft_s": ttft, "total_s": total})
        print(f"turn {i + 1:2}: first token {ttft:7.3f} s, total {total:7.3f} s", flush=True)
    return {"turns": turns}


def completion_tokens(base, prompt, n, speculative):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if not speculative:
        body["speculative"] = False
    with post(base, "/v1/completions", body, False) as r:
        return json.load(r)["usage"]["completion_tokens"]


def streams(base, speculative):
    # A first request faults the weights into the fresh server's address space and warms its
    # caches; timed, it would make one stream look slower than it is.
    completion_tokens(base, "Warm-up: once upon a time", 16, speculative)
    out = []
    for n in (1, 2, 4):
        counts = [0] * n

        def run(k):
            counts[k] = completion_tokens(base, f"Story {k}: once upon a time in {TOPICS[k]}", 128,
                                          speculative)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        out.append({"streams": n, "tokens": sum(counts), "seconds": wall,
                    "aggregate_tok_s": sum(counts) / wall})
        print(f"{n} streams: {sum(counts)} tokens in {wall:.2f} s = {sum(counts) / wall:.1f} tok/s",
              flush=True)
    return {"streams": out}


if __name__ == "__main__":
    mode, base = sys.argv[1], sys.argv[2].rstrip("/")
    speculative = "--no-speculative" not in sys.argv[3:]
    result = chat(base) if mode == "chat" else streams(base, speculative)
    print(json.dumps(result))
