#!/usr/bin/env python3
"""How often prompt-lookup drafts are taken, per kind of prompt, against a running llm-server
(one slot): for each prompt, greedy, the deltas of /metrics' draft and pass counters around one
chat request. Load-independent (counts, not times). Standard library only.
  draft_acceptance.py BASE_URL [MAX_TOKENS]
"""
import json
import sys
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


def main():
    base = sys.argv[1].rstrip("/")
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    for name, prompt in CASES.items():
        before = metrics(base)
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "cache_prompt": False}
        req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
        drafted, accepted, passes, tokens = (a - b for a, b in zip(metrics(base), before))
        share = 100 * accepted / drafted if drafted else 0
        print(f"{name:11}: {tokens:.0f} tokens in {passes:.0f} passes, drafted {drafted:.0f}, "
              f"accepted {accepted:.0f} ({share:.0f} %), {tokens / max(passes, 1):.2f} tokens per pass")


if __name__ == "__main__":
    main()
