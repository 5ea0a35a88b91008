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
NAME=consume_cost
REPEAT=${REPEAT:-3}
# shellcheck source=cost_common.sh
source "$(dirname "$0")/cost_common.sh"
cost_args "$@"

# ticks PID: user and system CPU ticks of the process; faults PID: its minor faults.
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
faults() { awk '{print $10}' "/proc/$1/stat"; }

# run_one MORTARD: one broker, one prefill, one measured consume; prints its figures.
run_one() {
  local u0 s0 u1 s1 f0
  start_broker "$1"
  local pid=$BROKER_PID addr=$BROKER_ADDR work=$BROKER_WORK
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
  stop_broker
}

cost_rounds run_one
