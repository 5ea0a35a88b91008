#!/usr/bin/env bash
# Follower catch-up rate of a 3-node loopback cluster (issue 15, docs/BENCHMARKS.md): one
# follower is stopped, MIB MiB of REPLICATED 1 KiB records are published to the other
# two, the follower comes back, and the leader's /stats `cluster` section is read every
# 20 ms until the follower's match_index reaches the leader's last index (its journal has
# every entry, fsynced), then the follower's own /stats until its applied_index does
# (its segments have every record).
#
#   bash tools/catchup_bench.sh [MIB (256)] [MODE: kill | pause (kill)] [-- MORTARD FLAGS]
#
# kill: kill -9, then the same command again (journal replay, then catch-up); pause:
# SIGSTOP, then SIGCONT (its links time out and reconnect). Prints the entries, records
# and journal bytes caught up, the times, and entries/s, records/s and MiB/s.
set -euo pipefail
MIB=${1:-256}
MODE=${2:-kill}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
case $MODE in kill | pause) ;; *) echo "catchup_bench: MODE is kill or pause" >&2; exit 2 ;; esac
# How often /stats is read while the follower catches up, and how long it may take.
POLL_INTERVAL_SECONDS=0.02
CATCHUP_LIMIT_SECONDS=600
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin mortard --bin mortar-bench --bin mortarctl
BIN=target/release
# shellcheck source=cluster_common.sh
source tools/cluster_common.sh
WORK=$(mktemp -d)
declare -A PID
cleanup() {
  for p in "${PID[@]}"; do
    kill -CONT "$p" 2>/dev/null || true
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

PEERS=$(loopback_peers)
declare -A CLIENT ADMIN
for id in 1 2 3; do
  CLIENT[$id]=127.0.0.1:$(free_port)
  ADMIN[$id]=127.0.0.1:$(free_port)
done

start() { # ID
  : >"$WORK/out$1"
  "$BIN/mortard" --data-dir "$WORK/n$1" --listen "${CLIENT[$1]}" --admin-listen "${ADMIN[$1]}" \
    --node-id "$1" --peers "$PEERS" "${EXTRA[@]}" >>"$WORK/out$1" 2>>"$WORK/log$1" &
  PID[$1]=$!
  disown "$!"
  for _ in $(seq 400); do
    grep -q '^listening ' "$WORK/out$1" && return
    sleep 0.05
  done
  echo "catchup_bench: node $1 did not start" >&2
  cat "$WORK/log$1" >&2
  exit 1
}
stats() { curl -sf "http://${ADMIN[$1]}/stats"; }
field() { # ID PYTHON-EXPRESSION over c = the cluster section
  stats "$1" | python3 -c "import json,sys; c = json.load(sys.stdin)['cluster']; print($2)"
}

for id in 1 2 3; do start "$id"; done
L=
for _ in $(seq 400); do
  L=$(first_to_declare catchup "${CLIENT[1]}" "${CLIENT[2]}" "${CLIENT[3]}")
  [ -n "$L" ] && break
  sleep 0.05
done
[ -n "$L" ] || { echo "catchup_bench: no leader" >&2; exit 1; }
F=$((L % 3 + 1))
OTHERS="${CLIENT[$L]},${CLIENT[$((F % 3 + 1))]}"
echo "leader node $L, follower node $F ($MODE), ${MIB} MiB of 1 KiB records"

FROM=$(field "$F" "c['last_index']")
JOURNAL=$WORK/n$F/raft-journal
JOURNAL_BEFORE=$(du -sb "$JOURNAL" | cut -f1)
if [ "$MODE" = kill ]; then kill -9 "${PID[$F]}"; else kill -STOP "${PID[$F]}"; fi
RECORDS=$((MIB * 1024))
t_pub=$(date +%s.%N)
"$BIN/mortar-bench" --broker "${CLIENT[$L]}" --json publish --connections 4 --pipeline 64 \
  --value-size 1024 --count "$RECORDS" --durability replicated --topic catchup >"$WORK/pub.json"
python3 - "$WORK/pub.json" "$t_pub" <<'EOF'
import json, sys, time
r = json.load(open(sys.argv[1]))
if r.get("errors"):
    sys.exit("catchup_bench: %s publish errors" % r["errors"])
print("published %d records in %.1f s (%d msgs/s, two nodes up)"
      % (r["ops"], time.time() - float(sys.argv[2]), r["ops_per_sec"]))
EOF
TARGET=$(field "$L" "c['last_index']")
echo "leader last_index $TARGET; the follower had $FROM"

t0=$(date +%s.%N)
if [ "$MODE" = kill ]; then start "$F"; else kill -CONT "${PID[$F]}"; fi
python3 - "${ADMIN[$L]}" "${ADMIN[$F]}" "$F" "$TARGET" "$t0" "$POLL_INTERVAL_SECONDS" \
  "$CATCHUP_LIMIT_SECONDS" >"$WORK/times" <<'EOF'
import json, sys, time, urllib.request
leader, follower, fid, target, t0, every, limit = sys.argv[1:]
fid, target, t0, every, limit = int(fid), int(target), float(t0), float(every), float(limit)
def cluster(addr):
    try:
        with urllib.request.urlopen("http://%s/stats" % addr, timeout=2) as r:
            return json.load(r)["cluster"]
    except OSError:
        return None  # not listening yet (restarting) or busy
matched = applied = None
while matched is None or applied is None:
    now = time.time()
    if now - t0 > limit:
        sys.exit("catchup_bench: not caught up within %.0f s" % limit)
    if matched is None:
        c = cluster(leader)
        m = c and [p["match_index"] for p in c["peers"] if p["id"] == fid][0]
        if m is not None and m >= target:
            matched = time.time() - t0
    if applied is None:
        c = cluster(follower)
        if c is not None and c["applied_index"] >= target:
            applied = time.time() - t0
    time.sleep(every)
print(matched, applied)
EOF
read -r MATCHED APPLIED <"$WORK/times"
JOURNAL_AFTER=$(du -sb "$JOURNAL" | cut -f1)
python3 - "$FROM" "$TARGET" "$RECORDS" "$JOURNAL_BEFORE" "$JOURNAL_AFTER" "$MATCHED" \
  "$APPLIED" <<'EOF'
import sys
frm, target, records, before, after = map(int, sys.argv[1:6])
matched, applied = map(float, sys.argv[6:8])
entries, journal_mib = target - frm, (after - before) / 2**20
print("caught up %d entries, %d records (%.0f MiB of values), follower journal +%.0f MiB"
      % (entries, records, records / 1024, journal_mib))
for what, t in (("match_index (journal, fsynced)", matched), ("applied_index (segments)", applied)):
    print("%-31s after %6.2f s: %7.0f entries/s %8.0f records/s %6.1f MiB/s of journal"
          % (what, t, entries / t, records / t, journal_mib / t))
EOF
