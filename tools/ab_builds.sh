#!/usr/bin/env bash
# Throughput of two mortard builds, alternating, a fresh broker per round (issue 14: what
# the small build costs against the default one). Per round and build: publish 16x16 1 KiB
# WRITTEN (300,000) and FSYNC (150,000), FSYNC over 64 partitions (150,000), then push
# consume with credit 256 and an ACK per message (300,000, prefilled by mortar-bench).
# Prints one line per round and build, and the ratio B / A of each figure over all rounds.
#
# usage: tools/ab_builds.sh A B [ROUNDS]
#   e.g. cargo build --release && tools/build_small.sh &&
#        tools/ab_builds.sh target/release/mortard target/small/mortard 3
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3}
BENCH=target/release/mortar-bench
[ -x "$BENCH" ] || cargo build --release --bin mortar-bench
NAME=ab_builds
# shellcheck source=cost_common.sh
source tools/cost_common.sh
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

field() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)[sys.argv[1]]))' "$1"; }

# run BINARY: prints "written fsync fsync_p64 consume" (msgs/s).
run() {
  local w f p c
  start_broker "$1"
  local addr=$BROKER_ADDR
  w=$("$BENCH" --broker "$addr" --json publish --connections 16 --pipeline 16 \
    --durability written --value-size 1024 --count 300000 --topic w | field ops_per_sec)
  f=$("$BENCH" --broker "$addr" --json publish --connections 16 --pipeline 16 \
    --durability fsync --value-size 1024 --count 150000 --topic f | field ops_per_sec)
  p=$("$BENCH" --broker "$addr" --json publish --connections 16 --pipeline 16 \
    --durability fsync --value-size 1024 --count 150000 --topic p --partitions 64 |
    field ops_per_sec)
  c=$("$BENCH" --broker "$addr" --json consume --mode push --credit 256 --count 300000 \
    --topic c | field msgs_per_sec)
  stop_broker
  echo "$w $f $p $c"
}

names=(written_16x16 fsync_16x16 fsync_16x16_p64 consume_push)
declare -a SUM_A=(0 0 0 0) SUM_B=(0 0 0 0)
line() {
  local out="round $1 $2" i
  for i in 0 1 2 3; do out+=" ${names[i]}=$(eval "echo \${$3[i]}")"; done
  echo "$out"
}
for r in $(seq "$ROUNDS"); do
  read -r -a a <<<"$(run "$A")"
  line "$r" A a
  read -r -a b <<<"$(run "$B")"
  line "$r" B b
  for i in 0 1 2 3; do
    SUM_A[i]=$((SUM_A[i] + a[i]))
    SUM_B[i]=$((SUM_B[i] + b[i]))
  done
done
for i in 0 1 2 3; do
  python3 -c 'import sys; print(f"{sys.argv[1]} B/A={int(sys.argv[3])/int(sys.argv[2]):.2f}")' \
    "${names[i]}" "${SUM_A[i]}" "${SUM_B[i]}"
done
