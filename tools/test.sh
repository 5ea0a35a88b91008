#!/usr/bin/env bash
# The project's one test command (README "Run the tests"; CI runs exactly this).
# Checks formatting, lints, the man pages, then every unit and integration test, then
# the Python client's tests (clients/python).
# Integration tests start real `mortard` processes on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# mandoc lints the man pages; install it where it is missing (fresh machines).
if ! command -v mandoc >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq mandoc) >/dev/null 2>&1 || true
  fi
fi

cargo fmt --check
cargo clippy --all-targets -- -D warnings
bash tools/tidy.sh
if command -v mandoc >/dev/null 2>&1; then
  for page in man/*.[0-9]; do
    mandoc -T lint -W warning "$page"
  done
fi
cargo test --all-targets

# The Python client, from source (standard library only: nothing to install), against
# the mortard built above. MORTARMQ_REQUIRE_BROKER turns "no broker binary" into a
# failure instead of a skip.
cargo build --bin mortard
PYTHONPATH=clients/python MORTARMQ_REQUIRE_BROKER=1 \
  python3 -m unittest discover -s clients/python/tests
