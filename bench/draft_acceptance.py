#!/usr/bin/env python3
"""How often prompt-lookup drafts are taken, per kind of prompt, and what that does to the
decode speed, against a running llm-server (one slot, nothing else using it). For each prompt,
greedy and without the prompt cache:
  - the deltas of /metrics' draft and pass counters around one chat request (load-independent
    counts, not times);
  - PAIRS pairs of streamed requests with "speculative": true and false, the order alternating
    from pair to pair (so a drift in the machine's load falls on both), each timed from its first
    content token to its end: decode tokens per second, the median of each side, and the
    speed-up as the median of the pairs' ratios. The answers must all be the same text (greedy
    speculation changes no token).
Standard library only.
  draft_acceptance.py BASE_URL [MAX_TOKENS] [PAIRS]
"""
import json
import statistics
import sys
import time
import urllib.request

PARA = ("The harbour of Westhaven was rebuilt in 1788 after the great storm. Its keeper, Anna "
        "Morel, kept a log of every ship that entered: 412 in the first year, 655 in the second, "
        "and more than a thousand by 1800, when the railway reached the town.")
CODE = ("def total(xs):\n    x = 0\n    for v in xs:\n        x = x + v\n    return x\n\n"
        "print(total([1, 2, 3]))\n")
CASES = {
    "extraction": f"Copy this paragraph exactly, word for word:\n\n{PARA}",
    "code edit": "Rename the variable x to acc in this Python code and show the whole code:"
                 f"\n\n```python\n{CODE}```",
    "summary": f"Summarise in two sentences, reusing its words:\n\n{PARA}",
    "free chat": "Tell me a short story about a dragon who learns to cook.",
}
NAMES = ["llm_draft_tokens_total", "llm_draft_accepted_total", "llm_decode_passes_total",
         "llm_generated_tokens_total"]


def metrics(base):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    values = dict(line.split()[:2] for line in text.splitlines()
                  if line and not line.startswith("#") and " " in line)
    return [float(values[n]) for n in NAMES]


def chat(base, prompt, max_tokens, speculative, stream):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "cache_prompt": False, "speculative": speculative}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def counts(base, prompt, max_tokens):
    """(tokens, passes, drafted, accepted) of one speculative request."""
    before = metrics(base)
    chat(base, prompt, max_tokens, True, False).read()
    drafted, accepted, passes, tokens = (a - b for a, b in zip(metrics(base), before))
    return tokens, passes, drafted, accepted


def timed(base, prompt, max_tokens, speculative):
    """(decode tokens per second after the first content token, answer text)"""
    start, first, text, tokens = time.perf_counter(), None, [], 0
    with chat(base, prompt, max_tokens, speculative, True) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices"):
                continue
            piece = chunk["choices"][0].get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter()
                text.append(piece)
    end = time.perf_counter()
    first = first if first is not None else start
    # The first token comes with the prompt's evaluation, the same work either way.
    return (tokens - 1) / max(end - first, 1e-9), "".join(text)


def main():
    base = sys.argv[1].rstrip("/")
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    if max_tokens < 2 or pairs < 1:
        sys.exit("MAX_TOKENS must be at least 2 and PAIRS at least 1")
    print(f"{max_tokens} greedy tokens per request, median of {pairs} pairs (decode tok/s after "
          "the first token)")
    print(f"{'prompt':11} {'tokens':>6} {'passes':>6} {'drafted':>7} {'accepted':>12} "
          f"{'tok/pass':>8} {'spec tok/s':>10} {'plain tok/s':>11} {'speed-up':>8} same")
    for name, prompt in CASES.items():
        tokens, passes, drafted, accepted = counts(base, prompt, max_tokens)
        rates = {True: [], False: []}
        texts = set()
        for i in range(pairs):
            for speculative in ((True, False) if i % 2 == 0 else (False, True)):
                rate, text = timed(base, prompt, max_tokens, speculative)
                rates[speculative].append(rate)
                texts.add(text)
        spec, plain = statistics.median(rates[True]), statistics.median(rates[False])
        # Within a pair the two ran back to back: the median of the pairs' ratios is steadier
        # than the ratio of the medians when the machine's load changes.
        speedup = statistics.median(s / p for s, p in zip(rates[True], rates[False]))
        share = 100 * accepted / drafted if drafted else 0
        print(f"{name:11} {tokens:6.0f} {passes:6.0f} {drafted:7.0f} "
              f"{accepted:5.0f} ({share:3.0f} %) {tokens / max(passes, 1):8.2f} {spec:10.1f} "
              f"{plain:11.1f} {speedup:7.2f}x {'yes' if len(texts) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
