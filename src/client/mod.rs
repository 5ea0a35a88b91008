//! The client room: the Rust client library of MortarMQ, and the frame-level client
//! that tests and tools use for raw frames.
//!
//! - [`Producer`] publishes records: pipelined, idempotent by default, retried as the
//!   error registry allows and resent after a reconnect without a copy.
//! - [`Consumer`] is a consumer-group member: it answers the group's NOTICEs, heartbeats
//!   (from a helper thread), keeps its credit window flowing, echoes ownership epochs,
//!   pulls in PULL mode and joins again after a lost connection; [`Message`]s are
//!   settled with `ack`, `nack_retry` or `reject`.
//! - [`Error`] is the one error type of both, with the registry's code, name and
//!   "client should" advice.
//! - A cluster (`man/mortarmq.7`, REPLICATION): both follow NOT_LEADER to the leader it
//!   names and, when no leader can serve, back off and try the other addresses they
//!   were given (`brokers`; several through a slice of addresses, see
//!   [`resolve_brokers`]).
//! - [`Client`] (`raw`) sends and receives frames as they are, for tests and tools.
//!
//! Blocking and `std` only: no async runtime. README.md ("Rust client") and
//! `examples/` show it end to end; `man/mortarmq.7` is the protocol underneath.
//!
//! Depends on `wire` only.

mod brokers;
mod bytes;
mod conn;
mod consumer;
mod error;
mod producer;
mod raw;
mod topics;

pub use brokers::resolve_brokers;
pub use bytes::Bytes;
pub use conn::DEFAULT_TIMEOUT;
pub use consumer::{
    Consumer, ConsumerBuilder, ConsumerStats, DeadLetterOrigin, Message, Messages, Rebalance,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_RECONNECT_TIMEOUT,
};
pub use error::{Error, Result};
pub use producer::{
    Producer, ProducerBuilder, ProducerStats, Receipt, Record, SendHandle,
    DEFAULT_MAX_IN_FLIGHT_RECORDS, DEFAULT_RETRY_TIMEOUT,
};
pub use raw::{Client, ClientError, Delivery, OwnedFrame, Push, Reply, Result as ClientResult};
pub use topics::{partition_for_key, TopicInfo};

// The protocol values a caller names, so that `mortarmq::client::*` is enough.
pub use crate::wire::errors::Retry;
pub use crate::wire::ops::CreditResult;
pub use crate::wire::{Durability, ErrorCode, OriginReason, StartPolicy};
