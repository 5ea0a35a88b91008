//! MortarMQ: a persistent message broker for small hosts.
//!
//! Data flows one way: socket → frame splitter → session → broker state → log (the
//! partition's segment and the node's journal) → fsync pool → back to the reactor
//! (through its `mio::Waker`) → answer. Each room is
//! small and its dependencies point down; `tools/tidy.sh` checks the rules below.
//!
//! | room | what it is for | may depend on |
//! |---|---|---|
//! | [`wire`] | frames, ops, requests, responses, every protocol value, limits, codes | nothing |
//! | [`log`] | segments, index, recovery, retention, journal, metadata files | nothing (files) |
//! | [`fsync`] | the worker pool that runs durable I/O off the reactor thread | nothing |
//! | [`consume`] | consumer groups, credit, delivery, redelivery: a pure state machine | `wire` |
//! | [`broker`] | registry, publish, group commit, consume; blocking I/O as jobs | those four |
//! | [`broker::replica`] | replication: raft group, storage, cluster mode | `broker`'s, `raft`† |
//! | [`session`] | CONNECT, the one dispatch, response slots in order | `wire`, `broker` |
//! | [`peer`] | `--listen-peer` links: dial, HELLO, frames, caps, backoff | `raft`'s messages§ |
//! | [`reactor`] | the mio loop: sockets, buffers, timers, backpressure | all above |
//! | [`admin`] | HTTP: stats, peeks, changes | `broker`, `consume`, `session`, `wire`, `logging`‡ |
//! | [`config`] | the flag table: argv into the layers' configs, `--help` | config types* |
//! | [`client`] | the client library (`Producer`, `Consumer`), raw frames for tests | `wire` |
//! | [`systemd`] | `Type=notify` readiness (`READY=1`, `STOPPING=1`) | nothing |
//! | [`logging`] | `mortard`'s log line formats (text, JSON, journald priorities) | `config` |
//!
//! Rules: only `reactor` and `peer` (both on the reactor thread, on its one `Poll`) and
//! `admin`'s HTTP listener touch sockets; `broker` and
//! `consume` take the time as an argument and return effects, so they are tested
//! without sockets or clocks; the reactor thread never blocks (no fsync, no DNS, no
//! sleep).
//!
//! † and `slog`, raft's logging interface; no other room names `raft` or `slog`, except:
//!
//! § `peer` names raft's `eraftpb` (the message types) and `protobuf` (their codec) only;
//! it depends on no room of this crate.
//!
//! \* `config` may name `wire`'s limits and `Durability` and the config types of `log`,
//! `consume`, `broker` and `reactor` (each owns its defaults there), never code that runs.
//!
//! ‡ `admin` writes `/stats` with `logging::json_string`, `mortard`'s one JSON string
//! writer (it links no JSON library).

pub mod admin;
pub mod broker;
pub mod client;
pub mod config;
pub mod consume;
pub mod fsync;
pub mod log;
pub mod logging;
pub mod peer;
pub mod reactor;
pub mod session;
pub mod systemd;
pub mod wire;
