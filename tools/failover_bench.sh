#!/usr/bin/env bash
# Failover time of a 3-node loopback cluster (issue 15, docs/BENCHMARKS.md): kill -9 of
# the leader → the first REPLICATED OK from the new leader, seen by a client that knows
# every node (mortarctl pub with a --broker list follows NOT_LEADER and backs off on
# LEADER_UNKNOWN). The killed node is restarted and caught up before the next round.
#
#   bash tools/failover_bench.sh [KILLS (20)]
#
# Prints each round's time and the p50 and max.
set -euo pipefail
KILLS=${1:-20}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin mortard --bin mortarctl
BIN=target/release
# shellcheck source=cluster_common.sh
source tools/cluster_common.sh
WORK=$(mktemp -d)
declare -A PID
cleanup() {
  for p in "${PID[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

PEERS=$(loopback_peers)
declare -A CLIENT
for id in 1 2 3; do CLIENT[$id]=127.0.0.1:$(free_port); done
ALL="${CLIENT[1]},${CLIENT[2]},${CLIENT[3]}"

start() { # ID
  "$BIN/mortard" --data-dir "$WORK/n$1" --listen "${CLIENT[$1]}" --admin-listen off \
    --node-id "$1" --peers "$PEERS" >>"$WORK/out$1" 2>>"$WORK/log$1" &
  PID[$1]=$!
  disown "$!" # no "Killed" line from the shell for each kill
}
leader() { first_to_declare failover "${CLIENT[1]}" "${CLIENT[2]}" "${CLIENT[3]}"; }
ms() { date +%s%3N; }

for id in 1 2 3; do start "$id"; done
L=
until [ -n "$L" ]; do L=$(leader); sleep 0.1; done
TIMES=()
for round in $(seq "$KILLS"); do
  "$BIN/mortarctl" --broker "$ALL" pub failover --value "before $round" >/dev/null
  t0=$(ms)
  kill -9 "${PID[$L]}"
  "$BIN/mortarctl" --broker "$ALL" --timeout 30s pub failover --value "after $round" >/dev/null
  t=$(($(ms) - t0))
  TIMES+=("$t")
  echo "round $round: node $L killed, first REPLICATED OK after $t ms"
  start "$L"
  NEW=
  until [ -n "$NEW" ]; do NEW=$(leader); sleep 0.1; done
  L=$NEW
  sleep 1 # the restarted node catches up before the next kill
done
printf '%s\n' "${TIMES[@]}" | sort -n | python3 -c '
import sys
t = [int(x) for x in sys.stdin]
print("failover over %d kills: p50 %d ms, max %d ms" % (len(t), t[len(t) // 2], t[-1]))'
