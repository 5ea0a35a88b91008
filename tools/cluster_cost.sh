#!/usr/bin/env bash
# What a REPLICATED record costs a 3-node loopback cluster, for two or more mortard
# binaries alternated round by round (docs/BENCHMARKS.md): CPU ticks (user + system,
# 1/100 s), minor page faults and (where perf can count them) fdatasync calls per 1,000 records, on the leader and on all three nodes,
# read from /proc around a `mortar-bench publish` run (16 connections x 16 in flight,
# 1 KiB, 5 s). On a shared 2-core host the rate is noise; the cost per record is not.
#
#   bash tools/cluster_cost.sh ROUNDS MORTARD...
#
# Each run starts a fresh cluster of the given binary with temporary data directories.
set -euo pipefail
ROUNDS=${1:?usage: cluster_cost.sh ROUNDS MORTARD...}
shift
[ $# -ge 1 ] || { echo "cluster_cost: name at least one mortard binary" >&2; exit 2; }
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin mortar-bench --bin mortarctl
BIN=target/release
# shellcheck source=cluster_common.sh
source tools/cluster_common.sh

# ticks PID... / faults PID...: summed over the processes.
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
faults() { local f=0 p; for p in "$@"; do f=$((f + $(awk '{print $10}' "/proc/$p/stat"))); done; echo $f; }

# run_one MORTARD: one cluster, one bench run; prints its figures.
run_one() {
  local bin=$1 work peers id i leader= lpid= pids=() nodes=()
  work=$(mktemp -d)
  peers=$(loopback_peers)
  for id in 1 2 3; do
    mkdir -p "$work/n$id"
    "$bin" --data-dir "$work/n$id/data" --admin-listen off --listen "127.0.0.1:$(free_port)" \
      --node-id "$id" --peers "$peers" >"$work/n$id/out" 2>"$work/n$id/log" &
    pids+=($!)
  done
  for id in 1 2 3; do
    for _ in $(seq 200); do grep -qs '^listening ' "$work/n$id/out" && break; sleep 0.05; done
    nodes+=("$(sed -n 's/^listening //p' "$work/n$id/out")")
  done
  for _ in $(seq 200); do
    i=$(first_to_declare bench "${nodes[@]}")
    if [ -n "$i" ]; then leader=${nodes[$((i - 1))]}; lpid=${pids[$((i - 1))]}; break; fi
    sleep 0.1
  done
  [ -n "$leader" ] || { echo "cluster_cost: no leader" >&2; exit 1; }
  local lt0 lf0 at0 af0
  lt0=$(ticks "$lpid"); lf0=$(faults "$lpid"); at0=$(ticks "${pids[@]}"); af0=$(faults "${pids[@]}")
  # fdatasync calls of all three nodes during the run, where perf can count them.
  local syncs=-1
  if perf stat -x, -e syscalls:sys_enter_fdatasync -p "$(IFS=,; echo "${pids[*]}")" \
    -o "$work/syncs" -- sleep 0.01 >/dev/null 2>&1; then
    perf stat -x, -e syscalls:sys_enter_fdatasync -p "$(IFS=,; echo "${pids[*]}")" \
      -o "$work/syncs" -- sleep 5 >/dev/null 2>&1 &
  fi
  local perf_pid=$!
  "$BIN/mortar-bench" --broker "$leader" --json publish --connections 16 --pipeline 16 \
    --value-size 1024 --duration 5s --durability replicated --topic bench >"$work/bench.json"
  wait "$perf_pid" 2>/dev/null || true
  [ -s "$work/syncs" ] && syncs=$(awk -F, '/fdatasync/ {print $1}' "$work/syncs")
  python3 - "$work/bench.json" "$syncs" $(($(ticks "$lpid") - lt0)) $(($(faults "$lpid") - lf0)) \
    $(($(ticks "${pids[@]}") - at0)) $(($(faults "${pids[@]}") - af0)) <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("errors"):
    sys.exit("cluster_cost: %s errors" % r["errors"])
k = r["ops"] / 1000
syncs = int(sys.argv[2])
lt, lf, at, af = (int(v) for v in sys.argv[3:])
synced = "  all %.1f fdatasyncs" % (syncs / k) if syncs >= 0 else ""
print("%6d msgs/s  leader %.2f ticks %5.1f faults  all %.2f ticks %5.1f faults%s /1k"
      % (r["ops_per_sec"], lt / k, lf / k, at / k, af / k, synced))
EOF
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}

for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    echo "round $round $bin: $(run_one "$bin")"
  done
done
