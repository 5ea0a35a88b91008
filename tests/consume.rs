//! The consume plane over real TCP (issue 5): SUB → ASSIGN → CONTROL_ACK → MSG → ACK,
//! redelivery, dead letters, PULL, rebalancing and positions across restarts.

mod common;

use std::time::Duration;

use common::mortard::Mortard;
use mortarmq::client::{Client, Delivery, Push};
use mortarmq::wire::ops::*;

pub fn sub(c: &mut Client, group: &str, topic_id: u16, flags: u16) -> SubResult {
    c.request(&Frame::Sub(Sub {
        group: group.as_bytes(),
        topic_id,
        partition: 0xFFFF,
        start_policy: 0,
        credit_count: 0,
        credit_bytes: 0,
        flags,
    }))
    .unwrap()
    .typed()
    .unwrap()
}

/// Acknowledges every ASSIGN until `n` partitions are held; returns the notices.
pub fn accept_assignments(c: &mut Client, n: usize) -> Vec<Notice> {
    let mut held = Vec::new();
    while held.len() < n {
        match c.next_push().unwrap() {
            Push::Notice(notice) => {
                c.request(&Frame::ControlAck(ControlAck {
                    notice_id: notice.notice_id,
                    notice_kind: notice.kind,
                    group_id: notice.group_id,
                    membership_epoch: notice.membership_epoch,
                    assignment_epoch: notice.assignment_epoch,
                    ownership_epoch: notice.ownership_epoch,
                    result: 0,
                }))
                .unwrap();
                if notice.kind == 0 {
                    held.push(notice);
                }
            }
            Push::Msg(m) => panic!("MSG before ASSIGN was acknowledged: {m:?}"),
        }
    }
    held
}

pub fn next_msg(c: &mut Client) -> Delivery {
    match c.next_push().unwrap() {
        Push::Msg(m) => m,
        Push::Notice(n) => panic!("unexpected notice {n:?}"),
    }
}

pub fn ack(c: &mut Client, m: &Delivery) -> mortarmq::client::Result<mortarmq::client::Reply> {
    c.request(&Frame::Ack(Ack {
        subscription_id: m.subscription_id,
        topic_id: m.topic_id,
        partition: m.partition,
        seq: m.sequence,
        delivery_id: m.delivery_id,
        ownership_epoch: m.ownership_epoch,
        flags: 0,
    }))
}

#[test]
fn sub_assign_control_ack_msg_ack_flow() {
    let broker = Mortard::start(&[]);
    let mut producer = broker.client();
    let topic = producer.declare("flow", 2, 0).unwrap().topic_id;
    for i in 0..10u8 {
        producer
            .publish_value(topic, u16::from(i % 2), &[i], 2)
            .unwrap();
    }
    let mut consumer = broker.client();
    consumer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let r = sub(&mut consumer, "billing", topic, 0);
    assert_eq!(
        (r.subscription_id, r.member_id, r.assignment_epoch),
        (1, 1, 0)
    );
    let held = accept_assignments(&mut consumer, 2);
    assert_eq!(held[0].assignment_epoch, 1);
    let mut seen = Vec::new();
    for _ in 0..10 {
        let m = next_msg(&mut consumer);
        assert_eq!(m.attempt, 1);
        ack(&mut consumer, &m).unwrap();
        seen.push(m.value[0]);
    }
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<u8>>());
    // New records flow to the member as they are published.
    producer.publish_value(topic, 0, b"late", 1).unwrap();
    let m = next_msg(&mut consumer);
    assert_eq!(m.value, b"late");
}
