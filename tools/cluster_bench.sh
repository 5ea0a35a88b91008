#!/usr/bin/env bash
# REPLICATED publish on a 3-node loopback cluster against FSYNC on one node, alternated in
# one run (issue 15, docs/BENCHMARKS.md): the ratio is the figure, absolute rates on a
# shared 2-core host are noise.
#
#   bash tools/cluster_bench.sh [ROUNDS (2)] [DURATION (5s)]
#
# Builds release binaries, starts one single node and a 3-node cluster on free loopback
# ports with temporary data directories, finds the leader (the node whose probe DECLARE
# is not answered NOT_LEADER), and runs `mortar-bench publish` 16 connections x 16 in
# flight, 1 KiB, against each in turn. Prints one line per run (with the CPU the brokers
# used per record, from /proc/PID/stat) and the ratio.
set -euo pipefail
ROUNDS=${1:-2}
DURATION=${2:-5s}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin mortard --bin mortar-bench --bin mortarctl
BIN=target/release
# shellcheck source=cluster_common.sh
source tools/cluster_common.sh
WORK=$(mktemp -d)
cleanup() {
  # `start` runs in a command substitution, a subshell: each pid is in a file.
  for f in "$WORK"/*/pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT


# start NAME ARGS...: runs mortard in $WORK/NAME, echoes its client address.
start() {
  local name=$1
  shift
  mkdir -p "$WORK/$name"
  "$BIN/mortard" --data-dir "$WORK/$name/data" --admin-listen off "$@" \
    >"$WORK/$name/out" 2>"$WORK/$name/log" &
  echo $! >"$WORK/$name/pid"
  for _ in $(seq 200); do
    if grep -q '^listening ' "$WORK/$name/out"; then
      sed -n 's/^listening //p' "$WORK/$name/out"
      return
    fi
    sleep 0.05
  done
  echo "cluster_bench: $name did not start" >&2
  cat "$WORK/$name/log" >&2
  exit 1
}

SINGLE=$(start single --listen 127.0.0.1:0)
PEERS=$(loopback_peers)
NODES=()
for id in 1 2 3; do
  NODES+=("$(start "node$id" --listen "127.0.0.1:$(free_port)" --node-id "$id" --peers "$PEERS")")
done

# The leader: the node that creates the topic (followers answer NOT_LEADER).
LEADER=
for _ in $(seq 200); do
  i=$(first_to_declare bench "${NODES[@]}")
  if [ -n "$i" ]; then
    LEADER=${NODES[$((i - 1))]}
    break
  fi
  sleep 0.1
done
[ -n "$LEADER" ] || { echo "cluster_bench: no leader" >&2; exit 1; }
"$BIN/mortarctl" --broker "$SINGLE" topics create bench --partitions 1 >/dev/null

# ticks PID...: CPU (user + system, 1/100 s) the processes used so far, summed.
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

rate() { # ADDR DURABILITY PID... -> "msgs/s µs-of-broker-CPU-per-record"
  local addr=$1 durability=$2 t0
  shift 2
  t0=$(ticks "$@")
  "$BIN/mortar-bench" --broker "$addr" --json publish --connections 16 --pipeline 16 \
    --value-size 1024 --duration "$DURATION" --durability "$durability" --topic bench \
    >"$WORK/bench.json"
  python3 - "$WORK/bench.json" $(($(ticks "$@") - t0)) <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("errors"):
    sys.exit("cluster_bench: %s errors" % r["errors"])
print(round(r["ops_per_sec"]), round(int(sys.argv[2]) * 1e4 / r["ops"], 1))
EOF
}

single_sum=0
cluster_sum=0
for round in $(seq "$ROUNDS"); do
  out=$(rate "$SINGLE" fsync "$(cat "$WORK/single/pid")")
  read -r s s_cpu <<<"$out"
  # shellcheck disable=SC2046 # one pid per word
  out=$(rate "$LEADER" replicated $(cat "$WORK"/node*/pid))
  read -r c c_cpu <<<"$out"
  echo "round $round: single-node FSYNC $s msgs/s ($s_cpu µs CPU/record)," \
    "3-node REPLICATED $c msgs/s ($c_cpu µs CPU/record, three nodes)"
  single_sum=$((single_sum + s))
  cluster_sum=$((cluster_sum + c))
done
python3 -c "print('REPLICATED / FSYNC = %.2f' % ($cluster_sum / $single_sum))"
