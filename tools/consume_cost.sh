#!/usr/bin/env bash
# What a consumed-and-acked record costs the broker, for two or more mortard binaries
# alternated round by round (docs/BENCHMARKS.md, "Consume: CPU per message"): CPU ticks
# (user + system, 1/100 s) and minor page faults of the broker per 1,000 messages, read
# from /proc around a `mortar-bench consume` run (push, credit 256, an ACK per message,
# 1 KiB values: the consume of tools/ab_builds.sh and tools/compare.sh). On a shared
# 2-core host the rate is noise; the cost per message much less so.
#
#   bash tools/consume_cost.sh ROUNDS [COUNT] -- MORTARD...
#
# Each run starts a fresh broker with a temporary data directory, prefills COUNT
# (300,000) records and consumes them once unmeasured, then measures REPEAT (3, env)
# more consumes of all of them (mortar-bench subscribes a new group each time, from the
# earliest record): 900,000 messages, about 80 ticks, per figure.
set -euo pipefail
ROUNDS=${1:?usage: consume_cost.sh ROUNDS [COUNT] -- MORTARD...}
shift
COUNT=300000
REPEAT=${REPEAT:-3}
if [ "${1:-}" != "--" ]; then COUNT=${1:?}; shift; fi
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { echo "consume_cost: name at least one mortard binary" >&2; exit 2; }
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin mortar-bench
BENCH=target/release/mortar-bench
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

# ticks PID: user and system CPU ticks of the process; faults PID: its minor faults.
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
faults() { awk '{print $10}' "/proc/$1/stat"; }

# run_one MORTARD: one broker, one prefill, one measured consume; prints its figures.
run_one() {
  local bin=$1 work pid addr u0 s0 u1 s1 f0
  work=$(mktemp -d)
  RUST_LOG=warn "$bin" --listen 127.0.0.1:0 --admin-listen off --data-dir "$work/data" \
    >"$work/out" 2>/dev/null &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 100); do grep -q '^listening ' "$work/out" && break; sleep 0.1; done
  addr=$(awk '/^listening /{print $2; exit}' "$work/out")
  [ -n "$addr" ] || { echo "consume_cost: $bin did not start" >&2; exit 1; }
  # Prefill (mortar-bench waits out BACKPRESSURE) and a first, unmeasured consume.
  "$BENCH" --broker "$addr" --json consume --mode push --credit 256 --count "$COUNT" \
    --value-size 1024 --topic c >/dev/null
  read -r u0 s0 <<<"$(ticks "$pid")"; f0=$(faults "$pid")
  for i in $(seq "$REPEAT"); do
    "$BENCH" --broker "$addr" --json consume --mode push --credit 256 --count "$COUNT" \
      --value-size 1024 --topic c >"$work/bench$i.json"
  done
  read -r u1 s1 <<<"$(ticks "$pid")"
  python3 - "$work"/bench*.json -- $((u1 - u0)) $((s1 - s0)) $(($(faults "$pid") - f0)) \
    "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF'
import json, sys
cut = sys.argv.index("--")
runs = [json.load(open(f)) for f in sys.argv[1:cut]]
for r in runs:
    if r.get("errors") or r.get("prefilled"):
        sys.exit("consume_cost: %s errors, %s prefilled" % (r["errors"], r["prefilled"]))
msgs = sum(r["msgs"] for r in runs)
rate = msgs / sum(r["seconds"] for r in runs)
u, s, f = (int(v) for v in sys.argv[cut + 1:cut + 4])
k = msgs / 1000
print("%7d msgs/s  broker %.4f ticks (user %.4f sys %.4f) %5.2f faults /1k msgs"
      "  (%d ticks)  load %s" % (rate, (u + s) / k, u / k, s / k, f / k, u + s, sys.argv[cut + 4]))
EOF
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}

for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    echo "round $round $bin: $(run_one "$bin")"
  done
done
