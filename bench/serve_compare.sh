#!/usr/bin/env bash
# Serving side by side: llm-server and llama-server (built from the llama.cpp that
# llama-cpp-python 0.3.36 vendors; see testdata/README.md), one after the other on this machine,
# same model, 2 threads. Phase "chat": 2 slots, 8192 tokens in all (llama-server divides -c
# among its slots, so ours gets 4096 per slot), a 10-turn conversation (bench/serve_bench.py).
# Phase "streams": 4 slots of 2048, aggregate tok/s of 1, 2 and 4 concurrent streams, with our
# default prompt-lookup drafting and again with it off (one token per pass, as llama-server
# decodes: what batching the streams alone gives).
#   LLAMA_SERVER=path/to/llama-server MODEL=x.gguf bench/serve_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_SERVER=${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
PORT=${PORT:-8391}
cargo build --release -q -p llm-server --bin llm-server

wait_up() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server did not come up" >&2
  return 1
}

run() { # name phase command...  (phase: chat, streams or streams-plain)
  local name=$1 phase=$2 args=()
  shift 2
  [ "$phase" = streams-plain ] && args=(streams --no-speculative) || args=("$phase")
  "$@" >"/tmp/serve_compare.$name.log" 2>&1 &
  local pid=$!
  wait_up
  echo "== $name, $phase"
  python3 bench/serve_bench.py "${args[0]}" "http://127.0.0.1:$PORT" "${args[@]:1}" | tail -n +1 >"/tmp/serve_compare.$name.$phase.out"
  grep -v '^{' "/tmp/serve_compare.$name.$phase.out"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

for phase in chat streams streams-plain; do
  if [ "$phase" = chat ]; then slots=2; else slots=4; fi
  run ours "$phase" ./target/release/llm-server serve -m "$MODEL" -t 2 -p "$slots" \
    -c $((8192 / slots)) --port "$PORT" --host 127.0.0.1 --default-max-tokens 512
  run llama-server "$phase" "$LLAMA_SERVER" -m "$MODEL" -t 2 -np "$slots" -c 8192 \
    --port "$PORT" --host 127.0.0.1
done
