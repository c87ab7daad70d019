#!/usr/bin/env bash
# Side-by-side throughput of llm-server and llama.cpp, alternating one repetition of each so both
# see the same machine noise; prints each engine's median over the pairs and the median of the
# per-pair ratios (ours / llama.cpp). Needs the peer's virtualenv (see testdata/README.md).
#   PEER=~/.cache/peer/bin/python MODEL=x.gguf bench/compare.sh [PAIRS] [bench args...]
# e.g. bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2   (those are the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-$HOME/.cache/peer/bin/python}
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
PAIRS=${1:-5}
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-p 128,2048 -n 128 -t 1,2)
cargo build --release -q -p llm-server --bin llm-server
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$PAIRS"); do
  ./target/release/llm-server bench -m "$MODEL" "${ARGS[@]}" -r 1 --json >"$out/ours.$i.json"
  "$PEER" bench/peer_bench.py -m "$MODEL" "${ARGS[@]}" -r 1 >"$out/peer.$i.json"
done
"$PEER" - "$out" "$PAIRS" <<'PY'
import json, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
load = lambda e, i: json.load(open(f"{d}/{e}.{i}.json"))
runs = [(load("ours", i), load("peer", i)) for i in range(1, pairs + 1)]
ours0, peer0 = runs[0]
print(f"{ours0['model']} on {ours0['cpu']}, {pairs} alternating pairs")
print("| test | threads | ours tok/s | llama.cpp tok/s | ratio (median of pairs) | ratio range |")
print("|---|---|---|---|---|---|")
for k, r in enumerate(ours0["results"]):
    o = [a["results"][k]["median"] for a, _ in runs]
    p = [b["results"][k]["median"] for _, b in runs]
    ratios = [x / y for x, y in zip(o, p)]
    print(f"| {r['test']} | {r['threads']} | {statistics.median(o):.1f} | {statistics.median(p):.1f}"
          f" | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} |")
anon = lambda rs: max(x["rss_anon_peak_kb"] for x in rs) // 1024
file_ = lambda rs: max(x["rss_file_peak_kb"] for x in rs) // 1024
print(f"peak RssAnon / RssFile MiB: ours {anon([a for a, _ in runs])} / {file_([a for a, _ in runs])},"
      f" llama.cpp {anon([b for _, b in runs])} / {file_([b for _, b in runs])} (with its Python host)")
PY
