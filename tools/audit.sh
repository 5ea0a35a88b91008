#!/usr/bin/env bash
# RustSec audit of Cargo.lock (docs/REPLICATION.md §11). Needs cargo-audit
# (`cargo install cargo-audit --locked`, about 10 minutes on 2 cores) and the RustSec
# advisory database: cargo-audit fetches it over the network, or DB_DIR names a local
# clone and nothing is fetched. Not run by tools/test.sh or CI, which have no such network.
# Exits non-zero on any vulnerability but one: RUSTSEC-2024-0437 is the recursion of
# protobuf 3.x before 3.7.2; the 2.28 that raft 0.7 pins refuses a nested unknown group
# instead (§11), which src/peer/tests.rs checks with a 400,000-deep frame.
#
# usage: tools/audit.sh [DB_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-audit >/dev/null 2>&1; then
  echo "audit.sh: no cargo-audit; cargo install cargo-audit --locked" >&2
  exit 1
fi
db=()
[ $# -eq 0 ] || db=(--db "$1" --no-fetch)
exec cargo audit "${db[@]}" --ignore RUSTSEC-2024-0437
