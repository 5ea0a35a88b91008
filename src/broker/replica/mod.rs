//! Replication (issue 15, `docs/REPLICATION.md`): one raft group per cluster whose log is
//! the node-wide journal. This is where tikv's `raft` crate is used, and the only place:
//! the `RawNode`, its `raft::Storage` over journal format 2 and the `raft-state` file,
//! proposals and the Ready loop will live here, sans-IO like the rest of `broker` (time
//! and peer messages come in as arguments, messages and jobs go out as effects).
//!
//! Built so far (`docs/REPLICATION.md` §10): the logger raft writes to ([`logger`]),
//! `raft::Storage` over journal format 2 and `raft-state` ([`storage`]), what entry data
//! means ([`entry`]: BATCH, REGISTRY, FLOOR, ADMIN) and the sans-IO state machine ([`machine`]: the
//! Ready loop, the role gate, REPLICATED waiters, the lease), tested by a three-node
//! in-process harness (`sim`) and the seeded simulator of §9.3 (`simnet`: faults and a
//! checker); and the broker's cluster mode ([`cluster`]: a `Broker` owning a `Replica`,
//! PUB and DECLARE as proposals, apply into partitions, registry and producers), tested
//! by three in-process brokers (`cluster_sim`) and, driven by `mortard --peers`, by
//! `tests/cluster.rs`; journal compaction up to what every node holds ([`compaction`]:
//! FLOOR entries, checkpoints), INSTALL for a node whose log is gone ([`install`]) and
//! the operator's purges and group changes as ADMIN entries ([`admin`]), and the group
//! positions as the applied log says them, which undo a stopped leader's group changes
//! whose entries had not applied (`applied`).
//!
//! Depends on what `broker` may, plus `raft` and `slog` (raft's logging interface).

pub mod admin;
mod applied;
pub mod cluster;
pub mod compaction;
pub mod entry;
pub mod install;
pub mod logger;
pub mod machine;
pub mod storage;
pub mod vet;

/// What peers exchange: the crate's message, named here so that no room outside
/// `broker::replica` names `raft`.
pub use raft::eraftpb::Message as PeerMessage;

#[cfg(test)]
mod cluster_sim;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod simnet;
