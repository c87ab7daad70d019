#!/usr/bin/env bash
# Instructions per decoded token of `llm-server bench` under callgrind: the loop metric for kernel
# work on a shared machine, where wall-clock figures are noise. Runs `bench -p 1 -n N1` and
# `-n N2` (1 thread) and prints (Ir(N2) - Ir(N1)) / (N2 - N1), so loading, the prompt and the
# warm-up cancel out. Needs valgrind.
#
#   bench/ir_per_token.sh MODEL.gguf [N1=4] [N2=12]    (BIN=path/to/llm-server to override)
set -euo pipefail
BIN=${BIN:-target/release/llm-server}
M=${1:?usage: bench/ir_per_token.sh MODEL.gguf [N1] [N2]}
N1=${2:-4}
N2=${3:-12}
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
[ -x "$BIN" ] || { echo "$BIN not found: cargo build --release -p llm-server, or set BIN" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ir() {
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$BIN" bench -m "$M" -p 1 -n "$1" -r 1 -t 1 \
        >/dev/null 2>"$tmp/err.$1" || { cat "$tmp/err.$1" >&2; exit 1; }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/err.$1"
}
a=$(ir "$N1")
b=$(ir "$N2")
echo "$(basename "$M"): $(((b - a) / (N2 - N1))) Ir per decoded token"
