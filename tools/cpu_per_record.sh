#!/usr/bin/env bash
# What a record costs each server and its load generator, side by side (issue 14,
# docs/BENCHMARKS.md "Round 6"): mortard PUB WRITTEN and FSYNC against redis-server
# XADD with appendfsync everysec and always, 16 connections x 16 in flight, 1 KiB values,
# as in tools/compare.sh. Per run: msgs/s, PUBs refused (BACKPRESSURE), the server's CPU
# per record (all threads, and its main thread alone: mortard's reactor, Redis's event
# loop, with the share of the run that thread was on a core), the disk bytes it wrote per
# record (/proc/PID/io write_bytes, and wchar: what it handed to write calls, sockets
# included), and the load generator's CPU per record (/usr/bin/time).
#
#   bash tools/cpu_per_record.sh [ROUNDS (2)] [COUNT (300000)]
set -euo pipefail
NAME=cpu_per_record
rounds=${1:-2}
# shellcheck source=cost_common.sh
source "$(dirname "$0")/cost_common.sh"
cost_args "$rounds" "${2:-300000}" -- target/release/mortard
cargo build --release --quiet --bin mortard
command -v redis-server >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
}
[ -x /usr/bin/time ] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
main_ticks() { awk '{print $14 + $15}' "/proc/$1/task/$1/stat"; }
io() { awk '/^wchar/{w=$2} /^write_bytes/{b=$2} END{print w, b}' "/proc/$1/io"; }

RWORK=$(mktemp -d)
RPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$RWORK" --appendonly yes --save "" \
  >/dev/null 2>&1 &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
VALUE=$(head -c 1024 /dev/zero | tr '\0' x)

# measure LABEL SERVER_PID CMD...: runs CMD (mortar-bench --json or redis-benchmark
# --csv) and prints one line of figures.
measure() {
  local label=$1 pid=$2 t0 m0 w0 b0 e0 out t1 m1 w1 b1 e1
  shift 2
  t0=$(ticks "$pid") m0=$(main_ticks "$pid") e0=$(date +%s.%N)
  read -r w0 b0 <<<"$(io "$pid")"
  out=$(/usr/bin/time -f "CPU %U %S" "$@" 2>&1)
  e1=$(date +%s.%N)
  sleep 1 # the write-back of what the run dirtied
  t1=$(ticks "$pid") m1=$(main_ticks "$pid")
  read -r w1 b1 <<<"$(io "$pid")"
  OUT=$out python3 - "$label" "$COUNT" "$((t1 - t0))" "$((m1 - m0))" "$e0" "$e1" \
    "$((w1 - w0))" "$((b1 - b0))" <<'PY'
import json, os, re, sys
label, count = sys.argv[1], int(sys.argv[2])
ticks, main, e0, e1, wchar, wbytes = (float(a) for a in sys.argv[3:9])
out = os.environ["OUT"]
user, system = map(float, re.search(r"CPU ([\d.]+) ([\d.]+)", out).group(1, 2))
start = out.find("{")
if start >= 0:
    r = json.loads(out[start:out.rindex("}") + 1])
    rate, ok, refused = r["ops_per_sec"], r["ops"], r["errors"]
else:
    rows = [l for l in out.splitlines() if l.startswith('"XADD')]
    rate, ok, refused = float(rows[-1].split('","')[1]), count, 0
print(f"{label:22s} {rate:9.0f} msgs/s refused {refused:6d} | server {ticks * 1e4 / ok:4.2f} "
      f"µs/rec, main thread {main * 1e4 / ok:4.2f} ({main / 100 / (e1 - e0):3.0%} of the run) | "
      f"disk {wbytes / ok:5.0f} B/rec, wchar {wchar / ok:5.0f} B/rec | "
      f"load generator {(user + system) * 1e6 / count:4.2f} µs/rec")
PY
}

for round in $(seq "$ROUNDS"); do
  echo "round $round (load $(cut -d' ' -f1 /proc/loadavg))"
  start_broker target/release/mortard
  for d in written fsync; do
    measure "mortard ${d^^} 16x16" "$BROKER_PID" "$BENCH" --broker "$BROKER_ADDR" --json \
      publish --connections 16 --pipeline 16 --durability "$d" --count "$COUNT" --topic "$d"
  done
  stop_broker
  for mode in everysec always; do
    redis-cli -p "$RPORT" config set appendfsync "$mode" >/dev/null
    redis-cli -p "$RPORT" del bench >/dev/null
    measure "redis $mode 16x16" "$RPID" redis-benchmark -p "$RPORT" -c 16 -P 16 -n "$COUNT" \
      --csv XADD bench '*' f "$VALUE"
  done
done
rm -rf "$RWORK"
