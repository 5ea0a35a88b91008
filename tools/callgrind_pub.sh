#!/usr/bin/env bash
# Instructions per PUB on the broker (issue 7): runs a release mortard under
# `valgrind --tool=callgrind`, publishes N records (1 KiB, WRITTEN, 4 connections x 16
# in flight) with mortar-bench, stops the broker, and prints total instructions / N
# and the top functions. Instruction counts are repeatable whatever else the machine
# does, unlike times. usage: tools/callgrind_pub.sh [N] (default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
cargo build --release --bin mortard --bin mortar-bench >/dev/null 2>&1
WORK=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
  target/release/mortard --listen 127.0.0.1:0 --admin-listen off --data-dir "$WORK/data" \
  >"$WORK/out" 2>"$WORK/err" &
PID=$!
for _ in $(seq 300); do grep -q '^listening ' "$WORK/out" && break; sleep 0.1; done
ADDR=$(awk '/^listening /{print $2; exit}' "$WORK/out")
target/release/mortar-bench --broker "$ADDR" publish --connections 4 --pipeline 16 \
  --durability written --count "$N" --value-size 1024 >/dev/null
kill -TERM "$PID"
wait "$PID" || true
TOTAL=$(callgrind_annotate "$WORK/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1; exit}')
echo "instructions_total=$TOTAL pubs=$N instructions_per_pub=$((TOTAL / N))"
callgrind_annotate "$WORK/cg.out" 2>/dev/null | sed -n '/file:function/,$p' | head -25
