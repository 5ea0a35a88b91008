//! The wire room: frames, ops, protocol limits and the error registry of MortarMQ v0.
//!
//! Sans-IO: bytes in, typed values out, typed values in, bytes out. It depends on
//! nothing else in the crate (only `std`), so clients, tools, the broker and the golden
//! tests all share one codec. The byte layouts are those of
//! `man/mortarmq.7` (field order = byte order, big-endian).
//!
//! - [`limits`]: every protocol constant, with its unit in its name.
//! - [`frame`]: the incremental splitter that yields only complete frames.
//! - [`ops`]: the 15 ops as typed messages and the typed OK results.
//! - [`errors`]: the 51-code registry with each code's "after" and retry class.
//! - [`vocab`]: every flag set, kind, reason and durability level, typed.
//! - [`request`] / [`response`]: what a client asks, and the one answer it gets.

pub mod codec;
pub mod errors;
pub mod frame;
pub mod limits;
pub mod ops;
pub mod request;
pub mod response;
pub mod vocab;

pub use errors::ErrorCode;
pub use frame::{split_frame, FrameError, RawFrame};
pub use ops::{DecodeError, DeliveryRef, Frame, Op};
pub use request::{NotARequest, Request};
pub use response::Response;
pub use vocab::{
    dlq_twin_id, AckFlags, ControlResult, CreditMode, DeclareCreated, DeclareFlags, Durability,
    HeartbeatState, MsgFlags, NackReason, NoticeKind, OriginReason, PubFlags, PubResultFlags,
    StartPolicy, SubFlags, DLQ_SUFFIX,
};
