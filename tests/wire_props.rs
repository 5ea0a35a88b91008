//! Properties of the codec: decode(encode(m)) == m for random messages of every op, and
//! the splitter and decoders never panic on arbitrary bytes, whole or split anywhere.

use mortarmq::wire::frame::{classify_op, split_frame, OpClass};
use mortarmq::wire::limits::MAX_FRAME_LEN_BYTES;
use mortarmq::wire::ops::*;
use mortarmq::wire::{AckFlags, DeclareFlags, MsgFlags, PubFlags, SubFlags};
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Every op's message, with owned bytes so the strategy can hand them out.
#[derive(Debug, Clone)]
struct Owned {
    op: u8,
    ints: Vec<u64>,
    a: Vec<u8>,
    b: Vec<u8>,
    list: Vec<u64>,
    origin: Option<Origin>,
}

fn owned() -> impl Strategy<Value = Owned> {
    (
        1u8..=15,
        proptest::collection::vec(any::<u64>(), 12),
        bytes(300),
        bytes(600),
        proptest::collection::vec(any::<u64>(), 0..8),
        any::<bool>(),
    )
        .prop_map(|(op, ints, a, b, list, has_origin)| Owned {
            op,
            ints,
            a,
            b,
            list,
            origin: has_origin.then_some(Origin {
                origin_topic_id: 7,
                origin_partition: 1,
                origin_sequence: 99,
                attempts: 5,
                reason: 1,
            }),
        })
}

fn build(o: &Owned) -> Frame<'_> {
    let i = |k: usize| o.ints[k];
    let key = &o.a[..o.a.len().min(255)];
    match Op::from_u8(o.op).unwrap() {
        Op::Connect => Frame::Connect(Connect {
            protocol_version: i(0) as u8,
            client_flags: i(1) as u16,
            token: &o.a,
            reserved: i(2) as u32,
        }),
        Op::Declare => Frame::Declare(Declare {
            topic: &o.a,
            partition_count: i(0) as u16,
            flags: DeclareFlags::from_bits_retain(i(1) as u16),
        }),
        Op::Pub => Frame::Pub(Pub {
            topic_id: i(0) as u16,
            partition: i(1) as u16,
            producer_id: i(2),
            producer_seq: i(3),
            flags: PubFlags::from_bits_retain(i(4) as u16),
            key,
            value: &o.b,
        }),
        Op::Sub => Frame::Sub(Sub {
            group: &o.a,
            topic_id: i(0) as u16,
            partition: i(1) as u16,
            start_policy: i(2) as u8,
            credit_count: i(3) as u16,
            credit_bytes: i(4) as u32,
            flags: SubFlags::from_bits_retain(i(5) as u16),
        }),
        Op::Ack => Frame::Ack(Ack {
            subscription_id: i(0) as u16,
            topic_id: i(1) as u16,
            partition: i(2) as u16,
            seq: i(3),
            delivery_id: i(4),
            ownership_epoch: i(5),
            flags: AckFlags::from_bits_retain(i(6) as u16),
        }),
        Op::Nack => Frame::Nack(Nack {
            subscription_id: i(0) as u16,
            topic_id: i(1) as u16,
            partition: i(2) as u16,
            seq: i(3),
            delivery_id: i(4),
            ownership_epoch: i(5),
            reason: i(6) as u8,
            flags: i(7) as u16,
        }),
        Op::Ping => Frame::Ping(Ping {}),
        Op::Err => Frame::Err(ErrFrame {
            code: i(0) as u16,
            request_op: i(1) as u8,
            message: &o.a,
        }),
        Op::Ok => Frame::Ok(OkFrame {
            request_op: i(0) as u8,
            result: &o.b,
        }),
        Op::Msg => Frame::Msg(Msg {
            subscription_id: i(0) as u16,
            topic_id: i(1) as u16,
            partition: i(2) as u16,
            sequence: i(3),
            delivery_id: i(4),
            attempt: i(5) as u16,
            ownership_epoch: i(6),
            producer_id: i(7),
            producer_seq: i(8),
            flags: if o.origin.is_some() {
                MsgFlags::ORIGIN
            } else {
                MsgFlags::empty()
            },
            key,
            value: &o.b,
            origin: o.origin,
        }),
        Op::Pull => Frame::Pull(Pull {
            subscription_id: i(0) as u16,
            member_id: i(1),
            membership_epoch: i(2) as u32,
            assignment_epoch: i(3) as u32,
            ownership_epochs: o.list.clone(),
            max_msgs: i(4) as u16,
            max_bytes: i(5) as u32,
            wait_ms: i(6) as u16,
            min_bytes: i(7) as u32,
        }),
        Op::Heartbeat => Frame::Heartbeat(Heartbeat {
            subscription_id: i(0) as u16,
            member_id: i(1),
            membership_epoch: i(2) as u32,
            assignment_epoch: i(3) as u32,
            state: i(4) as u8,
        }),
        Op::Notice => Frame::Notice(Notice {
            notice_id: i(0),
            kind: i(1) as u8,
            group_id: i(2) as u16,
            membership_epoch: i(3) as u32,
            assignment_epoch: i(4) as u32,
            ownership_epoch: i(5),
            topic_id: i(6) as u16,
            partition: i(7) as u16,
            member_id: i(8),
        }),
        Op::ControlAck => Frame::ControlAck(ControlAck {
            notice_id: i(0),
            notice_kind: i(1) as u8,
            group_id: i(2) as u16,
            membership_epoch: i(3) as u32,
            assignment_epoch: i(4) as u32,
            ownership_epoch: i(5),
            result: i(6) as u8,
        }),
        Op::Credit => Frame::Credit(Credit {
            subscription_id: i(0) as u16,
            membership_epoch: i(1) as u32,
            ownership_epoch: i(2),
            mode: i(3) as u8,
            credit_count: i(4) as u16,
            credit_bytes: i(5) as u32,
            reserved: i(6) as u32,
        }),
    }
}

/// Splits frames off `buf` the way the reactor does, decoding each; never panics.
fn drain(buf: &[u8]) -> usize {
    let mut at = 0;
    let mut decoded = 0;
    while let Ok(Some(raw)) = split_frame(&buf[at..], MAX_FRAME_LEN_BYTES) {
        if let OpClass::Known(op) = classify_op(raw.op) {
            if Frame::decode(op, raw.payload).is_ok() {
                decoded += 1;
            }
        }
        at += raw.total_bytes;
    }
    decoded
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_of_encode_is_identity(o in owned()) {
        let frame = build(&o);
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        let raw = split_frame(&bytes, MAX_FRAME_LEN_BYTES).unwrap().unwrap();
        prop_assert_eq!(raw.total_bytes, bytes.len());
        let op = Op::from_u8(raw.op).unwrap();
        prop_assert_eq!(op, frame.op());
        prop_assert_eq!(Frame::decode(op, raw.payload).unwrap(), frame);
    }

    #[test]
    fn byte_at_a_time_equals_whole(o in owned()) {
        let mut bytes = Vec::new();
        build(&o).encode(&mut bytes);
        for cut in 0..bytes.len() {
            prop_assert_eq!(split_frame(&bytes[..cut], MAX_FRAME_LEN_BYTES), Ok(None));
        }
        prop_assert!(split_frame(&bytes, MAX_FRAME_LEN_BYTES).unwrap().is_some());
    }

    #[test]
    fn arbitrary_bytes_never_panic(garbage in bytes(4096)) {
        drain(&garbage);
        for op in Op::ALL {
            let _ = Frame::decode(op, &garbage);
        }
    }

    #[test]
    fn mutated_frames_never_panic(o in owned(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = Vec::new();
        build(&o).encode(&mut bytes);
        for (at, v) in flips {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        drain(&bytes);
    }
}
