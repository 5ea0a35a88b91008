#!/usr/bin/env bash
# End-to-end latency at 20k msgs/s on a fresh broker per run, broker pinned to core 0 and
# mortar-bench to core 1 (what tools/compare.sh does), to compare builds or flags
# (issue 14, docs/BENCHMARKS.md "Round 5"). Prints deliver and PUB->OK percentiles.
#
# usage: tools/e2e_runs.sh DURABILITY [MORTARD [FLAG...]]
#   e.g. tools/e2e_runs.sh fsync target/release/mortard --journal-file-size 1GiB \
#          --journal-retain 1GiB
# Environment: DURATION (7s), SETTLE seconds before the run (1), TMPBASE (data dir parent).
set -euo pipefail
cd "$(dirname "$0")/.."
durability=${1:?usage: tools/e2e_runs.sh DURABILITY [MORTARD [FLAG...]]}
mortard=${2:-target/release/mortard}
shift $(($# < 2 ? $# : 2))
cargo build --release --quiet --bin mortar-bench
NAME=e2e_runs PIDS=()
# shellcheck source=cost_common.sh
source tools/cost_common.sh
trap 'stop_broker' EXIT
start_broker "$mortard" "$@"
# Every thread of the broker (they are all started by now) on core 0.
taskset -a -p -c 0 "$BROKER_PID" >/dev/null
sleep "${SETTLE:-1}"
js=$(taskset -c 1 target/release/mortar-bench --broker "$BROKER_ADDR" --json end-to-end \
  --rate 20000 --duration "${DURATION:-7s}" --durability "$durability")
python3 - "$js" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
print(" ".join(f"{k}={d[k]}" for k in ("durability", "deliver_p50_us", "deliver_p99_us",
      "deliver_p999_us", "deliver_max_us", "pub_ok_p99_us", "pub_ok_p999_us")))
PY
