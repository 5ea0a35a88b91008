//! Coordinator tests: a fake log (`Log`), an injected clock (`H::now`), and the
//! bookkeeping invariants checked after every step (`H::effects`).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::*;

const TOPIC: u16 = 1;
const RECORD_BYTES: u32 = 10;

/// A fake log: per partition (first retained, next) and optional per-record sizes.
#[derive(Default)]
struct Log {
    partitions: BTreeMap<u16, Vec<(u64, u64)>>,
    sizes: HashMap<(u16, u16, u64), u32>,
    /// Records whose reads fail for now (EIO, EMFILE).
    unreadable: HashSet<(u16, u16, u64)>,
}

impl Records for Log {
    fn partition_count(&self, topic_id: u16) -> Option<u16> {
        self.partitions.get(&topic_id).map(|p| p.len() as u16)
    }
    fn first_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions[&topic_id][usize::from(partition)].0
    }
    fn next_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions[&topic_id][usize::from(partition)].1
    }
    fn record_bytes(&mut self, topic_id: u16, partition: u16, sequence: u64) -> RecordBytes {
        let range = self
            .partitions
            .get(&topic_id)
            .and_then(|p| p.get(usize::from(partition)));
        let Some(&(first, next)) = range else {
            return RecordBytes::Gone;
        };
        if sequence < first || sequence >= next {
            return RecordBytes::Gone;
        }
        if self.unreadable.contains(&(topic_id, partition, sequence)) {
            return RecordBytes::Unreadable;
        }
        let size = self.sizes.get(&(topic_id, partition, sequence));
        RecordBytes::Size(size.copied().unwrap_or(RECORD_BYTES))
    }
}

fn config() -> ConsumeConfig {
    ConsumeConfig {
        session_timeout_ms: 30_000,
        revoke_timeout_ms: 10_000,
        ack_wait_ms: 5_000,
        nack_delay_ms: 1_000,
        max_attempts: 3,
        max_credit_count: 1000,
        max_credit_bytes: 4 * 1024 * 1024,
        max_subscriptions_per_conn: 4,
        max_groups: 8,
        max_members_per_group: 8,
        group_ttl_ms: 60_000,
    }
}

/// Test harness: coordinator + fake log + clock + what each connection's output can
/// still take (unlimited unless a test says).
struct H {
    c: Coordinator,
    log: Log,
    now: u64,
    room: HashMap<ConnId, u64>,
}

impl H {
    fn new(partitions: u16) -> H {
        H::with(config(), partitions)
    }

    fn with(config: ConsumeConfig, partitions: u16) -> H {
        let mut log = Log::default();
        log.partitions
            .insert(TOPIC, vec![(1, 1); usize::from(partitions)]);
        H {
            c: Coordinator::new(config),
            log,
            now: 1_000,
            room: HashMap::new(),
        }
    }

    fn append(&mut self, partition: u16, n: u64) {
        self.log.partitions.get_mut(&TOPIC).unwrap()[usize::from(partition)].1 += n;
        self.c.records_available(TOPIC, partition);
    }

    fn sub_req(group: &[u8], flags: u16) -> Sub<'_> {
        Sub {
            group,
            topic_id: TOPIC,
            partition: SUB_PARTITION_ANY,
            start_policy: StartPolicy::Earliest.as_code(),
            credit_count: 0,
            credit_bytes: 0,
            flags: SubFlags::from_bits_retain(flags),
        }
    }

    fn try_sub(&mut self, conn: ConnId, sub: &Sub) -> Result<SubResult, ErrorCode> {
        let r = self.c.subscribe(conn, sub, self.now, &mut self.log);
        self.c.check_invariants();
        r
    }

    fn sub(&mut self, conn: ConnId, flags: u16) -> SubResult {
        self.try_sub(conn, &H::sub_req(b"g", flags)).unwrap()
    }

    fn pump(&mut self) {
        let room = |conn| self.room.get(&conn).copied().unwrap_or(u64::MAX);
        self.c.pump(self.now, &mut self.log, &room);
        self.c.check_invariants();
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.pump();
    }

    /// Pumps, then drains the effects (which reach their connections: their room is
    /// what `room` says from now on).
    fn effects(&mut self) -> Vec<Effect> {
        self.pump();
        self.c.outputs_caught_up();
        self.c.take_effects()
    }

    fn control_ack(&mut self, conn: ConnId, n: &Notice, result: u8) -> Result<(), ErrorCode> {
        let ca = ControlAck {
            result,
            ..ControlAck::answering(n, ControlResult::Ok)
        };
        let r = self.c.control_ack(conn, &ca, self.now);
        self.c.check_invariants();
        r
    }

    /// Acks every notice in `fx` with OK.
    fn accept(&mut self, fx: &[Effect]) {
        for (conn, n) in notices(fx) {
            self.control_ack(conn, &n, ControlResult::Ok.as_code())
                .unwrap();
        }
    }

    /// SUB + accept the ASSIGNs it produced.
    fn join(&mut self, conn: ConnId, flags: u16) -> SubResult {
        let r = self.sub(conn, flags);
        let fx = self.effects();
        self.accept(&fx);
        r
    }

    fn ack(&mut self, conn: ConnId, d: &Delivery, flags: u16) -> Result<(), ErrorCode> {
        let r = self.c.ack(
            conn,
            &d.reference.ack(AckFlags::from_bits_retain(flags)),
            self.now,
        );
        self.c.check_invariants();
        r
    }

    fn nack(&mut self, conn: ConnId, d: &Delivery, reason: u8) -> Result<(), ErrorCode> {
        let r = self.c.nack(
            conn,
            &Nack {
                reason,
                ..d.reference.nack(NackReason::Retry)
            },
            self.now,
        );
        self.c.check_invariants();
        r
    }

    fn heartbeat(&mut self, conn: ConnId, s: &SubResult, state: u8) -> Result<(), ErrorCode> {
        let r = self.c.heartbeat(
            conn,
            &Heartbeat {
                subscription_id: s.subscription_id,
                member_id: s.member_id,
                membership_epoch: s.membership_epoch,
                assignment_epoch: 0,
                state,
            },
            self.now,
        );
        self.c.check_invariants();
        r
    }

    fn pull_req(&self, s: &SubResult, max_msgs: u16, wait_ms: u16, min_bytes: u32) -> Pull {
        Pull {
            subscription_id: s.subscription_id,
            member_id: s.member_id,
            membership_epoch: s.membership_epoch,
            assignment_epoch: self.assignment_epoch(s.member_id),
            ownership_epochs: Vec::new(),
            max_msgs,
            max_bytes: 0,
            wait_ms,
            min_bytes,
        }
    }

    fn pull(&mut self, conn: ConnId, pull_id: u64, p: &Pull) -> Result<(), ErrorCode> {
        let room = |conn| self.room.get(&conn).copied().unwrap_or(u64::MAX);
        let r = self
            .c
            .pull(conn, pull_id, p, self.now, &mut self.log, &room);
        self.c.check_invariants();
        r
    }

    fn credit(
        &mut self,
        conn: ConnId,
        s: &SubResult,
        mode: u8,
        count: u16,
        bytes: u32,
    ) -> Result<CreditResult, ErrorCode> {
        let r = self.c.credit(
            conn,
            &Credit {
                subscription_id: s.subscription_id,
                membership_epoch: s.membership_epoch,
                ownership_epoch: 0,
                mode,
                credit_count: count,
                credit_bytes: bytes,
                reserved: 0,
            },
            self.now,
        );
        self.c.check_invariants();
        r
    }

    fn assignment_epoch(&self, member_id: u64) -> u32 {
        self.member(member_id).assignment_epoch
    }

    fn member(&self, member_id: u64) -> MemberSnapshot {
        self.c.snapshot().groups[0]
            .members
            .iter()
            .find(|m| m.member_id == member_id)
            .cloned()
            .unwrap()
    }

    fn partition(&self, p: u16) -> PartitionSnapshot {
        self.c.snapshot().groups[0].partitions[usize::from(p)].clone()
    }

    /// Owner of each partition (None while unowned).
    fn owners(&self) -> Vec<Option<u64>> {
        self.c.snapshot().groups[0]
            .partitions
            .iter()
            .map(|p| p.owner)
            .collect()
    }
}

fn notices(fx: &[Effect]) -> Vec<(ConnId, Notice)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Notice { conn, notice } => Some((*conn, notice.clone())),
            _ => None,
        })
        .collect()
}

fn kinds(fx: &[Effect]) -> Vec<(ConnId, u8, u16)> {
    notices(fx)
        .into_iter()
        .map(|(c, n)| (c, n.kind, n.partition))
        .collect()
}

fn pushed(fx: &[Effect]) -> Vec<(ConnId, Delivery)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Deliver { conn, delivery } => Some((*conn, *delivery)),
            _ => None,
        })
        .collect()
}

/// The sequences of the records pushed in `fx`, in order.
fn pushed_sequences(fx: &[Effect]) -> Vec<u64> {
    pushed(fx)
        .iter()
        .map(|(_, d)| d.reference.sequence)
        .collect()
}

fn seqs(fx: &[Effect]) -> Vec<u64> {
    pushed(fx)
        .iter()
        .map(|(_, d)| d.reference.sequence)
        .collect()
}

fn pull_answers(fx: &[Effect]) -> Vec<(ConnId, u64, Vec<Delivery>)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::PullAnswer {
                conn,
                pull_id,
                deliveries,
                ..
            } => Some((*conn, *pull_id, deliveries.clone())),
            _ => None,
        })
        .collect()
}

fn dead_letters(fx: &[Effect]) -> Vec<(u64, u16, OriginReason)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::DeadLetter {
                sequence,
                attempts,
                reason,
                ..
            } => Some((*sequence, *attempts, *reason)),
            _ => None,
        })
        .collect()
}

const A: ConnId = 10;
const B: ConnId = 20;
const C: ConnId = 30;

// ---- membership and assignment -----------------------------------------------------

#[test]
fn first_member_gets_every_partition_with_rising_epochs() {
    let mut h = H::new(3);
    let s = h.sub(A, 0);
    assert_eq!(
        s,
        SubResult {
            subscription_id: 1,
            member_id: 1,
            membership_epoch: 1,
            assignment_epoch: 0
        }
    );
    let fx = h.effects();
    let ns = notices(&fx);
    assert_eq!(ns.len(), 3);
    for (i, (conn, n)) in ns.iter().enumerate() {
        assert_eq!(*conn, A);
        assert_eq!(n.notice_id, i as u64 + 1);
        assert_eq!(n.kind, NoticeKind::Assign.as_code());
        assert_eq!(n.group_id, 1);
        assert_eq!(n.member_id, 1);
        assert_eq!(n.membership_epoch, 1);
        assert_eq!(n.assignment_epoch, i as u32 + 1);
        assert_eq!(n.ownership_epoch, 1);
        assert_eq!((n.topic_id, n.partition), (TOPIC, i as u16));
    }
    // A second subscription on the same connection gets id 2 and a new member id.
    let s2 = h.sub(A, 0);
    assert_eq!(
        (s2.subscription_id, s2.member_id, s2.membership_epoch),
        (2, 2, 2)
    );
}

/// A cluster node that starts leading in term 3 hands out member ids and ownership
/// epochs above `3 << 32`, above anything a leader of an earlier term gave, for groups
/// it already had and groups made later alike.
#[test]
fn a_new_leaders_member_ids_and_ownership_epochs_start_above_its_term() {
    let mut h = H::new(2);
    h.sub(A, 0);
    let fx = h.effects();
    let before: Vec<u64> = notices(&fx)
        .iter()
        .map(|(_, n)| n.ownership_epoch)
        .collect();
    assert_eq!(before, [1, 1]);
    h.accept(&fx);
    let base = 3u64 << 32;
    h.c.raise_epochs(base);
    let s = h.sub(B, 0);
    assert!(s.member_id > base, "{s:?}");
    // B's share is revoked from A under the raised epoch, then assigned above it.
    let revokes = h.effects();
    assert!(!notices(&revokes).is_empty());
    for (_, n) in notices(&revokes) {
        assert_eq!(n.ownership_epoch, base, "{n:?}");
    }
    h.accept(&revokes);
    let assigns = notices(&h.effects());
    assert!(!assigns.is_empty());
    for (_, n) in assigns {
        assert_eq!(n.kind, NoticeKind::Assign.as_code());
        assert!(n.ownership_epoch > base, "{n:?}");
    }
    // A lower base (an older term's) lowers nothing.
    h.c.raise_epochs(1 << 32);
    assert!(h.sub(C, 0).member_id > base);
}

#[test]
fn msg_flows_only_after_the_assign_is_acked() {
    let mut h = H::new(1);
    h.sub(A, 0);
    h.append(0, 3);
    let fx = h.effects();
    assert!(pushed(&fx).is_empty(), "no MSG before CONTROL_ACK(OK)");
    assert_eq!(h.partition(0).state, OwnershipState::Assigning);
    h.accept(&fx);
    let fx = h.effects();
    assert_eq!(seqs(&fx), vec![1, 2, 3]);
    let (conn, d) = pushed(&fx)[0];
    assert_eq!(conn, A);
    assert_eq!(
        (
            d.reference.delivery_id,
            d.attempt,
            d.reference.ownership_epoch,
            d.reference.subscription_id
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn second_member_gets_half_via_revoke_then_assign() {
    let mut h = H::new(4);
    h.join(A, 0);
    let b = h.sub(B, 0);
    let fx = h.effects();
    // Sticky: A keeps 0 and 1, gives up its highest partitions; B gets nothing yet.
    assert_eq!(
        kinds(&fx),
        vec![
            (A, NoticeKind::Revoke.as_code(), 3),
            (A, NoticeKind::Revoke.as_code(), 2)
        ]
    );
    let revokes = notices(&fx);
    assert_eq!(
        revokes[0].1.assignment_epoch, 5,
        "4 ASSIGNs then this REVOKE"
    );
    assert_eq!(revokes[1].1.assignment_epoch, 6);
    assert_eq!(
        revokes[0].1.ownership_epoch, 1,
        "REVOKE carries the current epoch"
    );
    assert_eq!(h.partition(3).state, OwnershipState::Revoking);

    h.control_ack(A, &revokes[0].1, ControlResult::Ok.as_code())
        .unwrap();
    let fx = h.effects();
    let ns = notices(&fx);
    assert_eq!(kinds(&fx), vec![(B, NoticeKind::Assign.as_code(), 3)]);
    assert_eq!(ns[0].1.member_id, b.member_id);
    assert_eq!(ns[0].1.assignment_epoch, 1);
    assert_eq!(
        ns[0].1.ownership_epoch, 2,
        "ownership epoch +1 on every ASSIGN"
    );

    // STALE on a REVOKE still releases.
    h.control_ack(A, &revokes[1].1, ControlResult::Stale.as_code())
        .unwrap();
    let fx = h.effects();
    assert_eq!(kinds(&fx), vec![(B, NoticeKind::Assign.as_code(), 2)]);
    h.accept(&fx);
    assert_eq!(h.owners(), vec![Some(1), Some(1), Some(2), Some(2)]);
}

#[test]
fn third_member_moves_the_minimum_and_leaving_rebalances() {
    let mut h = H::new(6);
    h.join(A, 0);
    h.sub(B, 0);
    let fx = h.effects();
    h.accept(&fx); // REVOKEs
    let fx = h.effects();
    h.accept(&fx); // ASSIGNs to B
    assert_eq!(
        h.owners(),
        vec![Some(1), Some(1), Some(1), Some(2), Some(2), Some(2)]
    );

    h.sub(C, 0);
    let fx = h.effects();
    // 3+3 → 2+2+2: exactly one REVOKE each from A and B.
    assert_eq!(
        kinds(&fx),
        vec![
            (A, NoticeKind::Revoke.as_code(), 2),
            (B, NoticeKind::Revoke.as_code(), 5)
        ]
    );
    h.accept(&fx);
    let fx = h.effects();
    assert_eq!(
        kinds(&fx),
        vec![
            (C, NoticeKind::Assign.as_code(), 2),
            (C, NoticeKind::Assign.as_code(), 5)
        ]
    );
    h.accept(&fx);
    assert_eq!(
        h.owners(),
        vec![Some(1), Some(1), Some(3), Some(2), Some(2), Some(3)]
    );

    // B leaves: its two partitions go straight to A and C (no REVOKE to B).
    h.c.connection_closed(B, h.now);
    let fx = h.effects();
    let k = kinds(&fx);
    assert_eq!(k.len(), 2);
    assert!(k
        .iter()
        .all(|(c, kind, _)| *c != B && *kind == NoticeKind::Assign.as_code()));
    h.accept(&fx);
    let owners = h.owners();
    assert_eq!(owners.iter().filter(|o| **o == Some(1)).count(), 3);
    assert_eq!(owners.iter().filter(|o| **o == Some(3)).count(), 3);
    assert_eq!(owners[0..2], [Some(1), Some(1)], "A kept what it had");
}

#[test]
fn uneven_counts_spread_within_one() {
    let mut h = H::new(5);
    h.join(A, 0);
    h.join(B, 0);
    for _ in 0..3 {
        let fx = h.effects();
        h.accept(&fx);
    }
    let owners = h.owners();
    let a = owners.iter().filter(|o| **o == Some(1)).count();
    let b = owners.iter().filter(|o| **o == Some(2)).count();
    assert_eq!(
        (a, b),
        (3, 2),
        "the larger share stays with the member that held more"
    );
}

#[test]
fn revoke_timeout_releases_and_fences_the_old_owner() {
    let mut h = H::new(2);
    h.join(A, 0);
    h.append(1, 1);
    let fx = h.effects();
    let (_, d) = pushed(&fx)[0];
    assert_eq!(d.reference.partition, 1);
    h.sub(B, 0);
    let fx = h.effects();
    assert_eq!(kinds(&fx), vec![(A, NoticeKind::Revoke.as_code(), 1)]);
    assert_eq!(
        h.c.next_deadline_ms(),
        Some(h.now + 5_000),
        "ack-wait is first"
    );

    // A never answers the REVOKE (it keeps its session alive).
    h.advance(4_000);
    assert_eq!(
        h.ack(A, &d, AckFlags::PROGRESS.bits()),
        Ok(()),
        "old owner may work until release"
    );
    h.advance(6_000);
    let fx = h.c.take_effects();
    let ns = notices(&fx);
    assert_eq!(kinds(&fx), vec![(B, NoticeKind::Assign.as_code(), 1)]);
    h.control_ack(B, &ns[0].1, ControlResult::Ok.as_code())
        .unwrap();
    let fx = h.effects();
    let (conn, d2) = pushed(&fx)[0];
    assert_eq!(
        (
            conn,
            d2.reference.sequence,
            d2.attempt,
            d2.reference.ownership_epoch
        ),
        (B, 1, 2, 2)
    );
    // Zombie: A's ACK of the released delivery is fenced and changes nothing.
    assert_eq!(h.ack(A, &d, 0), Err(ErrorCode::OwnershipFenced));
    assert_eq!(h.partition(1).outstanding, 1);
    assert_eq!(h.ack(B, &d2, 0), Ok(()));
    assert_eq!(h.partition(1).committed, 1);
}

#[test]
fn assign_refused_is_offered_again() {
    let mut h = H::new(1);
    h.sub(A, 0);
    let fx = h.effects();
    let n = notices(&fx)[0].1.clone();
    h.control_ack(A, &n, ControlResult::Error.as_code())
        .unwrap();
    let fx = h.effects();
    let again = notices(&fx);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1.kind, NoticeKind::Assign.as_code());
    assert_eq!(again[0].1.ownership_epoch, 2);
    assert_eq!(again[0].1.assignment_epoch, 2);
    // A notice can be acked once; another connection cannot ack it.
    assert_eq!(
        h.control_ack(A, &n, ControlResult::Ok.as_code()),
        Err(ErrorCode::UnknownNotice)
    );
    assert_eq!(
        h.control_ack(B, &again[0].1, ControlResult::Ok.as_code()),
        Err(ErrorCode::UnknownNotice)
    );
    assert_eq!(
        h.control_ack(A, &again[0].1, 3),
        Err(ErrorCode::InvalidArgument)
    );
    h.control_ack(A, &again[0].1, ControlResult::Ok.as_code())
        .unwrap();
    assert_eq!(h.partition(0).state, OwnershipState::Owned);
}

#[test]
fn leave_frees_partitions_and_redelivers_outstanding() {
    let mut h = H::new(2);
    let a = h.join(A, 0);
    h.join(B, 0);
    let fx = h.effects();
    h.accept(&fx);
    let fx = h.effects();
    h.accept(&fx);
    assert_eq!(h.owners(), vec![Some(1), Some(2)]);
    h.append(1, 1);
    let fx = h.effects();
    let (conn_b, d_b) = pushed(&fx)[0];
    assert_eq!(conn_b, B);

    let b = SubResult {
        subscription_id: 1,
        member_id: 2,
        membership_epoch: 2,
        assignment_epoch: 0,
    };
    h.heartbeat(B, &b, HeartbeatState::Leave.as_code()).unwrap();
    let fx = h.effects();
    assert_eq!(
        kinds(&fx),
        vec![(A, NoticeKind::Assign.as_code(), 1)],
        "no REVOKE to a gone member"
    );
    h.accept(&fx);
    let fx = h.effects();
    let (conn, d) = pushed(&fx)[0];
    assert_eq!((conn, d.reference.sequence, d.attempt), (A, 1, 2));
    // The left member's subscription is still open but its member is unknown.
    assert_eq!(
        h.heartbeat(B, &b, HeartbeatState::Active.as_code()),
        Err(ErrorCode::UnknownMember)
    );
    // CREDIT of a member that left: "SUB again" rather than a STALE_EPOCH loop.
    assert_eq!(
        h.credit(B, &b, CreditMode::Add.as_code(), 1, 0),
        Err(ErrorCode::UnknownMember)
    );
    // Its ACK of a delivery that moved is fenced.
    assert_eq!(h.ack(B, &d_b, 0), Err(ErrorCode::OwnershipFenced));
    let p = h.pull_req(&a, 1, 0, 0);
    assert_eq!(
        h.pull(
            A,
            9,
            &Pull {
                subscription_id: 1,
                ..p.clone()
            }
        ),
        Ok(())
    );
    let mut p_b = p;
    p_b.member_id = 2;
    assert_eq!(h.pull(B, 1, &p_b), Err(ErrorCode::UnknownMember));
}

#[test]
fn session_expires_without_ops_and_any_op_keeps_it() {
    let mut h = H::new(2);
    let a = h.join(A, 0);
    let b = h.join(B, 0);
    for _ in 0..2 {
        let fx = h.effects();
        h.accept(&fx);
    }
    h.append(0, 1);
    let fx = h.effects();
    let (_, d) = pushed(&fx)[0];
    assert_eq!(d.reference.partition, 0);

    h.advance(4_000);
    h.ack(A, &d, 0).unwrap();
    h.advance(16_000); // t0 + 20 s
    h.heartbeat(B, &b, HeartbeatState::Active.as_code())
        .unwrap();
    h.advance(5_000); // t0 + 25 s
    h.credit(A, &a, CreditMode::Add.as_code(), 0, 0).unwrap(); // any op on the subscription counts
    h.advance(24_999);
    assert_eq!(h.c.snapshot().groups[0].members.len(), 2);
    h.advance(1); // t0 + 50 s
                  // B's last op was 30 s ago: expelled; A's CREDIT kept A alive.
    let members: Vec<u64> = h.c.snapshot().groups[0]
        .members
        .iter()
        .map(|m| m.member_id)
        .collect();
    assert_eq!(members, vec![a.member_id]);
    let fx = h.c.take_effects();
    assert_eq!(kinds(&fx), vec![(A, NoticeKind::Assign.as_code(), 1)]);
    assert_eq!(
        h.heartbeat(B, &b, HeartbeatState::Active.as_code()),
        Err(ErrorCode::UnknownMember)
    );
    // Rejoining gives a new member id and membership epoch.
    let b2 = h.sub(B, 0);
    assert_eq!(
        (b2.subscription_id, b2.member_id, b2.membership_epoch),
        (2, 3, 3)
    );
}

#[test]
fn connection_close_drops_pulls_and_notices_silently() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    let p = h.pull_req(&a, 10, 5_000, 0);
    h.pull(A, 7, &p).unwrap();
    h.c.connection_closed(A, h.now);
    let fx = h.effects();
    assert!(
        fx.is_empty(),
        "nothing is sent to a closed connection: {fx:?}"
    );
    assert!(h.c.snapshot().groups[0].members.is_empty());
    assert_eq!(
        h.c.next_deadline_ms(),
        Some(h.now + config().group_ttl_ms),
        "its timers are gone; the empty group's expiry is left"
    );
}

#[test]
fn zombie_epochs_are_fenced() {
    let mut h = H::new(2);
    let a = h.join(A, 0);
    h.append(1, 1);
    let fx = h.effects();
    let (_, d) = pushed(&fx)[0];
    let stale_pull = h.pull_req(&a, 1, 0, 0);
    h.sub(B, 0);
    let fx = h.effects();
    h.accept(&fx); // A acks the REVOKE of partition 1
    let fx = h.effects();
    h.accept(&fx); // B acks the ASSIGN
                   // A's PULL built before the REVOKE carries an old assignment epoch.
    assert_eq!(h.pull(A, 1, &stale_pull), Err(ErrorCode::StaleEpoch));
    // A's ACK of the moved partition is fenced and nothing changes.
    assert_eq!(h.ack(A, &d, 0), Err(ErrorCode::OwnershipFenced));
    assert_eq!(
        h.nack(A, &d, NackReason::Reject.as_code()),
        Err(ErrorCode::OwnershipFenced)
    );
    let fx = h.effects();
    assert!(dead_letters(&fx).is_empty());
    assert_eq!(pushed(&fx).len(), 1, "B gets the record");
    // Wrong membership epoch → UNKNOWN_MEMBER; CREDIT → STALE_EPOCH.
    let mut hb = a;
    hb.membership_epoch += 7;
    assert_eq!(h.heartbeat(A, &hb, 0), Err(ErrorCode::UnknownMember));
    assert_eq!(
        h.credit(A, &hb, CreditMode::Add.as_code(), 1, 0),
        Err(ErrorCode::StaleEpoch)
    );
    let mut p = h.pull_req(&a, 1, 0, 0);
    p.membership_epoch += 7;
    assert_eq!(h.pull(A, 2, &p), Err(ErrorCode::UnknownMember));
}

// ---- SUB validation ----------------------------------------------------------------

#[test]
fn sub_validation_errors() {
    let mut h = H::new(1);
    let ok = H::sub_req(b"g", 0);
    let bad = |f: &dyn Fn(&mut Sub)| {
        let mut s = ok.clone();
        f(&mut s);
        s
    };
    let long = vec![b'a'; 256];
    let max = vec![b'a'; 255];
    let cases: Vec<(Sub, ErrorCode)> = vec![
        (bad(&|s| s.partition = 0), ErrorCode::InvalidSubscription),
        (bad(&|s| s.start_policy = 2), ErrorCode::InvalidSubscription),
        (bad(&|s| s.group = b""), ErrorCode::InvalidSubscription),
        (bad(&|s| s.group = b"a b"), ErrorCode::InvalidGroupName),
        (
            bad(&|s| s.group = "é".as_bytes()),
            ErrorCode::InvalidGroupName,
        ),
        (
            Sub {
                group: &long,
                ..ok.clone()
            },
            ErrorCode::InvalidGroupName,
        ),
        (bad(&|s| s.topic_id = 99), ErrorCode::UnknownTopic),
        (bad(&|s| s.credit_count = 1001), ErrorCode::CreditLimit),
        (
            bad(&|s| s.credit_bytes = 4 * 1024 * 1024 + 1),
            ErrorCode::CreditLimit,
        ),
    ];
    for (s, e) in cases {
        assert_eq!(h.try_sub(A, &s), Err(e), "{s:?}");
    }
    assert!(
        h.c.snapshot().groups.is_empty(),
        "a refused SUB creates nothing"
    );
    let r = h
        .try_sub(
            A,
            &Sub {
                group: &max,
                ..ok.clone()
            },
        )
        .unwrap();
    assert_eq!(r.subscription_id, 1);
    assert!(h.try_sub(A, &H::sub_req(b"A-z_0.9", 0)).is_ok());
}

#[test]
fn sub_default_credit_and_limits() {
    let mut h = H::new(1);
    let s = h.sub(A, 0);
    let r = h.credit(A, &s, CreditMode::Add.as_code(), 0, 0).unwrap();
    assert_eq!((r.granted_count, r.granted_bytes), (256, 2 * 1024 * 1024));
    // Per-connection limit (4).
    for _ in 0..3 {
        h.sub(A, 0);
    }
    assert_eq!(
        h.try_sub(A, &H::sub_req(b"g", 0)),
        Err(ErrorCode::TooManySubscriptions)
    );
    // Members per group (8): A has 4, B adds 4 more.
    for _ in 0..4 {
        h.sub(B, 0);
    }
    assert_eq!(
        h.try_sub(C, &H::sub_req(b"g", 0)),
        Err(ErrorCode::GroupLimitReached)
    );
    // Groups (8): "g" plus 7 more.
    for i in 0..7u8 {
        let name = [b'h', b'0' + i];
        h.try_sub(C + u32::from(i), &H::sub_req(&name, 0)).unwrap();
    }
    assert_eq!(
        h.try_sub(99, &H::sub_req(b"zz", 0)),
        Err(ErrorCode::GroupLimitReached)
    );
    assert_eq!(h.c.snapshot().groups.last().unwrap().group_id, 8);
}

// ---- credit ------------------------------------------------------------------------

#[test]
fn credit_count_window_limits_pushes() {
    let mut h = H::new(1);
    let s = h
        .try_sub(
            A,
            &Sub {
                credit_count: 2,
                ..H::sub_req(b"g", 0)
            },
        )
        .unwrap();
    let fx = h.effects();
    h.accept(&fx);
    h.append(0, 5);
    let fx = h.effects();
    let ds = pushed(&fx);
    assert_eq!(seqs(&fx), vec![1, 2]);
    assert!(h.effects().is_empty());
    h.ack(A, &ds[0].1, 0).unwrap();
    assert_eq!(seqs(&h.effects()), vec![3]);
    let r = h.credit(A, &s, CreditMode::Add.as_code(), 2, 0).unwrap();
    assert_eq!((r.granted_count, r.outstanding_count), (4, 2));
    assert_eq!(r.outstanding_bytes, 2 * RECORD_BYTES);
    assert_eq!(seqs(&h.effects()), vec![4, 5]);
}

#[test]
fn credit_bytes_window_and_the_one_record_exception() {
    let mut h = H::new(1);
    h.try_sub(
        A,
        &Sub {
            credit_bytes: 100,
            ..H::sub_req(b"g", 0)
        },
    )
    .unwrap();
    let fx = h.effects();
    h.accept(&fx);
    // Record 1 is larger than the whole window: it flows because nothing is out.
    h.log.sizes.insert((TOPIC, 0, 1), 500);
    h.log.sizes.insert((TOPIC, 0, 2), 60);
    h.log.sizes.insert((TOPIC, 0, 3), 40);
    h.log.sizes.insert((TOPIC, 0, 4), 1);
    h.append(0, 4);
    let fx = h.effects();
    assert_eq!(seqs(&fx), vec![1]);
    h.ack(A, &pushed(&fx)[0].1, 0).unwrap();
    // 60 + 40 = 100 fits exactly; 101 does not.
    let fx = h.effects();
    assert_eq!(seqs(&fx), vec![2, 3]);
    h.ack(A, &pushed(&fx)[0].1, 0).unwrap();
    assert_eq!(seqs(&h.effects()), vec![4]);
}

#[test]
fn credit_set_add_limits_and_epochs() {
    let mut h = H::new(1);
    let s = h
        .try_sub(
            A,
            &Sub {
                credit_count: 10,
                credit_bytes: 1000,
                ..H::sub_req(b"g", 0)
            },
        )
        .unwrap();
    let r = h.credit(A, &s, CreditMode::Set.as_code(), 0, 0).unwrap();
    assert_eq!(
        (r.granted_count, r.granted_bytes, r.credit_epoch),
        (10, 1000, 0),
        "SET 0/0: no change"
    );
    let r = h.credit(A, &s, CreditMode::Set.as_code(), 5, 0).unwrap();
    assert_eq!(
        (r.granted_count, r.granted_bytes, r.credit_epoch),
        (5, 1000, 1)
    );
    let r = h.credit(A, &s, CreditMode::Set.as_code(), 0, 2000).unwrap();
    assert_eq!(
        (r.granted_count, r.granted_bytes, r.credit_epoch),
        (5, 2000, 2)
    );
    let r = h.credit(A, &s, CreditMode::Add.as_code(), 3, 10).unwrap();
    assert_eq!(
        (r.granted_count, r.granted_bytes, r.credit_epoch),
        (8, 2010, 3)
    );
    assert_eq!(
        h.credit(A, &s, CreditMode::Add.as_code(), 993, 0),
        Err(ErrorCode::CreditLimit)
    );
    assert_eq!(
        h.credit(A, &s, CreditMode::Set.as_code(), 0, 4 * 1024 * 1024 + 1),
        Err(ErrorCode::CreditLimit)
    );
    assert_eq!(
        h.credit(A, &s, CreditMode::Add.as_code(), u16::MAX, 0),
        Err(ErrorCode::CreditLimit)
    );
    assert_eq!(h.credit(A, &s, 2, 1, 1), Err(ErrorCode::InvalidArgument));
    let r = h.credit(A, &s, CreditMode::Add.as_code(), 992, 0).unwrap();
    assert_eq!(
        (r.granted_count, r.credit_epoch),
        (1000, 4),
        "unchanged by the refusals"
    );
    let other = SubResult {
        subscription_id: 9,
        ..s
    };
    assert_eq!(
        h.credit(A, &other, CreditMode::Add.as_code(), 1, 0),
        Err(ErrorCode::UnknownSubscription)
    );
}

// ---- ack, nack, expiry, dead letters -------------------------------------------------

#[test]
fn ack_errors() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 1);
    let fx = h.effects();
    let (_, d) = pushed(&fx)[0];
    assert_eq!(
        h.ack(
            A,
            &Delivery {
                reference: DeliveryRef {
                    subscription_id: 5,
                    ..d.reference
                },
                ..d
            },
            0
        ),
        Err(ErrorCode::UnknownSubscription)
    );
    assert_eq!(h.ack(B, &d, 0), Err(ErrorCode::UnknownSubscription));
    assert_eq!(
        h.ack(
            A,
            &Delivery {
                reference: DeliveryRef {
                    ownership_epoch: 9,
                    ..d.reference
                },
                ..d
            },
            0
        ),
        Err(ErrorCode::OwnershipFenced)
    );
    assert_eq!(
        h.ack(
            A,
            &Delivery {
                reference: DeliveryRef {
                    delivery_id: 9,
                    ..d.reference
                },
                ..d
            },
            0
        ),
        Err(ErrorCode::UnknownDelivery)
    );
    assert_eq!(
        h.ack(
            A,
            &Delivery {
                reference: DeliveryRef {
                    sequence: 2,
                    ..d.reference
                },
                ..d
            },
            0
        ),
        Err(ErrorCode::UnknownDelivery)
    );
    assert_eq!(
        h.ack(
            A,
            &Delivery {
                reference: DeliveryRef {
                    partition: 4,
                    ..d.reference
                },
                ..d
            },
            0
        ),
        Err(ErrorCode::UnknownDelivery)
    );
    assert_eq!(h.nack(A, &d, 2), Err(ErrorCode::InvalidArgument));
    assert_eq!(h.nack(A, &d, 3), Err(ErrorCode::InvalidArgument));
    assert_eq!(h.ack(A, &d, 0), Ok(()));
    assert_eq!(
        h.ack(A, &d, 0),
        Err(ErrorCode::UnknownDelivery),
        "already settled"
    );
    assert_eq!(h.partition(0).committed, 1);
}

#[test]
fn ack_wait_expiry_redelivers_with_attempt_plus_one() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 1);
    let fx = h.effects();
    let (_, d1) = pushed(&fx)[0];
    assert_eq!(h.c.next_deadline_ms(), Some(h.now + 5_000));
    h.advance(4_999);
    assert!(pushed(&h.c.take_effects()).is_empty());
    h.advance(1);
    let fx = h.c.take_effects();
    let (_, d2) = pushed(&fx)[0];
    assert_eq!((d2.reference.sequence, d2.attempt), (1, 2));
    assert_ne!(d2.reference.delivery_id, d1.reference.delivery_id);
    assert_eq!(
        h.ack(A, &d1, 0),
        Err(ErrorCode::UnknownDelivery),
        "the expired delivery"
    );
    assert_eq!(h.c.stats().expired, 1);
    assert_eq!(h.ack(A, &d2, 0), Ok(()));
}

/// One ack-wait timer per partition (`group.rs`, `arm_ack_wait`): a delivery settled
/// before its deadline leaves the timer early, and each other delivery still expires at
/// its own deadline, neither before nor after.
#[test]
fn each_delivery_expires_at_its_own_deadline_after_an_earlier_one_was_acked() {
    let mut h = H::new(1);
    h.join(A, 0);
    let t0 = h.now;
    h.append(0, 1);
    let fx = h.effects();
    let (_, d1) = pushed(&fx)[0];
    h.advance(1_000);
    h.append(0, 1);
    let fx = h.effects();
    let (_, d2) = pushed(&fx)[0];
    h.advance(500);
    h.append(0, 1);
    let fx = h.effects();
    let (_, d3) = pushed(&fx)[0];
    h.ack(A, &d1, 0).unwrap();
    h.advance(t0 + 5_000 - h.now);
    assert!(
        h.c.take_effects().is_empty(),
        "the acked one's deadline: nothing due"
    );
    assert_eq!(h.c.stats().expired, 0);
    assert_eq!(
        h.c.next_deadline_ms(),
        Some(t0 + 6_000),
        "set again at d2's"
    );
    h.advance(999);
    assert!(pushed(&h.c.take_effects()).is_empty());
    h.advance(1);
    assert_eq!(
        pushed_sequences(&h.c.take_effects()),
        vec![d2.reference.sequence],
        "d2 alone, at its deadline"
    );
    assert_eq!(h.c.stats().expired, 1);
    h.advance(499);
    assert!(pushed(&h.c.take_effects()).is_empty(), "d3 is not due yet");
    h.advance(1);
    assert_eq!(
        pushed_sequences(&h.c.take_effects()),
        vec![d3.reference.sequence]
    );
    assert_eq!(h.c.stats().expired, 2);
    h.c.check_invariants();
}

#[test]
fn progress_resets_the_deadline_without_settling() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 1);
    let fx = h.effects();
    let (_, d) = pushed(&fx)[0];
    h.advance(4_000);
    h.ack(A, &d, AckFlags::PROGRESS.bits()).unwrap();
    assert_eq!(h.c.next_deadline_ms(), Some(h.now + 5_000));
    h.advance(4_000);
    assert!(h.c.take_effects().is_empty(), "not expired: deadline moved");
    assert_eq!(h.partition(0).committed, 0, "PROGRESS does not settle");
    assert_eq!(h.member(1).outstanding_count, 1, "nor return credit");
    h.advance(1_000);
    assert_eq!(pushed(&h.c.take_effects())[0].1.attempt, 2);
}

#[test]
fn nack_retry_redelivers_after_the_delay() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 2);
    let fx = h.effects();
    let ds = pushed(&fx);
    h.nack(A, &ds[0].1, NackReason::Retry.as_code()).unwrap();
    assert_eq!(h.member(1).outstanding_count, 1, "NACK returns credit");
    assert!(pushed(&h.effects()).is_empty());
    assert_eq!(h.c.next_deadline_ms(), Some(h.now + 1_000));
    h.advance(999);
    assert!(pushed(&h.c.take_effects()).is_empty());
    h.advance(1);
    let fx = h.c.take_effects();
    let (_, d) = pushed(&fx)[0];
    assert_eq!((d.reference.sequence, d.attempt), (1, 2));
    h.ack(A, &ds[1].1, 0).unwrap();
    assert_eq!(h.partition(0).committed, 0, "seq 1 is still unsettled");
    h.ack(A, &d, 0).unwrap();
    assert_eq!(h.partition(0).committed, 2);
}

#[test]
fn max_attempts_dead_letters_exactly_once() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 1);
    let mut fx = h.effects();
    for attempt in 1..=3u16 {
        let (_, d) = pushed(&fx)[0];
        assert_eq!(d.attempt, attempt);
        assert!(dead_letters(&fx).is_empty());
        if attempt == 2 {
            h.nack(A, &d, NackReason::Retry.as_code()).unwrap();
            h.advance(1_000);
        } else {
            h.advance(5_000);
        }
        fx = h.c.take_effects();
    }
    assert_eq!(dead_letters(&fx), vec![(1, 3, OriginReason::MaxAttempts)]);
    assert!(pushed(&fx).is_empty());
    assert_eq!(
        h.partition(0).committed,
        0,
        "held until the DLQ append is durable"
    );
    assert_eq!(h.partition(0).dead_letter_pending, 1);
    h.advance(60_000);
    assert!(dead_letters(&h.c.take_effects()).is_empty(), "never twice");
    h.c.dead_lettered(1, TOPIC, 0, 1);
    assert_eq!(h.partition(0).committed, 1);
    assert_eq!(h.c.stats().dead_letters, 1);
}

#[test]
fn reject_dead_letters_at_once() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 2);
    let fx = h.effects();
    let ds = pushed(&fx);
    h.nack(A, &ds[0].1, NackReason::Reject.as_code()).unwrap();
    let fx = h.effects();
    assert_eq!(dead_letters(&fx), vec![(1, 1, OriginReason::Rejected)]);
    assert!(matches!(
        fx[0],
        Effect::DeadLetter {
            group_id: 1,
            topic_id: TOPIC,
            partition: 0,
            ..
        }
    ));
    h.ack(A, &ds[1].1, 0).unwrap();
    assert_eq!(h.partition(0).committed, 0);
    h.c.dead_lettered(1, TOPIC, 0, 1);
    assert_eq!(h.partition(0).committed, 2);
    assert_eq!(h.c.positions()[0].committed, 2);
}

#[test]
fn committed_advances_only_over_contiguous_settled_records() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 5);
    let fx = h.effects();
    let ds: Vec<Delivery> = pushed(&fx).into_iter().map(|(_, d)| d).collect();
    h.ack(A, &ds[1], 0).unwrap();
    h.ack(A, &ds[2], 0).unwrap();
    h.ack(A, &ds[4], 0).unwrap();
    assert_eq!(h.partition(0).committed, 0);
    h.ack(A, &ds[0], 0).unwrap();
    assert_eq!(h.partition(0).committed, 3);
    h.ack(A, &ds[3], 0).unwrap();
    assert_eq!(
        h.c.positions(),
        vec![GroupPosition {
            group: b"g".to_vec(),
            topic_id: TOPIC,
            partition: 0,
            committed: 5
        }]
    );
}

// ---- start positions and restore -------------------------------------------------------

#[test]
fn latest_starts_at_the_log_end_and_earliest_at_the_first_retained() {
    let mut h = H::new(1);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (3, 8);
    h.try_sub(
        A,
        &Sub {
            start_policy: StartPolicy::Latest.as_code(),
            ..H::sub_req(b"late", 0)
        },
    )
    .unwrap();
    h.try_sub(B, &H::sub_req(b"early", 0)).unwrap();
    let fx = h.effects();
    h.accept(&fx);
    let fx = h.effects();
    let a: Vec<u64> = pushed(&fx)
        .iter()
        .filter(|(c, _)| *c == A)
        .map(|(_, d)| d.reference.sequence)
        .collect();
    let b: Vec<u64> = pushed(&fx)
        .iter()
        .filter(|(c, _)| *c == B)
        .map(|(_, d)| d.reference.sequence)
        .collect();
    assert!(a.is_empty());
    assert_eq!(b, vec![3, 4, 5, 6, 7]);
    let pos = h.c.positions();
    assert_eq!(
        (pos[0].group.as_slice(), pos[0].committed),
        (&b"early"[..], 2)
    );
    assert_eq!(
        (pos[1].group.as_slice(), pos[1].committed),
        (&b"late"[..], 7)
    );
    h.append(0, 1);
    let fx = h.effects();
    assert_eq!(
        pushed(&fx)
            .iter()
            .map(|(c, d)| (*c, d.reference.sequence))
            .collect::<Vec<_>>(),
        vec![(A, 8), (B, 8)]
    );
}

#[test]
fn restore_position_and_dead_lettered_records() {
    let mut h = H::new(2);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 9);
    let now = h.now;
    h.c.restore_position((b"g", TOPIC), 0, 2, now);
    h.c.restore_dead_lettered((b"g", TOPIC), 0, 3, now);
    h.c.restore_dead_lettered((b"g", TOPIC), 0, 5, now);
    h.c.restore_dead_lettered((b"g", TOPIC), 0, 2, now); // at or below committed: irrelevant
    h.c.restore_position((b"other", TOPIC), 1, 7, now);
    // Positions restored but not yet re-SUBscribed are still reported.
    assert_eq!(h.c.positions().len(), 2);
    h.join(A, 0);
    let fx = h.effects();
    // The latest policy does not matter: partition 0 has a position.
    assert_eq!(seqs(&fx), vec![4, 6, 7, 8]);
    for (_, d) in pushed(&fx) {
        h.ack(A, &d, 0).unwrap();
    }
    let pos = h.c.positions();
    let g0 = pos
        .iter()
        .find(|p| p.group == b"g" && p.partition == 0)
        .unwrap();
    assert_eq!(g0.committed, 8, "restored dead letters count as settled");
    let other = pos.iter().find(|p| p.group == b"other").unwrap();
    assert_eq!(other.committed, 7);
}

#[test]
fn restored_groups_are_shown_without_members_until_rejoined_or_expired() {
    let ttl = config().group_ttl_ms;
    let mut h = H::new(2);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 9);
    let now = h.now;
    h.c.restore_position((b"g", TOPIC), 0, 2, now);
    h.c.restore_position((b"g", TOPIC), 1, 0, now);
    h.c.restore_position((b"idle", TOPIC), 0, 5, now);
    h.c.check_invariants();
    let snap = h.c.snapshot();
    let names: Vec<&[u8]> = snap.groups.iter().map(|g| g.name.as_slice()).collect();
    assert_eq!(names, vec![&b"g"[..], &b"idle"[..]]);
    let g = &snap.groups[0];
    assert_eq!((g.group_id, g.topic_id), (RESTORED_GROUP_ID, TOPIC));
    assert!(g.members.is_empty());
    let parts: Vec<(u16, u64, u64)> = (g.partitions.iter())
        .map(|p| (p.partition, p.committed, p.next_sequence))
        .collect();
    assert_eq!(parts, vec![(0, 2, 3), (1, 0, 1)]);
    assert!(g
        .partitions
        .iter()
        .all(|p| p.owner.is_none() && p.outstanding == 0));

    // A member joins: the restored group becomes a live one, once, at its position.
    h.join(A, 0);
    let snap = h.c.snapshot();
    let g: Vec<&GroupSnapshot> = snap.groups.iter().filter(|g| g.name == b"g").collect();
    assert_eq!(g.len(), 1, "no duplicate of the rejoined group");
    assert_ne!(g[0].group_id, RESTORED_GROUP_ID);
    assert_eq!(g[0].members.len(), 1);
    assert_eq!(
        g[0].partitions[0].committed, 2,
        "the restored position is kept"
    );
    assert_eq!(snap.groups.last().unwrap().name, b"idle".to_vec());

    // The unclaimed one is removed by --group-ttl, counted as an expired group.
    h.c.take_effects();
    h.advance(ttl);
    let expired = Effect::GroupExpired {
        group: b"idle".to_vec(),
        topic_id: TOPIC,
    };
    assert!(h.c.take_effects().contains(&expired));
    let snap = h.c.snapshot();
    assert!(snap.groups.iter().all(|g| g.name != b"idle"));
    assert_eq!(snap.stats.groups_expired, 1);
}

#[test]
fn retention_skips_records_that_are_gone() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (6, 8);
    h.c.records_available(TOPIC, 0);
    assert_eq!(seqs(&h.effects()), vec![6, 7]);
    assert_eq!(h.c.stats().skipped_records, 5);
}

// ---- PULL --------------------------------------------------------------------------

#[test]
fn pull_mode_gets_no_push_and_pull_answers_at_once() {
    let mut h = H::new(2);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 3);
    h.append(1, 3);
    assert!(pushed(&h.effects()).is_empty(), "PULL_MODE: no pushed MSG");
    let p = h.pull_req(&a, 4, 0, 0);
    h.pull(A, 77, &p).unwrap();
    let fx = h.c.take_effects();
    let answers = pull_answers(&fx);
    assert_eq!(answers.len(), 1);
    let (conn, id, ds) = &answers[0];
    assert_eq!((*conn, *id, ds.len()), (A, 77, 4));
    let mut by_part: Vec<(u16, u64)> = ds
        .iter()
        .map(|d| (d.reference.partition, d.reference.sequence))
        .collect();
    by_part.sort();
    assert_eq!(
        by_part,
        vec![(0, 1), (0, 2), (1, 1), (1, 2)],
        "round-robin over partitions"
    );
    assert_eq!(
        h.member(1).outstanding_count,
        4,
        "pulled deliveries are outstanding"
    );
    // Empty answer at once when nothing is ready and wait_ms is 0.
    let mut p = h.pull_req(&a, 10, 0, 0);
    p.ownership_epochs = vec![999];
    h.pull(A, 78, &p).unwrap();
    assert_eq!(pull_answers(&h.c.take_effects()), vec![(A, 78, vec![])]);
    assert_eq!(
        h.pull(A, 79, &h.pull_req(&a, 0, 0, 0)),
        Err(ErrorCode::InvalidArgument)
    );
    let bad = Pull {
        subscription_id: 9,
        ..h.pull_req(&a, 1, 0, 0)
    };
    assert_eq!(h.pull(A, 80, &bad), Err(ErrorCode::UnknownSubscription));
}

#[test]
fn pull_filters_by_ownership_epoch_and_limits_bytes() {
    let mut h = H::new(2);
    let a = h.sub(A, SubFlags::PULL_MODE.bits());
    // Refuse partition 1's first ASSIGN so that its ownership epoch (2) differs
    // from partition 0's (1): epochs are per partition.
    let fx = h.effects();
    let ns = notices(&fx);
    h.control_ack(A, &ns[0].1, ControlResult::Ok.as_code())
        .unwrap();
    h.control_ack(A, &ns[1].1, ControlResult::Stale.as_code())
        .unwrap();
    let fx = h.effects();
    h.accept(&fx);
    h.append(0, 3);
    h.append(1, 3);
    let epoch_p1 = h.partition(1).ownership_epoch;
    assert_eq!((h.partition(0).ownership_epoch, epoch_p1), (1, 2));
    let mut p = h.pull_req(&a, 10, 0, 0);
    p.ownership_epochs = vec![epoch_p1];
    p.max_bytes = 25; // two 10-byte records
    h.pull(A, 1, &p).unwrap();
    let answers = pull_answers(&h.c.take_effects());
    let ds = &answers[0].2;
    assert_eq!(
        ds.iter()
            .map(|d| (d.reference.partition, d.reference.sequence))
            .collect::<Vec<_>>(),
        vec![(1, 1), (1, 2)]
    );
    // One record larger than max_bytes still flows (as with credit).
    h.log.sizes.insert((TOPIC, 0, 1), 1_000);
    let mut p = h.pull_req(&a, 10, 0, 0);
    p.max_bytes = 5;
    h.pull(A, 2, &p).unwrap();
    let answers = pull_answers(&h.c.take_effects());
    assert_eq!(answers[0].2.len(), 1);
}

#[test]
fn pull_waits_then_answers_when_records_arrive() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    let p = h.pull_req(&a, 10, 2_000, 0);
    h.pull(A, 5, &p).unwrap();
    assert!(h.effects().is_empty());
    assert_eq!(h.c.next_deadline_ms(), Some(h.now + 2_000));
    h.now += 500;
    h.append(0, 2);
    let answers = pull_answers(&h.effects());
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answers[0]
            .2
            .iter()
            .map(|d| d.reference.sequence)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
    // Ack-wait applies to pulled deliveries.
    h.advance(5_000);
    assert_eq!(h.partition(0).pending_redeliveries, 2);
    let p = h.pull_req(&a, 10, 0, 0);
    h.pull(A, 6, &p).unwrap();
    let answers = pull_answers(&h.c.take_effects());
    assert!(answers[0].2.iter().all(|d| d.attempt == 2));
}

#[test]
fn pull_wait_timeout_answers_empty_and_queues_in_order() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.pull(A, 1, &h.pull_req(&a, 10, 1_000, 0)).unwrap();
    h.pull(A, 2, &h.pull_req(&a, 10, 0, 0)).unwrap();
    assert!(
        h.c.take_effects().is_empty(),
        "a later PULL waits behind the earlier one"
    );
    h.advance(999);
    assert!(h.c.take_effects().is_empty());
    h.advance(1);
    let answers = pull_answers(&h.c.take_effects());
    assert_eq!(answers, vec![(A, 1, vec![]), (A, 2, vec![])]);
    assert_eq!(
        h.c.next_deadline_ms(),
        Some(1_000 + 30_000),
        "only the session timer is left"
    );
}

#[test]
fn pull_min_bytes_waits_for_enough_data() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 1);
    h.pull(A, 1, &h.pull_req(&a, 100, 3_000, 35)).unwrap();
    assert!(h.effects().is_empty(), "10 of 35 bytes");
    h.append(0, 2);
    assert!(h.effects().is_empty(), "30 of 35 bytes");
    h.append(0, 1);
    let answers = pull_answers(&h.effects());
    assert_eq!(answers[0].2.len(), 4);
    // min_bytes unreachable within max_msgs: a full window answers.
    h.append(0, 5);
    h.pull(A, 2, &h.pull_req(&a, 2, 3_000, 1_000)).unwrap();
    assert_eq!(pull_answers(&h.c.take_effects())[0].2.len(), 2);
    // Past the deadline whatever is ready is answered.
    h.pull(A, 3, &h.pull_req(&a, 100, 3_000, 1_000)).unwrap();
    assert!(h.c.take_effects().is_empty());
    h.advance(3_000);
    assert_eq!(pull_answers(&h.c.take_effects())[0].2.len(), 3);
}

#[test]
fn leave_answers_waiting_pulls_empty() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.pull(A, 4, &h.pull_req(&a, 10, 5_000, 0)).unwrap();
    h.heartbeat(A, &a, HeartbeatState::Leave.as_code()).unwrap();
    assert_eq!(pull_answers(&h.effects()), vec![(A, 4, vec![])]);
    assert_eq!(h.heartbeat(A, &a, 2), Err(ErrorCode::InvalidArgument));
}

const MIB: u32 = 1024 * 1024;

/// Bytes of the answer to a PULL that got records of these sizes (key + value).
fn answer_bytes(sizes: &[u32]) -> u64 {
    let msgs: u64 = sizes
        .iter()
        .map(|&b| MSG_FRAME_FIXED_BYTES as u64 + u64::from(b))
        .sum();
    msgs + OK_EMPTY_FRAME_BYTES as u64
}

/// The (pull_id, deliveries, bytes) of every PULL answer in `fx`.
fn answers_with_bytes(fx: &[Effect]) -> Vec<(u64, usize, u64)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::PullAnswer {
                pull_id,
                deliveries,
                bytes,
                ..
            } => Some((*pull_id, deliveries.len(), *bytes)),
            _ => None,
        })
        .collect()
}

#[test]
fn pull_answers_are_capped_by_the_credit_caps_whatever_they_ask() {
    // config(): --max-credit-size 4 MiB, --max-credit-count 1000.
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 10);
    for seq in 1..=10 {
        h.log.sizes.insert((TOPIC, 0, seq), MIB);
    }
    let mut p = h.pull_req(&a, u16::MAX, 0, 0);
    p.max_bytes = u32::MAX;
    h.pull(A, 1, &p).unwrap();
    let fx = h.c.take_effects();
    assert_eq!(
        answers_with_bytes(&fx),
        vec![(1, 4, answer_bytes(&[MIB; 4]))],
        "4 GiB asked, 4 MiB (--max-credit-size) answered"
    );
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 2_000);
    let mut p = h.pull_req(&a, u16::MAX, 0, 0);
    p.max_bytes = u32::MAX;
    h.pull(A, 2, &p).unwrap();
    let answers = answers_with_bytes(&h.c.take_effects());
    assert_eq!(
        answers[0].1, 1_000,
        "65,535 asked, 1,000 (--max-credit-count)"
    );
}

#[test]
fn pull_answers_fit_the_room_left_in_the_connections_output() {
    let mut h = H::new(1);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 6);
    for seq in 1..=6 {
        h.log.sizes.insert((TOPIC, 0, seq), MIB);
    }
    // Room for two records and the OK, and a little more.
    h.room.insert(A, answer_bytes(&[MIB; 2]) + 1_000);
    let p = h.pull_req(&a, 100, 0, 0);
    h.pull(A, 1, &p).unwrap();
    // A second PULL before the first answer reached the output: what is left (1,000
    // bytes) holds no record, so with wait_ms 0 it is answered empty, not over the cap.
    h.pull(A, 2, &p).unwrap();
    let fx = h.c.take_effects();
    assert_eq!(
        answers_with_bytes(&fx),
        vec![(1, 2, answer_bytes(&[MIB; 2])), (2, 0, answer_bytes(&[]))]
    );
    // Once the outputs caught up, a PULL that waits for room is answered at its deadline
    // with what fits (nothing); nothing it could not take was made outstanding.
    h.c.outputs_caught_up();
    h.room.insert(A, MIB.into());
    h.pull(A, 3, &h.pull_req(&a, 100, 500, 0)).unwrap();
    assert!(
        h.effects().is_empty(),
        "no room for the next record: it waits"
    );
    h.advance(500);
    assert_eq!(answers_with_bytes(&h.c.take_effects()), vec![(3, 0, 10)]);
    assert_eq!(h.member(a.member_id).outstanding_count, 2);
    // With room again the next record flows; a record larger than max_bytes still does.
    h.room.insert(A, u64::MAX);
    let mut p = h.pull_req(&a, 100, 0, 0);
    p.max_bytes = 1;
    h.pull(A, 4, &p).unwrap();
    assert_eq!(answers_with_bytes(&h.c.take_effects())[0].1, 1);
}

#[test]
fn a_waiting_pull_keeps_the_partitions_its_epochs_named_not_the_list() {
    let mut h = H::new(3);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    let e1 = h.partition(1).ownership_epoch;
    let mut p = h.pull_req(&a, 10, 5_000, 0);
    // 65,535 epochs, one of them partition 1's.
    p.ownership_epochs = (1_000..1_000 + u64::from(u16::MAX) - 1).collect();
    p.ownership_epochs.push(e1);
    h.pull(A, 1, &p).unwrap();
    let pending = &h.c.groups[&1].members[&a.member_id].pulls[0];
    let only = pending.only.as_deref().unwrap();
    assert_eq!(
        only,
        [(0, e1), (1, e1), (2, e1)],
        "partitions, not the 65,535 epochs"
    );
    assert!(h.effects().is_empty());
    h.append(0, 1);
    h.append(1, 1);
    let answers = pull_answers(&h.effects());
    let got: Vec<(u16, u64)> = answers[0]
        .2
        .iter()
        .map(|d| (d.reference.partition, d.reference.sequence))
        .collect();
    assert_eq!(
        got,
        vec![(0, 1), (1, 1)],
        "all three share the epoch listed"
    );
}

#[test]
fn an_assign_left_unanswered_is_taken_back_and_its_member_stalls() {
    let (revoke, assign, ok) = (
        NoticeKind::Revoke.as_code(),
        NoticeKind::Assign.as_code(),
        ControlResult::Ok.as_code(),
    );
    let mut h = H::new(2);
    let a = h.sub(A, 0);
    let assigns_to_a = notices(&h.effects());
    assert_eq!(
        assigns_to_a.len(),
        2,
        "A heartbeats but never answers these"
    );
    h.advance(5_000);
    h.heartbeat(A, &a, HeartbeatState::Active.as_code())
        .unwrap();
    let b = h.sub(B, 0);
    assert_eq!(
        kinds(&h.effects()),
        vec![(A, revoke, 1)],
        "A is over its share"
    );
    h.advance(5_000);
    // Partition 0's ASSIGN is --revoke-timeout old: taken back with a REVOKE, given to B.
    let fx = h.c.take_effects();
    assert_eq!(kinds(&fx), vec![(A, revoke, 0), (B, assign, 0)]);
    assert_eq!(h.c.stats().assigns_taken_back, 1);
    let revoke_of_0 = notices(&fx)[0].1.clone();
    h.control_ack(B, &notices(&fx)[1].1, ok).unwrap();
    // Partition 1's unanswered REVOKE times out as it always did: B gets it too.
    h.advance(5_000);
    let fx = h.c.take_effects();
    assert_eq!(kinds(&fx), vec![(B, assign, 1)]);
    h.accept(&fx);
    assert_eq!(h.owners(), vec![Some(b.member_id); 2]);
    // The ASSIGN taken back is forgotten: its late CONTROL_ACK gets UNKNOWN_NOTICE.
    assert_eq!(
        h.control_ack(A, &assigns_to_a[0].1, ok),
        Err(ErrorCode::UnknownNotice)
    );
    // Stalled, A heartbeats on and is given nothing.
    h.heartbeat(A, &a, HeartbeatState::Active.as_code())
        .unwrap();
    h.advance(20_000);
    assert!(
        kinds(&h.c.take_effects()).is_empty(),
        "nothing new for a stalled member"
    );
    // Answering a notice (the REVOKE) makes it a member like the others again.
    h.control_ack(A, &revoke_of_0, ok).unwrap();
    assert_eq!(kinds(&h.effects()), vec![(B, revoke, 1)]);
}

#[test]
fn a_stalled_member_keeps_what_it_owns() {
    let mut h = H::new(2);
    h.sub(A, 0);
    let fx = h.effects();
    let ns = notices(&fx);
    h.control_ack(A, &ns[0].1, ControlResult::Ok.as_code())
        .unwrap();
    h.advance(10_000);
    assert_eq!(h.c.stats().assigns_taken_back, 1, "partition 1's ASSIGN");
    h.c.take_effects();
    assert_eq!(h.partition(0).state, OwnershipState::Owned);
    assert_eq!(
        h.partition(1).state,
        OwnershipState::Unowned,
        "no active member"
    );
    // A newcomer gets the free partition; the stalled member's own one is not moved.
    h.join(B, 0);
    assert_eq!(h.owners(), vec![Some(1), Some(2)]);
    h.append(0, 1);
    assert_eq!(
        pushed(&h.effects())[0].0,
        A,
        "it still delivers what it owns"
    );
}

// ---- state that only grows: groups ----------------------------------------------------

#[test]
fn a_group_without_members_is_removed_after_the_ttl_with_its_positions() {
    let ttl = config().group_ttl_ms;
    let mut h = H::new(1);
    let a = h.join(A, 0);
    h.append(0, 3);
    for (_, d) in pushed(&h.effects()) {
        h.ack(A, &d, 0).unwrap();
    }
    assert_eq!(h.c.positions()[0].committed, 3);
    h.heartbeat(A, &a, HeartbeatState::Leave.as_code()).unwrap();
    h.advance(ttl - 1);
    assert_eq!(h.c.snapshot().groups.len(), 1, "kept until the ttl");
    h.c.take_effects();
    h.advance(1);
    assert!(h.c.snapshot().groups.is_empty());
    let expired = Effect::GroupExpired {
        group: b"g".to_vec(),
        topic_id: TOPIC,
    };
    assert_eq!(
        h.c.take_effects(),
        vec![expired],
        "a cluster leader replicates it"
    );
    assert!(h.c.positions().is_empty(), "its positions go with it");
    assert_eq!(h.c.stats().groups_expired, 1);
    assert_eq!(h.c.next_deadline_ms(), None, "no timer outlives it");
    // The same name later is a new group: EARLIEST reads from the start again.
    h.join(B, 0);
    assert_eq!(seqs(&h.effects()), vec![1, 2, 3]);
}

#[test]
fn a_member_joining_in_time_keeps_the_group() {
    let ttl = config().group_ttl_ms;
    let mut h = H::new(1);
    h.join(A, 0);
    h.c.connection_closed(A, h.now);
    h.advance(ttl - 1);
    h.join(B, 0);
    h.advance(ttl);
    assert_eq!(h.c.snapshot().groups.len(), 1);
    assert_eq!(h.c.stats().groups_expired, 0);
}

#[test]
fn a_group_is_removed_only_once_its_dead_letters_are_durable() {
    let ttl = config().group_ttl_ms;
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 1);
    let (_, d) = pushed(&h.effects())[0];
    h.nack(A, &d, NackReason::Reject.as_code()).unwrap();
    assert_eq!(dead_letters(&h.effects()).len(), 1);
    h.c.connection_closed(A, h.now);
    h.advance(ttl);
    assert_eq!(
        h.c.snapshot().groups.len(),
        1,
        "its dead letter is not durable yet"
    );
    h.c.dead_lettered(1, TOPIC, 0, 1);
    h.advance(GROUP_EXPIRY_RETRY_MS);
    assert!(h.c.snapshot().groups.is_empty());
}

#[test]
fn group_ids_are_reused_once_all_were_handed_out() {
    let ttl = config().group_ttl_ms;
    let mut h = H::new(1);
    h.c.next_group_id = GROUP_IDS_MAX;
    h.join(A, 0);
    assert_eq!(h.c.snapshot().groups[0].group_id, u16::MAX);
    assert_eq!(
        h.try_sub(B, &H::sub_req(b"other", 0)),
        Err(ErrorCode::GroupLimitReached),
        "no id left"
    );
    h.c.connection_closed(A, h.now);
    h.advance(ttl);
    let r = h.try_sub(B, &H::sub_req(b"other", 0));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(h.c.snapshot().groups[0].group_id, u16::MAX, "the freed id");
}

#[test]
fn restored_positions_count_against_max_groups_until_claimed_or_expired() {
    let ttl = config().group_ttl_ms;
    let mut h = H::with(
        ConsumeConfig {
            max_groups: 2,
            ..config()
        },
        1,
    );
    let now = h.now;
    h.c.restore_position((b"x", TOPIC), 0, 5, now);
    h.c.restore_position((b"y", TOPIC), 0, 7, now);
    h.c.check_invariants();
    assert_eq!(
        h.try_sub(A, &H::sub_req(b"z", 0)),
        Err(ErrorCode::GroupLimitReached),
        "x and y hold both slots"
    );
    h.try_sub(A, &H::sub_req(b"x", 0)).unwrap();
    h.advance(ttl);
    let names: Vec<Vec<u8>> = h.c.positions().into_iter().map(|p| p.group).collect();
    assert_eq!(names, vec![b"x".to_vec()], "y was never claimed");
    h.try_sub(B, &H::sub_req(b"z", 0)).unwrap();
}

// ---- topic deletion ------------------------------------------------------------------

#[test]
fn topic_deleted_revokes_and_closes_subscriptions() {
    let mut h = H::new(2);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.append(0, 1);
    h.pull(A, 1, &h.pull_req(&a, 1, 0, 0)).unwrap();
    let d = pull_answers(&h.c.take_effects())[0].2[0];
    h.pull(A, 2, &h.pull_req(&a, 10, 9_000, 0)).unwrap();
    h.c.topic_deleted(TOPIC, h.now);
    h.c.check_invariants();
    let fx = h.effects();
    assert_eq!(
        kinds(&fx),
        vec![
            (A, NoticeKind::Revoke.as_code(), 0),
            (A, NoticeKind::Revoke.as_code(), 1)
        ]
    );
    assert_eq!(pull_answers(&fx), vec![(A, 2, vec![])]);
    let revoke = notices(&fx)[0].1.clone();
    assert_eq!(
        h.control_ack(A, &revoke, ControlResult::Ok.as_code()),
        Err(ErrorCode::UnknownSubscription)
    );
    assert_eq!(h.ack(A, &d, 0), Err(ErrorCode::UnknownSubscription));
    assert_eq!(h.heartbeat(A, &a, 0), Err(ErrorCode::UnknownSubscription));
    assert_eq!(
        h.credit(A, &a, CreditMode::Add.as_code(), 1, 0),
        Err(ErrorCode::UnknownSubscription)
    );
    assert!(h.c.positions().is_empty());
    assert_eq!(h.c.next_deadline_ms(), None);
    h.c.dead_lettered(1, TOPIC, 0, 1); // late completion for a gone group: ignored
}

// ---- a long mixed run ------------------------------------------------------------------

/// Many members come and go, ack, nack, let deliveries expire; afterwards, with one
/// steady member, every record is settled exactly up to the log end, no record was
/// dead-lettered twice, and the books balance after every step.
#[test]
fn churn_settles_everything() {
    let mut h = H::with(
        ConsumeConfig {
            max_attempts: 1000,
            max_subscriptions_per_conn: 64,
            max_members_per_group: 64,
            ..config()
        },
        5,
    );
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut live: Vec<(ConnId, SubResult)> = Vec::new();
    let mut outstanding: Vec<(ConnId, Delivery)> = Vec::new();
    let mut dead = std::collections::BTreeSet::new();
    let mut next_conn = 100;
    for _ in 0..3_000 {
        match rand(10) {
            0 if live.len() < 5 => {
                next_conn += 1;
                let s = h.sub(next_conn, 0);
                live.push((next_conn, s));
            }
            1 if !live.is_empty() => {
                let (conn, _) = live.remove(rand(live.len() as u64) as usize);
                h.c.connection_closed(conn, h.now);
            }
            2 => h.append(rand(5) as u16, 1 + rand(3)),
            4 => {
                for (conn, s) in &live {
                    let _ = h.heartbeat(*conn, s, HeartbeatState::Active.as_code());
                }
            }
            3 => h.advance(rand(3_000)),
            _ if !outstanding.is_empty() => {
                let (conn, d) = outstanding.swap_remove(rand(outstanding.len() as u64) as usize);
                let _ = match rand(8) {
                    0 => h.nack(conn, &d, NackReason::Retry.as_code()),
                    1 => h.nack(conn, &d, NackReason::Reject.as_code()),
                    _ => h.ack(conn, &d, 0),
                };
            }
            _ => {}
        }
        let fx = h.effects();
        for e in &fx {
            match e {
                Effect::Notice { conn, notice } => {
                    if rand(5) != 0 {
                        // A member may have expired later in the same pump.
                        let r = h.control_ack(*conn, notice, ControlResult::Ok.as_code());
                        assert!(matches!(r, Ok(()) | Err(ErrorCode::UnknownNotice)), "{r:?}");
                    }
                }
                Effect::Deliver { conn, delivery } => outstanding.push((*conn, *delivery)),
                Effect::DeadLetter {
                    partition,
                    sequence,
                    ..
                } => {
                    assert!(dead.insert((*partition, *sequence)), "dead-lettered twice");
                    h.c.dead_lettered(1, TOPIC, *partition, *sequence);
                }
                Effect::PullAnswer { .. } => unreachable!("no PULLs here"),
                Effect::GroupExpired { .. } => {}
            }
        }
    }
    // Drain: one fresh member acks everything until quiet.
    for (conn, _) in live.drain(..) {
        h.c.connection_closed(conn, h.now);
    }
    h.c.take_effects(); // addressed to the connections just closed
    let last = h.sub(1, 0);
    for _ in 0..200 {
        h.advance(1_000);
        h.heartbeat(1, &last, HeartbeatState::Active.as_code())
            .unwrap();
        let fx = h.c.take_effects();
        for (conn, n) in notices(&fx) {
            assert_eq!(conn, 1);
            h.control_ack(conn, &n, ControlResult::Ok.as_code())
                .unwrap();
        }
        for (conn, d) in pushed(&fx) {
            h.ack(conn, &d, 0).unwrap();
        }
        for (_, partition, sequence) in fx.iter().filter_map(|e| match e {
            Effect::DeadLetter {
                partition,
                sequence,
                ..
            } => Some(((), *partition, *sequence)),
            _ => None,
        }) {
            h.c.dead_lettered(1, TOPIC, partition, sequence);
        }
    }
    for p in 0..5u16 {
        let end = h.log.partitions[&TOPIC][usize::from(p)].1;
        assert_eq!(h.partition(p).committed, end - 1, "partition {p}");
    }
}

/// A read error (EIO, EMFILE) is not corruption: the record waits and is delivered once
/// it reads again, never skipped (durability hole 5).
#[test]
fn an_unreadable_record_is_retried_not_skipped() {
    let mut h = H::new(1);
    h.join(A, 0);
    h.log.unreadable.insert((TOPIC, 0, 1));
    h.append(0, 2);
    assert!(
        pushed(&h.effects()).is_empty(),
        "nothing past an unreadable head"
    );
    assert!(h.c.stats().read_retries > 0);
    assert_eq!(h.c.stats().skipped_records, 0);
    h.log.unreadable.clear();
    h.advance(READ_RETRY_MS);
    let seqs: Vec<u64> = pushed(&h.c.take_effects())
        .iter()
        .map(|(_, d)| d.reference.sequence)
        .collect();
    assert_eq!(seqs, vec![1, 2]);
    assert_eq!(h.c.stats().skipped_records, 0);
}

// ---- operator changes (manage.rs) ------------------------------------------------------

/// Joins A to g on one partition holding 5 records, receives them all and ACKs the
/// first two: (the deliveries, the harness).
fn five_delivered_two_acked() -> (Vec<Delivery>, H) {
    let mut h = H::new(1);
    h.join(A, 0);
    h.append(0, 5);
    let fx = h.effects();
    let ds: Vec<Delivery> = pushed(&fx).into_iter().map(|(_, d)| d).collect();
    assert_eq!(ds.len(), 5);
    h.ack(A, &ds[0], 0).unwrap();
    h.ack(A, &ds[1], 0).unwrap();
    (ds, h)
}

#[test]
fn reset_waits_for_members_to_leave_then_moves_the_next_delivery() {
    let (_, mut h) = five_delivered_two_acked();
    let g = (&b"g"[..], TOPIC);
    assert_eq!(
        h.c.reset_group(g, &[(0, 1)]),
        Err(GroupRefusal::HasMembers(1))
    );
    assert_eq!(h.c.delete_group(g), Err(GroupRefusal::HasMembers(1)));
    assert_eq!(h.partition(0).committed, 2, "a refusal changes nothing");
    h.c.connection_closed(A, h.now);
    h.c.check_invariants();
    assert_eq!(h.partition(0).pending_redeliveries, 3, "what A held waits");
    assert_eq!(
        h.c.reset_group((b"nope", TOPIC), &[(0, 1)]),
        Err(GroupRefusal::Unknown)
    );
    h.c.reset_group(g, &[(0, 5)]).unwrap();
    h.c.check_invariants();
    let p = h.partition(0);
    assert_eq!(
        (p.committed, p.next_sequence, p.pending_redeliveries),
        (4, 5, 0)
    );
    h.join(B, 0);
    let fx = h.effects();
    let got: Vec<(u64, u16)> = (pushed(&fx).iter())
        .map(|(_, d)| (d.reference.sequence, d.attempt))
        .collect();
    assert_eq!(got, vec![(5, 1)], "from the reset on, as a first attempt");
    // Backwards too: an earlier position redelivers what was settled.
    h.c.connection_closed(B, h.now);
    h.c.reset_group(g, &[(0, 1)]).unwrap();
    assert_eq!(h.partition(0).committed, 0);
}

#[test]
fn delete_frees_the_groups_slot_and_forgets_its_positions() {
    let mut h = H::with(
        ConsumeConfig {
            max_groups: 2,
            ..config()
        },
        1,
    );
    h.append(0, 3);
    h.join(A, 0);
    let now = h.now;
    h.c.restore_position((b"old", TOPIC), 0, 2, now);
    h.c.connection_closed(A, h.now);
    assert_eq!(
        h.try_sub(B, &H::sub_req(b"new", 0)),
        Err(ErrorCode::GroupLimitReached),
        "g and the restored old hold both slots"
    );
    h.c.reset_group((b"old", TOPIC), &[(0, 1)]).unwrap();
    let old = |h: &H| h.c.positions().into_iter().find(|p| p.group == b"old");
    assert_eq!(
        old(&h).map(|p| p.committed),
        Some(0),
        "a restored group resets"
    );
    h.c.delete_group((b"old", TOPIC)).unwrap();
    assert_eq!(old(&h), None);
    h.c.delete_group((b"g", TOPIC)).unwrap();
    h.c.check_invariants();
    assert!(h.c.positions().is_empty() && h.c.snapshot().groups.is_empty());
    assert!(!h.c.group_exists(b"g", TOPIC));
    assert_eq!(h.c.delete_group((b"g", TOPIC)), Err(GroupRefusal::Unknown));
    h.try_sub(B, &H::sub_req(b"new", 0)).unwrap();
    h.try_sub(B, &H::sub_req(b"g", 0)).unwrap();
    let fx = h.effects();
    h.accept(&fx);
    let fx = h.effects();
    let g_seqs: Vec<u64> = (pushed(&fx).iter())
        .filter(|(_, d)| d.reference.subscription_id == 2)
        .map(|(_, d)| d.reference.sequence)
        .collect();
    assert_eq!(g_seqs, vec![1, 2, 3], "a new g starts by its start policy");
}

#[test]
fn a_purge_ends_deliveries_below_it_and_moves_positions_up() {
    let (ds, mut h) = five_delivered_two_acked();
    let now = h.now;
    h.c.restore_position((b"r", TOPIC), 0, 1, now);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (6, 6);
    h.c.purged(TOPIC, 0, 6);
    h.c.check_invariants();
    let p = h.partition(0);
    assert_eq!((p.committed, p.next_sequence, p.outstanding), (5, 6, 0));
    assert_eq!(h.member(1).outstanding_count, 0, "their credit came back");
    assert_eq!(h.ack(A, &ds[3], 0), Err(ErrorCode::UnknownDelivery));
    let r =
        h.c.positions()
            .into_iter()
            .find(|p| p.group == b"r")
            .unwrap();
    assert_eq!(r.committed, 5, "restored positions move up too");
    h.append(0, 1);
    let fx = h.effects();
    assert_eq!(seqs(&fx), vec![6]);
}

#[test]
fn a_followers_replicated_groups_do_not_expire_and_a_new_leader_gives_them_a_whole_ttl() {
    let ttl = config().group_ttl_ms;
    let names = |h: &H| -> Vec<Vec<u8>> {
        let snap = h.c.snapshot();
        snap.groups.into_iter().map(|g| g.name).collect()
    };
    let mut h = H::new(2);
    h.c.set_following(true, h.now);
    let now = h.now;
    h.c.restore_position((b"g", TOPIC), 0, 2, now);
    h.advance(3 * ttl);
    assert_eq!(names(&h), vec![b"g".to_vec()], "expired while following");
    // Leading from now: the members of the last leader have one --group-ttl to return.
    h.c.set_following(false, h.now);
    h.advance(ttl / 2);
    assert_eq!(
        names(&h),
        vec![b"g".to_vec()],
        "expired early after promotion"
    );
    h.advance(ttl);
    assert!(names(&h).is_empty(), "kept past its ttl on the leader");
}

#[test]
fn a_replicated_position_forgets_the_dead_letters_at_or_below_it() {
    let mut h = H::new(2);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 9);
    let now = h.now;
    for seq in [3, 5, 7] {
        h.c.restore_dead_lettered((b"g", TOPIC), 0, seq, now);
    }
    h.c.restore_position((b"g", TOPIC), 0, 5, now);
    let restored = &h.c.restored[&(b"g".to_vec(), TOPIC)];
    assert_eq!(restored.dead_lettered[&0], BTreeSet::from([7]));
    h.join(A, 0);
    let fx = h.effects();
    // 6 and 8 are due; 7 stays settled by its dead letter.
    assert_eq!(seqs(&fx), vec![6, 8]);
}

#[test]
fn a_node_that_stops_leading_ends_its_members_and_keeps_its_groups_at_their_positions() {
    let mut h = H::new(1);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 2);
    let a = h.join(A, SubFlags::PULL_MODE.bits());
    h.pull(A, 1, &h.pull_req(&a, 10, 0, 0)).unwrap();
    let answers = pull_answers(&h.c.take_effects());
    assert_eq!(answers[0].2.len(), 1);
    h.ack(A, &answers[0].2[0], 0).unwrap();
    // Nothing more to read: the next PULL waits.
    h.pull(A, 2, &h.pull_req(&a, 10, 5_000, 0)).unwrap();
    assert!(pull_answers(&h.c.take_effects()).is_empty());
    let late_pull = h.pull_req(&a, 10, 0, 0);

    h.c.set_following(true, h.now);
    h.c.check_invariants();
    assert_eq!(
        pull_answers(&h.c.take_effects()),
        vec![(A, 2, vec![])],
        "a waiting PULL stays unanswered"
    );
    // Records the new leader replicates are not handed out from here.
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 9);
    h.c.records_available(TOPIC, 0);
    h.advance(config().ack_wait_ms * 2);
    assert_eq!(
        h.pull(A, 3, &late_pull),
        Err(ErrorCode::UnknownSubscription)
    );
    assert!(h.effects().is_empty(), "a deposed leader delivers");
    let snap = h.c.snapshot();
    assert_eq!(snap.groups.len(), 1);
    assert!(snap.groups[0].members.is_empty());
    assert_eq!(snap.groups[0].partitions[0].committed, 1);
    // Leading again, a new SUB rebuilds the group at its position.
    h.c.set_following(false, h.now);
    h.join(B, 0);
    assert_eq!(seqs(&h.effects())[0], 2);
}

#[test]
fn a_node_that_follows_its_applied_log_undoes_unapplied_changes_and_keeps_dead_letters() {
    let mut h = H::new(1);
    h.log.partitions.get_mut(&TOPIC).unwrap()[0] = (1, 9);
    let now = h.now;
    h.c.set_following(true, now);
    // As a leader's reset made before its entry commits leaves them: ahead of the log.
    h.c.restore_position((b"g", TOPIC), 0, 7, now);
    for seq in [3, 8] {
        h.c.restore_dead_lettered((b"g", TOPIC), 0, seq, now);
    }
    // Created by a reset whose entry is not applied, and not changed: kept.
    h.c.restore_position((b"unlogged", TOPIC), 0, 1, now);
    h.c.restore_position((b"unchanged", TOPIC), 0, 6, now);
    let at = |group: &[u8], committed| GroupPosition {
        group: group.to_vec(),
        topic_id: TOPIC,
        partition: 0,
        committed,
    };
    let key = |group: &[u8]| (group.to_vec(), TOPIC);
    let changed = [key(b"g"), key(b"unlogged"), key(b"deleted")];
    let applied = [at(b"deleted", 4), at(b"g", 2), at(b"unchanged", 5)];
    h.c.follow_replicated(&changed, &applied, now);
    h.c.check_invariants();
    let held = vec![at(b"deleted", 4), at(b"g", 2), at(b"unchanged", 6)];
    assert_eq!(h.c.positions(), held);
    let dead = &h.c.restored[&key(b"g")].dead_lettered[&0];
    assert_eq!(dead, &BTreeSet::from([3, 8]));
    // Leading again, the group resumes at the log's position, its dead letters settled.
    h.c.set_following(false, now);
    h.join(A, 0);
    assert_eq!(seqs(&h.effects())[0], 4);
}
