#!/usr/bin/env bash
# Side-by-side throughput of llm-server and llama.cpp on the default model, alternating runs so
# both see the same machine noise. Needs the peer venv (see testdata/README.md):
#   PEER=~/.cache/peer/bin/python bench/compare.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-$HOME/.cache/peer/bin/python}
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
ROUNDS=${1:-3}
cargo build --release -q -p llm-server --example decode_bench
for threads in 1 2; do
  for _ in $(seq "$ROUNDS"); do
    ./target/release/examples/decode_bench "$MODEL" "$threads"
    "$PEER" bench/peer_bench.py "$MODEL" "$threads"
  done
done
