#!/usr/bin/env bash
# Builds the small mortard (issue 14): Cargo.toml's `small` profile (opt-level "z") with
# glibc linked statically, so the process maps only the libc code it calls and no ld.so or
# libgcc_s. Idle VmRSS about 2.5 MiB against 3.7 for `cargo build --release` (1.9 and 3.1
# before raft was linked in); push consume about half as fast (docs/BENCHMARKS.md, "Idle
# memory"; `tools/ab_builds.sh` compares).
# Prints the binary's path: target/small/mortard.
# Static glibc needs the static C library (Debian: libc6-dev, which the Rust toolchain
# already needs for linking). mortard resolves no host names (its flags take IP:PORT), so
# static glibc's NSS limits do not apply.
#
# usage: tools/build_small.sh
#   then e.g. python3 tools/idle_rss.py 0 --binary target/small/mortard --max-idle-kib 2048
set -euo pipefail
cd "$(dirname "$0")/.."
cargo rustc --profile small --bin mortard -- -C target-feature=+crt-static
echo "$(pwd)/target/small/mortard"
