#!/usr/bin/env bash
# Ours and llama.cpp under a CPU quota, the budget a 1/8-OCPU VM or a systemd CPUQuota= gives:
# inside a fresh cgroup granting QUOTA (cgroup v2 `cpu.max` text, written as cpu.cfs_quota_us /
# cpu.cfs_period_us where the cpu controller is on v1), each pair runs ours at FORCED threads,
# llama.cpp at FORCED, ours at its default (no -t: what `serve` picks under the quota) and
# llama.cpp at that same count, alternating. Raw results go to OUT (each run's JSON, run.json),
# from which `bench/performance_page.py --quota OUT` writes this CPU class's section under
# docs/performance.md's "Under a CPU quota". Needs root (to make the cgroup) and the peer's
# virtualenv (testdata/README.md).
#   OUT=/tmp/perf/quota bench/quota.sh [PAIRS] [bench args...]
# e.g. QUOTA="25000 100000" FORCED=2 KERNELS=avx2 bench/quota.sh 3 -p 128 -n 32   (the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-$HOME/.cache/peer/bin/python}
MODEL=${MODEL:-$(cargo xtask model 2>/dev/null)}
QUOTA=${QUOTA:-25000 100000}
FORCED=${FORCED:-2}
KERNELS=${KERNELS-avx2}
OUT=${OUT:?give OUT=DIR for the raw results}
PAIRS=${1:-3}
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-p 128 -n 32)
for a in "${ARGS[@]}"; do
  case $a in -t* | --threads*) echo "quota.sh sets the threads itself (FORCED=N and the default); drop $a" >&2; exit 2 ;; esac
done
read -r quota period <<<"$QUOTA"
[[ $quota =~ ^[0-9]+$ && $period =~ ^[0-9]+$ ]] || { echo "QUOTA must be \"QUOTA PERIOD\" in µs, e.g. \"25000 100000\"" >&2; exit 2; }
# Built outside the quota: a build inside it would take four times as long.
cargo build --release -q -p llm-server --bin llm-server
mkdir -p "$OUT"
name=llm-quota-bench-$$
if [ -e /sys/fs/cgroup/cpu/cgroup.procs ]; then
  parent=/sys/fs/cgroup/cpu
  mkdir "$parent/$name"
  echo "$period" >"$parent/$name/cpu.cfs_period_us"
  echo "$quota" >"$parent/$name/cpu.cfs_quota_us"
  file="cpu.cfs_quota_us/cpu.cfs_period_us"
else
  parent=/sys/fs/cgroup
  grep -qw cpu "$parent/cgroup.subtree_control" || echo +cpu >"$parent/cgroup.subtree_control"
  mkdir "$parent/$name"
  echo "$quota $period" >"$parent/$name/cpu.max"
  file="cpu.max"
fi
leave() {
  echo $$ >"$parent/cgroup.procs"
  rmdir "$parent/$name"
}
trap leave EXIT
"$PEER" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$MODEL"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo $$ >"$parent/$name/cgroup.procs"
ours() { ./target/release/llm-server ${KERNELS:+--kernels "$KERNELS"} bench -m "$MODEL" "${ARGS[@]}" -r 1 --json "$@"; }
for i in $(seq "$PAIRS"); do
  ours -t "$FORCED" >"$OUT/ours.forced.$i.json"
  "$PEER" bench/peer_bench.py -m "$MODEL" "${ARGS[@]}" -t "$FORCED" -r 1 >"$OUT/peer.forced.$i.json"
  ours >"$OUT/ours.default.$i.json"
  default=$("$PEER" -c 'import json, sys; print(json.load(open(sys.argv[1]))["default_threads"]["threads"])' "$OUT/ours.default.$i.json")
  "$PEER" bench/peer_bench.py -m "$MODEL" "${ARGS[@]}" -t "$default" -r 1 >"$OUT/peer.default.$i.json"
done
echo $$ >"$parent/cgroup.procs"
"$PEER" - "$OUT/run.json" "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- server || echo +dirty)" \
  "$KERNELS" "$PAIRS" "$quota" "$period" "$file" "$FORCED" "${ARGS[@]}" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from cpu_identity import cpu_identity
path, started, finished, commit, kernels, pairs, quota, period, file, forced, *args = sys.argv[1:]
command = f'QUOTA="{quota} {period}" FORCED={forced} KERNELS={kernels} bench/quota.sh {pairs} {" ".join(args)}'
json.dump({"command": command, "pairs": int(pairs), "started": started, "finished": finished,
           "commit": commit, "kernels": kernels, "quota": int(quota), "period": int(period),
           "cgroup_file": file, "forced_threads": int(forced), **cpu_identity()},
          open(path, "w"), indent=1)
PY
echo "raw results in $OUT; write the page with bench/performance_page.py --quota $OUT"
