//! Replication (issue 15, `docs/REPLICATION.md`): one raft group per cluster whose log is
//! the node-wide journal. This is where tikv's `raft` crate is used, and the only place:
//! the `RawNode`, its `raft::Storage` over journal format 2 and the `raft-state` file,
//! proposals and the Ready loop will live here, sans-IO like the rest of `broker` (time
//! and peer messages come in as arguments, messages and jobs go out as effects).
//!
//! Built so far (`docs/REPLICATION.md` §10): the logger raft writes to ([`logger`]),
//! `raft::Storage` over journal format 2 and `raft-state` ([`storage`]), what entry data
//! means ([`entry`]: BATCH, REGISTRY) and the sans-IO state machine ([`machine`]: the
//! Ready loop, the role gate, REPLICATED waiters, the lease), tested by a three-node
//! in-process harness (`sim`) and the seeded simulator of §9.3 (`simnet`: faults and a
//! checker). Nothing calls them outside tests yet: `mortard` refuses `--peers`.
//!
//! Depends on what `broker` may, plus `raft` and `slog` (raft's logging interface).

pub mod entry;
pub mod logger;
pub mod machine;
pub mod storage;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod simnet;
