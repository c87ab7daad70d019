#!/usr/bin/env bash
# Concurrent streams on `llm-server serve`: one server (2 threads, 4 slots) and REPS repetitions
# of bench/serve_bench.py's streams phase (aggregate tok/s of 1, 2 and 4 concurrent streams of
# 128 greedy tokens), each rep once with one token per pass (`--no-speculative`, what batching
# the streams alone gives) and once with prompt-lookup drafting (the default), alternating so both
# see the same machine noise. Raw results go to OUT (plain-K.json, spec-K.json, run.json and the
# server's log), from which `bench/performance_page.py --streams OUT` writes this CPU class's
# section under docs/performance.md's "Concurrent streams on `serve`".
#   OUT=DIR [BIN=path] [MODEL=x.gguf] [KERNELS=avx2] [PORT=N] bench/streams.sh [REPS]
# e.g. OUT=/tmp/perf/streams bench/streams.sh 3   (KERNELS=avx2 and 3 reps are the defaults;
# KERNELS= runs the best kernels the CPU has). Without BIN it builds target/release/llm-server.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?give OUT=DIR for the raw results}
REPS=${1:-3}
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "REPS must be a positive count of repetitions, e.g. bench/streams.sh 3" >&2; exit 2; }
KERNELS=${KERNELS-avx2}
THREADS=2
PARALLEL=4
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p llm-server --bin llm-server
  BIN=./target/release/llm-server
fi
[ -x "$BIN" ] || { echo "BIN=$BIN is not an executable llm-server" >&2; exit 2; }
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
[ -f "$MODEL" ] || { echo "MODEL=$MODEL is not a file: give MODEL=x.gguf (or run cargo xtask model)" >&2; exit 2; }
# A port the kernel says is free now, so two runs (or another server on 8080) do not collide.
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"
rm -f "$OUT"/plain-*.json "$OUT"/spec-*.json "$OUT/run.json"
log=$OUT/server.log

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"$BIN" serve -m "$MODEL" --threads "$THREADS" --parallel "$PARALLEL" ${KERNELS:+--kernels "$KERNELS"} \
  --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
server=$!
stop() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap stop EXIT
fail() {
  echo "$1; the end of the server's log ($log):" >&2
  tail -n 20 "$log" >&2
  exit 1
}
# Up when /health answers 200 from our process (a dead process means the answer, if any, would
# come from someone else's server on the port).
up=
for _ in $(seq 600); do
  kill -0 "$server" 2>/dev/null || fail "llm-server serve exited before it came up"
  if curl -sf "$URL/health" >/dev/null 2>&1; then
    up=1
    break
  fi
  sleep 0.5
done
[ -n "$up" ] || fail "llm-server serve did not answer $URL/health within 300 s"

streams_run() { # name args...: one serve_bench.py streams run, its JSON (the last line) in OUT/name.json
  local name=$1
  shift
  echo "== $name"
  python3 bench/serve_bench.py streams "$URL" "$@" >"$OUT/$name.out" ||
    { cat "$OUT/$name.out" >&2; fail "bench/serve_bench.py streams $* failed"; }
  grep -v '^{' "$OUT/$name.out" || true
  tail -n 1 "$OUT/$name.out" >"$OUT/$name.json"
  rm "$OUT/$name.out"
}
for k in $(seq "$REPS"); do
  streams_run "plain-$k" --no-speculative
  streams_run "spec-$k"
done
kill -0 "$server" 2>/dev/null || fail "llm-server serve died during the runs"

# The commit of the tree BIN was built in (BIN may come from another worktree).
bin_dir=$(cd "$(dirname "$BIN")" && pwd)
if root=$(git -C "$bin_dir" rev-parse --show-toplevel 2>/dev/null); then
  commit=$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- server || echo +dirty)
else
  commit="unknown (BIN is outside a git tree)"
fi
python3 - "$OUT/run.json" "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$KERNELS" \
  "$THREADS" "$PARALLEL" "$REPS" "$(basename "$MODEL")" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from cpu_identity import cpu_identity
path, started, finished, commit, kernels, threads, parallel, reps, model = sys.argv[1:]
command = f"KERNELS={kernels} bench/streams.sh {reps}"
json.dump({"command": command, "reps": int(reps), "started": started, "finished": finished,
           "commit": commit, "kernels": kernels, "threads": int(threads),
           "parallel": int(parallel), "model_file": model, **cpu_identity()},
          open(path, "w"), indent=1)
PY
echo "raw results in $OUT; write the page with bench/performance_page.py --streams $OUT"
