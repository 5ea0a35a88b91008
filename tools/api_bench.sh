#!/usr/bin/env bash
# The Rust client library (mortarmq::client) against mortar-bench's raw frames (issue 16).
#
# usage: tools/api_bench.sh [ROUNDS]     (default 5)
#
# Builds release, starts one mortard on a free loopback port with a temporary data
# directory, and runs each workload ROUNDS times, alternating the raw loop and --api
# run by run so that both see the same machine. The machine is shared: read the
# ratios, not the absolute figures. Per workload it prints one line
#   NAME raw=X api=Y ratio=R round_ratios=P25/P50/P75 raw_cpu_us=A api_cpu_us=B rounds=V/N
# X and Y in msgs/s over all V rounds (every message of a side over all its seconds,
# which weighs out the other tenants' bursts better than any single round), R = Y/X,
# then the quartiles of the per-round ratios, and the client's CPU (user + system) per
# message in microseconds; V counts the rounds of N in which neither run had an error
# (a raw run counts BACKPRESSURE refusals as done, quickly; the library backs off and
# resends them, which is no comparison). One partition:
#   pub_written_idem  128-byte values, publish --durability written --pipeline 64, raw
#                     --idempotent (producer_id + producer_seq, as the library sends)
#                     vs --api; small values, so the client's cost per message shows
#                     and the disk keeps up without BACKPRESSURE
#   pub_written_plain the same without idempotence (raw default vs --api --not-idempotent)
#   pub_fsync_idem    1 KiB values, --durability fsync --pipeline 64, idempotent both
#   consume_push      1 KiB values, consume --mode push --credit 256, an ACK per message
#   consume_pull      1 KiB values, consume --mode pull --credit 256
# The raw JSON of every run goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-5}
PUB_COUNT=500000
FSYNC_COUNT=50000
CONSUME_COUNT=500000

echo "api_bench: building release" >&2
cargo build --release --quiet --bin mortard --bin mortar-bench
BENCH=target/release/mortar-bench

WORK=$(mktemp -d /tmp/mortar-api-bench.XXXXXX)
MORTAR_PID=""
cleanup() {
  [ -z "$MORTAR_PID" ] || kill "$MORTAR_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Retention keeps the data directory small over many publish runs.
RUST_LOG=warn target/release/mortard --listen 127.0.0.1:0 --admin-listen off \
  --data-dir "$WORK/data" --retention-size 1GiB \
  >"$WORK/mortard.out" 2>"$WORK/mortard.err" &
MORTAR_PID=$!
for _ in $(seq 100); do grep -q '^listening ' "$WORK/mortard.out" && break; sleep 0.1; done
MORTAR=$(awk '/^listening /{print $2; exit}' "$WORK/mortard.out")
[ -n "$MORTAR" ] || { echo "api_bench: mortard did not start" >&2; cat "$WORK/mortard.err"; exit 1; }
echo "api_bench: mortard $MORTAR (pid $MORTAR_PID), $ROUNDS rounds" >&2

# run ARGS...: one mortar-bench run; prints "messages seconds client_cpu_seconds errors".
run() {
  local out
  out=$("$BENCH" --broker "$MORTAR" --json "$@")
  echo "$* $out" >&2
  python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print(d.get("ops", d.get("msgs")), d["seconds"], d["tool_cpu_pct"] / 100 * d["seconds"],
      d["errors"])' "$out"
}

# pair NAME RAW_ARGS -- API_ARGS: ROUNDS alternating runs, then the summary line.
pair() {
  local name=$1 raw=() api=() side=raw
  shift
  for a in "$@"; do
    if [ "$a" = "--" ]; then side=api; continue; fi
    if [ $side = raw ]; then raw+=("$a"); else api+=("$a"); fi
  done
  local results=()
  for _ in $(seq "$ROUNDS"); do
    results+=("$(run "${raw[@]}") $(run "${api[@]}")")
  done
  python3 -c '
import statistics as st, sys
name, runs = sys.argv[1], [list(map(float, r.split())) for r in sys.argv[2:]]
# each run: messages seconds cpu_seconds errors; raw first, then api
rows = [r for r in runs if r[3] == 0 and r[7] == 0]
if not rows:
    sys.exit("%s: every round had errors" % name)
total = lambda i: sum(r[i] for r in rows)
raw, api = total(0) / total(1), total(4) / total(5)
q = st.quantiles([(r[4] / r[5]) / (r[0] / r[1]) for r in rows], n=4) if len(rows) > 1 else [0] * 3
print("%s raw=%.0f api=%.0f ratio=%.3f round_ratios=%.2f/%.2f/%.2f raw_cpu_us=%.2f "
      "api_cpu_us=%.2f rounds=%d/%d"
      % (name, raw, api, api / raw, q[0], q[1], q[2], total(2) / total(0) * 1e6,
         total(6) / total(4) * 1e6, len(rows), len(runs)))' "$name" "${results[@]}"
}

PUB=(publish --topic pub --pipeline 64 --durability written --count $PUB_COUNT --value-size 128)
pair pub_written_idem "${PUB[@]}" --idempotent -- "${PUB[@]}" --api
pair pub_written_plain "${PUB[@]}" -- "${PUB[@]}" --api --not-idempotent
FSYNC=(publish --topic fsync --pipeline 64 --durability fsync --count $FSYNC_COUNT)
pair pub_fsync_idem "${FSYNC[@]}" --idempotent -- "${FSYNC[@]}" --api
# Filled through the library, which backs off on BACKPRESSURE where the raw prefill
# gives up; every consume run then reads the same records in a group of its own.
"$BENCH" --broker "$MORTAR" publish --api --topic consume --durability written \
  --count $CONSUME_COUNT --pipeline 256 >/dev/null
CONSUME=(consume --topic consume --credit 256 --count $CONSUME_COUNT)
pair consume_push "${CONSUME[@]}" --mode push -- "${CONSUME[@]}" --mode push --api
pair consume_pull "${CONSUME[@]}" --mode pull -- "${CONSUME[@]}" --mode pull --api
