//! The producer's pipeline: records written, answers read in order, and what happens to
//! a record the broker refused or whose connection was lost.
//!
//! [`refusal`] is the one place that turns an ERR answering a PUB into an action, from
//! the registry's retry class. Following NOT_LEADER to another broker (replication) is
//! a [`Route`] taken once the connection's records are answered ([`Producer::resend`]),
//! then an address change in [`Producer::reconnect`].

use std::time::{Duration, Instant};

use crate::wire::errors::Retry;
use crate::wire::limits::{FRAME_HEADER_BYTES, OP_BYTES};
use crate::wire::ops::{Frame, Message, OkResult, Pub, PubResult};
use crate::wire::{Durability, ErrorCode, Op, PubFlags, PubResultFlags};

use super::super::brokers::{self, Route};
use super::super::conn::{answer_to, Conn, FrameAt};
use super::super::error::{Error, Result};
use super::{new_producer_id, Producer, Receipt, SendHandle};

/// The registry's advice for BACKPRESSURE: 10 ms doubling to 1 s.
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A broker that refuses connections is asked again after this, doubling to BACKOFF_MAX.
const RECONNECT_BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// Queued records are written once this many bytes wait, without waiting for a read.
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// The producer_seq the next record of (topic, partition) takes, 1 for the first.
fn next_seq_mut(seqs: &mut Vec<Vec<u64>>, topic_id: u16, partition: u16) -> &mut u64 {
    let (t, p) = (usize::from(topic_id), usize::from(partition));
    if seqs.len() <= t {
        seqs.resize_with(t + 1, Vec::new);
    }
    let topic = &mut seqs[t];
    if topic.len() <= p {
        topic.resize(p + 1, 1);
    }
    &mut topic[p]
}

/// Sleeps the `n`-th backoff (0-based).
pub(super) fn backoff(n: u32) {
    std::thread::sleep(backoff_delay(BACKOFF_FIRST, n));
}

fn backoff_delay(first: Duration, n: u32) -> Duration {
    first.saturating_mul(1 << n.min(16)).min(BACKOFF_MAX)
}

/// A record between `send` and its answer.
pub(super) struct Pending {
    topic_id: u16,
    partition: u16,
    flags: PubFlags,
    /// Bytes of its PUB in the outbox, while in flight.
    len: usize,
    /// Its PUB while it waits to be resent (re-encoded when renumbered).
    frame: Vec<u8>,
    pub(super) handle: SendHandle,
    /// A `publish` waits for it: its failure is reported there, not by `flush`.
    awaited: bool,
    pid: u64,
    seq: u64,
    /// First-send order, kept across resends.
    order: u64,
    /// Behind a hole and not appended: take a fresh producer_seq when sent again.
    renumber: bool,
    backoffs: u32,
    first_sent: Instant,
    /// Why it is being resent; `outcome_unknown` when it may have been appended.
    error: Option<Error>,
    outcome_unknown: bool,
}

impl Pending {
    /// A record whose PUB (`len` bytes) was just encoded into the outbox.
    pub(super) fn new(
        (topic_id, partition): (u16, u16),
        (pid, seq): (u64, u64),
        flags: PubFlags,
        len: usize,
        (handle, awaited): (SendHandle, bool),
        now: Instant,
    ) -> Pending {
        Pending {
            topic_id,
            partition,
            flags,
            len,
            frame: Vec::new(),
            handle,
            awaited,
            pid,
            seq,
            order: u64::MAX,
            renumber: false,
            backoffs: 0,
            first_sent: now,
            error: None,
            outcome_unknown: false,
        }
    }

    /// Encodes its kept PUB again, with its current producer fields.
    fn encode_renumbered(&self, out: &mut Vec<u8>) {
        let payload = &self.frame[FRAME_HEADER_BYTES + OP_BYTES..];
        let Ok(Frame::Pub(p)) = Frame::decode(Op::Pub, payload) else {
            unreachable!("a Pending keeps the PUB it encoded")
        };
        Pub {
            producer_id: self.pid,
            producer_seq: self.seq,
            flags: self.flags,
            ..p
        }
        .encode_frame(out);
    }

    /// How long to wait before resending it: the cluster's backoff after a cluster's
    /// refusal (`man/mortarmq.7`, REPLICATION), else the registry's for BACKPRESSURE.
    fn backoff_wait(&self) -> Duration {
        let Some(n) = self.backoffs.checked_sub(1) else {
            return Duration::ZERO;
        };
        match self.error.as_ref().map(brokers::route) {
            Some(Route::MoveOn) => brokers::cluster_backoff(n),
            _ => backoff_delay(BACKOFF_FIRST, n),
        }
    }

    fn same_stream(&self, other: &Pending) -> bool {
        self.pid == other.pid
            && self.topic_id == other.topic_id
            && self.partition == other.partition
    }
}

/// What to do with a record the broker refused with a connection-keeping ERR.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Send it again as it is after a backoff: refused for now (BACKPRESSURE and the
    /// like, not appended), or answered INTERNAL_ERROR (outcome unknown) by a broker
    /// that may answer every resend the same way (a failed disk refuses writes until a
    /// restart): resent at full speed, that was a storm of resends until the timeout.
    Backoff,
    /// Send it again as it is at once (it waits behind a resend).
    Resend,
    /// It failed for good; it leaves a hole in its partition's producer_seqs.
    Fail,
    /// It failed, and this producer's sequence state is not the broker's: a new
    /// producer_id (the registry's advice for SEQUENCE_OUT_OF_ORDER).
    FailNewProducer,
}

/// The registry's retry class, applied to a PUB. `behind` says the record was refused
/// only because an earlier record of its partition was.
fn refusal(code: ErrorCode, behind: bool, idempotent: bool) -> Refusal {
    match (code, code.retry()) {
        (ErrorCode::SequenceOutOfOrder, _) if behind => Refusal::Resend,
        (ErrorCode::SequenceOutOfOrder, _) => Refusal::FailNewProducer,
        (_, Retry::Backoff) => Refusal::Backoff,
        (_, Retry::Idempotent) if idempotent => Refusal::Backoff,
        _ => Refusal::Fail,
    }
}

/// Whether a broker error answers a PUB (SHUTTING_DOWN at a drain answers no request:
/// its `request_op` is 0).
fn answers_pub(e: &Error) -> bool {
    matches!(e, Error::Broker { request_op, .. } if *request_op == Op::Pub as u8)
}

/// An OK or ERR with nothing in flight: the broker's goodbye, or a protocol breach.
fn unsolicited(op: Op, payload: &[u8]) -> Error {
    match answer_to(Op::Pub, op, payload) {
        Err(e) if e.closes_connection() => e,
        _ => Error::Protocol(format!("{} answering nothing", op.name())),
    }
}

/// The receipt in an answer to PUB, or the ERR it carries.
fn receipt(op: Op, payload: &[u8], partition: u16) -> Result<Receipt> {
    let result = answer_to(Op::Pub, op, payload)?;
    let r = PubResult::decode_result(result).map_err(|e| Error::Protocol(e.to_string()))?;
    let durability = Durability::from_code(r.durability)
        .ok_or_else(|| Error::Protocol(format!("PUB answered durability {}", r.durability)))?;
    Ok(Receipt {
        partition,
        sequence: r.sequence,
        durability,
        leader_epoch: r.leader_epoch,
        commit_seq: r.commit_seq,
        deduplicated: r.result_flags.contains(PubResultFlags::DEDUPLICATED),
    })
}

impl Producer {
    /// Works until `done`: writes, reads answers, reconnects, resends. `Err` when the
    /// broker stayed out of reach for the retry timeout (the records waiting for it
    /// have failed with it).
    pub(super) fn pump(&mut self, done: &dyn Fn(&Producer) -> bool) -> Result<()> {
        while !done(self) {
            if self.conn.is_none() {
                self.reconnect_or_fail()?;
            } else if !self.inflight.is_empty() {
                self.read_answers();
            } else if !self.retry.is_empty() {
                self.resend();
            } else if self.must_drain {
                self.must_drain = false;
            } else {
                break;
            }
        }
        Ok(())
    }

    /// The producer fields of the next record of a partition: (0, 0) when not
    /// idempotent.
    pub(super) fn number(&mut self, topic_id: u16, partition: u16) -> (u64, u64) {
        if !self.settings.idempotent {
            return (0, 0);
        }
        let next = next_seq_mut(&mut self.next_seq, topic_id, partition);
        *next += 1;
        (self.producer_id, *next - 1)
    }

    /// `p`, its PUB in the outbox, is in flight.
    pub(super) fn admit(&mut self, mut p: Pending) {
        if p.order == u64::MAX {
            p.order = self.order;
            self.order += 1;
        }
        self.inflight.push_back(p);
    }

    /// Queues the kept PUB of `p` again, renumbered first when it is behind a hole.
    fn write_again(&mut self, mut p: Pending) {
        if p.renumber {
            (p.pid, p.seq) = self.number(p.topic_id, p.partition);
            p.renumber = false;
            p.len = self.outbox.push(|out| p.encode_renumbered(out));
        } else {
            p.len = self.outbox.push(|out| out.extend_from_slice(&p.frame));
        }
        p.frame = Vec::new();
        self.admit(p);
    }

    /// Moves the PUB of `p`, the oldest in flight, out of the outbox and into `p`.
    fn take_out(&mut self, p: &mut Pending) {
        p.frame = self.outbox.front(p.len).to_vec();
        self.outbox.pop_front(p.len);
    }

    pub(super) fn write_if_batch_full(&mut self) {
        if self.outbox.unwritten().len() >= WRITE_BATCH_BYTES {
            self.write_queued();
        }
    }

    /// Writes the queued records; a failed write loses the connection (its records are
    /// resent by the next pump).
    pub(super) fn write_queued(&mut self) {
        let (Some(conn), unwritten) = (self.conn.as_mut(), self.outbox.unwritten()) else {
            return;
        };
        if unwritten.is_empty() {
            return;
        }
        match conn.write_bytes(unwritten) {
            Ok(()) => self.outbox.mark_written(),
            Err(e) => self.lose_connection(e),
        }
    }

    /// Waits for one answer (up to the timeout), then takes every answer already read.
    fn read_answers(&mut self) {
        self.write_queued();
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let deadline = Instant::now() + self.settings.timeout;
        let mut next = conn.next_frame(deadline, Duration::MAX);
        let lost = loop {
            match next {
                Ok(Some(f)) => {
                    if let Err(e) = self.take_answer(&conn, f) {
                        break Some(e);
                    }
                }
                Ok(None) => break Some(Error::Timeout("no answer from the broker".into())),
                Err(e) => break Some(e),
            }
            next = match conn.buffered() {
                Ok(None) => break None,
                other => other,
            };
        };
        self.now = Instant::now();
        match lost {
            None => self.conn = Some(conn),
            Some(e) => self.lose_connection(e),
        }
    }

    /// Settles the oldest record in flight with the answer `f`. `Err`: the connection
    /// is done for (the broker closes it after this ERR, or broke the protocol).
    fn take_answer(&mut self, conn: &Conn, f: FrameAt) -> Result<()> {
        let Some(mut p) = self.inflight.pop_front() else {
            return Err(unsolicited(f.op, conn.payload(f)));
        };
        match receipt(f.op, conn.payload(f), p.partition) {
            Ok(r) => {
                self.outbox.pop_front(p.len);
                self.settle(p.handle, Ok(r));
                self.brokers.served();
                Ok(())
            }
            Err(e) if e.code().is_none() || !answers_pub(&e) => {
                // Not this record's answer (the broker's goodbye at shutdown answers
                // no request), or unreadable: the record's outcome is unknown.
                self.inflight.push_front(p);
                Err(e)
            }
            Err(e) if e.closes_connection() => {
                self.take_out(&mut p);
                if e.retry() == Retry::No {
                    self.hole(&p);
                    self.fail(p, e.clone());
                } else {
                    p.backoffs += 1;
                    p.outcome_unknown = false;
                    p.error = Some(e.clone());
                    self.retry.push(p);
                }
                Err(e)
            }
            Err(e) => {
                self.take_out(&mut p);
                self.refused(p, e);
                Ok(())
            }
        }
    }

    /// A connection-keeping ERR answering `p`: resend it, or fail it.
    fn refused(&mut self, mut p: Pending, err: Error) {
        let code = err.code().expect("a broker error");
        let behind = p.renumber
            || self
                .retry
                .iter()
                .any(|r| r.same_stream(&p) && r.seq < p.seq);
        let route = brokers::route(&err);
        let action = match route {
            // Refused at the gate, not appended: as it is, to the leader named.
            Route::Follow(_) => Refusal::Resend,
            _ => refusal(code, behind, self.settings.idempotent),
        };
        // An outcome unknown with no leader able to serve backs off too (`refusal`).
        if route != Route::Stay && action != Refusal::Fail {
            self.reroute = Some(route);
        }
        if matches!(code, ErrorCode::UnknownTopic | ErrorCode::UnknownPartition) {
            // Deleted or recreated: look it up afresh next time.
            self.topics.clear();
            self.last_topic.0.clear();
        }
        p.outcome_unknown = code.retry() == Retry::Idempotent;
        p.error = Some(err.clone());
        match action {
            Refusal::Backoff => {
                p.backoffs += 1;
                self.retry.push(p);
            }
            Refusal::Resend => self.retry.push(p),
            Refusal::FailNewProducer => {
                self.producer_id = new_producer_id();
                self.next_seq.clear();
                self.fail(p, err);
            }
            Refusal::Fail => {
                self.hole(&p);
                self.fail(p, err);
            }
        }
    }

    /// `failed` was not appended: its producer_seq is a hole the broker never sees
    /// filled, so the later records of its partition are refused until renumbered.
    fn hole(&mut self, failed: &Pending) {
        if failed.pid == 0 || failed.renumber {
            return;
        }
        for p in self.inflight.iter_mut().chain(self.retry.iter_mut()) {
            if p.same_stream(failed) && p.seq > failed.seq {
                p.renumber = true;
            }
        }
        let key = (failed.topic_id, failed.partition);
        if failed.pid == self.producer_id {
            if let Some(next) = self
                .next_seq
                .get_mut(usize::from(key.0))
                .and_then(|t| t.get_mut(usize::from(key.1)))
            {
                *next = (*next).min(failed.seq);
            }
        }
        // New records wait until the doomed ones are answered, so they cannot overtake
        // them in the partition.
        self.must_drain = true;
    }

    fn fail(&mut self, p: Pending, err: Error) {
        if !p.awaited && self.unreported.is_none() {
            self.unreported = Some(err.clone());
        }
        self.settle(p.handle, Err(err));
    }

    /// Sends the records to resend, in their first-send order, after the longest
    /// backoff any of them asked for.
    fn resend(&mut self) {
        if let Some(route) = self.reroute.take() {
            // Nothing is in flight here any more: go where the broker said.
            if let Some(n) = self.brokers.take(&route) {
                std::thread::sleep(brokers::cluster_backoff(n));
            }
            self.conn = None;
            return;
        }
        let mut ps = std::mem::take(&mut self.retry);
        ps.sort_by_key(|p| p.order);
        // Nothing is in flight: the resent records go out ahead of any new one.
        self.must_drain = false;
        if let Some(wait) = ps.iter().map(Pending::backoff_wait).max() {
            std::thread::sleep(wait);
        }
        for p in ps {
            let expired = p.first_sent.elapsed() > self.settings.retry_timeout;
            match p.error.clone() {
                Some(e) if expired => self.give_up(p, e),
                _ if self.conn.is_none() => self.retry.push(p),
                _ => {
                    self.stats.resent += 1;
                    self.write_again(p);
                }
            }
        }
        self.write_queued();
    }

    /// `p` is out of time: it fails. If it may have been appended, neither reusing nor
    /// skipping its producer_seq is safe, so later records take a new producer_id.
    fn give_up(&mut self, p: Pending, err: Error) {
        if p.renumber || !p.outcome_unknown {
            self.hole(&p);
        } else if p.pid != 0 && p.pid == self.producer_id {
            self.producer_id = new_producer_id();
            self.next_seq.clear();
        }
        self.fail(p, err);
    }

    /// The connection is gone: what was in flight has an unknown outcome.
    fn lose_connection(&mut self, why: Error) {
        self.conn = None;
        match self.reroute.take() {
            Some(route) => _ = self.brokers.take(&route),
            // The broker may be gone: another is tried first.
            None => self.brokers.move_on(),
        }
        let mut lost: Vec<Pending> = self.inflight.drain(..).collect();
        for p in &mut lost {
            p.frame = self.outbox.take_front(p.len);
        }
        self.outbox.clear();
        for mut p in lost {
            if self.settings.idempotent {
                p.outcome_unknown = true;
                p.error = Some(why.clone());
                self.retry.push(p);
            } else {
                let e = Error::io(
                    std::io::ErrorKind::ConnectionAborted,
                    format!("{why}; the outcome is unknown and the producer is not idempotent"),
                );
                self.fail(p, e);
            }
        }
    }

    /// Connects again, backing off, until `deadline`.
    pub(super) fn reconnect(&mut self, deadline: Instant) -> Result<()> {
        let mut n = 0;
        loop {
            let s = &self.settings;
            let err = match Conn::open_to(&mut self.brokers, &s.token, s.timeout) {
                Ok(c) => {
                    self.conn = Some(c);
                    self.stats.reconnects += 1;
                    return Ok(());
                }
                Err(e) => e,
            };
            if !err.is_retryable() || Instant::now() >= deadline {
                return Err(err);
            }
            std::thread::sleep(backoff_delay(RECONNECT_BACKOFF_FIRST, n));
            n += 1;
        }
    }

    /// Reconnects for the records waiting to be resent; when the broker stays away past
    /// the retry timeout of the oldest, they all fail.
    fn reconnect_or_fail(&mut self) -> Result<()> {
        let oldest = self.retry.iter().map(|p| p.first_sent).min();
        let deadline = oldest.unwrap_or_else(Instant::now) + self.settings.retry_timeout;
        let err = match self.reconnect(deadline) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let mut ps = std::mem::take(&mut self.retry);
        ps.sort_by_key(|p| p.order);
        for p in ps {
            self.give_up(p, err.clone());
        }
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_follow_the_registry() {
        use ErrorCode::*;
        assert_eq!(refusal(Backpressure, false, true), Refusal::Backoff);
        assert_eq!(refusal(NotLeader, false, true), Refusal::Backoff);
        assert_eq!(refusal(InternalError, false, true), Refusal::Backoff);
        assert_eq!(refusal(InternalError, false, false), Refusal::Fail);
        assert_eq!(refusal(SequenceOutOfOrder, true, true), Refusal::Resend);
        assert_eq!(
            refusal(SequenceOutOfOrder, false, true),
            Refusal::FailNewProducer
        );
        assert_eq!(refusal(DurabilityUnavailable, false, true), Refusal::Fail);
        assert_eq!(refusal(UnknownTopic, false, true), Refusal::Fail);
    }

    #[test]
    fn a_cluster_refusal_backs_off_as_the_replication_spec_says() {
        let handle = SendHandle {
            slot: std::sync::Arc::default(),
        };
        let mut p = Pending::new(
            (1, 0),
            (7, 1),
            PubFlags::empty(),
            0,
            (handle, false),
            Instant::now(),
        );
        assert_eq!(p.backoff_wait(), Duration::ZERO, "not refused yet");
        p.backoffs = 3;
        p.error = Some(Error::from_err(0x4001, Op::Pub as u8, b""));
        assert_eq!(
            p.backoff_wait(),
            Duration::from_millis(40),
            "BACKPRESSURE's"
        );
        p.error = Some(Error::from_err(0x6002, Op::Pub as u8, b""));
        assert_eq!(
            p.backoff_wait(),
            Duration::from_millis(200),
            "LEADER_UNKNOWN's"
        );
        p.backoffs = 30;
        assert_eq!(p.backoff_wait(), Duration::from_secs(2), "capped at 2 s");
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        assert_eq!(backoff_delay(BACKOFF_FIRST, 0), Duration::from_millis(10));
        assert_eq!(backoff_delay(BACKOFF_FIRST, 3), Duration::from_millis(80));
        assert_eq!(backoff_delay(BACKOFF_FIRST, 40), BACKOFF_MAX);
    }
}
