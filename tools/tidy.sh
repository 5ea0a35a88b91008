#!/usr/bin/env bash
# Mechanical guards (after TigerBeetle's tidy): line length, function length, no
# protocol constant outside src/wire, no debugging leftovers,
# `unsafe` only where a SAFETY comment explains it, and the rooms' dependency rules.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
say() { echo "tidy: $*"; fail=1; }

long=$(grep -rnE '^.{101,}$' src tools --include='*.rs' || true)
[ -z "$long" ] || say "lines over 100 characters:"$'\n'"$long"

leftovers=$(grep -rnE '\b(dbg!|todo!|unimplemented!)' src --include='*.rs' || true)
[ -z "$leftovers" ] || say "debugging leftovers:"$'\n'"$leftovers"

unsafe_files=$(grep -rlE '\bunsafe\b' src --include='*.rs' | grep -v '^src/log/mmap.rs$' || true)
[ -z "$unsafe_files" ] || say "unsafe outside src/log/mmap.rs: $unsafe_files"
if grep -qE '\bunsafe\b' src/log/mmap.rs && ! grep -q 'SAFETY:' src/log/mmap.rs; then
  say "src/log/mmap.rs uses unsafe without a // SAFETY: comment"
fi

# One protocol vocabulary: every flag, kind, reason, durability level and error code is
# defined once, typed, in src/wire (see src/wire/vocab.rs). A constant outside it named
# like a protocol field, or holding a 16-bit hex code, is a second copy. Storage-format
# flags (RECORD_*) are the broker's on-disk layout (docs/STORAGE.md), not the protocol;
# EXIT_* are process exit statuses.
proto=$(grep -rnE '^\s*(pub(\([a-z]+\))? )?const [A-Z0-9_]+: u(8|16) = ' src tools tests \
    --include='*.rs' | grep -v '^src/wire/' | grep -vE 'const (RECORD|EXIT)_' \
  | grep -E '_?(FLAG|REASON|KIND|STATE|MODE|RESULT|POLICY|DURABILITY|ERR|ERROR|CREATED|DELETED|ASSIGN|REVOKE)(_[A-Z0-9_]*)?: |= 0x[0-9A-Fa-f]+;' \
  || true)
[ -z "$proto" ] || say "protocol constants outside src/wire (use src/wire/vocab.rs):"$'\n'"$proto"

# Functions fit on a screen (TigerBeetle's 70-line limit); test code is exempt.
long_fns=$(python3 tools/fn_length.py 70 src || true)
[ -z "$long_fns" ] || say "functions over 70 lines:"$'\n'"$long_fns"

# The repository stands alone: references name its own files (man/mortarmq.7, docs/),
# never the spec files it was built from outside it.
outside=$(grep -rnE '\.\./shared|semantics\.md|wire-v0\.seed|errors\.md|replication\.md' \
  src tools tests docs man golden README.md | grep -v '^tools/tidy.sh:' || true)
[ -z "$outside" ] || say "references to files outside the repository:"$'\n'"$outside"

# Dependencies point down: wire <- log, fsync <- broker <- session <- reactor.
deny() { # room, forbidden pattern
  local hits
  hits=$(grep -rnHE "$2" "$1" --include='*.rs' | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
  [ -z "$hits" ] || say "$1 must not use $2:"$'\n'"$hits"
}
deny src/wire 'use crate::(log|broker|reactor|session|fsync|admin|config|client|consume)|mio::'
deny src/log 'use crate::|mio::'
deny src/fsync.rs 'use crate::|mio::'
deny src/broker 'use crate::(reactor|session|admin|config|client)|mio::|TcpStream'
[ ! -d src/consume ] || deny src/consume 'use crate::(log|broker|reactor|session|fsync|admin|config)|mio::|Instant::now'
deny src/config.rs 'use crate::(session|fsync|admin|client)|mio::'
# config fills the layers' config structs, so it may name those types (and the limits its
# bounds come from), never the code that runs.
config_allowed='wire::Durability|wire::limits::|log::(LogConfig|SEGMENT_[A-Z_]+|JOURNAL_[A-Z_]+)'
config_allowed+='|consume::ConsumeConfig|broker::BrokerConfig|reactor::ReactorConfig'
config_paths=$(grep -noE 'crate::[A-Za-z_:]+' src/config.rs \
  | grep -vE ":crate::($config_allowed)\$" || true)
[ -z "$config_paths" ] \
  || say "src/config.rs may name only the layers' config types and limits:"$'\n'"$config_paths"
deny src/client 'use crate::(log|broker|reactor|session|fsync|admin|config|consume)|mio::'
# tikv's raft (and slog, its logging interface) stay inside broker::replica, behind the
# sans-IO wrapper: an upgrade of the pinned crate touches that room only. The peer room
# carries raft's messages, so it may name `raft::eraftpb` (and `protobuf`, their codec),
# nothing else of the crate.
raft_users=$(grep -rlE '\b(raft|slog)::' src --include='*.rs' \
  | grep -vE '^src/(broker/replica|peer)/' || true)
[ -z "$raft_users" ] || say "raft and slog are used only in src/broker/replica and src/peer:"$'\n'"$raft_users"
peer_raft=$(grep -rnE '\b(raft|slog)::' src/peer --include='*.rs' | grep -vE '\braft::eraftpb::' || true)
[ -z "$peer_raft" ] || say "src/peer may name only raft::eraftpb (the message types):"$'\n'"$peer_raft"
protobuf_users=$(grep -rlE '\bprotobuf::' src --include='*.rs' | grep -v '^src/peer/' || true)
[ -z "$protobuf_users" ] || say "protobuf (the peer frames' codec) is used only in src/peer:"$'\n'"$protobuf_users"
# The peer room is sans-broker: it reports events and takes messages, depending on no room.
deny src/peer 'use crate::'
# Sockets live on the reactor thread (reactor, peer) or in admin's HTTP thread; the client
# library and main (which binds admin's listener) are not the broker.
socket_users=$(grep -rlE '\b(TcpStream|TcpListener|mio::net)\b' src --include='*.rs' \
  | grep -vE '^src/(reactor|peer|admin|client)/|^src/main\.rs$' || true)
[ -z "$socket_users" ] || say "sockets are touched only in reactor, peer and admin:"$'\n'"$socket_users"
# admin renders /stats with logging's JSON string writer, so logging stays below it.
deny src/logging.rs 'use crate::(wire|log|fsync|consume|broker|session|reactor|admin|client)|mio::'

exit $fail
