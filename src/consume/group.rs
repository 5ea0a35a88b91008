//! One consumer group: its members, the ownership of each partition, and per
//! partition the delivery bookkeeping (`man/mortarmq.7`, CONSUMER GROUPS).
//!
//! Every record of a partition at or above `next_seq` is undelivered. Every record
//! below it is in exactly one of these states:
//!
//! ```text
//!   outstanding   delivered to a member, awaiting ACK/NACK/expiry     (outstanding map)
//!   retry         failed or released, awaiting redelivery             (retries map)
//!   dead-pending  DeadLetter effect emitted, append not yet durable   (dead_pending map)
//!   settled       ACKed, dead-lettered, skipped by retention, or      (not stored)
//!                 restored as already dead-lettered
//! ```
//!
//! so the committed position — the highest sequence with everything up to it settled
//! — is one below the lowest key of the three maps, or `next_seq - 1` when they are
//! empty. Memory per partition is therefore bounded by what is in flight.
//!
//! Ownership of a partition moves `Unowned → Assigning → Owned → Revoking → Unowned`.
//! Only `Owned` partitions deliver: MSGs flow after CONTROL_ACK(OK) of the ASSIGN and
//! stop once REVOKE is sent (the old owner may still ACK what it holds until release).
//! `Assigning` and `Revoking` both end at `--revoke-timeout`: a REVOKE not answered by
//! then releases the partition; an ASSIGN not answered by then is taken back (the member
//! gets a REVOKE for it) and the member is *stalled*: it keeps what it owns but is given
//! nothing new until it answers a notice, so a member that heartbeats but ignores its
//! notices cannot hold partitions it never consumes.
//!
//! A PULL is answered with what fits three bounds: its own `max_msgs` and `max_bytes`
//! (the latter 0 = the member's credit bytes), both capped by `--max-credit-count` and
//! `--max-credit-size`; and the room the connection's output has left before
//! `--max-output-size` ([`OutputRoom`](super::OutputRoom)). The first record is allowed
//! past the first two (so a record larger than `max_bytes` still flows) but never past
//! the room: a PULL whose connection cannot take its next record waits for its
//! deadline, then is answered with what fits, possibly nothing.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{
    ConnId, CreditResult, Delivery, DeliveryRef, Effect, ErrorCode, GroupSnapshot, MemberSnapshot,
    Notice, NoticeKind, OriginReason, OutputRoom, OwnershipState, PartitionSnapshot, PendingNotice,
    RecordBytes, Records, Restored, Shared, StartPolicy, Timer, MSG_FRAME_FIXED_BYTES,
    OK_EMPTY_FRAME_BYTES, READ_RETRY_MS,
};

fn ack_timer(group_id: u16, p: usize) -> Timer {
    Timer::AckWait {
        group_id,
        partition: p as u16,
    }
}

fn retry_timer(group_id: u16, p: usize, seq: u64) -> Timer {
    Timer::Retry {
        group_id,
        partition: p as u16,
        seq,
    }
}

fn assign_timer(group_id: u16, p: usize) -> Timer {
    Timer::Assign {
        group_id,
        partition: p as u16,
    }
}

fn revoke_timer(group_id: u16, p: usize) -> Timer {
    Timer::Revoke {
        group_id,
        partition: p as u16,
    }
}

/// Queues a PULL's answer and counts its bytes against the connection's room until the
/// caller's outputs catch up.
pub(super) fn answer_pull(
    sh: &mut Shared,
    conn: ConnId,
    pull_id: u64,
    deliveries: Vec<Delivery>,
    msg_bytes: u64,
) {
    let bytes = msg_bytes + OK_EMPTY_FRAME_BYTES as u64;
    *sh.answered_bytes.entry(conn).or_default() += bytes;
    sh.effects.push(Effect::PullAnswer {
        conn,
        pull_id,
        deliveries,
        bytes,
    });
}

fn pull_timer(group_id: u16, member_id: u64, pull_id: u64) -> Timer {
    Timer::Pull {
        group_id,
        member_id,
        pull_id,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ownership {
    Unowned,
    Assigning {
        member_id: u64,
        notice_id: u64,
        deadline_ms: u64,
    },
    Owned {
        member_id: u64,
    },
    Revoking {
        member_id: u64,
        notice_id: u64,
        deadline_ms: u64,
    },
}

impl Ownership {
    fn member(self) -> Option<u64> {
        match self {
            Ownership::Unowned => None,
            Ownership::Assigning { member_id, .. }
            | Ownership::Owned { member_id }
            | Ownership::Revoking { member_id, .. } => Some(member_id),
        }
    }

    /// Held = counted against the member's share; a partition being revoked is
    /// already on its way out.
    fn held_by(self) -> Option<u64> {
        match self {
            Ownership::Assigning { member_id, .. } | Ownership::Owned { member_id } => {
                Some(member_id)
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    delivery_id: u64,
    member_id: u64,
    attempt: u16,
    bytes: u32,
    deadline_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Retry {
    /// Deliveries made so far; the redelivery is attempt `attempts + 1`.
    attempts: u16,
    ready_at_ms: u64,
}

pub(super) struct Partition {
    pub(super) ownership: Ownership,
    ownership_epoch: u64,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    retries: BTreeMap<u64, Retry>,
    /// seq → attempts, DeadLetter emitted, waiting for `dead_lettered`.
    dead_pending: BTreeMap<u64, u16>,
    /// Restored at start: already in the DLQ, skip when reached. Only entries at or
    /// above `next_seq` are kept.
    restored_dead: BTreeSet<u64>,
    /// When the partition's one ack-wait timer is set: at or before the earliest
    /// deadline in `outstanding` whenever that is not empty (see [`Group::arm_ack_wait`]).
    ack_timer_ms: Option<u64>,
}

impl Partition {
    #[cfg(test)]
    pub(super) fn ack_timer_ms(&self) -> Option<u64> {
        self.ack_timer_ms
    }
}

pub(super) struct PendingPull {
    pub(super) pull_id: u64,
    /// The partitions (with their ownership epochs then) the PULL's `ownership_epochs`
    /// named among those the member held when it arrived; `None`: all it owns.
    pub(super) only: Option<Vec<(u16, u64)>>,
    /// Already capped by `--max-credit-count` and `--max-credit-size`.
    pub(super) max_msgs: u16,
    pub(super) max_bytes: u32,
    pub(super) min_bytes: u32,
    pub(super) deadline_ms: u64,
}

pub(super) struct Member {
    pub(super) member_id: u64,
    pub(super) membership_epoch: u32,
    assignment_epoch: u32,
    pub(super) conn: ConnId,
    pub(super) subscription_id: u16,
    pull_mode: bool,
    pub(super) session_deadline_ms: u64,
    pub(super) credit_count: u16,
    pub(super) credit_bytes: u32,
    pub(super) credit_epoch: u64,
    outstanding_count: u32,
    outstanding_bytes: u64,
    /// Waiting PULLs in request order; only the head is served (later answers queue
    /// behind it on the connection anyway, and serving them first would hand later
    /// records to an earlier slot out of order).
    pub(super) pulls: VecDeque<PendingPull>,
    /// Where the next delivery pass starts among the member's partitions (fairness).
    rotation: usize,
    /// Left an ASSIGN unanswered past `--revoke-timeout`: given no partition until it
    /// CONTROL_ACKs a notice.
    stalled: bool,
}

impl Member {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        member_id: u64,
        membership_epoch: u32,
        conn: ConnId,
        subscription_id: u16,
        pull_mode: bool,
        credit_count: u16,
        credit_bytes: u32,
        session_deadline_ms: u64,
    ) -> Self {
        Member {
            member_id,
            membership_epoch,
            assignment_epoch: 0,
            conn,
            subscription_id,
            pull_mode,
            session_deadline_ms,
            credit_count,
            credit_bytes,
            credit_epoch: 0,
            outstanding_count: 0,
            outstanding_bytes: 0,
            pulls: VecDeque::new(),
            rotation: 0,
            stalled: false,
        }
    }

    pub(super) fn assignment_epoch(&self) -> u32 {
        self.assignment_epoch
    }

    pub(super) fn credit_result(&self) -> CreditResult {
        CreditResult {
            granted_count: self.credit_count,
            granted_bytes: self.credit_bytes,
            outstanding_count: u16::try_from(self.outstanding_count).unwrap_or(u16::MAX),
            outstanding_bytes: u32::try_from(self.outstanding_bytes).unwrap_or(u32::MAX),
            credit_epoch: self.credit_epoch,
        }
    }

    fn credit_return(&mut self, bytes: u32) {
        self.outstanding_count -= 1;
        self.outstanding_bytes -= u64::from(bytes);
    }
}

/// How much a delivery pass may hand out. The first record is always allowed when
/// `have_count` is 0, so a record larger than the byte window still flows; the room for
/// MSG frames is never passed, not even by the first.
#[derive(Debug, Clone, Copy)]
struct Window {
    have_count: u32,
    have_bytes: u64,
    max_count: u32,
    max_bytes: u64,
    /// Encoded MSG bytes so far, and how many the connection's output can take.
    have_frame_bytes: u64,
    frame_room: u64,
}

impl Window {
    fn credit(have_count: u32, have_bytes: u64, max_count: u32, max_bytes: u64) -> Window {
        Window {
            have_count,
            have_bytes,
            max_count,
            max_bytes,
            have_frame_bytes: 0,
            frame_room: u64::MAX,
        }
    }

    fn admits(&self, bytes: u32) -> bool {
        let frame = msg_frame_bytes(bytes);
        self.have_frame_bytes.saturating_add(frame) <= self.frame_room
            && (self.have_count == 0
                || (self.have_count < self.max_count
                    && self.have_bytes + u64::from(bytes) <= self.max_bytes))
    }

    fn take(&mut self, bytes: u32) {
        self.have_count += 1;
        self.have_bytes += u64::from(bytes);
        self.have_frame_bytes += msg_frame_bytes(bytes);
    }
}

/// At most the MSG frame of a record of `bytes` key and value bytes: a dead letter's
/// stored value holds its trailer and more, so it only shrinks on the wire.
fn msg_frame_bytes(bytes: u32) -> u64 {
    MSG_FRAME_FIXED_BYTES as u64 + u64::from(bytes)
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    partition: usize,
    seq: u64,
    bytes: u32,
    retry: bool,
}

#[derive(Default)]
struct Gathered {
    candidates: Vec<Candidate>,
    bytes: u64,
    /// Encoded MSG frames of the candidates, at most.
    frame_bytes: u64,
    /// Stopped by the window rather than by running out of records.
    full: bool,
}

/// A partition's view for one delivery pass.
struct Cursor {
    partition: usize,
    ready_retries: Vec<u64>,
    next_retry: usize,
    next_new: u64,
    end: u64,
    done: bool,
}

impl Cursor {
    /// The next record to offer: a ready redelivery first, else the next new record
    /// (passing over dead letters restored at start); `None` when there is none.
    fn next(&mut self, part: &Partition) -> Option<(u64, bool)> {
        if let Some(&seq) = self.ready_retries.get(self.next_retry) {
            return Some((seq, true));
        }
        while self.next_new < self.end && part.restored_dead.contains(&self.next_new) {
            self.next_new += 1;
        }
        (self.next_new < self.end).then_some((self.next_new, false))
    }

    fn advance(&mut self, retry: bool) {
        if retry {
            self.next_retry += 1;
        } else {
            self.next_new += 1;
        }
    }
}

pub(super) struct Group {
    pub(super) id: u16,
    pub(super) name: Vec<u8>,
    pub(super) topic_id: u16,
    pub(super) members: BTreeMap<u64, Member>,
    pub(super) partitions: Vec<Partition>,
    /// Without members since `--group-ttl` before this: removed then.
    pub(super) expires_at_ms: Option<u64>,
}

impl Group {
    /// Creates the group and gives each partition its start: the restored committed
    /// position, else EARLIEST = first retained, LATEST = the log's next sequence now
    /// (the group first gets all its partitions when it is created).
    pub(super) fn new(
        id: u16,
        name: Vec<u8>,
        topic_id: u16,
        partition_count: u16,
        start_policy: StartPolicy,
        mut restored: Restored,
        recs: &mut dyn Records,
    ) -> Self {
        let partitions = (0..partition_count)
            .map(|p| {
                let next_seq = match restored.committed.get(&p) {
                    Some(&committed) => committed + 1,
                    None if start_policy == StartPolicy::Earliest => {
                        recs.first_sequence(topic_id, p)
                    }
                    None => recs.next_sequence(topic_id, p),
                };
                let mut restored_dead = restored.dead_lettered.remove(&p).unwrap_or_default();
                restored_dead.retain(|&s| s >= next_seq);
                Partition {
                    ownership: Ownership::Unowned,
                    ownership_epoch: 0,
                    next_seq,
                    outstanding: BTreeMap::new(),
                    retries: BTreeMap::new(),
                    dead_pending: BTreeMap::new(),
                    restored_dead,
                    ack_timer_ms: None,
                }
            })
            .collect();
        Group {
            id,
            name,
            topic_id,
            members: BTreeMap::new(),
            partitions,
            expires_at_ms: None,
        }
    }

    pub(super) fn committed(&self, p: usize) -> u64 {
        let part = &self.partitions[p];
        let lowest_unsettled = [
            part.outstanding.keys().next(),
            part.retries.keys().next(),
            part.dead_pending.keys().next(),
        ]
        .into_iter()
        .flatten()
        .copied()
        .min()
        .unwrap_or(part.next_seq)
        .min(part.next_seq);
        lowest_unsettled.saturating_sub(1)
    }

    // ---- assignment -----------------------------------------------------------------

    /// Spreads the partitions evenly, moving as few as possible: each member's share
    /// is ⌊n/m⌋, and the n mod m larger shares go to the members already holding the
    /// most (ties: lower member id). Members over their share get REVOKEs (highest
    /// partitions first); free partitions go to members under their share (lowest
    /// member id first). Partitions being revoked are reassigned once released.
    /// Stalled members take no part: they keep what they own, outside the count.
    pub(super) fn rebalance(&mut self, sh: &mut Shared, now_ms: u64) {
        let mut held: BTreeMap<u64, Vec<usize>> = (self.members.iter())
            .filter(|(_, m)| !m.stalled)
            .map(|(&id, _)| (id, Vec::new()))
            .collect();
        if held.is_empty() {
            return;
        }
        let mut n = 0;
        for (p, part) in self.partitions.iter().enumerate() {
            if let Some(m) = part.ownership.held_by() {
                let Some(parts) = held.get_mut(&m) else {
                    continue;
                };
                parts.push(p);
            }
            n += 1;
        }
        let m = held.len();
        let (base, extra) = (n / m, n % m);
        let mut ranked: Vec<u64> = held.keys().copied().collect();
        ranked.sort_by_key(|id| (Reverse(held[id].len()), *id));
        let share: BTreeMap<u64, usize> = ranked
            .iter()
            .enumerate()
            .map(|(rank, &id)| (id, base + usize::from(rank < extra)))
            .collect();

        let mut surplus = Vec::new();
        for (id, parts) in &held {
            if parts.len() > share[id] {
                surplus.extend(parts.iter().rev().take(parts.len() - share[id]));
            }
        }
        for p in surplus {
            self.revoke(sh, p, now_ms);
        }

        let mut count: BTreeMap<u64, usize> = held
            .iter()
            .map(|(&id, ps)| (id, ps.len().min(share[&id])))
            .collect();
        for p in 0..self.partitions.len() {
            if self.partitions[p].ownership != Ownership::Unowned {
                continue;
            }
            let Some((&id, c)) = count.iter_mut().find(|(id, c)| **c < share[*id]) else {
                break;
            };
            *c += 1;
            self.assign(sh, p, id, now_ms);
        }
    }

    fn notice(&mut self, sh: &mut Shared, p: usize, member_id: u64, kind: NoticeKind) -> u64 {
        let member = self
            .members
            .get_mut(&member_id)
            .expect("notice to a member");
        member.assignment_epoch = member.assignment_epoch.wrapping_add(1);
        let notice_id = sh.next_notice_id;
        sh.next_notice_id += 1;
        sh.notices.insert(
            notice_id,
            PendingNotice {
                conn: member.conn,
                subscription_id: member.subscription_id,
                group_id: self.id,
                member_id,
                kind,
                partition: p as u16,
            },
        );
        sh.stats.notices += 1;
        sh.effects.push(Effect::Notice {
            conn: member.conn,
            notice: Notice {
                notice_id,
                kind: kind.as_code(),
                group_id: self.id,
                membership_epoch: member.membership_epoch,
                assignment_epoch: member.assignment_epoch,
                ownership_epoch: self.partitions[p].ownership_epoch,
                topic_id: self.topic_id,
                partition: p as u16,
                member_id,
            },
        });
        notice_id
    }

    /// Ownership epochs continue from at least `base` (`Coordinator::raise_epochs`).
    pub(super) fn raise_epochs(&mut self, base: u64) {
        for part in &mut self.partitions {
            part.ownership_epoch = part.ownership_epoch.max(base);
        }
    }

    fn assign(&mut self, sh: &mut Shared, p: usize, member_id: u64, now_ms: u64) {
        self.partitions[p].ownership_epoch += 1;
        let notice_id = self.notice(sh, p, member_id, NoticeKind::Assign);
        let deadline_ms = now_ms.saturating_add(sh.config.revoke_timeout_ms);
        self.partitions[p].ownership = Ownership::Assigning {
            member_id,
            notice_id,
            deadline_ms,
        };
        sh.timer_set(deadline_ms, assign_timer(self.id, p));
    }

    fn revoke(&mut self, sh: &mut Shared, p: usize, now_ms: u64) {
        let Some(member_id) = self.partitions[p].ownership.held_by() else {
            return;
        };
        self.clear_phase_timer(sh, p);
        let notice_id = self.notice(sh, p, member_id, NoticeKind::Revoke);
        let deadline_ms = now_ms.saturating_add(sh.config.revoke_timeout_ms);
        self.partitions[p].ownership = Ownership::Revoking {
            member_id,
            notice_id,
            deadline_ms,
        };
        sh.timer_set(deadline_ms, revoke_timer(self.id, p));
    }

    /// Removes the timer of the partition's phase (ASSIGN or REVOKE waiting for its
    /// CONTROL_ACK) before the phase ends, so no timer outlives what it waits for.
    fn clear_phase_timer(&self, sh: &mut Shared, p: usize) {
        match self.partitions[p].ownership {
            Ownership::Assigning { deadline_ms, .. } => {
                sh.timer_clear(deadline_ms, assign_timer(self.id, p))
            }
            Ownership::Revoking { deadline_ms, .. } => {
                sh.timer_clear(deadline_ms, revoke_timer(self.id, p))
            }
            Ownership::Unowned | Ownership::Owned { .. } => {}
        }
    }

    /// Frees the partition: its outstanding deliveries return their credit and become
    /// redeliverable at once (a release is not a failure: no dead-letter check).
    pub(super) fn release(&mut self, sh: &mut Shared, p: usize, now_ms: u64) {
        self.clear_phase_timer(sh, p);
        let part = &mut self.partitions[p];
        part.ownership = Ownership::Unowned;
        if let Some(at_ms) = part.ack_timer_ms.take() {
            sh.timer_clear(at_ms, ack_timer(self.id, p));
        }
        for (seq, o) in std::mem::take(&mut part.outstanding) {
            if let Some(m) = self.members.get_mut(&o.member_id) {
                m.credit_return(o.bytes);
            }
            part.retries.insert(
                seq,
                Retry {
                    attempts: o.attempt,
                    ready_at_ms: now_ms,
                },
            );
        }
        sh.dirty.insert(self.id);
    }

    /// The REVOKE of `p` was not CONTROL_ACKed within `--revoke-timeout`: released as if
    /// it had been.
    pub(super) fn revoke_timed_out(&mut self, sh: &mut Shared, p: usize, now_ms: u64) {
        let phase = self.partitions.get(p).map(|part| part.ownership);
        if let Some(Ownership::Revoking { deadline_ms, .. }) = phase {
            if deadline_ms <= now_ms {
                self.release(sh, p, now_ms);
                self.rebalance(sh, now_ms);
            }
        }
    }

    /// The ASSIGN of `p` was not CONTROL_ACKed within `--revoke-timeout`: the member
    /// gets a REVOKE for it (its view then matches the group's), is stalled, and the
    /// partition is offered to the others. Nothing was delivered from it (MSGs flow only
    /// after the CONTROL_ACK), so nothing is released. The ASSIGN is forgotten: its late
    /// CONTROL_ACK gets UNKNOWN_NOTICE, which clients ignore.
    pub(super) fn assign_timed_out(&mut self, sh: &mut Shared, p: usize, now_ms: u64) {
        let Some(Ownership::Assigning {
            member_id,
            notice_id,
            deadline_ms,
        }) = self.partitions.get(p).map(|part| part.ownership)
        else {
            return;
        };
        if deadline_ms > now_ms {
            return;
        }
        self.clear_phase_timer(sh, p);
        sh.notices.remove(&notice_id);
        self.partitions[p].ownership = Ownership::Unowned;
        self.notice(sh, p, member_id, NoticeKind::Revoke);
        self.members.get_mut(&member_id).expect("owner").stalled = true;
        sh.stats.assigns_taken_back += 1;
        self.rebalance(sh, now_ms);
    }

    /// Removes a member, freeing its partitions. Waiting PULLs are answered empty
    /// when the connection is still open (each request is answered exactly once).
    pub(super) fn remove_member(
        &mut self,
        sh: &mut Shared,
        member_id: u64,
        now_ms: u64,
        conn_open: bool,
    ) -> Option<Member> {
        if !self.members.contains_key(&member_id) {
            return None;
        }
        for p in 0..self.partitions.len() {
            if self.partitions[p].ownership.member() == Some(member_id) {
                self.release(sh, p, now_ms);
            }
        }
        let member = self.members.remove(&member_id)?;
        debug_assert_eq!(member.outstanding_count, 0);
        sh.timer_clear(
            member.session_deadline_ms,
            Timer::Session {
                group_id: self.id,
                member_id,
            },
        );
        for pull in &member.pulls {
            sh.timer_clear(
                pull.deadline_ms,
                pull_timer(self.id, member_id, pull.pull_id),
            );
            if conn_open {
                answer_pull(sh, member.conn, pull.pull_id, Vec::new(), 0);
            }
        }
        Some(member)
    }

    /// CONTROL_ACK of a notice of this group from `member_id`. A notice that no longer
    /// describes the partition's phase (an ASSIGN overtaken by a REVOKE, a REVOKE after
    /// its timeout) is simply consumed; either way a stalled member that answers is
    /// given partitions again.
    pub(super) fn control_ack(
        &mut self,
        sh: &mut Shared,
        (notice_id, kind, partition): (u64, NoticeKind, u16),
        member_id: u64,
        ok: bool,
        now_ms: u64,
    ) {
        let unstalled = match self.members.get_mut(&member_id) {
            Some(m) if m.stalled => {
                m.stalled = false;
                true
            }
            _ => false,
        };
        let p = usize::from(partition);
        let phase = self.partitions.get(p).map(|part| part.ownership);
        match (kind, phase) {
            (NoticeKind::Revoke, Some(Ownership::Revoking { notice_id: n, .. }))
                if n == notice_id =>
            {
                // Any result releases: STALE/ERROR on a REVOKE means "not mine anyway".
                self.release(sh, p, now_ms);
            }
            (NoticeKind::Assign, Some(Ownership::Assigning { notice_id: n, .. }))
                if n == notice_id =>
            {
                self.clear_phase_timer(sh, p);
                if ok {
                    self.partitions[p].ownership = Ownership::Owned { member_id };
                    sh.dirty.insert(self.id);
                    if !unstalled {
                        return;
                    }
                } else {
                    // Refused: offer it to the group again.
                    self.partitions[p].ownership = Ownership::Unowned;
                }
            }
            _ if !unstalled => return,
            _ => {}
        }
        self.rebalance(sh, now_ms);
    }

    /// DELETE of the topic: REVOKE to every owner not already being revoked, and
    /// empty answers to waiting PULLs. The caller drops the group.
    pub(super) fn revoke_all_for_delete(&mut self, sh: &mut Shared) {
        for p in 0..self.partitions.len() {
            if let Some(member_id) = self.partitions[p].ownership.held_by() {
                self.notice(sh, p, member_id, NoticeKind::Revoke);
            }
        }
        self.answer_pulls_empty(sh);
    }

    /// Answers every waiting PULL with no records: the group is going away.
    pub(super) fn answer_pulls_empty(&self, sh: &mut Shared) {
        let answers: Vec<(ConnId, u64)> = (self.members.values())
            .flat_map(|m| m.pulls.iter().map(|pull| (m.conn, pull.pull_id)))
            .collect();
        for (conn, pull_id) in answers {
            answer_pull(sh, conn, pull_id, Vec::new(), 0);
        }
    }

    /// Whether a dead letter of this group waits for its append to be durable.
    pub(super) fn dead_letters_pending(&self) -> bool {
        self.partitions.iter().any(|p| !p.dead_pending.is_empty())
    }

    /// Clears the timers a group without members still has (its redeliveries), before
    /// it is removed. Its read-retry timer, if any, fires within [`READ_RETRY_MS`] and
    /// finds no group.
    pub(super) fn clear_timers(&self, sh: &mut Shared) {
        for (p, part) in self.partitions.iter().enumerate() {
            for (&seq, r) in &part.retries {
                sh.timer_clear(r.ready_at_ms, retry_timer(self.id, p, seq));
            }
        }
    }

    // ---- settlement -----------------------------------------------------------------

    /// Finds the outstanding delivery an ACK/NACK names. Fencing first: an ownership
    /// epoch that is not the partition's current one is 0x0022 and changes nothing.
    pub(super) fn find_delivery(
        &self,
        member_id: u64,
        named: &DeliveryRef,
    ) -> Result<(usize, u64), ErrorCode> {
        let p = usize::from(named.partition);
        let seq = named.sequence;
        let part = self
            .partitions
            .get(p)
            .filter(|_| named.topic_id == self.topic_id)
            .ok_or(ErrorCode::UnknownDelivery)?;
        if named.ownership_epoch != part.ownership_epoch {
            return Err(ErrorCode::OwnershipFenced);
        }
        match part.outstanding.get(&seq) {
            Some(o) if o.delivery_id == named.delivery_id && o.member_id == member_id => {
                Ok((p, seq))
            }
            _ => Err(ErrorCode::UnknownDelivery),
        }
    }

    /// ACK PROGRESS: the deadline restarts from now; nothing is settled.
    pub(super) fn extend_deadline(&mut self, sh: &mut Shared, (p, seq): (usize, u64), now_ms: u64) {
        let deadline_ms = now_ms.saturating_add(sh.config.ack_wait_ms);
        let o = self.partitions[p].outstanding.get_mut(&seq).expect("found");
        o.deadline_ms = deadline_ms;
        // Rare (a slow consumer's keep-alive): worth a scan so that the poll does not
        // wake at the old deadline for nothing.
        self.rearm_ack_wait(sh, p);
    }

    /// Sets the partition's ack-wait timer at its earliest deadline, or clears it.
    fn rearm_ack_wait(&mut self, sh: &mut Shared, p: usize) {
        let part = &mut self.partitions[p];
        if let Some(at_ms) = part.ack_timer_ms.take() {
            sh.timer_clear(at_ms, ack_timer(self.id, p));
        }
        if let Some(next_ms) = part.outstanding.values().map(|o| o.deadline_ms).min() {
            self.arm_ack_wait(sh, p, next_ms);
        }
    }

    /// Keeps the partition's ack-wait timer at or before `deadline_ms`. One timer per
    /// partition rather than one per delivery: a delivery and its ACK then cost no
    /// timer-set insert and remove (docs/DECISIONS.md, "Ack-wait timer"). A settled
    /// delivery leaves the timer where it is; when it fires early, nothing is due and it
    /// is set again at the earliest deadline left ([`Group::ack_wait_fired`]).
    fn arm_ack_wait(&mut self, sh: &mut Shared, p: usize, deadline_ms: u64) {
        let timer = ack_timer(self.id, p);
        let part = &mut self.partitions[p];
        match part.ack_timer_ms {
            Some(at_ms) if at_ms <= deadline_ms => return,
            Some(at_ms) => sh.timer_clear(at_ms, timer),
            None => {}
        }
        part.ack_timer_ms = Some(deadline_ms);
        sh.timer_set(deadline_ms, timer);
    }

    /// Ends an outstanding delivery (ACK or NACK) and returns its credit; returns the
    /// delivery's attempt for the caller's failure handling.
    pub(super) fn settle(&mut self, sh: &mut Shared, (p, seq): (usize, u64)) -> u16 {
        let o = self.partitions[p].outstanding.remove(&seq).expect("found");
        if let Some(m) = self.members.get_mut(&o.member_id) {
            m.credit_return(o.bytes);
        }
        sh.dirty.insert(self.id);
        o.attempt
    }

    /// The partition's ack-wait timer, set for `at_ms`, fired: the deliveries whose
    /// deadline is `at_ms` or earlier expire, in sequence order (those of a later
    /// deadline wait for the timer set again at the earliest of them, so timers of other
    /// kinds due between the two still run in deadline order).
    pub(super) fn ack_wait_fired(&mut self, sh: &mut Shared, p: usize, at_ms: u64, now_ms: u64) {
        let Some(part) = self.partitions.get_mut(p) else {
            return;
        };
        if part.ack_timer_ms != Some(at_ms) {
            return;
        }
        part.ack_timer_ms = None;
        let due: Vec<u64> = (part.outstanding.iter())
            .filter(|(_, o)| o.deadline_ms <= at_ms)
            .map(|(&seq, _)| seq)
            .collect();
        for seq in due {
            self.expire(sh, p, seq, now_ms);
        }
        self.rearm_ack_wait(sh, p);
    }

    /// Ack-wait deadline reached: the credit returns and the record fails.
    fn expire(&mut self, sh: &mut Shared, p: usize, seq: u64, now_ms: u64) {
        sh.stats.expired += 1;
        let attempt = self.settle(sh, (p, seq));
        self.fail(sh, p, seq, attempt, now_ms, now_ms);
    }

    /// A delivery failed (NACK RETRY or expiry): dead-letter at `max_attempts`, else
    /// redeliver from `ready_at_ms` to whoever owns the partition then.
    pub(super) fn fail(
        &mut self,
        sh: &mut Shared,
        p: usize,
        seq: u64,
        attempt: u16,
        now_ms: u64,
        ready_at_ms: u64,
    ) {
        if attempt >= sh.config.max_attempts.max(1) {
            self.dead_letter(sh, p, seq, attempt, OriginReason::MaxAttempts);
            return;
        }
        self.partitions[p].retries.insert(
            seq,
            Retry {
                attempts: attempt,
                ready_at_ms,
            },
        );
        if ready_at_ms > now_ms {
            sh.timer_set(ready_at_ms, retry_timer(self.id, p, seq));
        } else {
            sh.dirty.insert(self.id);
        }
    }

    /// Emits the DeadLetter effect, once per record: the record waits in
    /// `dead_pending` (holding the committed position) until the append is durable.
    pub(super) fn dead_letter(
        &mut self,
        sh: &mut Shared,
        p: usize,
        seq: u64,
        attempts: u16,
        reason: OriginReason,
    ) {
        let part = &mut self.partitions[p];
        if part.dead_pending.contains_key(&seq) {
            return;
        }
        part.dead_pending.insert(seq, attempts);
        sh.stats.dead_letters += 1;
        sh.effects.push(Effect::DeadLetter {
            group_id: self.id,
            topic_id: self.topic_id,
            partition: p as u16,
            sequence: seq,
            attempts,
            reason,
        });
    }

    pub(super) fn dead_lettered(&mut self, partition: u16, seq: u64) {
        if let Some(part) = self.partitions.get_mut(usize::from(partition)) {
            part.dead_pending.remove(&seq);
        }
    }

    // ---- delivery -------------------------------------------------------------------

    /// One delivery pass: each member's waiting PULLs, then pushes within credit.
    pub(super) fn deliver(
        &mut self,
        sh: &mut Shared,
        now_ms: u64,
        recs: &mut dyn Records,
        room: &dyn OutputRoom,
    ) {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for id in ids {
            self.serve_pulls(sh, id, now_ms, recs, room);
            self.push(sh, id, now_ms, recs);
        }
    }

    fn push(&mut self, sh: &mut Shared, member_id: u64, now_ms: u64, recs: &mut dyn Records) {
        let member = &self.members[&member_id];
        if member.pull_mode {
            return;
        }
        let window = Window::credit(
            member.outstanding_count,
            member.outstanding_bytes,
            u32::from(member.credit_count),
            u64::from(member.credit_bytes),
        );
        let conn = member.conn;
        let eligible = self.eligible(member_id, None);
        let gathered = self.gather(sh, member_id, &eligible, window, now_ms, recs);
        for delivery in self.commit(sh, member_id, &gathered.candidates, now_ms) {
            sh.effects.push(Effect::Deliver { conn, delivery });
        }
    }

    /// Answers the member's waiting PULLs, in order, that are satisfied (enough
    /// bytes, or their window is full) or past their deadline.
    pub(super) fn serve_pulls(
        &mut self,
        sh: &mut Shared,
        member_id: u64,
        now_ms: u64,
        recs: &mut dyn Records,
        room: &dyn OutputRoom,
    ) {
        loop {
            let Some(member) = self.members.get(&member_id) else {
                return;
            };
            let Some(pull) = member.pulls.front() else {
                return;
            };
            let conn = member.conn;
            let window = Window {
                frame_room: sh
                    .room_left(room, conn)
                    .saturating_sub(OK_EMPTY_FRAME_BYTES as u64),
                ..Window::credit(0, 0, u32::from(pull.max_msgs), u64::from(pull.max_bytes))
            };
            let eligible = self.eligible(member_id, pull.only.as_deref());
            let (min_bytes, deadline_ms) = (pull.min_bytes, pull.deadline_ms);
            let gathered = self.gather(sh, member_id, &eligible, window, now_ms, recs);
            let satisfied = !gathered.candidates.is_empty()
                && (min_bytes == 0
                    || gathered.bytes >= u64::from(min_bytes)
                    || gathered.full
                    || gathered.candidates.len() as u32 >= window.max_count);
            if !satisfied && now_ms < deadline_ms {
                return;
            }
            let member = self.members.get_mut(&member_id).expect("checked");
            let pull = member.pulls.pop_front().expect("checked");
            sh.timer_clear(
                pull.deadline_ms,
                pull_timer(self.id, member_id, pull.pull_id),
            );
            let deliveries = self.commit(sh, member_id, &gathered.candidates, now_ms);
            answer_pull(sh, conn, pull.pull_id, deliveries, gathered.frame_bytes);
        }
    }

    /// The partitions a PULL's `ownership_epochs` name among those `member_id` holds
    /// (assigned or owned), with their ownership epochs; `None` for an empty list (all it
    /// owns). Matched once when the PULL arrives, in one pass over the list, so a waiting
    /// PULL keeps neither the list (up to 65,535 epochs) nor a rescan of it per serve.
    pub(super) fn pull_only(&self, member_id: u64, epochs: &[u64]) -> Option<Vec<(u16, u64)>> {
        if epochs.is_empty() {
            return None;
        }
        let mut held: BTreeMap<u64, Vec<u16>> = BTreeMap::new();
        for (p, part) in self.partitions.iter().enumerate() {
            if part.ownership.held_by() == Some(member_id) {
                held.entry(part.ownership_epoch).or_default().push(p as u16);
            }
        }
        let mut only = Vec::new();
        for epoch in epochs {
            if let Some(parts) = held.remove(epoch) {
                only.extend(parts.into_iter().map(|p| (p, *epoch)));
            }
        }
        only.sort_unstable();
        Some(only)
    }

    /// The partitions `member_id` owns now, in index order; with `only`, those of them
    /// still at the ownership epoch listed.
    fn eligible(&self, member_id: u64, only: Option<&[(u16, u64)]>) -> Vec<usize> {
        let owned = |p: usize| self.partitions[p].ownership == Ownership::Owned { member_id };
        match only {
            None => (0..self.partitions.len()).filter(|&p| owned(p)).collect(),
            Some(only) => (only.iter())
                .map(|&(p, epoch)| (usize::from(p), epoch))
                .filter(|&(p, epoch)| owned(p) && self.partitions[p].ownership_epoch == epoch)
                .map(|(p, _)| p)
                .collect(),
        }
    }

    /// Prepares a partition for a delivery pass: skips what retention removed (the
    /// log only loses whole segments from its start) and what was restored as
    /// already dead-lettered at the head.
    fn cursor(&mut self, sh: &mut Shared, p: usize, now_ms: u64, recs: &mut dyn Records) -> Cursor {
        let (topic, pi) = (self.topic_id, p as u16);
        let first = recs.first_sequence(topic, pi);
        let end = recs.next_sequence(topic, pi);
        let part = &mut self.partitions[p];
        if part.next_seq < first {
            sh.stats.skipped_records += first - part.next_seq;
            part.next_seq = first;
        }
        while part
            .retries
            .first_key_value()
            .is_some_and(|(&s, _)| s < first)
        {
            let (seq, r) = part.retries.pop_first().expect("checked");
            sh.timer_clear(r.ready_at_ms, retry_timer(self.id, p, seq));
            sh.stats.skipped_records += 1;
        }
        let part = &mut self.partitions[p];
        while part
            .restored_dead
            .first()
            .is_some_and(|&s| s <= part.next_seq)
        {
            let s = part.restored_dead.pop_first().expect("checked");
            if s == part.next_seq {
                part.next_seq += 1;
            }
        }
        Cursor {
            partition: p,
            ready_retries: part
                .retries
                .iter()
                .filter(|(_, r)| r.ready_at_ms <= now_ms)
                .map(|(&s, _)| s)
                .collect(),
            next_retry: 0,
            next_new: part.next_seq,
            end,
            done: false,
        }
    }

    /// Picks records for `member_id` within `window`, round-robin over the `eligible`
    /// partitions; redeliveries before new records within a partition. Changes no
    /// delivery state.
    fn gather(
        &mut self,
        sh: &mut Shared,
        member_id: u64,
        eligible: &[usize],
        mut window: Window,
        now_ms: u64,
        recs: &mut dyn Records,
    ) -> Gathered {
        let mut out = Gathered::default();
        if eligible.is_empty() {
            return out;
        }
        let start = {
            let m = self.members.get_mut(&member_id).expect("member");
            m.rotation = m.rotation.wrapping_add(1);
            m.rotation % eligible.len()
        };
        let mut cursors: Vec<Cursor> = eligible[start..]
            .iter()
            .chain(&eligible[..start])
            .map(|&p| self.cursor(sh, p, now_ms, recs))
            .collect();
        loop {
            let mut progressed = false;
            for c in cursors.iter_mut().filter(|c| !c.done) {
                let Some((seq, retry)) = c.next(&self.partitions[c.partition]) else {
                    c.done = true;
                    continue;
                };
                let bytes = match recs.record_bytes(self.topic_id, c.partition as u16, seq) {
                    RecordBytes::Size(bytes) => bytes,
                    RecordBytes::Gone => {
                        progressed |= self.skip_gone(sh, c, seq, retry);
                        continue;
                    }
                    RecordBytes::Unreadable => {
                        self.wait_for_read(sh, c, now_ms);
                        continue;
                    }
                };
                if !window.admits(bytes) {
                    out.full = true;
                    return out;
                }
                window.take(bytes);
                out.bytes += u64::from(bytes);
                out.frame_bytes += msg_frame_bytes(bytes);
                out.candidates.push(Candidate {
                    partition: c.partition,
                    seq,
                    bytes,
                    retry,
                });
                c.advance(retry);
                progressed = true;
            }
            if !progressed {
                return out;
            }
        }
    }

    /// A record that could not be read just now is never skipped for it: its partition
    /// waits, and the group looks again after [`READ_RETRY_MS`].
    fn wait_for_read(&self, sh: &mut Shared, c: &mut Cursor, now_ms: u64) {
        c.done = true;
        sh.stats.read_retries += 1;
        let timer = Timer::ReadRetry { group_id: self.id };
        sh.timer_set(now_ms.saturating_add(READ_RETRY_MS), timer);
    }

    /// A record below the log's end that is gone: removed by retention since the cursor
    /// looked, or corrupt (failed its CRC). Either way it can never be delivered, so it is
    /// skipped (counted) once it is at the head; waiting for it would stall the partition
    /// forever. Returns whether the cursor moved.
    fn skip_gone(&mut self, sh: &mut Shared, c: &mut Cursor, seq: u64, retry: bool) -> bool {
        let part = &mut self.partitions[c.partition];
        if retry {
            if let Some(r) = part.retries.remove(&seq) {
                sh.timer_clear(r.ready_at_ms, retry_timer(self.id, c.partition, seq));
            }
        } else if seq == part.next_seq {
            part.next_seq += 1;
        } else {
            c.done = true;
            return false;
        }
        sh.stats.skipped_records += 1;
        c.advance(retry);
        true
    }

    /// Makes gathered records outstanding for the member and returns the deliveries.
    fn commit(
        &mut self,
        sh: &mut Shared,
        member_id: u64,
        candidates: &[Candidate],
        now_ms: u64,
    ) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(candidates.len());
        for c in candidates {
            let (p, seq) = (c.partition, c.seq);
            let retry_timer = retry_timer(self.id, p, seq);
            let part = &mut self.partitions[p];
            let attempt = if c.retry {
                let r = part.retries.remove(&seq).expect("gathered retry");
                sh.timer_clear(r.ready_at_ms, retry_timer);
                r.attempts.saturating_add(1)
            } else {
                // Restored dead letters passed over on the way are settled.
                part.next_seq = seq + 1;
                while part.restored_dead.first().is_some_and(|&s| s <= seq) {
                    part.restored_dead.pop_first();
                }
                1
            };
            let delivery_id = sh.next_delivery_id;
            sh.next_delivery_id += 1;
            let deadline_ms = now_ms.saturating_add(sh.config.ack_wait_ms);
            part.outstanding.insert(
                seq,
                Outstanding {
                    delivery_id,
                    member_id,
                    attempt,
                    bytes: c.bytes,
                    deadline_ms,
                },
            );
            sh.stats.deliveries += 1;
            if attempt > 1 {
                sh.stats.redeliveries += 1;
            }
            let member = self.members.get_mut(&member_id).expect("member");
            member.outstanding_count += 1;
            member.outstanding_bytes += u64::from(c.bytes);
            out.push(Delivery {
                reference: DeliveryRef {
                    subscription_id: member.subscription_id,
                    topic_id: self.topic_id,
                    partition: p as u16,
                    sequence: seq,
                    delivery_id,
                    ownership_epoch: part.ownership_epoch,
                },
                attempt,
            });
            self.arm_ack_wait(sh, p, deadline_ms);
        }
        out
    }

    // ---- administration (`manage.rs`) ------------------------------------------------

    /// Operator reset of a group without members: partition `p` delivers from `next_seq`
    /// on. Its redeliveries go (the position says what is settled now); the caller
    /// checked that nothing is outstanding or waiting to be dead-lettered.
    pub(super) fn reset_partition(&mut self, sh: &mut Shared, p: usize, next_seq: u64) {
        let part = &mut self.partitions[p];
        debug_assert!(part.outstanding.is_empty() && part.dead_pending.is_empty());
        for (seq, r) in std::mem::take(&mut part.retries) {
            sh.timer_clear(r.ready_at_ms, retry_timer(self.id, p, seq));
        }
        part.restored_dead.retain(|&s| s >= next_seq);
        part.next_seq = next_seq;
    }

    /// Whether nothing is in flight in any partition (a reset may move them).
    pub(super) fn idle(&self) -> bool {
        self.partitions
            .iter()
            .all(|p| p.outstanding.is_empty() && p.dead_pending.is_empty())
    }

    /// The records of partition `p` below `first` were purged: deliveries of them end
    /// (their credit returns; an ACK for one gets UNKNOWN_DELIVERY), redeliveries of them
    /// are dropped, and the next delivery is at `first` or later. Dead letters already
    /// emitted settle as usual once durable.
    pub(super) fn purged(&mut self, sh: &mut Shared, p: usize, first: u64) {
        let gid = self.id;
        let Some(part) = self.partitions.get_mut(p) else {
            return;
        };
        while let Some((seq, r)) = part.retries.pop_first() {
            if seq >= first {
                part.retries.insert(seq, r);
                break;
            }
            sh.timer_clear(r.ready_at_ms, retry_timer(gid, p, seq));
        }
        let gone: Vec<u64> = part.outstanding.range(..first).map(|(&s, _)| s).collect();
        for seq in gone {
            let o = part.outstanding.remove(&seq).expect("listed");
            if let Some(m) = self.members.get_mut(&o.member_id) {
                m.credit_return(o.bytes);
            }
        }
        part.restored_dead.retain(|&s| s >= first);
        part.next_seq = part.next_seq.max(first);
        if !self.members.is_empty() {
            sh.dirty.insert(gid);
        }
    }

    // ---- observation ----------------------------------------------------------------

    pub(super) fn snapshot(&self) -> GroupSnapshot {
        GroupSnapshot {
            group_id: self.id,
            name: self.name.clone(),
            topic_id: self.topic_id,
            members: self
                .members
                .values()
                .map(|m| MemberSnapshot {
                    member_id: m.member_id,
                    membership_epoch: m.membership_epoch,
                    assignment_epoch: m.assignment_epoch,
                    conn: m.conn,
                    subscription_id: m.subscription_id,
                    pull_mode: m.pull_mode,
                    credit_count: m.credit_count,
                    credit_bytes: m.credit_bytes,
                    credit_epoch: m.credit_epoch,
                    outstanding_count: m.outstanding_count,
                    outstanding_bytes: m.outstanding_bytes,
                    pending_pulls: m.pulls.len(),
                })
                .collect(),
            partitions: self
                .partitions
                .iter()
                .enumerate()
                .map(|(p, part)| PartitionSnapshot {
                    partition: p as u16,
                    owner: part.ownership.member(),
                    state: match part.ownership {
                        Ownership::Unowned => OwnershipState::Unowned,
                        Ownership::Assigning { .. } => OwnershipState::Assigning,
                        Ownership::Owned { .. } => OwnershipState::Owned,
                        Ownership::Revoking { .. } => OwnershipState::Revoking,
                    },
                    ownership_epoch: part.ownership_epoch,
                    committed: self.committed(p),
                    next_sequence: part.next_seq,
                    outstanding: part.outstanding.len(),
                    pending_redeliveries: part.retries.len(),
                    dead_letter_pending: part.dead_pending.len(),
                })
                .collect(),
        }
    }

    /// The bookkeeping rules of the module doc, checked after every test step.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        // Set in the coordinator's timers too: `Coordinator::check_group_timers`.
        let mut count: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        for part in &self.partitions {
            if let Some(m) = part.ownership.member() {
                assert!(self.members.contains_key(&m), "owner {m} is not a member");
            }
            for (&seq, o) in &part.outstanding {
                assert!(seq < part.next_seq);
                assert!(!part.retries.contains_key(&seq) && !part.dead_pending.contains_key(&seq));
                assert!(
                    matches!(
                        part.ownership,
                        Ownership::Owned { member_id } | Ownership::Revoking { member_id, .. }
                            if member_id == o.member_id
                    ),
                    "outstanding delivery on a partition its member does not own"
                );
                let e = count.entry(o.member_id).or_default();
                e.0 += 1;
                e.1 += u64::from(o.bytes);
            }
            for seq in part.retries.keys() {
                assert!(*seq < part.next_seq && !part.dead_pending.contains_key(seq));
            }
            if let Some(earliest) = part.outstanding.values().map(|o| o.deadline_ms).min() {
                assert!(
                    part.ack_timer_ms.is_some_and(|at_ms| at_ms <= earliest),
                    "an outstanding delivery's deadline before its partition's ack-wait timer"
                );
            }
        }
        for m in self.members.values() {
            let (c, b) = count.get(&m.member_id).copied().unwrap_or_default();
            assert_eq!(
                (m.outstanding_count, m.outstanding_bytes),
                (c, b),
                "credit books"
            );
        }
    }
}
