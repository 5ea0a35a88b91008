# Sourced by tools/publish_cost.sh and tools/consume_cost.sh: their command line
# (ROUNDS [COUNT] -- MORTARD...), a broker on a temporary data directory, and the rounds
# that alternate the binaries; tools/ab_builds.sh starts its brokers with it too.
# Expects NAME (the script's name, for its messages).

# cost_args "$@": sets ROUNDS, COUNT (300,000 unless given) and BINARIES; builds
# mortar-bench (BENCH) and kills every broker started (PIDS) on exit.
cost_args() {
  ROUNDS=${1:?usage: $NAME.sh ROUNDS [COUNT] -- MORTARD...}
  shift
  COUNT=300000
  if [ "${1:-}" != "--" ]; then COUNT=${1:?}; shift; fi
  [ "${1:-}" = "--" ] && shift
  [ $# -ge 1 ] || { echo "$NAME: name at least one mortard binary" >&2; exit 2; }
  BINARIES=("$@")
  cd "$(dirname "$0")/.."
  cargo build --release --quiet --bin mortar-bench
  BENCH=target/release/mortar-bench
  PIDS=()
  trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
}

# start_broker MORTARD [FLAG...]: a broker on loopback with a fresh temporary data
# directory (under $TMPBASE when set); sets BROKER_PID, BROKER_ADDR and BROKER_WORK (the
# directory, removed by stop_broker). With BROKER_ADMIN=on its admin listener is on too,
# at BROKER_ADMIN_ADDR.
start_broker() {
  local admin=off ready='^listening '
  [ "${BROKER_ADMIN:-off}" = on ] && admin=127.0.0.1:0 ready='^admin '
  BROKER_WORK=$(mktemp -d ${TMPBASE:+-p "$TMPBASE"})
  RUST_LOG=warn "$1" --listen 127.0.0.1:0 --admin-listen "$admin" \
    --data-dir "$BROKER_WORK/data" "${@:2}" >"$BROKER_WORK/out" 2>/dev/null &
  BROKER_PID=$!
  PIDS+=("$BROKER_PID")
  for _ in $(seq 100); do grep -q "$ready" "$BROKER_WORK/out" && break; sleep 0.1; done
  BROKER_ADDR=$(awk '/^listening /{print $2; exit}' "$BROKER_WORK/out")
  BROKER_ADMIN_ADDR=$(awk '/^admin /{print $2; exit}' "$BROKER_WORK/out")
  [ -n "$BROKER_ADDR" ] || { echo "$NAME: $1 did not start" >&2; exit 1; }
}

stop_broker() {
  kill "$BROKER_PID"
  wait "$BROKER_PID" 2>/dev/null || true
  rm -rf "$BROKER_WORK"
}

# cost_rounds RUN_ONE: `RUN_ONE MORTARD` for every binary, ROUNDS times, alternating.
cost_rounds() {
  local round bin
  for round in $(seq "$ROUNDS"); do
    for bin in "${BINARIES[@]}"; do
      echo "round $round $bin: $($1 "$bin")"
    done
  done
}
