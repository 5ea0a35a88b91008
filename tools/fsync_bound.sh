#!/usr/bin/env bash
# FSYNC 1x16 against Redis `appendfsync always`, and how much of mortard's round its
# fdatasync alone takes (issue 14, docs/BENCHMARKS.md "Round 5"): with one connection and
# 16 PUBs in flight both servers make one fdatasync per 16 records, so Redis's round
# divided by mortard's fdatasync bounds the ratio a faster mortard could reach.
# Per round: a fresh mortard (admin on, for its /stats fdatasync mean) and then a fresh
# redis-server, each on a temporary directory, 100,000 records of 1 KiB.
#
# usage: tools/fsync_bound.sh [ROUNDS]   (default 3; needs redis-server and curl)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
cargo build --release --quiet --bin mortard --bin mortar-bench
NAME=fsync_bound PIDS=()
# shellcheck source=cost_common.sh
source tools/cost_common.sh
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
VALUE=$(head -c 1024 /dev/zero | tr '\0' x)
for round in $(seq "$ROUNDS"); do
  BROKER_ADMIN=on start_broker target/release/mortard
  sleep 1 # the first journal spare is made
  bench=$(target/release/mortar-bench --broker "$BROKER_ADDR" --json publish --connections 1 \
    --pipeline 16 --durability fsync --count 100000)
  stats=$(curl -s "${BROKER_ADMIN_ADDR%/}/stats")
  stop_broker
  work=$(mktemp -d)
  port=$(free_port)
  mkdir -p "$work/redis"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --appendonly yes \
    --appendfsync always --save "" >/dev/null 2>&1 &
  rpid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  rps=$(redis-benchmark -p "$port" -c 1 -P 16 -n 100000 --csv XADD bench '*' f "$VALUE" \
    | tail -1 | cut -d, -f2 | tr -d '"')
  kill "$rpid"
  wait "$rpid" 2>/dev/null || true
  rm -rf "$work"
  python3 - "$round" "$bench" "$stats" "$rps" <<'PY'
import json, sys
round_, bench, stats, rps = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
ops, sync_us = bench["ops_per_sec"], stats["fsync"]["mean_ms"] * 1000
ours, theirs = 16 / ops * 1e6, 16 / rps * 1e6
print(f"round {round_}: mortard {ops:.0f} msgs/s, round {ours:.0f} us, fdatasync mean "
      f"{sync_us:.0f} us; redis always {rps:.0f} msgs/s, round {theirs:.0f} us; "
      f"redis round / mortard fdatasync = {theirs / sync_us:.2f}")
PY
done
