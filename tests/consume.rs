//! The consume plane over real TCP (issue 5): SUB → ASSIGN → CONTROL_ACK → MSG → ACK,
//! redelivery, dead letters, PULL, rebalancing and positions across restarts.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use mortarmq::client::{Client, ClientError, Delivery, Push, Reply};
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::*;
use mortarmq::wire::{
    AckFlags, ControlResult, DeclareFlags, Durability, ErrorCode, NackReason, PubFlags,
    StartPolicy, SubFlags,
};

pub fn sub(c: &mut Client, group: &str, topic_id: u16, flags: u16) -> SubResult {
    c.request(&Frame::Sub(Sub {
        group: group.as_bytes(),
        topic_id,
        partition: SUB_PARTITION_ANY,
        start_policy: StartPolicy::Earliest.as_code(),
        credit_count: 0,
        credit_bytes: 0,
        flags: SubFlags::from_bits_retain(flags),
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
                c.request(&Frame::ControlAck(ControlAck::answering(
                    &notice,
                    ControlResult::Ok,
                )))
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

pub fn ack(
    c: &mut Client,
    m: &Delivery,
) -> mortarmq::client::ClientResult<mortarmq::client::Reply> {
    c.request(&Frame::Ack(m.ack(AckFlags::empty())))
}

#[test]
fn sub_assign_control_ack_msg_ack_flow() {
    let broker = Mortard::start(&[]);
    let mut producer = broker.client();
    let topic = producer
        .declare("flow", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..10u8 {
        producer
            .publish_value(topic, u16::from(i % 2), &[i], Some(Durability::Fsynced))
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
    producer
        .publish_value(topic, 0, b"late", Some(Durability::Written))
        .unwrap();
    let m = next_msg(&mut consumer);
    assert_eq!(m.value, b"late");
}

// ---- more helpers ---------------------------------------------------------------------

/// The harness's default read timeout, restored after every short wait.
const LONG: Duration = Duration::from_secs(20);
/// Shortened consume-plane timers for most tests. The ack-wait stays long so that a
/// slow, shared machine never expires a delivery a test holds on purpose, and so does
/// the session timeout (a test waiting in silence must not be expelled); the tests of
/// expiry shorten them themselves.
const FAST: &[&str] = &[
    "--ack-wait",
    "10s",
    "--nack-delay",
    "100ms",
    "--session-timeout",
    "5s",
    "--revoke-timeout",
    "500ms",
    "--commit-interval",
    "100ms",
];

/// FAST with some timers replaced or flags added (a flag may be given only once).
fn flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v: Vec<&str> = FAST
        .chunks(2)
        .filter(|pair| !extra.contains(&pair[0]))
        .flatten()
        .copied()
        .collect();
    v.extend_from_slice(extra);
    v
}

#[allow(clippy::too_many_arguments)]
fn sub_req(
    c: &mut Client,
    group: &[u8],
    topic_id: u16,
    partition: u16,
    start_policy: u8,
    credit_count: u16,
    credit_bytes: u32,
    flags: u16,
) -> mortarmq::client::ClientResult<SubResult> {
    c.request(&Frame::Sub(Sub {
        group,
        topic_id,
        partition,
        start_policy,
        credit_count,
        credit_bytes,
        flags: SubFlags::from_bits_retain(flags),
    }))?
    .typed()
}

/// The ERR code of a request that must fail.
fn err_code<T: std::fmt::Debug>(r: mortarmq::client::ClientResult<T>) -> u16 {
    match r {
        Err(ClientError::Broker { code, .. }) => code,
        other => panic!("expected an ERR, got {other:?}"),
    }
}

fn is_timeout(e: &ClientError) -> bool {
    matches!(e, ClientError::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// The next push within `wait`, or None when nothing arrived.
fn try_push(c: &mut Client, wait: Duration) -> Option<Push> {
    if let Some(p) = c.kept_pushes().pop_front() {
        return Some(p);
    }
    c.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
        .unwrap();
    let r = c.next_push();
    c.set_read_timeout(Some(LONG)).unwrap();
    match r {
        Ok(p) => Some(p),
        Err(e) if is_timeout(&e) => None,
        Err(e) => panic!("connection failed: {e}"),
    }
}

/// Nothing is pushed for `wait`.
fn expect_silence(c: &mut Client, wait: Duration) {
    if let Some(p) = try_push(c, wait) {
        panic!("expected nothing for {wait:?}, got {p:?}");
    }
}

fn next_msg_within(c: &mut Client, wait: Duration) -> Delivery {
    match try_push(c, wait) {
        Some(Push::Msg(m)) => m,
        other => panic!("expected a MSG within {wait:?}, got {other:?}"),
    }
}

fn control_ack(c: &mut Client, n: &Notice, result: u8) -> mortarmq::client::ClientResult<Reply> {
    c.request(&Frame::ControlAck(ControlAck {
        result,
        ..ControlAck::answering(n, ControlResult::Ok)
    }))
}

fn ack_flags(c: &mut Client, m: &Delivery, flags: u16) -> mortarmq::client::ClientResult<Reply> {
    c.request(&Frame::Ack(m.ack(AckFlags::from_bits_retain(flags))))
}

fn nack(c: &mut Client, m: &Delivery, reason: u8) -> mortarmq::client::ClientResult<Reply> {
    // The reason stays a raw code so that reserved values can be sent too.
    c.request(&Frame::Nack(Nack {
        reason,
        ..m.nack(NackReason::Retry)
    }))
}

fn heartbeat(
    c: &mut Client,
    r: &SubResult,
    assignment_epoch: u32,
    state: u8,
) -> mortarmq::client::ClientResult<Reply> {
    c.request(&Frame::Heartbeat(Heartbeat {
        subscription_id: r.subscription_id,
        member_id: r.member_id,
        membership_epoch: r.membership_epoch,
        assignment_epoch,
        state,
    }))
}

fn credit(
    c: &mut Client,
    r: &SubResult,
    mode: u8,
    count: u16,
    bytes: u32,
) -> mortarmq::client::ClientResult<CreditResult> {
    c.request(&Frame::Credit(Credit {
        subscription_id: r.subscription_id,
        membership_epoch: r.membership_epoch,
        ownership_epoch: 0,
        mode,
        credit_count: count,
        credit_bytes: bytes,
        reserved: 0,
    }))?
    .typed()
}

/// PULL; returns the MSGs of the answer (the OK ends it). Notices stay kept.
fn pull(
    c: &mut Client,
    r: &SubResult,
    assignment_epoch: u32,
    max_msgs: u16,
    wait_ms: u16,
) -> mortarmq::client::ClientResult<Vec<Delivery>> {
    c.request(&Frame::Pull(Pull {
        subscription_id: r.subscription_id,
        member_id: r.member_id,
        membership_epoch: r.membership_epoch,
        assignment_epoch,
        ownership_epochs: Vec::new(),
        max_msgs,
        max_bytes: 0,
        wait_ms,
        min_bytes: 0,
    }))?;
    Ok(take_kept_msgs(c))
}

fn take_kept_msgs(c: &mut Client) -> Vec<Delivery> {
    let mut msgs = Vec::new();
    let kept = c.kept_pushes();
    let mut rest = std::collections::VecDeque::new();
    while let Some(p) = kept.pop_front() {
        match p {
            Push::Msg(m) => msgs.push(m),
            other => rest.push_back(other),
        }
    }
    *kept = rest;
    msgs
}

fn publish_kv(c: &mut Client, topic_id: u16, partition: u16, key: &[u8], value: &[u8]) -> u64 {
    c.publish(&Pub {
        topic_id,
        partition,
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        key,
        value,
        ..Pub::default()
    })
    .unwrap()
    .sequence
}

/// A small deterministic generator (xorshift64*), so no extra dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn percent(&mut self) -> u64 {
        self.next() % 100
    }
}

/// What a [`Member`] does with a MSG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Ack,
    Retry,
    Reject,
}

/// A group member driven by a test: CONTROL_ACKs its notices (REVOKEs may be held
/// back), heartbeats, and settles every MSG (always ACK, or randomly).
struct Member {
    c: Client,
    group: String,
    topic_id: u16,
    sub: SubResult,
    assignment_epoch: u32,
    /// partition → ownership epoch, from ASSIGNs, minus REVOKEs.
    held: BTreeMap<u16, u64>,
    assigns: Vec<Notice>,
    hold_revokes: bool,
    held_revokes: Vec<Notice>,
    rng: Option<Rng>,
    last_heartbeat: Instant,
    /// Every MSG of the current subscription, in arrival order.
    received: Vec<Delivery>,
    /// Settled with an OK answer.
    acked: Vec<(u16, u64)>,
    rejected: Vec<(u16, u64)>,
    retried: u64,
}

impl Member {
    fn join(broker: &Mortard, group: &str, topic_id: u16) -> Member {
        let mut c = broker.client();
        let sub = sub(&mut c, group, topic_id, 0);
        Member {
            c,
            group: group.to_string(),
            topic_id,
            sub,
            assignment_epoch: 0,
            held: BTreeMap::new(),
            assigns: Vec::new(),
            hold_revokes: false,
            held_revokes: Vec::new(),
            rng: None,
            last_heartbeat: Instant::now(),
            received: Vec::new(),
            acked: Vec::new(),
            rejected: Vec::new(),
            retried: 0,
        }
    }

    fn heartbeat(&mut self, state: u8) -> mortarmq::client::ClientResult<Reply> {
        self.last_heartbeat = Instant::now();
        heartbeat(&mut self.c, &self.sub, self.assignment_epoch, state)
    }

    /// HEARTBEAT LEAVE, then (after `pause`) SUB again on the same connection.
    fn leave_and_rejoin(&mut self, pause: Duration) {
        self.heartbeat(1).unwrap();
        self.held.clear();
        self.held_revokes.clear();
        std::thread::sleep(pause);
        self.sub = sub(&mut self.c, &self.group, self.topic_id, 0);
        self.assignment_epoch = 0;
    }

    fn release_revokes(&mut self) {
        for n in std::mem::take(&mut self.held_revokes) {
            self.answer_notice(&n);
            self.held.remove(&n.partition);
        }
    }

    /// CONTROL_ACKs a notice; false if the broker no longer knows it (an ASSIGN answered
    /// after --revoke-timeout was taken back, which happens on a loaded machine: the
    /// registry says to ignore UNKNOWN_NOTICE, as this member does).
    fn answer_notice(&mut self, n: &Notice) -> bool {
        match control_ack(&mut self.c, n, 0) {
            Ok(_) => true,
            Err(ClientError::Broker { code, .. }) if code == ErrorCode::UnknownNotice.code() => {
                false
            }
            Err(e) => panic!("CONTROL_ACK of {n:?}: {e}"),
        }
    }

    /// Handles at most one push, waiting up to `wait`; true if one was handled.
    fn step(&mut self, wait: Duration) -> bool {
        if self.last_heartbeat.elapsed() >= Duration::from_millis(200) {
            self.heartbeat(0).unwrap();
        }
        let Some(push) = try_push(&mut self.c, wait) else {
            return false;
        };
        match push {
            // Left-over notices of an earlier incarnation are moot.
            Push::Notice(n) if n.member_id != self.sub.member_id => {}
            Push::Notice(n) => {
                self.assignment_epoch = self.assignment_epoch.max(n.assignment_epoch);
                if n.kind == 0 {
                    if self.answer_notice(&n) {
                        self.held.insert(n.partition, n.ownership_epoch);
                        self.assigns.push(n);
                    }
                } else if self.hold_revokes {
                    self.held_revokes.push(n);
                } else {
                    self.answer_notice(&n);
                    self.held.remove(&n.partition);
                }
            }
            Push::Msg(m) if m.subscription_id != self.sub.subscription_id => {}
            Push::Msg(m) => {
                let action = match self.rng.as_mut().map(Rng::percent) {
                    None => Action::Ack,
                    Some(r) if r < 90 => Action::Ack,
                    Some(r) if r < 97 => Action::Retry,
                    Some(_) => Action::Reject,
                };
                let r = match action {
                    Action::Ack => ack(&mut self.c, &m),
                    Action::Retry => nack(&mut self.c, &m, 0),
                    Action::Reject => nack(&mut self.c, &m, 1),
                };
                let key = (m.partition, m.sequence);
                match r {
                    Ok(_) => match action {
                        Action::Ack => self.acked.push(key),
                        Action::Retry => self.retried += 1,
                        Action::Reject => self.rejected.push(key),
                    },
                    // The partition moved or the delivery expired: the group redelivers.
                    Err(e) if matches!(e.code().map(|c| c.code()), Some(0x0022 | 0x0023)) => {}
                    Err(e) => panic!("{action:?} of {key:?}: {e}"),
                }
                self.received.push(m);
            }
        }
        true
    }
}

/// Steps every member round-robin until `done` holds; panics after `timeout`.
fn pump_until(
    members: &mut [&mut Member],
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(&[&mut Member]) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(members) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        for m in members.iter_mut() {
            while m.step(Duration::from_millis(5)) {}
        }
    }
}

fn poll_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---- delivery gating and credit -------------------------------------------------------

#[test]
fn msg_flows_only_after_control_ack_of_assign() {
    // The ASSIGN stays unanswered for 600 ms below: within --revoke-timeout, or it is
    // taken back.
    let mut args = FAST.to_vec();
    let at = args.iter().position(|a| *a == "--revoke-timeout").unwrap();
    args[at + 1] = "5s";
    let broker = Mortard::start(&args);
    let mut producer = broker.client();
    let topic = producer
        .declare("gate", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..3u8 {
        producer
            .publish_value(topic, 0, &[i], Some(Durability::Fsynced))
            .unwrap();
    }
    let mut c = broker.client();
    let r = sub(&mut c, "g", topic, 0);
    let n = match try_push(&mut c, Duration::from_secs(5)) {
        Some(Push::Notice(n)) => n,
        other => panic!("expected ASSIGN, got {other:?}"),
    };
    assert_eq!(
        (n.kind, n.member_id, n.assignment_epoch, n.ownership_epoch),
        (0, r.member_id, 1, 1)
    );
    assert_eq!(
        (n.topic_id, n.partition, n.membership_epoch),
        (topic, 0, r.membership_epoch)
    );
    // Records are there, but the ASSIGN is not acknowledged: nothing flows.
    expect_silence(&mut c, Duration::from_millis(400));
    producer
        .publish_value(topic, 0, b"more", Some(Durability::Fsynced))
        .unwrap();
    expect_silence(&mut c, Duration::from_millis(200));
    control_ack(&mut c, &n, 0).unwrap();
    let seqs: Vec<u64> = (0..4)
        .map(|_| next_msg_within(&mut c, Duration::from_secs(5)))
        .map(|m| {
            assert_eq!(m.ownership_epoch, 1);
            m.sequence
        })
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
}

#[test]
fn credit_count_window_and_credit_set_add() {
    let broker = Mortard::start(&flags(&["--max-credit-count", "8", "--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("credit", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..12u8 {
        producer
            .publish_value(topic, 0, &[i], Some(Durability::Fsynced))
            .unwrap();
    }
    let mut c = broker.client();
    // Over the broker's maximum at SUB time.
    assert_eq!(
        err_code(sub_req(&mut c, b"g", topic, 0xFFFF, 0, 9, 0, 0)),
        ErrorCode::CreditLimit.code()
    );
    let r = sub_req(&mut c, b"g", topic, 0xFFFF, 0, 2, 0, 0).unwrap();
    accept_assignments(&mut c, 1);
    let m1 = next_msg_within(&mut c, Duration::from_secs(5));
    let m2 = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((m1.sequence, m2.sequence), (1, 2));
    expect_silence(&mut c, Duration::from_millis(400));
    ack(&mut c, &m1).unwrap();
    let m3 = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!(m3.sequence, 3);
    expect_silence(&mut c, Duration::from_millis(300));
    // PROGRESS does not settle: no credit comes back.
    ack_flags(&mut c, &m2, 1).unwrap();
    expect_silence(&mut c, Duration::from_millis(300));

    // SET 4: two more may flow (2 outstanding).
    let cr = credit(&mut c, &r, 0, 4, 0).unwrap();
    assert_eq!(
        (
            cr.granted_count,
            cr.outstanding_count,
            cr.outstanding_bytes,
            cr.credit_epoch
        ),
        (4, 2, 2, 1)
    );
    assert_eq!(
        cr.granted_bytes,
        2 * 1024 * 1024,
        "SET with 0 bytes keeps the bytes"
    );
    let m4 = next_msg_within(&mut c, Duration::from_secs(5));
    let m5 = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((m4.sequence, m5.sequence), (4, 5));
    expect_silence(&mut c, Duration::from_millis(300));

    // ADD 1: one more.
    let cr = credit(&mut c, &r, 1, 1, 0).unwrap();
    assert_eq!(
        (cr.granted_count, cr.outstanding_count, cr.credit_epoch),
        (5, 4, 2)
    );
    assert_eq!(next_msg_within(&mut c, Duration::from_secs(5)).sequence, 6);
    expect_silence(&mut c, Duration::from_millis(300));

    // Over --max-credit-count: refused, window unchanged, nothing more flows.
    assert_eq!(
        err_code(credit(&mut c, &r, 0, 9, 0)),
        ErrorCode::CreditLimit.code()
    );
    assert_eq!(
        err_code(credit(&mut c, &r, 1, 4, 0)),
        ErrorCode::CreditLimit.code()
    );
    let cr = credit(&mut c, &r, 1, 0, 0).unwrap();
    assert_eq!(
        (cr.granted_count, cr.outstanding_count, cr.credit_epoch),
        (5, 5, 2)
    );
    expect_silence(&mut c, Duration::from_millis(300));
    // Exactly the maximum is allowed.
    let cr = credit(&mut c, &r, 0, 8, 0).unwrap();
    assert_eq!((cr.granted_count, cr.credit_epoch), (8, 3));
    for seq in 7..=9 {
        assert_eq!(
            next_msg_within(&mut c, Duration::from_secs(5)).sequence,
            seq
        );
    }
    expect_silence(&mut c, Duration::from_millis(300));
}

#[test]
fn credit_bytes_window_lets_one_oversized_record_through() {
    let broker = Mortard::start(&flags(&["--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("bytes", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish_kv(&mut producer, topic, 0, b"", &[7u8; 500]);
    for _ in 0..3 {
        publish_kv(&mut producer, topic, 0, b"k", &[1u8; 39]);
    }
    let mut c = broker.client();
    let r = sub_req(&mut c, b"g", topic, 0xFFFF, 0, 10, 100, 0).unwrap();
    accept_assignments(&mut c, 1);
    // 500 bytes > the 100-byte window, but nothing is outstanding: it flows alone.
    let big = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((big.sequence, big.value.len()), (1, 500));
    expect_silence(&mut c, Duration::from_millis(400));
    let cr = credit(&mut c, &r, 1, 0, 0).unwrap();
    assert_eq!(
        (cr.granted_bytes, cr.outstanding_count, cr.outstanding_bytes),
        (100, 1, 500)
    );
    ack(&mut c, &big).unwrap();
    // 40 + 40 fit in 100; a third 40 does not.
    let a = next_msg_within(&mut c, Duration::from_secs(5));
    let b = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((a.sequence, b.sequence), (2, 3));
    expect_silence(&mut c, Duration::from_millis(400));
    ack(&mut c, &a).unwrap();
    assert_eq!(next_msg_within(&mut c, Duration::from_secs(5)).sequence, 4);
}

// ---- fencing and errors ---------------------------------------------------------------

#[test]
fn consume_op_errors() {
    let broker = Mortard::start(FAST);
    let mut producer = broker.client();
    let topic = producer
        .declare("errs", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"x", Some(Durability::Fsynced))
        .unwrap();
    let mut c = broker.client();

    // SUB validation.
    assert_eq!(
        err_code(sub_req(&mut c, b"g", topic, 0, 0, 0, 0, 0)),
        ErrorCode::InvalidSubscription.code()
    );
    assert_eq!(
        err_code(sub_req(&mut c, b"g", topic, 0xFFFF, 2, 0, 0, 0)),
        ErrorCode::InvalidSubscription.code()
    );
    assert_eq!(
        err_code(sub_req(&mut c, b"", topic, 0xFFFF, 0, 0, 0, 0)),
        ErrorCode::InvalidSubscription.code()
    );
    for bad in [&b"bad name"[..], b"a/b", b"caf\xc3\xa9", &[b'g'; 256]] {
        assert_eq!(
            err_code(sub_req(&mut c, bad, topic, 0xFFFF, 0, 0, 0, 0)),
            ErrorCode::InvalidGroupName.code(),
            "group {bad:?}"
        );
    }
    assert_eq!(
        err_code(sub_req(&mut c, b"g", 99, 0xFFFF, 0, 0, 0, 0)),
        ErrorCode::UnknownTopic.code()
    );

    let r = sub(&mut c, "g", topic, 0);
    assert_eq!(r.subscription_id, 1, "failed SUBs take no subscription id");
    let notices = accept_assignments(&mut c, 1);
    let m = next_msg_within(&mut c, Duration::from_secs(5));

    // ACK fencing: wrong ownership epoch, nothing changes.
    let mut wrong = m.clone();
    wrong.ownership_epoch += 1;
    assert_eq!(
        err_code(ack(&mut c, &wrong)),
        ErrorCode::OwnershipFenced.code()
    );
    assert_eq!(
        err_code(nack(&mut c, &wrong, 1)),
        ErrorCode::OwnershipFenced.code()
    );
    // Unknown delivery: another delivery id, another sequence.
    let mut unknown = m.clone();
    unknown.delivery_id += 1000;
    assert_eq!(
        err_code(ack(&mut c, &unknown)),
        ErrorCode::UnknownDelivery.code()
    );
    let mut unknown = m.clone();
    unknown.sequence += 1;
    assert_eq!(
        err_code(ack(&mut c, &unknown)),
        ErrorCode::UnknownDelivery.code()
    );
    // Unknown subscription.
    let mut other_sub = m.clone();
    other_sub.subscription_id = 99;
    assert_eq!(
        err_code(ack(&mut c, &other_sub)),
        ErrorCode::UnknownSubscription.code()
    );
    assert_eq!(
        err_code(nack(&mut c, &other_sub, 0)),
        ErrorCode::UnknownSubscription.code()
    );
    // Reserved NACK reasons.
    assert_eq!(
        err_code(nack(&mut c, &m, 2)),
        ErrorCode::InvalidArgument.code()
    );
    assert_eq!(
        err_code(nack(&mut c, &m, 3)),
        ErrorCode::InvalidArgument.code()
    );
    // The delivery survived all of that.
    ack(&mut c, &m).unwrap();
    assert_eq!(
        err_code(ack(&mut c, &m)),
        ErrorCode::UnknownDelivery.code(),
        "settled twice"
    );

    // HEARTBEAT with a wrong member or membership epoch.
    let mut wrong_member = r;
    wrong_member.member_id += 7;
    assert_eq!(
        err_code(heartbeat(&mut c, &wrong_member, 1, 0)),
        ErrorCode::UnknownMember.code()
    );
    let mut wrong_epoch = r;
    wrong_epoch.membership_epoch += 7;
    assert_eq!(
        err_code(heartbeat(&mut c, &wrong_epoch, 1, 0)),
        ErrorCode::UnknownMember.code()
    );
    heartbeat(&mut c, &r, 1, 0).unwrap();
    assert_eq!(
        err_code(heartbeat(&mut c, &r, 1, 2)),
        ErrorCode::InvalidArgument.code()
    );

    // CONTROL_ACK of an unknown notice, and of one already acknowledged.
    let mut bogus = notices[0].clone();
    bogus.notice_id = 9999;
    assert_eq!(
        err_code(control_ack(&mut c, &bogus, 0)),
        ErrorCode::UnknownNotice.code()
    );
    assert_eq!(
        err_code(control_ack(&mut c, &notices[0], 0)),
        ErrorCode::UnknownNotice.code()
    );

    // CREDIT mode 2.
    assert_eq!(
        err_code(credit(&mut c, &r, 2, 1, 0)),
        ErrorCode::InvalidArgument.code()
    );

    // Every error above kept the connection.
    c.ping().unwrap();
    producer
        .publish_value(topic, 0, b"y", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(next_msg_within(&mut c, Duration::from_secs(5)).value, b"y");
}

// ---- redelivery -----------------------------------------------------------------------

#[test]
fn unacked_delivery_is_redelivered_after_ack_wait() {
    let broker = Mortard::start(&flags(&["--ack-wait", "1s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("redeliver", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"once", Some(Durability::Fsynced))
        .unwrap();
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let first = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!(first.attempt, 1);
    let t0 = Instant::now();
    let again = next_msg_within(&mut c, Duration::from_secs(5));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "redelivered after {waited:?}"
    );
    assert_eq!(
        (again.sequence, again.attempt, again.value.as_slice()),
        (first.sequence, 2, &b"once"[..])
    );
    assert_ne!(again.delivery_id, first.delivery_id);
    // The expired delivery is no longer outstanding; the new one is.
    assert_eq!(
        err_code(ack(&mut c, &first)),
        ErrorCode::UnknownDelivery.code()
    );
    ack(&mut c, &again).unwrap();
    expect_silence(&mut c, Duration::from_millis(600));
}

#[test]
fn ack_progress_postpones_expiry() {
    let broker = Mortard::start(&flags(&["--ack-wait", "600ms"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("progress", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"slow", Some(Durability::Fsynced))
        .unwrap();
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let m = next_msg_within(&mut c, Duration::from_secs(5));
    // Three ack-waits long, kept alive by PROGRESS every 100 ms.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1800) {
        ack_flags(&mut c, &m, 1).unwrap();
        expect_silence(&mut c, Duration::from_millis(100));
    }
    // Still the outstanding delivery: the final ACK settles it.
    ack(&mut c, &m).unwrap();
    expect_silence(&mut c, Duration::from_millis(900));
}

#[test]
fn nack_retry_redelivers_after_nack_delay() {
    let broker = Mortard::start(&[
        "--ack-wait",
        "10s",
        "--nack-delay",
        "300ms",
        "--session-timeout",
        "5s",
    ]);
    let mut producer = broker.client();
    let topic = producer
        .declare("retry", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"r", Some(Durability::Fsynced))
        .unwrap();
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let mut m = next_msg_within(&mut c, Duration::from_secs(5));
    for attempt in 2..=3 {
        let t0 = Instant::now();
        nack(&mut c, &m, 0).unwrap();
        assert_eq!(
            err_code(ack(&mut c, &m)),
            ErrorCode::UnknownDelivery.code(),
            "NACK settles"
        );
        let again = next_msg_within(&mut c, Duration::from_secs(5));
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(250),
            "redelivered after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(3),
            "redelivered after {waited:?}"
        );
        assert_eq!((again.sequence, again.attempt), (m.sequence, attempt));
        assert_ne!(again.delivery_id, m.delivery_id);
        m = again;
    }
    ack(&mut c, &m).unwrap();
    expect_silence(&mut c, Duration::from_millis(500));
}

// ---- dead letters ---------------------------------------------------------------------

#[test]
fn nack_reject_dead_letters_to_twin_with_origin() {
    let broker = Mortard::start(FAST);
    let mut producer = broker.client();
    let topic = producer
        .declare("orders", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish_kv(&mut producer, topic, 1, b"k0", b"fine");
    publish_kv(&mut producer, topic, 1, b"poison-key", b"poison-value");
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 2);
    let fine = next_msg_within(&mut c, Duration::from_secs(5));
    let bad = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((fine.sequence, bad.sequence, bad.partition), (1, 2, 1));
    assert!(fine.origin.is_none() && bad.origin.is_none());
    ack(&mut c, &fine).unwrap();
    nack(&mut c, &bad, 1).unwrap();
    assert_eq!(
        err_code(ack(&mut c, &bad)),
        ErrorCode::UnknownDelivery.code()
    );
    // Settled by the dead letter: never redelivered to this group.
    expect_silence(&mut c, Duration::from_millis(600));

    let mut reader = broker.client();
    let dlq = topic + 1;
    assert_eq!(
        producer
            .declare("orders.dlq", 2, DeclareFlags::PASSIVE)
            .map(|d| d.topic_id)
            .ok(),
        None,
        "twins are addressed via their source"
    );
    sub(&mut reader, "dlq-reader", dlq, 0);
    accept_assignments(&mut reader, 2);
    let d = next_msg_within(&mut reader, Duration::from_secs(5));
    assert_eq!((d.topic_id, d.partition, d.sequence), (dlq, 1, 1));
    assert_eq!(d.key, b"poison-key");
    assert_eq!(d.value, b"poison-value");
    // The codec fills `origin` exactly when MSG flags bit0 is set.
    let origin = d.origin.expect("MSG flags bit0 ORIGIN and the trailer");
    assert_eq!(
        origin,
        Origin {
            origin_topic_id: topic,
            origin_partition: 1,
            origin_sequence: 2,
            attempts: 1,
            reason: 0,
        }
    );
    ack(&mut reader, &d).unwrap();
    expect_silence(&mut reader, Duration::from_millis(300));
}

#[test]
fn max_attempts_dead_letters_exactly_once() {
    let broker = Mortard::start(&flags(&["--max-attempts", "2", "--ack-wait", "300ms"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("flaky", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish_kv(&mut producer, topic, 0, b"key", b"never-acked");
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let first = next_msg_within(&mut c, Duration::from_secs(5));
    let second = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!(
        (first.attempt, second.attempt, second.sequence),
        (1, 2, first.sequence)
    );
    // The second expiry reaches --max-attempts: dead-lettered, not delivered again.
    expect_silence(&mut c, Duration::from_millis(1200));

    let mut reader = broker.client();
    sub(&mut reader, "dlq-reader", topic + 1, 0);
    accept_assignments(&mut reader, 1);
    let d = next_msg_within(&mut reader, Duration::from_secs(5));
    assert_eq!(
        (d.key.as_slice(), d.value.as_slice()),
        (&b"key"[..], &b"never-acked"[..])
    );
    assert_eq!(
        d.origin,
        Some(Origin {
            origin_topic_id: topic,
            origin_partition: 0,
            origin_sequence: 1,
            attempts: 2,
            reason: 1,
        })
    );
    ack(&mut reader, &d).unwrap();
    // Exactly once in the twin.
    expect_silence(&mut reader, Duration::from_millis(500));
    let next_dlq_seq = publish_kv(&mut producer, topic + 1, 0, b"", b"replay");
    assert_eq!(next_dlq_seq, 2, "the twin holds one dead letter");
}

// ---- PULL -----------------------------------------------------------------------------

#[test]
fn pull_mode() {
    let broker = Mortard::start(&flags(&["--session-timeout", "10s", "--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("pulled", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let mut c = broker.client();
    let r = sub(&mut c, "g", topic, 1);
    let held = accept_assignments(&mut c, 2);
    let ae = held.iter().map(|n| n.assignment_epoch).max().unwrap();
    assert_eq!(ae, 2);

    // Empty, wait 0: just OK.
    assert!(pull(&mut c, &r, ae, 10, 0).unwrap().is_empty());
    // max_msgs 0.
    assert_eq!(
        err_code(pull(&mut c, &r, ae, 0, 0)),
        ErrorCode::InvalidArgument.code()
    );
    // An older assignment epoch.
    assert_eq!(err_code(pull(&mut c, &r, ae - 1, 10, 0)), 0x0021);

    for i in 0..5u16 {
        producer
            .publish_value(topic, i % 2, &[i as u8], Some(Durability::Fsynced))
            .unwrap();
    }
    // PULL_MODE: nothing is pushed.
    expect_silence(&mut c, Duration::from_millis(400));
    let got = pull(&mut c, &r, ae, 3, 0).unwrap();
    assert_eq!(got.len(), 3);
    let rest = pull(&mut c, &r, ae, 10, 0).unwrap();
    assert_eq!(rest.len(), 2);
    let mut values: Vec<u8> = got.iter().chain(&rest).map(|m| m.value[0]).collect();
    values.sort();
    assert_eq!(values, vec![0, 1, 2, 3, 4]);
    for m in got.iter().chain(&rest) {
        assert_eq!(m.attempt, 1);
        ack(&mut c, m).unwrap();
    }
    assert!(pull(&mut c, &r, ae, 10, 0).unwrap().is_empty());

    // A waiting PULL is answered by a record published meanwhile.
    let t0 = Instant::now();
    c.send(&Frame::Pull(Pull {
        subscription_id: r.subscription_id,
        member_id: r.member_id,
        membership_epoch: r.membership_epoch,
        assignment_epoch: ae,
        ownership_epochs: Vec::new(),
        max_msgs: 10,
        max_bytes: 0,
        wait_ms: 2000,
        min_bytes: 0,
    }))
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    producer
        .publish_value(topic, 1, b"late", Some(Durability::Fsynced))
        .unwrap();
    c.recv_reply().unwrap();
    let answered = t0.elapsed();
    let late = take_kept_msgs(&mut c);
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].value, b"late");
    assert!(
        answered < Duration::from_millis(1500),
        "answered after {answered:?}"
    );
    ack(&mut c, &late[0]).unwrap();

    // Wait timeout: OK, empty, after about wait_ms.
    let t0 = Instant::now();
    assert!(pull(&mut c, &r, ae, 10, 300).unwrap().is_empty());
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "answered after {waited:?}"
    );
}

// ---- rebalancing ----------------------------------------------------------------------

fn total_held(members: &[&mut Member]) -> usize {
    members.iter().map(|m| m.held.len()).sum()
}

#[test]
fn rebalance_is_cooperative_and_loses_nothing() {
    // A long revoke timeout: partitions move on the CONTROL_ACK, not the timer.
    let broker = Mortard::start(&[
        "--ack-wait",
        "2s",
        "--session-timeout",
        "5s",
        "--revoke-timeout",
        "10s",
    ]);
    let mut producer = broker.client();
    let topic = producer
        .declare("churn", 4, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let mut next = 0u32;
    let mut publish = |producer: &mut Client, n: u32| {
        for _ in 0..n {
            producer
                .publish_value(
                    topic,
                    (next % 4) as u16,
                    &next.to_be_bytes(),
                    Some(Durability::Fsynced),
                )
                .unwrap();
            next += 1;
        }
    };

    let mut a = Member::join(&broker, "g", topic);
    pump_until(&mut [&mut a], Duration::from_secs(5), "A holds 4", |m| {
        m[0].held.len() == 4
    });
    publish(&mut producer, 20);

    // B joins: A is asked to give up two partitions; B gets nothing until A agrees.
    a.hold_revokes = true;
    let mut b = Member::join(&broker, "g", topic);
    pump_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(5),
        "REVOKEs to A",
        |m| m[0].held_revokes.len() == 2,
    );
    let mut revoked: Vec<u16> = a.held_revokes.iter().map(|n| n.partition).collect();
    revoked.sort();
    assert_eq!(revoked, vec![2, 3], "the highest partitions move");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(400) {
        a.step(Duration::from_millis(10));
        b.step(Duration::from_millis(10));
    }
    assert!(
        b.assigns.is_empty(),
        "ASSIGN before the REVOKE was acknowledged"
    );
    a.hold_revokes = false;
    a.release_revokes();
    pump_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(3),
        "2 + 2",
        |m| m[0].held.len() == 2 && m[1].held.len() == 2,
    );
    assert_eq!(b.held.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    for n in &b.assigns {
        assert_eq!(
            n.ownership_epoch, 2,
            "second ASSIGN of partition {}",
            n.partition
        );
        assert_eq!(n.member_id, b.sub.member_id);
    }
    assert_eq!(b.assignment_epoch, 2);
    publish(&mut producer, 20);

    // C joins (4 over 3) and leaves again.
    let mut c = Member::join(&broker, "g", topic);
    pump_until(
        &mut [&mut a, &mut b, &mut c],
        Duration::from_secs(5),
        "C gets one",
        |m| m[2].held.len() == 1 && total_held(m) == 4,
    );
    publish(&mut producer, 20);
    pump_until(
        &mut [&mut a, &mut b, &mut c],
        Duration::from_secs(5),
        "C receives",
        |m| !m[2].received.is_empty(),
    );
    c.heartbeat(1).unwrap();
    assert_eq!(
        err_code(c.heartbeat(0)),
        ErrorCode::UnknownMember.code(),
        "after LEAVE"
    );
    c.held.clear();
    pump_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(5),
        "partitions back",
        |m| m[0].held.len() == 2 && m[1].held.len() == 2,
    );
    publish(&mut producer, 20);

    // Every record was delivered to and acknowledged by some member.
    let expected: BTreeSet<(u16, u64)> = (0..4u16)
        .flat_map(|p| (1..=(next as u64 / 4)).map(move |s| (p, s)))
        .collect();
    let acked = |ms: &[&mut Member], c: &Member| -> BTreeSet<(u16, u64)> {
        ms.iter()
            .flat_map(|m| m.acked.iter().copied())
            .chain(c.acked.iter().copied())
            .collect()
    };
    let c_ref = &c;
    pump_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "every record acked",
        |m| acked(m, c_ref).is_superset(&expected),
    );
    let all = acked(&[&mut a, &mut b], &c);
    assert_eq!(all, expected);
}

#[test]
fn killed_consumer_unacked_records_go_to_the_survivor() {
    let broker = Mortard::start(&flags(&["--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("crashy", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 1..=10u8 {
        producer
            .publish_value(topic, 0, &[i], Some(Durability::Fsynced))
            .unwrap();
    }
    let mut a = broker.client();
    sub_req(&mut a, b"g", topic, 0xFFFF, 0, 5, 0, 0).unwrap();
    accept_assignments(&mut a, 1);
    let mut survivor = Member::join(&broker, "g", topic);
    let batch: Vec<Delivery> = (0..5)
        .map(|_| next_msg_within(&mut a, Duration::from_secs(5)))
        .collect();
    ack(&mut a, &batch[0]).unwrap();
    ack(&mut a, &batch[1]).unwrap();
    // Mid-batch: 3 unacked (and perhaps 2 more pushed since).
    drop(a);
    pump_until(
        &mut [&mut survivor],
        Duration::from_secs(5),
        "records 3..=10",
        |m| m[0].acked.len() >= 8,
    );
    let mut seqs: Vec<u64> = survivor.received.iter().map(|m| m.sequence).collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (3..=10).collect::<Vec<u64>>(),
        "no acked record again"
    );
    for m in &survivor.received {
        if m.sequence <= 5 {
            assert_eq!(
                m.attempt, 2,
                "seq {} was delivered to the dead member",
                m.sequence
            );
        }
    }
    expect_silence(&mut survivor.c, Duration::from_millis(300));
}

#[test]
fn silent_member_is_expelled_after_session_timeout() {
    let broker = Mortard::start(&flags(&["--session-timeout", "1s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("sessions", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let mut a = Member::join(&broker, "g", topic);
    pump_until(&mut [&mut a], Duration::from_secs(5), "A holds 2", |m| {
        m[0].held.len() == 2
    });
    let mut b = Member::join(&broker, "g", topic);
    pump_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(5),
        "1 + 1",
        |m| m[0].held.len() == 1 && m[1].held.len() == 1,
    );
    let t0 = Instant::now();
    // B goes silent; A keeps heartbeating and gets B's partition back.
    pump_until(
        &mut [&mut a],
        Duration::from_secs(5),
        "A holds 2 again",
        |m| m[0].held.len() == 2,
    );
    let after = t0.elapsed();
    assert!(
        after >= Duration::from_millis(700),
        "expelled after {after:?}"
    );
    assert_eq!(err_code(b.heartbeat(0)), ErrorCode::UnknownMember.code());
    // A still is a member and receives from both partitions.
    producer
        .publish_value(topic, 0, b"p0", Some(Durability::Fsynced))
        .unwrap();
    producer
        .publish_value(topic, 1, b"p1", Some(Durability::Fsynced))
        .unwrap();
    pump_until(&mut [&mut a], Duration::from_secs(5), "2 records", |m| {
        m[0].acked.len() == 2
    });
}

// ---- positions ------------------------------------------------------------------------

const POSITION_RECORDS: u64 = 10;
const POSITION_ACKED: u64 = 4;

/// Publishes 10 records, receives all, acks 1..=4, waits until the groups file says so.
fn consume_four_of_ten(broker: &Mortard) -> u16 {
    let mut producer = broker.client();
    let topic = producer
        .declare("positions", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 1..=POSITION_RECORDS {
        producer
            .publish_value(topic, 0, &[i as u8], Some(Durability::Fsynced))
            .unwrap();
    }
    let mut c = broker.client();
    sub(&mut c, "pos", topic, 0);
    accept_assignments(&mut c, 1);
    let all: Vec<Delivery> = (0..POSITION_RECORDS)
        .map(|_| next_msg_within(&mut c, Duration::from_secs(5)))
        .collect();
    for m in &all[..POSITION_ACKED as usize] {
        ack(&mut c, m).unwrap();
    }
    let want = format!("\n{topic} 0 {POSITION_ACKED} pos\n");
    let groups = broker.data_dir().join("groups");
    poll_until(Duration::from_secs(5), "persisted position", || {
        String::from_utf8_lossy(&std::fs::read(&groups).unwrap_or_default()).contains(&want)
    });
    topic
}

fn sequences_after_restart(broker: &Mortard, topic: u16) -> Vec<u64> {
    let mut c = broker.client();
    sub(&mut c, "pos", topic, 0);
    accept_assignments(&mut c, 1);
    let mut seqs = Vec::new();
    while let Some(push) = try_push(&mut c, Duration::from_millis(700)) {
        let Push::Msg(m) = push else {
            panic!("unexpected {push:?}")
        };
        ack(&mut c, &m).unwrap();
        seqs.push(m.sequence);
    }
    seqs
}

#[test]
fn positions_survive_sigterm_restart() {
    let mut broker = Mortard::start(FAST);
    let topic = consume_four_of_ten(&broker);
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    broker.restart();
    let seqs = sequences_after_restart(&broker, topic);
    assert_eq!(
        seqs,
        (POSITION_ACKED + 1..=POSITION_RECORDS).collect::<Vec<_>>()
    );
}

#[test]
fn positions_survive_sigkill_at_least_once() {
    let mut broker = Mortard::start(FAST);
    let topic = consume_four_of_ten(&broker);
    broker.restart_after_kill9();
    let seqs = sequences_after_restart(&broker, topic);
    assert!(!seqs.is_empty(), "nothing redelivered");
    assert!(seqs[0] <= POSITION_ACKED + 1, "skipped to {}", seqs[0]);
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert!(
        unique.is_superset(&(POSITION_ACKED + 1..=POSITION_RECORDS).collect()),
        "missing records: {seqs:?}"
    );
}

#[test]
fn start_policy_latest_skips_earlier_records() {
    let broker = Mortard::start(&flags(&["--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("latest", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..6u16 {
        producer
            .publish_value(topic, i % 2, b"old", Some(Durability::Fsynced))
            .unwrap();
    }
    let mut c = broker.client();
    sub_req(&mut c, b"tail", topic, 0xFFFF, 1, 0, 0, 0).unwrap();
    accept_assignments(&mut c, 2);
    expect_silence(&mut c, Duration::from_millis(400));
    producer
        .publish_value(topic, 0, b"new0", Some(Durability::Fsynced))
        .unwrap();
    producer
        .publish_value(topic, 1, b"new1", Some(Durability::Fsynced))
        .unwrap();
    let mut got: Vec<(u16, u64, Vec<u8>)> = (0..2)
        .map(|_| next_msg_within(&mut c, Duration::from_secs(5)))
        .map(|m| (m.partition, m.sequence, m.value))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![(0, 4, b"new0".to_vec()), (1, 4, b"new1".to_vec())]
    );
    expect_silence(&mut c, Duration::from_millis(300));
    // An EARLIEST group on the same topic still starts at 1.
    let mut e = broker.client();
    sub(&mut e, "head", topic, 0);
    accept_assignments(&mut e, 2);
    assert_eq!(next_msg_within(&mut e, Duration::from_secs(5)).sequence, 1);
}

// ---- soak -----------------------------------------------------------------------------

const SOAK_PRODUCERS: u64 = 3;
const SOAK_PER_PRODUCER: u64 = 1200;
const SOAK_PARTITIONS: u16 = 4;

#[derive(Default)]
struct Tally {
    acked: BTreeSet<(u16, u64)>,
    acked_ok: u64,
    rejected: BTreeSet<(u16, u64)>,
    retried: u64,
    deliveries: u64,
    redeliveries: u64,
    delivered: BTreeSet<(u16, u64)>,
}

#[test]
fn soak_producers_and_churning_consumers_settle_everything() {
    let started = Instant::now();
    let broker = Mortard::start(&[
        "--ack-wait",
        "2s",
        "--nack-delay",
        "50ms",
        "--session-timeout",
        "3s",
        "--revoke-timeout",
        "500ms",
        "--commit-interval",
        "100ms",
    ]);
    let topic = broker
        .client()
        .declare("soak", SOAK_PARTITIONS, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let stop = Arc::new(AtomicBool::new(false));
    let rejoined = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));

    let producers: Vec<_> = (0..SOAK_PRODUCERS)
        .map(|i| {
            let mut c = broker.client();
            let produced = produced.clone();
            std::thread::spawn(move || {
                let mut next_seq = [0u64; SOAK_PARTITIONS as usize];
                let mut published = Vec::new();
                let window = 8;
                for start in (0..SOAK_PER_PRODUCER).step_by(window) {
                    let end = (start + window as u64).min(SOAK_PER_PRODUCER);
                    for n in start..end {
                        let p = ((n + i) % u64::from(SOAK_PARTITIONS)) as u16;
                        next_seq[p as usize] += 1;
                        let value = format!("{i}-{n}");
                        c.queue(&Frame::Pub(Pub {
                            topic_id: topic,
                            partition: p,
                            producer_id: i + 1,
                            producer_seq: next_seq[p as usize],
                            flags: PubFlags::requesting(Some(Durability::Fsynced)),
                            key: b"soak",
                            value: value.as_bytes(),
                        }));
                    }
                    c.flush().unwrap();
                    for n in start..end {
                        let p = ((n + i) % u64::from(SOAK_PARTITIONS)) as u16;
                        let r: PubResult = c.recv_reply().unwrap().typed().unwrap();
                        assert_eq!(r.result_flags.bits() & 1, 0, "deduplicated");
                        assert_eq!(r.durability, 2);
                        published.push((p, r.sequence));
                        produced.fetch_add(1, Ordering::Relaxed);
                    }
                }
                published
            })
        })
        .collect();

    let consumers: Vec<_> = (0..3u64)
        .map(|i| {
            let mut m = Member::join(&broker, "soak", topic);
            m.rng = Some(Rng(0x9E37_79B9_7F4A_7C15 ^ (i + 1)));
            let (stop, tally) = (stop.clone(), tally.clone());
            let (rejoined, produced) = (rejoined.clone(), produced.clone());
            std::thread::spawn(move || {
                let mut left = false;
                let mut seen = 0usize;
                let half = SOAK_PRODUCERS * SOAK_PER_PRODUCER / 2;
                while !stop.load(Ordering::Relaxed) {
                    // Midway through production: leave, stay away a while, rejoin.
                    if i == 0 && !left && produced.load(Ordering::Relaxed) >= half {
                        m.leave_and_rejoin(Duration::from_millis(300));
                        left = true;
                        rejoined.store(true, Ordering::Relaxed);
                    }
                    m.step(Duration::from_millis(20));
                    let mut t = tally.lock().unwrap();
                    for d in &m.received[seen..] {
                        t.deliveries += 1;
                        t.delivered.insert((d.partition, d.sequence));
                        if d.attempt > 1 {
                            t.redeliveries += 1;
                        }
                    }
                    seen = m.received.len();
                    for k in m.acked.drain(..) {
                        t.acked_ok += 1;
                        t.acked.insert(k);
                    }
                    t.rejected.extend(m.rejected.drain(..));
                    t.retried += std::mem::take(&mut m.retried);
                }
                left
            })
        })
        .collect();

    let mut published = BTreeSet::new();
    for p in producers {
        for k in p.join().unwrap() {
            assert!(published.insert(k), "sequence {k:?} given twice");
        }
    }
    let per_partition = SOAK_PRODUCERS * SOAK_PER_PRODUCER / u64::from(SOAK_PARTITIONS);
    let expected: BTreeSet<(u16, u64)> = (0..SOAK_PARTITIONS)
        .flat_map(|p| (1..=per_partition).map(move |s| (p, s)))
        .collect();
    assert_eq!(
        published, expected,
        "sequences are contiguous per partition"
    );

    // The dead letters, read back through another group on the twin.
    let mut dlq_reader = Member::join(&broker, "soak-dlq", topic + 1);
    let mut dead: BTreeMap<(u16, u64), u32> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        while dlq_reader.step(Duration::from_millis(20)) {}
        for d in dlq_reader.received.drain(..) {
            let o = d.origin.expect("dead letters carry the origin trailer");
            assert_eq!(o.origin_topic_id, topic);
            assert_eq!(o.origin_partition, d.partition);
            *dead
                .entry((o.origin_partition, o.origin_sequence))
                .or_default() += 1;
        }
        let settled = rejoined.load(Ordering::Relaxed) && {
            let t = tally.lock().unwrap();
            expected
                .iter()
                .all(|k| t.acked.contains(k) || dead.contains_key(k))
        };
        if settled {
            break;
        }
        if Instant::now() > deadline {
            let t = tally.lock().unwrap();
            let missing: Vec<_> = expected
                .iter()
                .filter(|k| !t.acked.contains(k) && !dead.contains_key(k))
                .take(20)
                .collect();
            panic!("not settled: {missing:?} ...");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rejoined: Vec<bool> = consumers.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(rejoined[0], "member 0 left and rejoined");
    // Late dead letters (none expected) would show up as duplicates here.
    while dlq_reader.step(Duration::from_millis(200)) {}
    for d in dlq_reader.received.drain(..) {
        let o = d.origin.unwrap();
        *dead
            .entry((o.origin_partition, o.origin_sequence))
            .or_default() += 1;
    }

    let t = tally.lock().unwrap();
    let dead_unique: BTreeSet<(u16, u64)> = dead.keys().copied().collect();
    let dead_twice: Vec<_> = dead.iter().filter(|(_, &n)| n > 1).collect();
    println!(
        "soak: published {}, acked (unique) {}, dead-lettered (unique) {}; MSGs handled {} \
         for {} records (duplicates seen {}), MSGs with attempt > 1 {} (includes records \
         whose first delivery sat unread in the leaving member's socket), NACK RETRY {}, \
         NACK REJECT {}; {:?}",
        published.len(),
        t.acked.len(),
        dead_unique.len(),
        t.deliveries,
        t.delivered.len(),
        t.deliveries - t.delivered.len() as u64,
        t.redeliveries,
        t.retried,
        t.rejected.len(),
        started.elapsed()
    );

    assert!(dead_twice.is_empty(), "dead-lettered twice: {dead_twice:?}");
    assert!(
        t.acked.is_disjoint(&dead_unique),
        "acked and dead-lettered: {:?}",
        t.acked.intersection(&dead_unique).collect::<Vec<_>>()
    );
    assert!(
        t.rejected.is_subset(&dead_unique),
        "a REJECT missing from the twin"
    );
    assert_eq!(
        t.acked_ok,
        t.acked.len() as u64,
        "a record was acknowledged twice"
    );
    assert_eq!(published.len(), t.acked.len() + dead_unique.len());
    assert!(dead_unique.iter().all(|k| expected.contains(k)));
}

// ---- more ownership and crash cases ---------------------------------------------------

#[test]
fn sub_ok_is_written_before_its_notices() {
    let broker = Mortard::start(FAST);
    let mut producer = broker.client();
    let topic = producer
        .declare("order", 3, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let mut c = broker.client();
    c.send(&Frame::Sub(Sub {
        group: b"g",
        topic_id: topic,
        partition: 0xFFFF,
        ..Sub::default()
    }))
    .unwrap();
    let first = c.read_frame().unwrap();
    assert_eq!(
        first.op,
        Op::Ok as u8,
        "a NOTICE naming the member id came before the SUB's OK"
    );
}

#[test]
fn refused_assign_is_offered_again() {
    let broker = Mortard::start(FAST);
    let mut producer = broker.client();
    let topic = producer
        .declare("refuse", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"x", Some(Durability::Fsynced))
        .unwrap();
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    let Some(Push::Notice(n1)) = try_push(&mut c, Duration::from_secs(5)) else {
        panic!("no ASSIGN")
    };
    control_ack(&mut c, &n1, 1).unwrap(); // STALE
    let Some(Push::Notice(n2)) = try_push(&mut c, Duration::from_secs(5)) else {
        panic!("the refused partition was not offered again")
    };
    assert_eq!((n2.kind, n2.partition), (0, 0));
    assert!(n2.notice_id > n1.notice_id);
    assert_eq!(n2.ownership_epoch, n1.ownership_epoch + 1);
    assert_eq!(n2.assignment_epoch, n1.assignment_epoch + 1);
    control_ack(&mut c, &n2, 0).unwrap();
    let m = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!(m.ownership_epoch, n2.ownership_epoch);
}

#[test]
fn moved_partition_fences_the_old_owner() {
    let broker = Mortard::start(&flags(&["--ack-wait", "10s", "--session-timeout", "5s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("fence", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    producer
        .publish_value(topic, 0, b"p0", Some(Durability::Fsynced))
        .unwrap();
    producer
        .publish_value(topic, 1, b"p1", Some(Durability::Fsynced))
        .unwrap();
    let mut a = broker.client();
    sub(&mut a, "g", topic, 0);
    accept_assignments(&mut a, 2);
    let mut held: BTreeMap<u16, Delivery> = BTreeMap::new();
    for _ in 0..2 {
        let m = next_msg_within(&mut a, Duration::from_secs(5));
        held.insert(m.partition, m);
    }
    let mut b = Member::join(&broker, "g", topic);
    let revoke = match try_push(&mut a, Duration::from_secs(5)) {
        Some(Push::Notice(n)) if n.kind == 1 => n,
        other => panic!("expected REVOKE, got {other:?}"),
    };
    assert_eq!(revoke.partition, 1);
    // Until the old owner acknowledges the REVOKE it may still settle what it holds.
    let p1 = held[&1].clone();
    ack_flags(&mut a, &p1, 1).unwrap();
    control_ack(&mut a, &revoke, 0).unwrap();
    pump_until(
        &mut [&mut b],
        Duration::from_secs(5),
        "the record at B",
        |m| !m[0].acked.is_empty(),
    );
    let redelivered = &b.received[0];
    assert_eq!((redelivered.partition, redelivered.sequence), (1, 1));
    assert_eq!(redelivered.attempt, 2);
    assert_eq!(redelivered.ownership_epoch, p1.ownership_epoch + 1);
    // A's delivery is fenced now; its other partition is untouched.
    assert_eq!(
        err_code(ack(&mut a, &p1)),
        ErrorCode::OwnershipFenced.code()
    );
    assert_eq!(
        err_code(nack(&mut a, &p1, 0)),
        ErrorCode::OwnershipFenced.code()
    );
    ack(&mut a, &held[&0]).unwrap();
}

#[test]
fn unanswered_revoke_moves_after_revoke_timeout() {
    let broker = Mortard::start(&flags(&["--ack-wait", "10s", "--session-timeout", "5s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("stubborn", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let mut a = broker.client();
    let ra = sub(&mut a, "g", topic, 0);
    accept_assignments(&mut a, 2);
    let mut b = Member::join(&broker, "g", topic);
    let t0 = Instant::now();
    let revoke = match try_push(&mut a, Duration::from_secs(5)) {
        Some(Push::Notice(n)) if n.kind == 1 => n,
        other => panic!("expected REVOKE, got {other:?}"),
    };
    // A never answers (but stays alive); the revoke timeout releases the partition.
    pump_until(&mut [&mut b], Duration::from_secs(5), "ASSIGN to B", |m| {
        m[0].held.len() == 1
    });
    let moved_after = t0.elapsed();
    assert!(
        moved_after >= Duration::from_millis(400),
        "moved after {moved_after:?}, before the revoke timeout"
    );
    assert_eq!(b.held.keys().next(), Some(&revoke.partition));
    heartbeat(&mut a, &ra, revoke.assignment_epoch, 0).unwrap();
    // The late CONTROL_ACK finds nothing to do; the notice is no longer pending.
    let late = control_ack(&mut a, &revoke, 0);
    assert!(
        late.is_ok() || err_code(late) == ErrorCode::UnknownNotice.code(),
        "late CONTROL_ACK"
    );
}

#[test]
fn dead_letter_is_not_repeated_after_sigkill() {
    let mut broker = Mortard::start(&flags(&["--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("crashdlq", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for v in [&b"held"[..], b"poison", b"after"] {
        publish_kv(&mut producer, topic, 0, b"", v);
    }
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let held = next_msg_within(&mut c, Duration::from_secs(5));
    let poison = next_msg_within(&mut c, Duration::from_secs(5));
    let after = next_msg_within(&mut c, Duration::from_secs(5));
    assert_eq!((held.sequence, poison.sequence), (1, 2));
    // Record 1 stays unsettled: the committed position stays 0, below the dead letter.
    nack(&mut c, &poison, 1).unwrap();
    ack(&mut c, &after).unwrap();
    let mut reader = broker.client();
    sub(&mut reader, "dlq", topic + 1, 0);
    accept_assignments(&mut reader, 1);
    let d = next_msg_within(&mut reader, Duration::from_secs(5));
    assert_eq!(d.origin.map(|o| o.origin_sequence), Some(2));
    ack(&mut reader, &d).unwrap();
    let want = format!("\n{topic} 0 0 g\n");
    let groups = broker.data_dir().join("groups");
    poll_until(Duration::from_secs(5), "persisted position", || {
        String::from_utf8_lossy(&std::fs::read(&groups).unwrap_or_default()).contains(&want)
    });
    drop((c, reader));
    broker.restart_after_kill9();

    // Records above the committed point come again, except the dead-lettered one.
    let mut c = broker.client();
    sub(&mut c, "g", topic, 0);
    accept_assignments(&mut c, 1);
    let mut seqs = Vec::new();
    while let Some(push) = try_push(&mut c, Duration::from_millis(700)) {
        let Push::Msg(m) = push else {
            panic!("unexpected {push:?}")
        };
        if m.sequence == 2 {
            // Not redelivered... but if it were, reject it again to expose a duplicate.
            nack(&mut c, &m, 1).unwrap();
        } else {
            ack(&mut c, &m).unwrap();
        }
        seqs.push(m.sequence);
    }
    assert_eq!(seqs, vec![1, 3], "redelivered after the crash");
    // The twin still holds exactly one dead letter.
    let mut producer = broker.client();
    assert_eq!(publish_kv(&mut producer, topic + 1, 0, b"", b"x"), 2);
}

#[test]
fn positions_are_persisted_at_clean_shutdown() {
    // The interval never comes round: only the shutdown can write the position.
    let mut broker = Mortard::start(&flags(&["--commit-interval", "1h", "--ack-wait", "10s"]));
    let mut producer = broker.client();
    let topic = producer
        .declare("shutdown", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 1..=POSITION_RECORDS {
        producer
            .publish_value(topic, 0, &[i as u8], Some(Durability::Fsynced))
            .unwrap();
    }
    let mut c = broker.client();
    sub(&mut c, "pos", topic, 0);
    accept_assignments(&mut c, 1);
    let all: Vec<Delivery> = (0..POSITION_RECORDS)
        .map(|_| next_msg_within(&mut c, Duration::from_secs(5)))
        .collect();
    for m in &all[..POSITION_ACKED as usize] {
        ack(&mut c, m).unwrap();
    }
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    broker.restart();
    let seqs = sequences_after_restart(&broker, topic);
    assert_eq!(
        seqs,
        (POSITION_ACKED + 1..=POSITION_RECORDS).collect::<Vec<_>>()
    );
}
