#!/usr/bin/env bash
# Side-by-side throughput of llm-server and llama.cpp, alternating one repetition of each so both
# see the same machine noise; prints each engine's median over the pairs and the median of the
# per-pair ratios (ours / llama.cpp), of tokens per second and of CPU time per token (user +
# system of each engine's process over the test: what a CPU quota or a burstable VM charges; below
# 1 ours spends less). For every decode test it also prints the weight bandwidth
# each engine reaches (our weight bytes per token × its tok/s: the same file, the same tensors
# read) beside the machine's read bandwidth, probed once before the pairs by
# `llm-server bench --read-bandwidth`. Needs the peer's virtualenv (see testdata/README.md).
#   PEER=~/.cache/peer/bin/python MODEL=x.gguf bench/compare.sh [PAIRS] [bench args...]
# e.g. bench/compare.sh 5 -p 128,2048 -n 128 -t 1,2   (those are the defaults)
# KERNELS=avx2 runs our x86-64-v3 kernels on a CPU that has VNNI (what Zen 1 runs).
# OUT=DIR keeps the raw results (each engine's JSON per pair, the probe, run.json) in DIR, from
# which bench/performance_page.py writes docs/performance.md's table for this CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-$HOME/.cache/peer/bin/python}
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
PAIRS=${1:-5}
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-p 128,2048 -n 128 -t 1,2)
cargo build --release -q -p llm-server --bin llm-server
if [ -n "${OUT:-}" ]; then
  out=$OUT
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# The probe runs at 1 thread and at the run's -t counts.
THREADS=1
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  case ${ARGS[i]} in
    -t | --threads) THREADS=${ARGS[i + 1]:-1} ;;
    --threads=*) THREADS=${ARGS[i]#*=} ;;
    -t?*) THREADS=${ARGS[i]#-t} ;;
  esac
done
# The model as a box reads it from disk: a file just written (quantised, downloaded) sits in the
# page cache in 4 KiB folios, which both engines' maps then cover with 4 KiB pages; read back
# from disk it comes in folios of up to 2 MiB, mapped with one entry each. Dropping the cached
# copy once (clean pages: nothing is lost) makes the next read fill it the way the appliance's
# boot does. Measured on Zen 5, our decode is 12-20 % faster in the second state.
"$PEER" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$MODEL"
./target/release/llm-server bench -m "$MODEL" -p 0 -n 0 -t "$THREADS" --read-bandwidth --json \
  >"$out/probe.json"
for i in $(seq "$PAIRS"); do
  ./target/release/llm-server ${KERNELS:+--kernels "$KERNELS"} bench -m "$MODEL" "${ARGS[@]}" -r 1 --json >"$out/ours.$i.json"
  "$PEER" bench/peer_bench.py -m "$MODEL" "${ARGS[@]}" -r 1 >"$out/peer.$i.json"
done
# What bench/performance_page.py needs besides the results: the command, when, at which commit,
# and the CPU's identity (its class: vendor, family, model).
"$PEER" - "$out/run.json" "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- server || echo +dirty)" \
  "${KERNELS:-}" "$PAIRS" "${ARGS[@]}" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from cpu_identity import cpu_identity
path, started, finished, commit, kernels, pairs, *args = sys.argv[1:]
command = " ".join(["bench/compare.sh", pairs, *args])
if kernels:
    command = f"KERNELS={kernels} {command}"
json.dump({"command": command, "pairs": int(pairs), "started": started, "finished": finished,
           "commit": commit, **cpu_identity()}, open(path, "w"), indent=1)
PY
"$PEER" - "$out" "$PAIRS" <<'PY'
import json, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
load = lambda e, i: json.load(open(f"{d}/{e}.{i}.json"))
runs = [(load("ours", i), load("peer", i)) for i in range(1, pairs + 1)]
probe = json.load(open(f"{d}/probe.json"))["read_bandwidth"]
ours0, peer0 = runs[0]
bpt = ours0["weight_bytes_per_token"]
print(f"{ours0['model']} on {ours0['cpu']} (our kernels: {ours0['kernels']}), {pairs} alternating pairs;"
      f" weights read per token {bpt / 1e6:.1f} MB")
# The probe's best GB/s per (source, threads); decode is compared with the model file's.
best = {(b["source"], b["threads"]): b["best_gb_per_s"] for b in probe}
for t in sorted({b["threads"] for b in probe}):
    print(f"read bandwidth, {t} thread{'s' if t > 1 else ''}: anonymous memory"
          f" {best[('anonymous', t)]:.1f} GB/s, model file's pages {best[('model_file', t)]:.1f} GB/s"
          " (best of 5)")
print("| test | threads | ours tok/s | llama.cpp tok/s | ratio (median of pairs) | ratio range"
      " | ours CPU ms/token | llama.cpp CPU ms/token | CPU ratio (median, range)"
      " | ours GB/s | llama.cpp GB/s | of read bandwidth (ours, llama.cpp) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
key = lambda r: (r["test"], r["threads"])
by_key = lambda doc: {key(r): r for r in doc["results"]}
runs_by = [(by_key(a), by_key(b)) for a, b in runs]
for r in ours0["results"]:
    k = key(r)
    if k not in runs_by[0][1]:
        continue  # a test the peer does not run (tgNxS)
    o = statistics.median(a[k]["median"] for a, _ in runs_by)
    p = statistics.median(b[k]["median"] for _, b in runs_by)
    ratios = [a[k]["median"] / b[k]["median"] for a, b in runs_by]
    cpu = "| - | - | - "
    if "cpu_ms_per_token" in r and "cpu_ms_per_token" in runs_by[0][1][k]:
        co = statistics.median(a[k]["cpu_ms_per_token"] for a, _ in runs_by)
        cp = statistics.median(b[k]["cpu_ms_per_token"] for _, b in runs_by)
        cr = [a[k]["cpu_ms_per_token"] / b[k]["cpu_ms_per_token"] for a, b in runs_by]
        cpu = (f"| {co:.2f} | {cp:.2f} | {statistics.median(cr):.2f}x"
               f" ({min(cr):.2f}-{max(cr):.2f}) ")
    bw = "| - | - | - |"
    if r["test"].startswith("tg"):
        go, gp = bpt * o / 1e9, bpt * p / 1e9
        ceiling = best.get(("model_file", r["threads"]))
        share = f"{go / ceiling:.0%}, {gp / ceiling:.0%}" if ceiling else "-"
        bw = f"| {go:.2f} | {gp:.2f} | {share} |"
    print(f"| {r['test']} | {r['threads']} | {o:.1f} | {p:.1f}"
          f" | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} {cpu}{bw}")
anon = lambda rs: max(x["rss_anon_peak_kb"] for x in rs) // 1024
file_ = lambda rs: max(x["rss_file_peak_kb"] for x in rs) // 1024
print(f"peak RssAnon / RssFile MiB: ours {anon([a for a, _ in runs])} / {file_([a for a, _ in runs])},"
      f" llama.cpp {anon([b for _, b in runs])} / {file_([b for _, b in runs])} (with its Python host);"
      f" our weights mapped in 2 MiB pages: {ours0.get('file_pmd_mapped_kb', 0) // 1024} MiB")
PY
