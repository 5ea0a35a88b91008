#!/usr/bin/env bash
# What a published record costs the broker, on 1 and on 64 partitions, for two or more
# mortard binaries alternated round by round (docs/BENCHMARKS.md, "Index entries written
# once a page"): CPU ticks (user + system, 1/100 s) of the broker per 1,000 records, read
# from /proc around a `mortar-bench publish` run (FSYNC, 16 connections x 16 in flight,
# 1 KiB values: the publish of tools/compare.sh), and where perf can count them its
# pwrite64 and fdatasync calls per 1,000 records. On a shared 2-core host the rate is
# noise; the cost per record much less so.
#
#   bash tools/publish_cost.sh ROUNDS [COUNT] -- MORTARD...
#
# Each run starts a fresh broker with a temporary data directory and publishes COUNT
# (300,000) records to a topic of 1 partition, then COUNT to a topic of 64.
set -euo pipefail
NAME=publish_cost
# shellcheck source=cost_common.sh
source "$(dirname "$0")/cost_common.sh"
cost_args "$@"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

EVENTS=syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync
PERF=0
perf stat -e "$EVENTS" -- true >/dev/null 2>&1 && PERF=1

# measure PID ADDR PARTITIONS: one publish run; prints "msgs/s ticks/1k [syscalls/1k]".
measure() {
  local t0 t1 js counts perf_pid='' out
  out=$(mktemp)
  t0=$(ticks "$1")
  if [ "$PERF" = 1 ]; then
    perf stat -x, -e "$EVENTS" -p "$1" -o "$out" &
    perf_pid=$!
  fi
  js=$("$BENCH" --broker "$2" --json publish --connections 16 --pipeline 16 \
    --durability fsync --value-size 1024 --count "$COUNT" --topic "p$3" --partitions "$3")
  t1=$(ticks "$1")
  if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; fi
  counts=$(awk -F, '/pwrite64/ {w=$1} /fdatasync/ {s=$1} END {print w + 0, s + 0}' "$out")
  rm -f "$out"
  python3 -c 'import json, sys
r = json.loads(sys.argv[1])
if r.get("errors"): sys.exit("publish_cost: %s errors" % r["errors"])
k = r["ops"] / 1000
w, s = (int(v) for v in sys.argv[3].split())
calls = " %5.1f pwrite64 %4.1f fdatasync/1k" % (w / k, s / k) if w > 0 else ""
print("%7d msgs/s %.3f ticks/1k%s" % (r["ops_per_sec"], int(sys.argv[2]) / k, calls))' \
    "$js" $((t1 - t0)) "$counts"
}

# run_one MORTARD: one broker; prints the 1- and 64-partition figures.
run_one() {
  local one many
  start_broker "$1"
  one=$(measure "$BROKER_PID" "$BROKER_ADDR" 1)
  many=$(measure "$BROKER_PID" "$BROKER_ADDR" 64)
  echo "p1 $one | p64 $many  load $(cut -d' ' -f1 /proc/loadavg)"
  stop_broker
}

cost_rounds run_one
