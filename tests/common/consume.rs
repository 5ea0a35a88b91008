//! Reading a topic back as a plain group member, for tests that check what survived.
#![allow(dead_code)]

use std::time::Duration;

use mortarmq::client::{Client, Delivery, Push};
use mortarmq::wire::ops::{ControlAck, Frame, Sub};
use mortarmq::wire::{AckFlags, ControlResult};

/// How long the stream may stay quiet before everything is taken to have arrived.
const QUIET: Duration = Duration::from_millis(1500);

/// Every record the broker delivers to a fresh group `g` on every partition of `topic`,
/// acknowledged, until it goes quiet: (sequence, value).
pub fn consume_all(c: &mut Client, topic: u16) -> Vec<(u64, Vec<u8>)> {
    c.request(&Frame::Sub(Sub {
        group: b"g",
        topic_id: topic,
        partition: 0xFFFF,
        ..Sub::default()
    }))
    .unwrap();
    c.set_read_timeout(Some(QUIET)).unwrap();
    let mut got = Vec::new();
    while let Ok(push) = c.next_push() {
        match push {
            Push::Notice(n) => {
                let ok = ControlAck::answering(&n, ControlResult::Ok);
                c.request(&Frame::ControlAck(ok)).unwrap();
            }
            Push::Msg(m) => {
                c.request(&Frame::Ack(m.ack(AckFlags::empty()))).unwrap();
                got.push((m.sequence, m.value));
            }
        }
    }
    got
}

/// Answers the group's NOTICEs (ASSIGNs) and returns the first `n` MSGs, each within
/// `timeout` of the push before it.
pub fn receive(c: &mut Client, n: usize, timeout: Duration) -> Vec<Delivery> {
    c.set_read_timeout(Some(timeout)).unwrap();
    let mut got = Vec::new();
    while got.len() < n {
        match c.next_push().expect("a push within the timeout") {
            Push::Notice(notice) => {
                let answer = ControlAck::answering(&notice, ControlResult::Ok);
                c.request(&Frame::ControlAck(answer)).unwrap();
            }
            Push::Msg(m) => got.push(m),
        }
    }
    got
}
