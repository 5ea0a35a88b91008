#!/usr/bin/env bash
# MortarMQ against Redis 7 streams, side by side (issue 7).
#
# usage: tools/compare.sh [--quick]
#
# Builds MortarMQ in release, starts a mortard and a redis-server on free loopback ports
# with temporary data directories, runs the same workloads against both and prints one
# table (each figure for both and mortar/redis), then one summary line per figure:
#   NAME mortar=X redis=Y ratio=R
# Pairs: PUB FSYNC vs appendfsync always, PUB WRITTEN vs appendfsync everysec, 1 KiB
# values, connections x pipeline 1x1, 1x16, 16x16; push consume with ACK (credit 256)
# vs XREADGROUP COUNT 256 + XACK; footprint (idle RSS, RSS per idle connection, peak RSS
# during 16x16, stripped binary). Mortar-only figures: 16x32 FSYNC publish, PULL
# consume, end-to-end latency at 20k msgs/s (broker and load generator pinned to a core
# each). --quick keeps the run under 2 minutes;
# the full run takes about 3 here. Servers are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
# q QUICK FULL: the value for this mode.
q() { if [ "$QUICK" = 1 ]; then echo "$1"; else echo "$2"; fi; }

IDLE_CONNS=5000
# Preconditions, checked and reported rather than assumed: descriptors for the idle
# phase (both servers and the client tool share this limit) and the tools it runs.
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
if [ "$NOFILE" -lt $((IDLE_CONNS + 200)) ]; then
  IDLE_CONNS=$((NOFILE - 200))
  echo "compare: ulimit -n is $NOFILE (hard $(ulimit -Hn)): idle phase uses $IDLE_CONNS" \
    "connections" >&2
fi
for tool in python3 awk timeout; do
  command -v "$tool" >/dev/null || { echo "compare: needs $tool" >&2; exit 1; }
done

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "compare: installing redis-server" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
echo "compare: building release" >&2
cargo build --release --quiet --bin mortard --bin mortar-bench
BENCH=target/release/mortar-bench

WORK=$(mktemp -d /tmp/mortar-compare.XXXXXX)
MORTAR_PID="" REDIS_PID="" BG_PIDS=()
cleanup() {
  local p
  for p in "${BG_PIDS[@]}" $MORTAR_PID $REDIS_PID; do
    kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# ---- servers ------------------------------------------------------------------------

# start_mortard NAME [COMMAND PREFIX...]: a mortard on free loopback ports with the data
# directory $WORK/NAME; sets MORTAR_PID, MORTAR (client address) and ADMIN.
start_mortard() {
  local name=$1
  shift
  RUST_LOG=warn "$@" target/release/mortard --listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 --data-dir "$WORK/$name" \
    --max-connections $((IDLE_CONNS + 100)) >"$WORK/$name.out" 2>"$WORK/$name.err" &
  MORTAR_PID=$!
  for _ in $(seq 100); do grep -q '^admin ' "$WORK/$name.out" && break; sleep 0.1; done
  MORTAR=$(awk '/^listening /{print $2; exit}' "$WORK/$name.out")
  ADMIN=$(awk '/^admin /{print $2; exit}' "$WORK/$name.out")
  [ -n "$MORTAR" ] || { echo "compare: mortard did not start" >&2; cat "$WORK/$name.err"; exit 1; }
}
start_mortard mortar

RPORT=$(free_port)
mkdir -p "$WORK/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK/redis" --appendonly yes \
  --appendfsync always --save "" --maxclients $((IDLE_CONNS + 100)) \
  >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
REDIS=127.0.0.1:$RPORT
rcli() { redis-cli -p "$RPORT" "$@"; }
for _ in $(seq 100); do rcli ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "compare: mortard $MORTAR (pid $MORTAR_PID), redis $REDIS (pid $REDIS_PID)" >&2

# ---- results ------------------------------------------------------------------------

ORDER=()
declare -A M R U T
# put NAME UNIT MORTAR REDIS TARGET
put() { ORDER+=("$1"); U[$1]=$2; M[$1]=$3; R[$1]=$4; T[$1]=$5; }

# mortar_pub CONNS DEPTH DURABILITY COUNT TOPIC -> JSON
# metric NAME: one sample's value from mortard's /metrics (0 when absent).
metric() {
  python3 - "$ADMIN" "$1" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
print(next((l.split()[-1] for l in text.splitlines() if l.split(" ")[0] == sys.argv[2]), 0))
PY
}
# mortar_pub CONNS DEPTH DURABILITY COUNT TOPIC [PARTITIONS] -> the bench JSON; also records the
# run's fsyncs/s and mean records per fsync (group commit) from /metrics, as
# FSYNC_INFO[TOPIC]="fsyncs_per_sec batch".
declare -A FSYNC_INFO
mortar_pub() {
  local f0 r0 t0 out f1 r1 t1
  f0=$(metric mortar_fsyncs_total) r0=$(metric mortar_fsync_batch_records_sum)
  t0=$(date +%s.%N)
  out=$(timeout 300 "$BENCH" --broker "$MORTAR" --json publish --connections "$1" \
    --pipeline "$2" --durability "$3" --count "$4" --topic "$5" --partitions "${6:-1}")
  t1=$(date +%s.%N)
  f1=$(metric mortar_fsyncs_total) r1=$(metric mortar_fsync_batch_records_sum)
  FSYNC_INFO[$5]=$(awk -v f="$((f1 - f0))" -v r="$r1" -v r0="$r0" -v t="$t1" -v t0="$t0" \
    'BEGIN{ printf "%.0f %.1f", f/(t-t0), (f > 0 ? (r-r0)/f : 0) }')
  echo "$out"
}
# redis_pub CONNS DEPTH APPENDFSYNC COUNT [KEYS] -> "rps p50_ms p99_ms"; with KEYS,
# each XADD goes to one of that many stream keys (redis-benchmark -r).
redis_pub() {
  local keys=${5:-0} key=bench spread=()
  rcli config set appendfsync "$3" >/dev/null
  rcli del bench >/dev/null
  if [ "$keys" -gt 0 ]; then key=bench:__rand_int__ spread=(-r "$keys"); fi
  timeout 300 redis-benchmark -p "$RPORT" -c "$1" -P "$2" -n "$4" "${spread[@]}" --csv \
    XADD "$key" '*' f "$VALUE" | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
r = dict(zip(rows[0], rows[-1]))
print(r["rps"], r["p50_latency_ms"], r["p99_latency_ms"])'
}
VALUE=$(head -c 1024 /dev/zero | tr '\0' x)

# peak_start PID FILE / peak_stop: poll VmRSS every 50 ms, keep the maximum in FILE.
peak_start() {
  (
    m=0
    while kill -0 "$1" 2>/dev/null; do
      r=$(rss_kib "$1" || echo 0)
      if [ "${r:-0}" -gt "$m" ]; then m=$r; echo "$m" >"$2"; fi
      sleep 0.05
    done
  ) &
  POLLER=$!
}
peak_stop() { kill "$POLLER" 2>/dev/null || true; wait "$POLLER" 2>/dev/null || true; }

# ---- footprint: idle ----------------------------------------------------------------

sleep 1
M_IDLE=$(rss_kib "$MORTAR_PID")
R_IDLE=$(rss_kib "$REDIS_PID")
put idle_rss_kib KiB "$M_IDLE" "$R_IDLE" "<=2048"

echo "compare: $IDLE_CONNS idle connections" >&2
"$BENCH" --broker "$MORTAR" idle --connections "$IDLE_CONNS" --duration 60s \
  >"$WORK/idle.out" 2>&1 &
IDLE_PID=$!
BG_PIDS+=("$IDLE_PID")
# Wait for the tool itself: ready, or gone (then its output says why).
while kill -0 "$IDLE_PID" 2>/dev/null && ! grep -q '^ready' "$WORK/idle.out"; do sleep 0.1; done
grep -q '^ready' "$WORK/idle.out" || {
  echo "compare: idle clients failed:" >&2
  cat "$WORK/idle.out" >&2
  exit 1
}
sleep 1
M_CONN=$(( ($(rss_kib "$MORTAR_PID") - M_IDLE) * 1024 / IDLE_CONNS ))
kill "$IDLE_PID"; wait "$IDLE_PID" 2>/dev/null || true

redis-benchmark -p "$RPORT" -I -c "$IDLE_CONNS" >/dev/null 2>&1 &
IDLE_PID=$!
BG_PIDS+=("$IDLE_PID")
for _ in $(seq 300); do
  n=$(rcli info clients | awk -F: '/^connected_clients/{print $2+0}')
  [ "${n:-0}" -gt "$IDLE_CONNS" ] && break
  sleep 0.1
done
sleep 1
R_CONN=$(( ($(rss_kib "$REDIS_PID") - R_IDLE) * 1024 / IDLE_CONNS ))
kill "$IDLE_PID"; wait "$IDLE_PID" 2>/dev/null || true
put bytes_per_idle_conn B "$M_CONN" "$R_CONN" "<=600"
sleep 1

# ---- publish ------------------------------------------------------------------------

# pub_pair NAME CONNS DEPTH MORTAR_DURABILITY REDIS_APPENDFSYNC COUNT TARGET [peak]
pub_pair() {
  local name=$1 c=$2 d=$3 dur=$4 fs=$5 n=$6 target=$7 peak=${8:-} js rs
  echo "compare: $name ($n records)" >&2
  if [ -n "$peak" ]; then peak_start "$MORTAR_PID" "$WORK/peak.m"; fi
  mortar_pub "$c" "$d" "$dur" "$n" "$name" >"$WORK/pub.json"
  js=$(cat "$WORK/pub.json")
  if [ -n "$peak" ]; then peak_stop; peak_start "$REDIS_PID" "$WORK/peak.r"; fi
  rs=$(redis_pub "$c" "$d" "$fs" "$n")
  if [ -n "$peak" ]; then peak_stop; fi
  read -r rps rp50 rp99 <<<"$rs"
  put "${name}_ops" ops/s "$(jget "$js" ops_per_sec)" "$rps" "$target"
  put "${name}_p50" us "$(jget "$js" pub_ok_p50_us)" "$(awk "BEGIN{print $rp50*1000}")" ""
  put "${name}_p99" us "$(jget "$js" pub_ok_p99_us)" "$(awk "BEGIN{print $rp99*1000}")" ""
  LAST_MORTAR_OPS=$(jget "$js" ops_per_sec)
  # PUBs the broker refused (BACKPRESSURE when the disk is behind): the rate above counts
  # only the accepted ones, so a run with many refusals measured a lighter load.
  put "${name}_refused" records "$(jget "$js" errors)" n/a ""
  read -r fps batch <<<"${FSYNC_INFO[$name]}"
  put "${name}_fsyncs_per_sec" 1/s "$fps" n/a ""
  put "${name}_fsync_batch" records "$batch" n/a ""
  echo "  mortar: $js" >&2
  echo "  redis:  rps=$rps p50_ms=$rp50 p99_ms=$rp99" >&2
}

pub_pair pub_fsync_1x1 1 1 fsync always "$(q 2000 8000)" ""
pub_pair pub_fsync_1x16 1 16 fsync always "$(q 20000 100000)" ">=2x"
pub_pair pub_fsync_16x16 16 16 fsync always "$(q 150000 600000)" ">=2x" peak
M_PEAK=$(cat "$WORK/peak.m") R_PEAK=$(cat "$WORK/peak.r")
M_FSYNC_16=$LAST_MORTAR_OPS
pub_pair pub_written_1x1 1 1 written everysec "$(q 6000 30000)" ""
pub_pair pub_written_1x16 1 16 written everysec "$(q 100000 400000)" ""
pub_pair pub_written_16x16 16 16 written everysec "$(q 250000 1000000)" ">=1.5x"
# Many partitions (issue 14): MortarMQ topics of 8 and 64 partitions against Redis on as
# many stream keys (both servers with the same history here). Against MortarMQ's own
# 1-partition figure further down, on fresh brokers.
for parts in 8 64; do
  name=pub_fsync_16x16_p$parts
  echo "compare: $name" >&2
  js=$(mortar_pub 16 16 fsync "$(q 150000 600000)" "$name" "$parts")
  rs=$(redis_pub 16 16 always "$(q 150000 600000)" "$parts")
  echo "  mortar: $js" >&2
  echo "  redis:  $rs" >&2
  put "${name}_ops" ops/s "$(jget "$js" ops_per_sec)" "$(echo "$rs" | awk '{print $1}')" ">=2x"
done
# FSYNC 16x16 against everysec: the second half of that issue-7 target.
ES_16=$(redis_pub 16 16 everysec "$(q 250000 1000000)" | awk '{print $1}')
put pub_fsync_16x16_vs_everysec_ops ops/s "$M_FSYNC_16" "$ES_16" ">=1x"
put peak_rss_16x16_kib KiB "$M_PEAK" "$R_PEAK" "<=16384"

echo "compare: publish 16x32 FSYNC (issue 4)" >&2
mortar_pub 16 32 fsync "$(q 150000 600000)" pub_fsync_16x32 >"$WORK/pub.json"
js=$(cat "$WORK/pub.json")
read -r fps batch <<<"${FSYNC_INFO[pub_fsync_16x32]}"
put pub_fsync_16x32_fsync_batch records "$batch" n/a ""
put pub_fsync_16x32_ops ops/s "$(jget "$js" ops_per_sec)" n/a ""
put pub_fsync_16x32_p99 us "$(jget "$js" pub_ok_p99_us)" n/a ""

# ---- consume ------------------------------------------------------------------------

N=$(q 300000 1000000)
echo "compare: consume $N records" >&2
rcli del consume >/dev/null
# Both tools prefill the topic / stream (WRITTEN / pipelined XADD) before timing.
js=$("$BENCH" --broker "$MORTAR" --json consume --mode push --credit 256 --count "$N" \
  --topic consume)
rs=$("$BENCH" --broker "$REDIS" --json redis-consume --credit 256 --count "$N" --topic consume)
echo "  mortar: $js" >&2
echo "  redis:  $rs" >&2
put consume_push_ack_msgs msgs/s "$(jget "$js" msgs_per_sec)" "$(jget "$rs" msgs_per_sec)" ">=2x"
js=$("$BENCH" --broker "$MORTAR" --json consume --mode pull --credit 256 --count "$N" \
  --topic consume)
put consume_pull_ack_msgs msgs/s "$(jget "$js" msgs_per_sec)" n/a ""

# ---- partitions against one partition, fresh brokers ----------------------------------

# The 1-partition figure above ran first, on an empty broker; the 8- and 64-partition runs
# come after several GiB more, when the kernel's write-back of them and the broker's
# checkpoints share the disk (docs/BENCHMARKS.md, "Full run"): their ratio measured the
# order of the phases. Here each partition count gets a broker of its own, started after
# the previous one stopped and its pages were written.
stop_servers() {
  local p
  for p in "$MORTAR_PID" "$REDIS_PID"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  MORTAR_PID="" REDIS_PID=""
  sync
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# wait_idle: until the broker used no CPU for 0.5 s (a fresh data dir's first journal
# spare is zero-filled right after start).
wait_idle() {
  local t0
  for _ in $(seq 60); do
    t0=$(cpu_ticks "$MORTAR_PID"); sleep 0.5
    [ "$(cpu_ticks "$MORTAR_PID")" = "$t0" ] && break
  done
}
declare -A FRESH_OPS
for parts in 1 8 64; do
  stop_servers
  start_mortard "mortar-p$parts"
  wait_idle
  name=pub_fsync_16x16_fresh_p$parts
  echo "compare: $name, fresh broker" >&2
  js=$(mortar_pub 16 16 fsync "$(q 150000 600000)" "$name" "$parts")
  echo "  mortar: $js" >&2
  FRESH_OPS[$parts]=$(jget "$js" ops_per_sec)
done
for parts in 8 64; do
  put "pub_fsync_16x16_p${parts}_vs_p1_ops" ops/s "${FRESH_OPS[$parts]}" "${FRESH_OPS[1]}" \
    ">=0.8x (R: mortar p1, fresh brokers)"
done

# ---- end-to-end ---------------------------------------------------------------------

# The fair setting on two cores: the broker's threads on one core, the load generator's
# (publisher, answer reader, consumer) on the other, so neither queues behind the other.
PIN_BROKER=() PIN_TOOL=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  PIN_BROKER=(taskset -c 0)
  PIN_TOOL=(taskset -c 1)
else
  echo "compare: no taskset or one core: end-to-end runs unpinned" >&2
fi
# A latency figure at a steady 20k msgs/s, so on a broker of its own: the ones above have
# just taken several GiB in bursts, and their checkpoints and the kernel's writeback of them
# would be measured instead, beside Redis's AOF rewrite of the same bursts (a forked child
# on both cores). The servers stop and their pages are written first; the new broker
# starts once its first journal spare is made.
stop_servers
start_mortard mortar-e2e "${PIN_BROKER[@]}"
wait_idle
for dur in written fsync; do
  echo "compare: end-to-end 20k msgs/s $dur, fresh broker ${PIN_BROKER[*]}" >&2
  js=$("${PIN_TOOL[@]}" "$BENCH" --broker "$MORTAR" --json end-to-end --rate 20000 \
    --duration "$(q 3s 10s)" --durability "$dur" --topic "e2e_$dur")
  echo "  mortar: $js" >&2
  limit=$([ "$dur" = written ] && echo "<=1000" || echo "<=2000")
  put "e2e_${dur}_deliver_p50" us "$(jget "$js" deliver_p50_us)" n/a ""
  put "e2e_${dur}_deliver_p99" us "$(jget "$js" deliver_p99_us)" n/a "$limit"
  put "e2e_${dur}_deliver_p999" us "$(jget "$js" deliver_p999_us)" n/a ""
  put "e2e_${dur}_pub_ok_p99" us "$(jget "$js" pub_ok_p99_us)" n/a ""
done

# ---- binaries -----------------------------------------------------------------------

cp target/release/mortard "$WORK/mortard.bin" && strip "$WORK/mortard.bin"
cp "$(readlink -f "$(command -v redis-server)")" "$WORK/redis.bin" && strip "$WORK/redis.bin"
put stripped_binary_bytes B "$(stat -c %s "$WORK/mortard.bin")" \
  "$(stat -c %s "$WORK/redis.bin")" "<=2097152"

# ---- table --------------------------------------------------------------------------

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN{ if (a+0 == a && b+0 == b && b != 0) printf "%.2f", a/b;
    else print "n/a" }'
}
num() { awk -v a="$1" 'BEGIN{ if (a+0 == a) printf "%.0f", a; else print a }'; }
echo
echo "MortarMQ vs Redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')" \
  "($(q quick full) run, $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ))"
printf '%-34s %-8s %12s %12s %7s  %s\n' figure unit mortar redis ratio target
for k in "${ORDER[@]}"; do
  printf '%-34s %-8s %12s %12s %7s  %s\n' "$k" "${U[$k]}" "$(num "${M[$k]}")" \
    "$(num "${R[$k]}")" "$(ratio "${M[$k]}" "${R[$k]}")" "${T[$k]}"
done
echo
for k in "${ORDER[@]}"; do
  echo "$k mortar=$(num "${M[$k]}") redis=$(num "${R[$k]}") ratio=$(ratio "${M[$k]}" "${R[$k]}")"
done
