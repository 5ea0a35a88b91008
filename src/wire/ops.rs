//! The 15 ops of wire v0 (9 core + 6 extension) as typed messages, and the typed OK
//! results of DECLARE, PUB, SUB and CREDIT.
//!
//! Every message lists its fields in byte order, all big-endian (`man/mortarmq.7`,
//! OPERATIONS). Byte fields are preceded on the wire by their length (`key_len:u16`
//! then `key`), and decoding borrows them from the frame buffer: a decoded PUB or MSG
//! copies neither key nor value. Bytes after the last known field are an unknown tail
//! from a later compatible version and are ignored; a payload shorter than its fields,
//! or an inner length past the frame end, is a [`DecodeError`] (MALFORMED_PAYLOAD;
//! `man/mortarmq.7`, FRAME FORMAT).
//!
//! [`Frame::fields`] lists the decoded fields by their spec names; the golden tests
//! compare it with the comments of the hand-written vectors.

use super::codec::{Put, Reader, Short, WireBits};
use super::limits::{FRAME_HEADER_BYTES, MAX_ERR_MESSAGE_BYTES, OP_BYTES};
use super::vocab::{
    AckFlags, ControlResult, DeclareFlags, MsgFlags, NackReason, OriginReason, PubFlags,
    PubResultFlags, SubFlags,
};

/// Op codes. 0x01–0x09 are the core ops, 0x0A–0x0F the extension ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    Connect = 0x01,
    Declare = 0x02,
    Pub = 0x03,
    Sub = 0x04,
    Ack = 0x05,
    Nack = 0x06,
    Ping = 0x07,
    Err = 0x08,
    Ok = 0x09,
    Msg = 0x0A,
    Pull = 0x0B,
    Heartbeat = 0x0C,
    Notice = 0x0D,
    ControlAck = 0x0E,
    Credit = 0x0F,
}

impl Op {
    pub const ALL: [Op; 15] = [
        Op::Connect,
        Op::Declare,
        Op::Pub,
        Op::Sub,
        Op::Ack,
        Op::Nack,
        Op::Ping,
        Op::Err,
        Op::Ok,
        Op::Msg,
        Op::Pull,
        Op::Heartbeat,
        Op::Notice,
        Op::ControlAck,
        Op::Credit,
    ];

    pub fn from_u8(op: u8) -> Option<Op> {
        Op::ALL.get(usize::from(op).checked_sub(1)?).copied()
    }

    /// The spec's name of the op, e.g. `CONTROL_ACK`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Connect => "CONNECT",
            Op::Declare => "DECLARE",
            Op::Pub => "PUB",
            Op::Sub => "SUB",
            Op::Ack => "ACK",
            Op::Nack => "NACK",
            Op::Ping => "PING",
            Op::Err => "ERR",
            Op::Ok => "OK",
            Op::Msg => "MSG",
            Op::Pull => "PULL",
            Op::Heartbeat => "HEARTBEAT",
            Op::Notice => "NOTICE",
            Op::ControlAck => "CONTROL_ACK",
            Op::Credit => "CREDIT",
        }
    }

    /// Ops only the server sends: a client sending one gets 0x000D UNEXPECTED_OP.
    /// ERR goes both ways and is not among them.
    pub fn is_server_only(self) -> bool {
        matches!(self, Op::Ok | Op::Msg | Op::Notice)
    }
}

/// A payload too short for its fields, or an inner length past the frame end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError {
    pub op: u8,
    /// Payload offset where the missing field starts.
    pub offset: usize,
    /// Bytes the field needed there.
    pub need: usize,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "malformed payload for op 0x{:02X}: {} bytes needed at payload offset {}",
            self.op, self.need, self.offset
        )
    }
}

/// One decoded field value, for [`Frame::fields`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field<'a> {
    Int(u64),
    Bytes(&'a [u8]),
    List(Vec<u64>),
}

/// A message's payload codec; [`Message::encode_frame`] adds the length and op.
pub trait Message<'a>: Sized {
    const OP: Op;
    fn decode_payload(r: &mut Reader<'a>) -> Result<Self, Short>;
    fn encode_payload(&self, out: &mut Vec<u8>);
    fn push_fields(&self, fields: &mut Vec<(&'static str, Field<'a>)>);

    fn decode(payload: &'a [u8]) -> Result<Self, DecodeError> {
        Self::decode_payload(&mut Reader::new(payload)).map_err(|s| DecodeError {
            op: Self::OP as u8,
            offset: s.offset,
            need: s.need,
        })
    }

    /// Appends the whole frame (length, op, payload) to `out`.
    fn encode_frame(&self, out: &mut Vec<u8>) {
        let start = begin_frame(out, Self::OP);
        self.encode_payload(out);
        end_frame(out, start);
    }
}

/// Writes a placeholder length and the op; [`end_frame`] patches the length. Lets hot
/// paths encode straight into a connection's output buffer without a temporary.
pub fn begin_frame(out: &mut Vec<u8>, op: Op) -> usize {
    let start = out.len();
    out.put_u32(0);
    out.put_u8(op as u8);
    start
}

pub fn end_frame(out: &mut [u8], start: usize) {
    let length = (out.len() - start - FRAME_HEADER_BYTES) as u32;
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&length.to_be_bytes());
}

// Field kinds of the message macro: fixed-width integers, and byte strings or u64
// lists preceded by a count of the named width.
macro_rules! field_ty {
    (u8) => { u8 };
    (u16) => { u16 };
    (u32) => { u32 };
    (u64) => { u64 };
    (bytes16) => { &'a [u8] };
    (bytes32) => { &'a [u8] };
    (list16) => { Vec<u64> };
    ($flags:ident) => { $flags };
}

macro_rules! field_read {
    ($r:ident, u8) => {
        $r.u8()?
    };
    ($r:ident, u16) => {
        $r.u16()?
    };
    ($r:ident, u32) => {
        $r.u32()?
    };
    ($r:ident, u64) => {
        $r.u64()?
    };
    ($r:ident, bytes16) => {{
        let n = $r.u16()? as usize;
        $r.bytes(n)?
    }};
    ($r:ident, bytes32) => {{
        let n = $r.u32()? as usize;
        $r.bytes(n)?
    }};
    ($r:ident, list16) => {{
        let n = $r.u16()? as usize;
        // Checked against the payload before allocating: a hostile count cannot
        // make the decoder reserve more than the frame holds.
        let raw = $r.bytes(n * 8)?;
        raw.chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
            .collect()
    }};
    ($r:ident, $flags:ident) => {
        $r.bits::<$flags>()?
    };
}

macro_rules! field_write {
    ($out:ident, $v:expr, u8) => {
        $out.put_u8($v)
    };
    ($out:ident, $v:expr, u16) => {
        $out.put_u16($v)
    };
    ($out:ident, $v:expr, u32) => {
        $out.put_u32($v)
    };
    ($out:ident, $v:expr, u64) => {
        $out.put_u64($v)
    };
    ($out:ident, $v:expr, bytes16) => {{
        $out.put_u16($v.len() as u16);
        $out.put_bytes($v)
    }};
    ($out:ident, $v:expr, bytes32) => {{
        $out.put_u32($v.len() as u32);
        $out.put_bytes($v)
    }};
    ($out:ident, $v:expr, list16) => {{
        $out.put_u16($v.len() as u16);
        for e in $v.iter() {
            $out.put_u64(*e)
        }
    }};
    ($out:ident, $v:expr, $flags:ident) => {
        WireBits::write(&$v, $out)
    };
}

macro_rules! field_push {
    ($f:ident, $name:ident, $v:expr, bytes16) => {{
        $f.push((
            concat!(stringify!($name), "_len"),
            Field::Int($v.len() as u64),
        ));
        $f.push((stringify!($name), Field::Bytes($v)));
    }};
    ($f:ident, $name:ident, $v:expr, bytes32) => {
        field_push!($f, $name, $v, bytes16)
    };
    ($f:ident, $name:ident, $v:expr, list16) => {{
        $f.push((
            concat!(stringify!($name), "_len"),
            Field::Int($v.len() as u64),
        ));
        $f.push((stringify!($name), Field::List($v.clone())));
    }};
    ($f:ident, $name:ident, $v:expr, $int:ident) => {
        $f.push((stringify!($name), Field::Int(u64::from($v))))
    };
}

macro_rules! message {
    ($(#[$meta:meta])* $name:ident $(<$lt:lifetime>)? = $op:ident {
        $( $(#[$fmeta:meta])* $field:ident : $kind:ident ),* $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $name $(<$lt>)? {
            $( $(#[$fmeta])* pub $field: field_ty!($kind), )*
        }

        impl<'a> Message<'a> for $name $(<$lt>)? {
            const OP: Op = Op::$op;

            #[allow(unused_variables)]
            fn decode_payload(r: &mut Reader<'a>) -> Result<Self, Short> {
                Ok($name { $( $field: field_read!(r, $kind), )* })
            }

            #[allow(unused_variables)]
            fn encode_payload(&self, out: &mut Vec<u8>) {
                $( field_write!(out, self.$field, $kind); )*
            }

            #[allow(unused_variables)]
            fn push_fields(&self, f: &mut Vec<(&'static str, Field<'a>)>) {
                $( field_push!(f, $field, self.$field, $kind); )*
            }
        }
    };
}

message! {
    /// CONNECT 0x01, C→S: opens the session. `client_flags` bits are all reserved.
    Connect<'a> = Connect {
        protocol_version: u8,
        client_flags: u16,
        token: bytes16,
        reserved: u32,
    }
}

message! {
    /// DECLARE 0x02, C→S: create, look up (PASSIVE) or delete a topic pair.
    Declare<'a> = Declare {
        topic: bytes16,
        partition_count: u16,
        flags: DeclareFlags,
    }
}

message! {
    /// PUB 0x03, C→S: append one record. `key` and `value` borrow the frame buffer.
    Pub<'a> = Pub {
        topic_id: u16,
        partition: u16,
        producer_id: u64,
        producer_seq: u64,
        /// Bits 0–1: the requested durability (0 = the broker's default).
        flags: PubFlags,
        key: bytes16,
        value: bytes32,
    }
}

message! {
    /// SUB 0x04, C→S: join `group` on a topic; v0 requires partition 0xFFFF.
    Sub<'a> = Sub {
        group: bytes16,
        topic_id: u16,
        partition: u16,
        /// [`StartPolicy`](super::vocab::StartPolicy) code.
        start_policy: u8,
        credit_count: u16,
        credit_bytes: u32,
        flags: SubFlags,
    }
}

message! {
    /// ACK 0x05, C→S: settle a delivery (flags bit0 PROGRESS only extends its deadline).
    Ack = Ack {
        subscription_id: u16,
        topic_id: u16,
        partition: u16,
        seq: u64,
        delivery_id: u64,
        ownership_epoch: u64,
        flags: AckFlags,
    }
}

message! {
    /// NACK 0x06, C→S: refuse a delivery.
    Nack = Nack {
        subscription_id: u16,
        topic_id: u16,
        partition: u16,
        seq: u64,
        delivery_id: u64,
        ownership_epoch: u64,
        /// [`NackReason`] code.
        reason: u8,
        /// Reserved.
        flags: u16,
    }
}

message! {
    /// PING 0x07, C→S: empty; answered with OK, even before CONNECT.
    Ping = Ping {}
}

message! {
    /// ERR 0x08, both directions. `message` is at most MAX_ERR_MESSAGE_BYTES.
    ErrFrame<'a> = Err {
        code: u16,
        request_op: u8,
        message: bytes16,
    }
}

message! {
    /// OK 0x09, S→C (a client sending it gets UNEXPECTED_OP). `result` is op-specific.
    OkFrame<'a> = Ok {
        request_op: u8,
        result: bytes32,
    }
}

message! {
    /// PULL 0x0B, C→S: fetch up to `max_msgs` records; answered MSG×N then OK.
    Pull = Pull {
        subscription_id: u16,
        member_id: u64,
        membership_epoch: u32,
        assignment_epoch: u32,
        ownership_epochs: list16,
        max_msgs: u16,
        max_bytes: u32,
        wait_ms: u16,
        min_bytes: u32,
    }
}

message! {
    /// HEARTBEAT 0x0C, C→S.
    Heartbeat = Heartbeat {
        subscription_id: u16,
        member_id: u64,
        membership_epoch: u32,
        assignment_epoch: u32,
        /// [`HeartbeatState`](super::vocab::HeartbeatState) code.
        state: u8,
    }
}

message! {
    /// NOTICE 0x0D, S→C push: ASSIGN or REVOKE of one partition.
    Notice = Notice {
        notice_id: u64,
        /// [`NoticeKind`](super::vocab::NoticeKind) code.
        kind: u8,
        group_id: u16,
        membership_epoch: u32,
        assignment_epoch: u32,
        ownership_epoch: u64,
        topic_id: u16,
        partition: u16,
        member_id: u64,
    }
}

message! {
    /// CONTROL_ACK 0x0E, C→S: answers a NOTICE.
    ControlAck = ControlAck {
        notice_id: u64,
        notice_kind: u8,
        group_id: u16,
        membership_epoch: u32,
        assignment_epoch: u32,
        ownership_epoch: u64,
        /// [`ControlResult`] code.
        result: u8,
    }
}

impl ControlAck {
    /// The CONTROL_ACK that answers `notice` with `result`, echoing its id, kind and
    /// epochs.
    pub fn answering(notice: &Notice, result: ControlResult) -> ControlAck {
        ControlAck {
            notice_id: notice.notice_id,
            notice_kind: notice.kind,
            group_id: notice.group_id,
            membership_epoch: notice.membership_epoch,
            assignment_epoch: notice.assignment_epoch,
            ownership_epoch: notice.ownership_epoch,
            result: result.as_code(),
        }
    }
}

message! {
    /// CREDIT 0x0F, C→S: SET or ADD to the subscription's credit window.
    Credit = Credit {
        subscription_id: u16,
        membership_epoch: u32,
        ownership_epoch: u64,
        /// [`CreditMode`](super::vocab::CreditMode) code.
        mode: u8,
        credit_count: u16,
        credit_bytes: u32,
        reserved: u32,
    }
}

/// The origin trailer of a dead-lettered record (`man/mortarmq.7`, MSG), after MSG's `value`.
///
/// ```text
/// origin_topic_id:u16 origin_partition:u16 origin_sequence:u64 attempts:u16 reason:u8
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    pub origin_topic_id: u16,
    pub origin_partition: u16,
    pub origin_sequence: u64,
    /// Deliveries made before dead-lettering.
    pub attempts: u16,
    /// [`OriginReason`] code.
    pub reason: u8,
}

impl Origin {
    pub const ENCODED_BYTES: usize = 2 + 2 + 8 + 2 + 1;

    fn read(r: &mut Reader<'_>) -> Result<Self, Short> {
        Ok(Origin {
            origin_topic_id: r.u16()?,
            origin_partition: r.u16()?,
            origin_sequence: r.u64()?,
            attempts: r.u16()?,
            reason: r.u8()?,
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.put_u16(self.origin_topic_id);
        out.put_u16(self.origin_partition);
        out.put_u64(self.origin_sequence);
        out.put_u16(self.attempts);
        out.put_u8(self.reason);
    }

    /// Decodes a trailer stored after a dead-lettered record's value.
    pub fn decode(bytes: &[u8]) -> Option<Origin> {
        Origin::read(&mut Reader::new(bytes)).ok()
    }
}

/// Bytes of a MSG frame besides its key, value and origin trailer: the length, the op
/// and the fixed fields (subscription_id, topic_id, partition, sequence, delivery_id,
/// attempt, ownership_epoch, producer_id, producer_seq, flags, key_len, value_len). A
/// PULL answer is sized with it before it is encoded.
pub const MSG_FRAME_FIXED_BYTES: usize =
    FRAME_HEADER_BYTES + OP_BYTES + 2 + 2 + 2 + 8 + 8 + 2 + 8 + 8 + 8 + 2 + 2 + 4;
/// Bytes of an OK frame with an empty result (request_op, result_len 0): the end of
/// every PULL answer.
pub const OK_EMPTY_FRAME_BYTES: usize = FRAME_HEADER_BYTES + OP_BYTES + 1 + 4;
/// Bytes of an ERR frame besides its message (code, request_op, message_len).
pub const ERR_FRAME_FIXED_BYTES: usize = FRAME_HEADER_BYTES + OP_BYTES + 2 + 1 + 2;

/// MSG 0x0A, S→C push: one delivery of one record. `key`/`value` borrow their source
/// (the frame buffer when decoding, the log's mapping when the broker encodes).
/// When `flags` has [`MsgFlags::ORIGIN`], `origin` is `Some` and follows `value`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Msg<'a> {
    pub subscription_id: u16,
    pub topic_id: u16,
    pub partition: u16,
    pub sequence: u64,
    pub delivery_id: u64,
    pub attempt: u16,
    pub ownership_epoch: u64,
    pub producer_id: u64,
    pub producer_seq: u64,
    pub flags: MsgFlags,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub origin: Option<Origin>,
}

impl<'a> Message<'a> for Msg<'a> {
    const OP: Op = Op::Msg;

    fn decode_payload(r: &mut Reader<'a>) -> Result<Self, Short> {
        let mut m = Msg {
            subscription_id: r.u16()?,
            topic_id: r.u16()?,
            partition: r.u16()?,
            sequence: r.u64()?,
            delivery_id: r.u64()?,
            attempt: r.u16()?,
            ownership_epoch: r.u64()?,
            producer_id: r.u64()?,
            producer_seq: r.u64()?,
            flags: field_read!(r, MsgFlags),
            key: field_read!(r, bytes16),
            value: field_read!(r, bytes32),
            origin: None,
        };
        if m.flags.contains(MsgFlags::ORIGIN) {
            m.origin = Some(Origin::read(r)?);
        }
        Ok(m)
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        out.put_u16(self.subscription_id);
        out.put_u16(self.topic_id);
        out.put_u16(self.partition);
        out.put_u64(self.sequence);
        out.put_u64(self.delivery_id);
        out.put_u16(self.attempt);
        out.put_u64(self.ownership_epoch);
        out.put_u64(self.producer_id);
        out.put_u64(self.producer_seq);
        // The flag is derived from `origin` so an encoded MSG can never promise a
        // trailer it lacks.
        let mut flags = self.flags;
        flags.set(MsgFlags::ORIGIN, self.origin.is_some());
        field_write!(out, flags, MsgFlags);
        field_write!(out, self.key, bytes16);
        field_write!(out, self.value, bytes32);
        if let Some(origin) = &self.origin {
            origin.write(out);
        }
    }

    fn push_fields(&self, f: &mut Vec<(&'static str, Field<'a>)>) {
        field_push!(f, subscription_id, self.subscription_id, u16);
        field_push!(f, topic_id, self.topic_id, u16);
        field_push!(f, partition, self.partition, u16);
        field_push!(f, sequence, self.sequence, u64);
        field_push!(f, delivery_id, self.delivery_id, u64);
        field_push!(f, attempt, self.attempt, u16);
        field_push!(f, ownership_epoch, self.ownership_epoch, u64);
        field_push!(f, producer_id, self.producer_id, u64);
        field_push!(f, producer_seq, self.producer_seq, u64);
        field_push!(f, flags, self.flags, MsgFlags);
        field_push!(f, key, self.key, bytes16);
        field_push!(f, value, self.value, bytes32);
        if let Some(o) = &self.origin {
            field_push!(f, origin_topic_id, o.origin_topic_id, u16);
            field_push!(f, origin_partition, o.origin_partition, u16);
            field_push!(f, origin_sequence, o.origin_sequence, u64);
            field_push!(f, attempts, o.attempts, u16);
            field_push!(f, reason, o.reason, u8);
        }
    }
}

/// Names one delivery (one send of one record to one member): the fields MSG carries
/// and ACK and NACK echo. The coordinator finds deliveries by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeliveryRef {
    pub subscription_id: u16,
    pub topic_id: u16,
    pub partition: u16,
    pub sequence: u64,
    pub delivery_id: u64,
    pub ownership_epoch: u64,
}

impl DeliveryRef {
    /// The ACK that settles this delivery (with PROGRESS it only extends the deadline).
    pub fn ack(&self, flags: AckFlags) -> Ack {
        Ack {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            seq: self.sequence,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
            flags,
        }
    }

    /// The NACK of this delivery.
    pub fn nack(&self, reason: NackReason) -> Nack {
        Nack {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            seq: self.sequence,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
            reason: reason.as_code(),
            flags: 0,
        }
    }
}

impl Ack {
    pub fn delivery_ref(&self) -> DeliveryRef {
        DeliveryRef {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            sequence: self.seq,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
        }
    }
}

impl Nack {
    pub fn delivery_ref(&self) -> DeliveryRef {
        DeliveryRef {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            sequence: self.seq,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
        }
    }
}

impl<'a> Msg<'a> {
    /// The MSG of `delivery`'s `attempt` for a record with these producer fields, key,
    /// value and origin.
    pub fn of(delivery: &DeliveryRef, attempt: u16, record: MsgRecord<'a>) -> Msg<'a> {
        Msg {
            subscription_id: delivery.subscription_id,
            topic_id: delivery.topic_id,
            partition: delivery.partition,
            sequence: delivery.sequence,
            delivery_id: delivery.delivery_id,
            attempt,
            ownership_epoch: delivery.ownership_epoch,
            producer_id: record.producer_id,
            producer_seq: record.producer_seq,
            flags: MsgFlags::empty(),
            key: record.key,
            value: record.value,
            origin: record.origin,
        }
    }

    pub fn delivery_ref(&self) -> DeliveryRef {
        DeliveryRef {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            sequence: self.sequence,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
        }
    }
}

/// The record half of a MSG: what the log supplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsgRecord<'a> {
    pub producer_id: u64,
    pub producer_seq: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub origin: Option<Origin>,
}

impl Origin {
    pub fn reason(&self) -> Option<OriginReason> {
        OriginReason::from_code(self.reason)
    }
}

/// A typed OK result (`man/mortarmq.7`, OK: exact sizes in v0; extra bytes from later
/// versions are ignored when decoding).
pub trait OkResult: Sized {
    const REQUEST_OP: Op;
    const ENCODED_BYTES: usize;
    fn decode_result(result: &[u8]) -> Result<Self, DecodeError>;
    fn encode_result(&self, out: &mut Vec<u8>);
    fn result_fields(&self) -> Vec<(&'static str, Field<'static>)>;
}

macro_rules! ok_result {
    ($(#[$meta:meta])* $name:ident for $op:ident, $bytes:literal {
        $( $(#[$fmeta:meta])* $field:ident : $kind:ident ),* $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $kind, )*
        }

        impl OkResult for $name {
            const REQUEST_OP: Op = Op::$op;
            const ENCODED_BYTES: usize = $bytes;

            fn decode_result(result: &[u8]) -> Result<Self, DecodeError> {
                let mut r = Reader::new(result);
                let decoded = (|| -> Result<Self, Short> {
                    Ok($name { $( $field: field_read!(r, $kind), )* })
                })();
                decoded.map_err(|s| DecodeError {
                    op: Op::Ok as u8,
                    offset: s.offset,
                    need: s.need,
                })
            }

            fn encode_result(&self, out: &mut Vec<u8>) {
                $( field_write!(out, self.$field, $kind); )*
            }

            #[allow(clippy::vec_init_then_push)]
            fn result_fields(&self) -> Vec<(&'static str, Field<'static>)> {
                let mut f = Vec::new();
                $( field_push!(f, $field, self.$field, $kind); )*
                f
            }
        }
    };
}

ok_result! {
    /// OK result of DECLARE: 5 bytes.
    DeclareResult for Declare, 5 {
        topic_id: u16,
        partition_count: u16,
        /// [`DeclareCreated`](super::vocab::DeclareCreated) code.
        created: u8,
    }
}

ok_result! {
    /// OK result of PUB: 26 bytes.
    PubResult for Pub, 26 {
        sequence: u64,
        /// [`Durability`](super::vocab::Durability) code reached.
        durability: u8,
        leader_epoch: u64,
        commit_seq: u64,
        result_flags: PubResultFlags,
    }
}

ok_result! {
    /// OK result of SUB: 18 bytes.
    SubResult for Sub, 18 {
        subscription_id: u16,
        member_id: u64,
        membership_epoch: u32,
        assignment_epoch: u32,
    }
}

ok_result! {
    /// OK result of CREDIT: 20 bytes.
    CreditResult for Credit, 20 {
        granted_count: u16,
        granted_bytes: u32,
        outstanding_count: u16,
        outstanding_bytes: u32,
        credit_epoch: u64,
    }
}

/// Appends an OK frame whose result is `result`'s encoding.
pub fn encode_ok_with<R: OkResult>(out: &mut Vec<u8>, result: &R) {
    let start = begin_frame(out, Op::Ok);
    out.put_u8(R::REQUEST_OP as u8);
    out.put_u32(R::ENCODED_BYTES as u32);
    result.encode_result(out);
    debug_assert_eq!(
        out.len() - start,
        FRAME_HEADER_BYTES + 1 + 1 + 4 + R::ENCODED_BYTES
    );
    end_frame(out, start);
}

/// Appends an OK frame with an empty result (CONNECT, PING, ACK, NACK, PULL, …).
pub fn encode_ok_empty(out: &mut Vec<u8>, request_op: u8) {
    OkFrame {
        request_op,
        result: &[],
    }
    .encode_frame(out);
}

/// Appends an ERR frame. The message is cut to MAX_ERR_MESSAGE_BYTES on a character
/// boundary, so a long diagnostic can never make an invalid frame.
pub fn encode_err(out: &mut Vec<u8>, code: super::ErrorCode, request_op: u8, message: &str) {
    ErrFrame {
        code: code.code(),
        request_op,
        message: err_message_sent(message).as_bytes(),
    }
    .encode_frame(out);
}

/// The part of an ERR diagnostic that is sent: at most MAX_ERR_MESSAGE_BYTES, cut on a
/// character boundary.
pub fn err_message_sent(message: &str) -> &str {
    let mut end = message.len().min(MAX_ERR_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// Any decoded frame. The single `match op` of the codec lives in [`Frame::decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Connect(Connect<'a>),
    Declare(Declare<'a>),
    Pub(Pub<'a>),
    Sub(Sub<'a>),
    Ack(Ack),
    Nack(Nack),
    Ping(Ping),
    Err(ErrFrame<'a>),
    Ok(OkFrame<'a>),
    Msg(Msg<'a>),
    Pull(Pull),
    Heartbeat(Heartbeat),
    Notice(Notice),
    ControlAck(ControlAck),
    Credit(Credit),
}

macro_rules! each_frame {
    ($self:expr, $m:ident => $body:expr) => {
        match $self {
            Frame::Connect($m) => $body,
            Frame::Declare($m) => $body,
            Frame::Pub($m) => $body,
            Frame::Sub($m) => $body,
            Frame::Ack($m) => $body,
            Frame::Nack($m) => $body,
            Frame::Ping($m) => $body,
            Frame::Err($m) => $body,
            Frame::Ok($m) => $body,
            Frame::Msg($m) => $body,
            Frame::Pull($m) => $body,
            Frame::Heartbeat($m) => $body,
            Frame::Notice($m) => $body,
            Frame::ControlAck($m) => $body,
            Frame::Credit($m) => $body,
        }
    };
}

impl<'a> Frame<'a> {
    pub fn decode(op: Op, payload: &'a [u8]) -> Result<Frame<'a>, DecodeError> {
        Ok(match op {
            Op::Connect => Frame::Connect(Message::decode(payload)?),
            Op::Declare => Frame::Declare(Message::decode(payload)?),
            Op::Pub => Frame::Pub(Message::decode(payload)?),
            Op::Sub => Frame::Sub(Message::decode(payload)?),
            Op::Ack => Frame::Ack(Message::decode(payload)?),
            Op::Nack => Frame::Nack(Message::decode(payload)?),
            Op::Ping => Frame::Ping(Message::decode(payload)?),
            Op::Err => Frame::Err(Message::decode(payload)?),
            Op::Ok => Frame::Ok(Message::decode(payload)?),
            Op::Msg => Frame::Msg(Message::decode(payload)?),
            Op::Pull => Frame::Pull(Message::decode(payload)?),
            Op::Heartbeat => Frame::Heartbeat(Message::decode(payload)?),
            Op::Notice => Frame::Notice(Message::decode(payload)?),
            Op::ControlAck => Frame::ControlAck(Message::decode(payload)?),
            Op::Credit => Frame::Credit(Message::decode(payload)?),
        })
    }

    pub fn op(&self) -> Op {
        fn op_of<'b, M: Message<'b>>(_: &M) -> Op {
            M::OP
        }
        each_frame!(self, m => op_of(m))
    }

    /// Appends the whole frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        each_frame!(self, m => m.encode_frame(out))
    }

    /// The fields in byte order with their spec names (`key_len` before `key`).
    pub fn fields(&self) -> Vec<(&'static str, Field<'a>)> {
        let mut f = Vec::new();
        each_frame!(self, m => m.push_fields(&mut f));
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::split_frame;
    use crate::wire::limits::MAX_FRAME_LEN_BYTES;

    fn round_trip(frame: &Frame<'_>) -> Vec<u8> {
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        let raw = split_frame(&bytes, MAX_FRAME_LEN_BYTES).unwrap().unwrap();
        assert_eq!(raw.total_bytes, bytes.len());
        let op = Op::from_u8(raw.op).unwrap();
        assert_eq!(&Frame::decode(op, raw.payload).unwrap(), frame);
        bytes
    }

    #[test]
    fn frame_size_constants_match_the_encodings() {
        let mut out = Vec::new();
        Msg::default().encode_frame(&mut out);
        assert_eq!(out.len(), MSG_FRAME_FIXED_BYTES);
        out.clear();
        encode_ok_empty(&mut out, Op::Pull as u8);
        assert_eq!(out.len(), OK_EMPTY_FRAME_BYTES);
        out.clear();
        encode_err(&mut out, crate::wire::ErrorCode::InvalidArgument, 3, "");
        assert_eq!(out.len(), ERR_FRAME_FIXED_BYTES);
    }

    #[test]
    fn ping_is_five_bytes() {
        assert_eq!(round_trip(&Frame::Ping(Ping {})), vec![0, 0, 0, 1, 0x07]);
    }

    #[test]
    fn pub_borrows_key_and_value_from_the_frame() {
        let mut bytes = Vec::new();
        Pub {
            topic_id: 1,
            key: b"k",
            value: b"hello",
            ..Default::default()
        }
        .encode_frame(&mut bytes);
        let raw = split_frame(&bytes, MAX_FRAME_LEN_BYTES).unwrap().unwrap();
        let Frame::Pub(p) = Frame::decode(Op::Pub, raw.payload).unwrap() else {
            panic!()
        };
        let range = bytes.as_ptr_range();
        assert!(range.contains(&p.value.as_ptr()) && range.contains(&p.key.as_ptr()));
    }

    #[test]
    fn every_truncation_is_malformed_and_a_tail_is_ignored() {
        let mut bytes = Vec::new();
        let sub = Sub {
            group: b"billing",
            topic_id: 3,
            partition: 0xFFFF,
            ..Default::default()
        };
        sub.encode_payload(&mut bytes);
        for cut in 0..bytes.len() {
            let err = Sub::decode(&bytes[..cut]).unwrap_err();
            assert_eq!(err.op, Op::Sub as u8);
        }
        bytes.extend_from_slice(&[9, 9, 9]);
        assert_eq!(Sub::decode(&bytes).unwrap(), sub);
    }

    #[test]
    fn msg_origin_flag_follows_the_trailer() {
        let origin = Origin {
            origin_topic_id: 1,
            origin_sequence: 7,
            attempts: 5,
            reason: 1,
            ..Default::default()
        };
        let msg = Frame::Msg(Msg {
            flags: MsgFlags::ORIGIN,
            value: b"v",
            origin: Some(origin),
            ..Default::default()
        });
        let bytes = round_trip(&msg);
        // A MSG that claims a trailer but lacks it is malformed.
        let short = &bytes[5..bytes.len() - 1];
        assert!(Msg::decode(short).is_err());
    }

    #[test]
    fn ok_results_have_their_exact_sizes() {
        fn size<R: OkResult + Default>() -> usize {
            let mut out = Vec::new();
            R::default().encode_result(&mut out);
            assert_eq!(out.len(), R::ENCODED_BYTES);
            out.len()
        }
        assert_eq!(size::<DeclareResult>(), 5);
        assert_eq!(size::<PubResult>(), 26);
        assert_eq!(size::<SubResult>(), 18);
        assert_eq!(size::<CreditResult>(), 20);
    }

    #[test]
    fn err_message_is_capped() {
        let mut out = Vec::new();
        let long = "é".repeat(MAX_ERR_MESSAGE_BYTES);
        encode_err(&mut out, crate::wire::ErrorCode::InternalError, 3, &long);
        let Frame::Err(e) = Frame::decode(Op::Err, &out[5..]).unwrap() else {
            panic!()
        };
        assert!(e.message.len() <= MAX_ERR_MESSAGE_BYTES);
        assert!(std::str::from_utf8(e.message).is_ok());
    }

    #[test]
    fn pull_list_count_cannot_outrun_the_payload() {
        let mut bytes = Vec::new();
        Pull {
            ownership_epochs: vec![1, 2],
            max_msgs: 1,
            ..Default::default()
        }
        .encode_payload(&mut bytes);
        // Claim 65535 entries: must be MALFORMED, not a giant allocation.
        bytes[18..20].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(Pull::decode(&bytes).is_err());
    }
}
