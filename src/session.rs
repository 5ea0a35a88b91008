//! Per-connection protocol state: the CONNECT gate and the response slots.
//!
//! A client may pipeline; every request gets exactly one answer, in request order
//! (semantics §1). An answer that is ready while nothing older waits is encoded
//! straight into the output buffer; otherwise it takes a slot in [`Slots`] and goes out
//! when every older slot has been answered. Pushes (MSG, NOTICE) never take a slot.
//!
//! Depends on `wire` and on `broker::Answer` (what an answer is before it is bytes).

use std::collections::VecDeque;

use crate::broker::Answer;
use crate::wire::frame::{classify_op, OpClass};
use crate::wire::limits::{MAX_FRAME_LEN_BYTES, PREAUTH_FRAME_LEN_MAX_BYTES};
use crate::wire::ops::Op;
use crate::wire::ErrorCode;

/// What to do with a complete frame, by the check order of semantics §1 (length and
/// op 0x00/0xFF were already checked by the splitter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Decode and handle it.
    Handle(Op),
    /// A client's ERR: log it, never answer it.
    Ignore,
    /// Answer with this error (keep or close per the registry's After column).
    Refuse(ErrorCode, &'static str),
}

#[derive(Debug, Default)]
pub struct Session {
    pub connected: bool,
}

impl Session {
    /// The cap on `length` in force: small until CONNECT succeeds.
    pub fn frame_len_max(&self) -> u32 {
        if self.connected {
            MAX_FRAME_LEN_BYTES
        } else {
            PREAUTH_FRAME_LEN_MAX_BYTES
        }
    }

    pub fn admit(&self, op_byte: u8) -> Admit {
        let class = classify_op(op_byte);
        if !self.connected && !matches!(class, OpClass::Known(Op::Connect | Op::Ping | Op::Err)) {
            return Admit::Refuse(ErrorCode::NotConnected, "send CONNECT first");
        }
        match class {
            OpClass::Illegal => Admit::Refuse(ErrorCode::IllegalOp, "op 0x00 and 0xFF are illegal"),
            OpClass::Reserved => Admit::Refuse(ErrorCode::UnknownOp, "op is reserved in wire v1"),
            OpClass::Known(op) if op.is_server_only() => Admit::Refuse(
                ErrorCode::UnexpectedOp,
                "OK, MSG and NOTICE are sent by the server only",
            ),
            OpClass::Known(Op::Err) => Admit::Ignore,
            OpClass::Known(op) => Admit::Handle(op),
        }
    }
}

/// Tokens compared without an early exit, so the time taken does not tell an
/// attacker how much of a guess was right. The length still shows through the loop
/// count over the longer input; tokens are secrets of fixed format in practice.
pub fn token_matches(tokens: &[Vec<u8>], offered: &[u8]) -> bool {
    let mut any = 0u8;
    for token in tokens {
        any |= constant_time_eq(token, offered) as u8;
    }
    any == 1
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

enum Slot {
    Waiting,
    Ready(Answer),
}

/// The response slots of one connection, oldest first. Slot ids count queued slots
/// only: `head_id` is the id of the oldest, so an id maps to `queue[id - head_id]`.
#[derive(Default)]
pub struct Slots {
    head_id: u64,
    queue: VecDeque<Slot>,
}

impl Slots {
    /// The id a request handled now would get if its answer has to wait.
    pub fn next_id(&self) -> u64 {
        self.head_id + self.queue.len() as u64
    }

    /// Unanswered requests (for backpressure).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Answers the newest request now: straight to `out` unless an older one waits.
    pub fn answer_now(&mut self, answer: Answer, out: &mut Vec<u8>) {
        if self.queue.is_empty() {
            answer.encode(out);
        } else {
            self.queue.push_back(Slot::Ready(answer));
        }
    }

    /// Reserves the slot `next_id()` for an answer that comes later.
    pub fn wait(&mut self) -> u64 {
        self.queue.push_back(Slot::Waiting);
        self.next_id() - 1
    }

    /// Fills a waiting slot, then writes every answer that is now at the head.
    /// Returns false if the slot is unknown (already answered: a broker bug).
    pub fn fill(&mut self, id: u64, answer: Answer, out: &mut Vec<u8>) -> bool {
        let Some(index) = id.checked_sub(self.head_id) else {
            return false;
        };
        match self.queue.get_mut(index as usize) {
            Some(slot @ Slot::Waiting) => *slot = Slot::Ready(answer),
            _ => return false,
        }
        while let Some(Slot::Ready(_)) = self.queue.front() {
            if let Some(Slot::Ready(answer)) = self.queue.pop_front() {
                answer.encode(out);
            }
            self.head_id += 1;
        }
        if self.queue.is_empty() && self.queue.capacity() > SLOTS_IDLE_CAPACITY_MAX {
            self.queue = VecDeque::new();
        }
        true
    }

    /// Answers every waiting slot with `answer` (shutdown, close), in order.
    pub fn fill_all(&mut self, answer: &Answer, out: &mut Vec<u8>) {
        for id in self.head_id..self.next_id() {
            self.fill(id, answer.clone(), out);
        }
    }
}

/// A drained slot queue keeps at most this many entries' capacity, so a burst of
/// pipelining does not pin memory on an idle connection.
const SLOTS_IDLE_CAPACITY_MAX: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(op: u8) -> Answer {
        Answer::Ok { request_op: op }
    }

    fn encoded(answers: &[Answer]) -> Vec<u8> {
        let mut out = Vec::new();
        for a in answers {
            a.encode(&mut out);
        }
        out
    }

    #[test]
    fn answers_leave_in_request_order_even_when_filled_out_of_order() {
        let mut slots = Slots::default();
        let mut out = Vec::new();
        let a = slots.wait();
        slots.answer_now(ok(7), &mut out);
        let b = slots.wait();
        assert!(out.is_empty(), "nothing passes a waiting slot");
        assert!(slots.fill(b, ok(3), &mut out));
        assert!(out.is_empty());
        assert!(slots.fill(a, ok(2), &mut out));
        assert_eq!(out, encoded(&[ok(2), ok(7), ok(3)]));
        assert!(slots.is_empty());
        assert!(!slots.fill(a, ok(2), &mut out), "a slot is answered once");
        slots.answer_now(ok(1), &mut out);
        assert_eq!(out, encoded(&[ok(2), ok(7), ok(3), ok(1)]));
    }

    #[test]
    fn the_gate_follows_the_check_order() {
        let fresh = Session::default();
        assert_eq!(fresh.admit(0x07), Admit::Handle(Op::Ping));
        assert_eq!(fresh.admit(0x01), Admit::Handle(Op::Connect));
        assert_eq!(fresh.admit(0x08), Admit::Ignore);
        // Before CONNECT, even a reserved op is NOT_CONNECTED (checked first).
        assert!(matches!(
            fresh.admit(0x10),
            Admit::Refuse(ErrorCode::NotConnected, _)
        ));
        assert!(matches!(
            fresh.admit(0x03),
            Admit::Refuse(ErrorCode::NotConnected, _)
        ));
        let on = Session { connected: true };
        assert!(matches!(
            on.admit(0x10),
            Admit::Refuse(ErrorCode::UnknownOp, _)
        ));
        assert!(matches!(
            on.admit(0x09),
            Admit::Refuse(ErrorCode::UnexpectedOp, _)
        ));
        assert!(matches!(
            on.admit(0x0A),
            Admit::Refuse(ErrorCode::UnexpectedOp, _)
        ));
        assert_eq!(on.admit(0x03), Admit::Handle(Op::Pub));
        assert_eq!(fresh.frame_len_max(), PREAUTH_FRAME_LEN_MAX_BYTES);
        assert_eq!(on.frame_len_max(), MAX_FRAME_LEN_BYTES);
    }

    #[test]
    fn tokens_match_exactly() {
        let tokens = vec![b"s3cret".to_vec(), b"other".to_vec()];
        assert!(token_matches(&tokens, b"s3cret"));
        assert!(token_matches(&tokens, b"other"));
        assert!(!token_matches(&tokens, b"s3cre"));
        assert!(!token_matches(&tokens, b"s3cret!"));
        assert!(!token_matches(&tokens, b""));
        assert!(!token_matches(&[], b"x"));
    }
}
