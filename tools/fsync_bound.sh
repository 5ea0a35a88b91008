#!/usr/bin/env bash
# FSYNC publish against Redis `appendfsync always`, and what bounds it (issue 14,
# docs/BENCHMARKS.md "Round 5" and "Round 8"). With one connection and 16 PUBs in flight
# both servers make one fdatasync per 16 records, so Redis's round divided by mortard's
# fdatasync bounds the ratio a faster mortard could reach. With more connections the
# script also prints what the disk is asked for: mortard's fdatasyncs per second, records
# per fdatasync, the time its fdatasyncs ran (the sum of their latencies per second of
# run: above 1, two overlapped), and for both servers the bytes the block device wrote per
# record (from /sys/class/block/DEV/stat around the run; n/a where the temporary
# directory is on no block device).
# Per round: a fresh mortard (admin on, for its /stats fdatasync figures) and then a fresh
# redis-server, each on a temporary directory, COUNT records of 1 KiB.
#
# usage: tools/fsync_bound.sh [ROUNDS [CONNECTIONS [COUNT]]]
#   (defaults 3, 1, and 100,000 per connection up to 600,000; needs redis-server and curl)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
CONNS=${2:-1}
COUNT=${3:-$((CONNS * 100000 < 600000 ? CONNS * 100000 : 600000))}
PIPELINE=16
cargo build --release --quiet --bin mortard --bin mortar-bench
NAME=fsync_bound PIDS=()
# shellcheck source=cost_common.sh
source tools/cost_common.sh
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# The stat file of the block device under the temporary directories, if there is one.
DEV_STAT=/sys/class/block/$(basename "$(df --output=source "${TMPBASE:-/tmp}" | tail -1)")/stat
# sectors_written: field 7 of the device's stat (512-byte sectors), or nothing.
sectors_written() { if [ -r "$DEV_STAT" ]; then awk '{print $7}' "$DEV_STAT"; fi; }
VALUE=$(head -c 1024 /dev/zero | tr '\0' x)
for round in $(seq "$ROUNDS"); do
  BROKER_ADMIN=on start_broker target/release/mortard
  sleep 1 # the first journal spare is made
  sync
  before=$(curl -s "${BROKER_ADMIN_ADDR%/}/stats")
  s0=$(sectors_written)
  bench=$(target/release/mortar-bench --broker "$BROKER_ADDR" --json publish \
    --connections "$CONNS" --pipeline "$PIPELINE" --durability fsync --count "$COUNT")
  s1=$(sectors_written)
  after=$(curl -s "${BROKER_ADMIN_ADDR%/}/stats")
  stop_broker
  work=$(mktemp -d ${TMPBASE:+-p "$TMPBASE"})
  port=$(free_port)
  mkdir -p "$work/redis"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$work/redis" --appendonly yes \
    --appendfsync always --save "" >/dev/null 2>&1 &
  rpid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  sync
  r0=$(sectors_written)
  rps=$(redis-benchmark -p "$port" -c "$CONNS" -P "$PIPELINE" -n "$COUNT" --csv XADD bench '*' \
    f "$VALUE" | tail -1 | cut -d, -f2 | tr -d '"')
  r1=$(sectors_written)
  kill "$rpid"
  wait "$rpid" 2>/dev/null || true
  rm -rf "$work"
  python3 - "$round" "$CONNS" "$COUNT" "$bench" "$before" "$after" "$rps" \
    "${s0:-0} ${s1:-0} ${r0:-0} ${r1:-0}" <<'PY'
import json, sys
round_, conns, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bench, before, after = (json.loads(a) for a in sys.argv[4:7])
rps = float(sys.argv[7])
s0, s1, r0, r1 = (int(v) for v in sys.argv[8].split())
ops = bench["ops_per_sec"]
f0, f1 = before["fsync"], after["fsync"]
syncs = f1["count"] - f0["count"]
sync_s = (f1["mean_ms"] * f1["count"] - f0["mean_ms"] * f0["count"]) / 1000
sync_us = sync_s / syncs * 1e6
run_s = bench["ops"] / ops
def device(a, b):
    return f"{(b - a) * 512 / count:.0f} B" if b > a else "n/a"
if conns == 1:
    ours, theirs = 16 / ops * 1e6, 16 / rps * 1e6
    print(f"round {round_}: mortard {ops:.0f} msgs/s, round {ours:.0f} us, fdatasync mean "
          f"{sync_us:.0f} us; redis always {rps:.0f} msgs/s, round {theirs:.0f} us; "
          f"redis round / mortard fdatasync = {theirs / sync_us:.2f}")
else:
    print(f"round {round_}: mortard {ops:.0f} msgs/s, {syncs / run_s:.0f} fdatasyncs/s of "
          f"{bench['ops'] / syncs:.0f} records, mean {sync_us:.0f} us, fdatasync time "
          f"{sync_s / run_s:.2f} s/s, device {device(s0, s1)}/record; redis always "
          f"{rps:.0f} msgs/s, device {device(r0, r1)}/record; ratio {ops / rps:.2f}")
PY
done
