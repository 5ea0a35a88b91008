//! The consumer's side of the group protocol: joining (and joining again), reading and
//! dispatching what the broker sends, answering NOTICEs, PULL and CREDIT.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::limits::{DEFAULT_CREDIT_COUNT, SUB_PARTITION_ANY};
use crate::wire::ops::{
    ControlAck, Credit, CreditResult, ErrFrame, Frame, Message as _, Msg, Notice, OkResult, Pull,
    Sub, SubResult,
};
use crate::wire::{
    ControlResult, CreditMode, ErrorCode, HeartbeatState, NoticeKind, Op, OriginReason, SubFlags,
};

use super::super::brokers::{self, Route};
use super::super::bytes::Bytes;
use super::super::conn::{answer_to, Conn, FrameAt};
use super::super::error::{Error, Result};
use super::super::topics;
use super::link::Owed;
use super::{Consumer, DeadLetterOrigin, Message, Rebalance};

/// `poll` looks at the heartbeat thread's findings (a failed write, an expulsion) at
/// least this often while it waits.
const READ_SLICE: Duration = Duration::from_secs(1);
/// A rejoin refused for a passing reason is tried again after this, doubling.
const REJOIN_BACKOFF_FIRST: Duration = Duration::from_millis(50);
const REJOIN_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Whether an ERR answers no request: `request_op` 0, sent before the broker closes.
fn goodbye(payload: &[u8]) -> bool {
    ErrFrame::decode(payload).is_ok_and(|e| e.request_op == 0)
}

impl Consumer {
    /// Connects (unless a fresh connection waits), resolves the topic and SUBs.
    pub(super) fn join_once(&mut self) -> Result<()> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => Conn::open_to(
                &mut self.brokers,
                &self.settings.token,
                self.settings.timeout,
            )?,
        };
        let sub = self.sub.as_mut().expect("subscribed");
        let deadline = Instant::now() + self.settings.timeout;
        let mut pushes: Vec<(Op, Vec<u8>)> = Vec::new();
        let mut keep = |op: Op, payload: &[u8]| pushes.push((op, payload.to_vec()));
        let topic = topics::resolve(&sub.topic, None, &mut |f| {
            conn.request(f, deadline, &mut keep)
        })?;
        let flags = match self.settings.pull {
            true => SubFlags::PULL_MODE,
            false => SubFlags::empty(),
        };
        let frame = Frame::Sub(Sub {
            group: &sub.group,
            topic_id: topic.id,
            partition: SUB_PARTITION_ANY,
            start_policy: sub.start.as_code(),
            credit_count: self.settings.credit_count,
            credit_bytes: self.settings.credit_bytes,
            flags,
        });
        let answer = conn.request(&frame, deadline, &mut keep)?;
        let member =
            SubResult::decode_result(&answer).map_err(|e| Error::Protocol(e.to_string()))?;
        sub.resolved = Some(topic);
        let writer = conn.stream().try_clone()?;
        self.gen = self.link.lock().install(writer, member);
        self.conn = Some(conn);
        self.member = Some(member);
        self.held.clear();
        self.pulling = false;
        for (op, payload) in pushes {
            self.dispatch(op, &payload, None)?;
        }
        Ok(())
    }

    /// The connection is gone (or the member expelled): every partition is lost;
    /// connect and SUB again, backing off, until the reconnect timeout.
    pub(super) fn rejoin(&mut self) -> Result<()> {
        self.drop_connection();
        for partition in std::mem::take(&mut self.held).into_keys() {
            self.rebalanced(Rebalance::Lost(partition));
        }
        match self.reroute.take() {
            Some(route) => _ = self.brokers.take(&route),
            // The broker may be gone (a failover): another is tried first.
            None => self.brokers.move_on(),
        }
        self.join(true)?;
        self.stats.rejoins += 1;
        Ok(())
    }

    /// Joins, following NOT_LEADER and backing off while no leader can serve, until
    /// the reconnect timeout. `rejoining`: any retryable failure is tried again (a
    /// first `subscribe` fails at once on anything but the cluster's redirects).
    pub(super) fn join(&mut self, rejoining: bool) -> Result<()> {
        let started = Instant::now();
        let mut backoff = REJOIN_BACKOFF_FIRST;
        let mut cluster_backoffs = 0;
        loop {
            let err = match self.join_once() {
                Ok(()) => {
                    self.brokers.served();
                    return Ok(());
                }
                Err(e) => e,
            };
            // AUTH_FAILED, UNKNOWN_TOPIC and the like do not pass by retrying.
            let out_of_time = self
                .settings
                .reconnect_timeout
                .is_some_and(|t| started.elapsed() >= t);
            let route = brokers::route(&err);
            if !err.is_retryable() || out_of_time || (!rejoining && route == Route::Stay) {
                return Err(err);
            }
            let wait = match route {
                Route::Follow(_) => self.brokers.take(&route).map(brokers::cluster_backoff),
                Route::MoveOn => {
                    self.brokers.take(&route);
                    cluster_backoffs += 1;
                    Some(brokers::cluster_backoff(cluster_backoffs - 1))
                }
                Route::Stay => {
                    if err.code().is_none() {
                        self.brokers.move_on();
                    }
                    backoff = (backoff * 2).min(REJOIN_BACKOFF_MAX);
                    Some(backoff / 2)
                }
            };
            if let Some(wait) = wait {
                std::thread::sleep(wait);
            }
        }
    }

    pub(super) fn drop_connection(&mut self) {
        self.link.lock().disconnect();
        self.conn = None;
        self.member = None;
        self.ready.clear();
        self.notices.clear();
        self.pulling = false;
    }

    /// HEARTBEAT LEAVE, and its answer awaited (up to the timeout).
    pub(super) fn leave(&mut self) {
        if !self.link.lock().heartbeat(HeartbeatState::Leave) {
            return;
        }
        let deadline = Instant::now() + self.settings.timeout;
        while self.link.lock().owes_anything() && Instant::now() < deadline {
            if !self.read(Some(deadline)) && !self.link.lock().alive() {
                break;
            }
        }
    }

    fn rebalanced(&mut self, event: Rebalance) {
        if let Some(callback) = self.on_rebalance.as_mut() {
            callback(event);
        }
    }

    /// Reads and handles what arrives by `deadline` (at most a [`READ_SLICE`]): `false`
    /// when nothing did. A broken connection is marked for `poll` to join again.
    pub(super) fn read(&mut self, deadline: Option<Instant>) -> bool {
        let Some(mut conn) = self.conn.take() else {
            return false;
        };
        if !conn.has_frame() {
            self.link.lock().write_out();
        }
        let slice_end = Instant::now() + READ_SLICE;
        let until = deadline.map_or(slice_end, |d| d.min(slice_end));
        let mut next = conn.next_frame(until, READ_SLICE);
        let mut got = false;
        let outcome = loop {
            match next {
                Ok(Some(f)) => {
                    got = true;
                    if let Err(e) = self.dispatch_at(&conn, f) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
            next = conn.buffered();
        };
        self.conn = Some(conn);
        if outcome.is_err() {
            self.link.lock().broken = true;
        }
        got
    }

    fn dispatch_at(&mut self, conn: &Conn, f: FrameAt) -> Result<()> {
        self.dispatch(f.op, conn.payload(f), Some(conn))
    }

    /// Handles one frame; a MSG's key and value are shared with `conn`'s read buffer
    /// when the payload is in it, copied otherwise.
    fn dispatch(&mut self, op: Op, payload: &[u8], conn: Option<&Conn>) -> Result<()> {
        let malformed = |e: crate::wire::DecodeError| Error::Protocol(e.to_string());
        match op {
            Op::Msg => {
                let m = Msg::decode(payload).map_err(malformed)?;
                if self
                    .member
                    .is_some_and(|s| s.subscription_id == m.subscription_id)
                {
                    let share = |b: &[u8]| match conn {
                        Some(c) => c.share(b),
                        None => Bytes::from(b.to_vec()),
                    };
                    let message = self.message(&m, share(m.key), share(m.value));
                    self.ready.push_back(message);
                }
                // A MSG for an earlier subscription of this connection is moot.
            }
            Op::Notice => self
                .notices
                .push_back(Notice::decode(payload).map_err(malformed)?),
            Op::Err if goodbye(payload) => {
                // The broker's ERR before it closes (SHUTTING_DOWN at a drain answers no
                // request): join again.
                return Err(answer_to(Op::Ping, op, payload).unwrap_err());
            }
            Op::Ok | Op::Err => {
                let owed = self.link.lock().pop_owed();
                let owed = owed.ok_or_else(|| Error::Protocol("an answer to no request".into()))?;
                self.answered(owed, op, payload)?;
            }
            other => return Err(Error::Protocol(format!("{} from the broker", other.name()))),
        }
        Ok(())
    }

    fn message(&self, m: &Msg<'_>, key: Bytes, value: Bytes) -> Message {
        let sub = self.sub.as_ref().expect("subscribed");
        let origin = m.origin.map(|o| DeadLetterOrigin {
            topic_id: o.origin_topic_id,
            topic: match sub.resolved.and_then(|t| t.source_id) {
                Some(id) if id == o.origin_topic_id => sub.source.clone(),
                _ => None,
            },
            partition: o.origin_partition,
            sequence: o.origin_sequence,
            attempts: o.attempts,
            reason: OriginReason::from_code(o.reason),
        });
        Message {
            topic: Arc::clone(&sub.topic),
            partition: m.partition,
            sequence: m.sequence,
            attempt: m.attempt,
            key,
            value,
            origin,
            producer_id: m.producer_id,
            producer_seq: m.producer_seq,
            link: Arc::clone(&self.link),
            gen: self.gen,
            delivery: m.delivery_ref(),
        }
    }

    /// An OK or ERR answering the request `owed`. `Err`: the connection is done for.
    fn answered(&mut self, owed: Owed, op: Op, payload: &[u8]) -> Result<()> {
        let request = match owed {
            Owed::Ack => Op::Ack,
            Owed::Nack => Op::Nack,
            Owed::ControlAck => Op::ControlAck,
            Owed::Heartbeat => Op::Heartbeat,
            Owed::Pull => Op::Pull,
            Owed::Credit => Op::Credit,
        };
        if owed == Owed::Pull {
            self.pulling = false;
        }
        match answer_to(request, op, payload) {
            Ok(result) if owed == Owed::Credit => {
                let granted = CreditResult::decode_result(result);
                self.credit_answer = Some(granted.map_err(|e| Error::Protocol(e.to_string())));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) if e.code().is_none() => Err(e),
            Err(e) => self.refused(owed, e),
        }
    }

    /// What the registry advises for an ERR answering the consumer's requests.
    fn refused(&mut self, owed: Owed, err: Error) -> Result<()> {
        let code = err.code().expect("a broker error");
        let settle = matches!(owed, Owed::Ack | Owed::Nack);
        match code {
            // The partition moved, or the delivery expired: the broker delivers the
            // record again, here or elsewhere.
            ErrorCode::OwnershipFenced | ErrorCode::UnknownDelivery if settle => {
                self.stats.ignored_errors += 1;
                if code == ErrorCode::UnknownDelivery {
                    // Also all an expelled member hears: a HEARTBEAT finds out
                    // (UNKNOWN_MEMBER) without waiting for the heartbeat thread.
                    self.link.lock().heartbeat(HeartbeatState::Active);
                }
            }
            // A notice already superseded; a PULL that raced a rebalance (its NOTICE
            // follows).
            ErrorCode::UnknownNotice => self.stats.ignored_errors += 1,
            ErrorCode::StaleEpoch if owed == Owed::Pull => self.stats.ignored_errors += 1,
            // Expelled (silent past the session timeout): join again.
            ErrorCode::UnknownSubscription | ErrorCode::UnknownMember => return Err(err),
            // This node does not lead (any more): join again where the error says.
            _ if brokers::route(&err) != Route::Stay => {
                self.reroute = Some(brokers::route(&err));
                return Err(err);
            }
            _ if err.closes_connection() => return Err(err),
            _ if owed == Owed::Credit => self.credit_answer = Some(Err(err)),
            _ => self.errors.push_back(err),
        }
        Ok(())
    }

    /// Answers the oldest NOTICE: the callback first, then the CONTROL_ACK.
    pub(super) fn answer_notice(&mut self) {
        let Some(n) = self.notices.pop_front() else {
            return;
        };
        let current = self.member.is_some_and(|m| m.member_id == n.member_id);
        let kind = NoticeKind::from_code(n.kind);
        if current {
            self.take_notice(&n, kind);
        }
        let result = match (current, kind) {
            (true, Some(_)) => ControlResult::Ok,
            _ => ControlResult::Stale,
        };
        let answer = Frame::ControlAck(ControlAck::answering(&n, result));
        let mut link = self.link.lock();
        link.assignment_epoch = link.assignment_epoch.max(n.assignment_epoch);
        link.request(&answer, Owed::ControlAck, None, false);
    }

    fn take_notice(&mut self, n: &Notice, kind: Option<NoticeKind>) {
        match kind {
            Some(NoticeKind::Assign) => {
                self.held.insert(n.partition, n.ownership_epoch);
                self.rebalanced(Rebalance::Assigned(n.partition));
            }
            Some(NoticeKind::Revoke) => {
                // Messages of the partition not yet handed out go to the next owner.
                self.ready.retain(|m| m.partition != n.partition);
                if self.held.remove(&n.partition).is_some() {
                    self.rebalanced(Rebalance::Revoked(n.partition));
                }
            }
            None => {}
        }
    }

    /// In PULL mode, asks for messages when no PULL is outstanding, waiting at the
    /// broker until `deadline` (at most a [`READ_SLICE`]).
    pub(super) fn pull_if_idle(&mut self, deadline: Option<Instant>) {
        if !self.settings.pull || self.pulling || self.held.is_empty() {
            return;
        }
        let Some(member) = self.member else {
            return;
        };
        let wait = deadline.map_or(READ_SLICE, |d| d.saturating_duration_since(Instant::now()));
        let max_msgs = match self.settings.credit_count {
            0 => DEFAULT_CREDIT_COUNT,
            n => n,
        };
        let mut link = self.link.lock();
        let pull = Frame::Pull(Pull {
            subscription_id: member.subscription_id,
            member_id: member.member_id,
            membership_epoch: member.membership_epoch,
            assignment_epoch: link.assignment_epoch,
            ownership_epochs: self.held.values().copied().collect(),
            max_msgs,
            max_bytes: 0,
            wait_ms: wait.min(READ_SLICE).as_millis() as u16,
            min_bytes: 0,
        });
        self.pulling = link.request(&pull, Owed::Pull, None, false);
    }

    /// CREDIT SET on the current membership, joining again first when needed.
    pub(super) fn credit_request(&mut self, records: u16, bytes: u32) -> Result<CreditResult> {
        loop {
            if self.sub.is_none() {
                return Err(Error::InvalidInput("set_credit before subscribe".into()));
            }
            if !self.link.lock().alive() {
                self.rejoin()?;
            }
            let member = self.member.expect("joined");
            let credit = Frame::Credit(Credit {
                subscription_id: member.subscription_id,
                membership_epoch: member.membership_epoch,
                ownership_epoch: 0,
                mode: CreditMode::Set.as_code(),
                credit_count: records,
                credit_bytes: bytes,
                reserved: 0,
            });
            self.credit_answer = None;
            if !self.link.lock().request(&credit, Owed::Credit, None, false) {
                continue;
            }
            let deadline = Instant::now() + self.settings.timeout;
            while self.credit_answer.is_none() && Instant::now() < deadline {
                self.read(Some(deadline));
                if !self.link.lock().alive() {
                    break;
                }
            }
            match self.credit_answer.take() {
                Some(answer) => return answer,
                None if self.link.lock().alive() => {
                    return Err(Error::Timeout("no answer to CREDIT".into()))
                }
                None => continue,
            }
        }
    }
}
