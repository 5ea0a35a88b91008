//! The consumer-group coordinator and delivery engine (`man/mortarmq.7`, OPERATIONS
//! and CONSUMER GROUPS).
//!
//! A pure state machine: inputs are the client ops of the consume plane (SUB, ACK,
//! NACK, PULL, HEARTBEAT, CONTROL_ACK, CREDIT), reactor events (connection closed,
//! records appended, topic deleted, dead letter durable) and a clock value `now_ms`;
//! outputs are the op's result plus [`Effect`]s queued for the broker to carry out
//! (push a NOTICE, push a MSG, answer a waiting PULL, append a dead letter). No
//! sockets, threads, files or `Instant::now()` here, so every path is testable with
//! an injected clock and a fake log ([`Records`]).
//!
//! How the broker drives it:
//! - call the op handler for each decoded request, answer the request's slot with
//!   the `Result` (SUB/CREDIT results are typed OK results), *then* drain effects, so
//!   a SUB's OK reaches the client before the NOTICEs naming its member id;
//! - call [`Coordinator::pump`] once per reactor pass (after the batch of inputs):
//!   it runs due timers and pushes deliveries that became possible (handlers without a
//!   `Records` argument only mark groups dirty);
//! - poll no longer than [`Coordinator::next_deadline_ms`];
//! - tell it through [`OutputRoom`] how much each connection's output can still take (a
//!   PULL answer is cut to fit), and call [`Coordinator::outputs_caught_up`] once the
//!   answers it emitted are in those outputs.
//!
//! Memory is bounded by what is in flight, never by the log: per partition the
//! coordinator keeps the next sequence to deliver, the outstanding deliveries, the
//! pending redeliveries and the dead letters awaiting durability. Settled records are
//! not tracked: the committed position is derived as "one below the lowest unsettled
//! sequence" (see `group.rs`). Nothing else only grows: a group without members is
//! removed after `--group-ttl` (so are positions read back at start that no SUB claims),
//! group ids are reused once all 65,535 were handed out, and a member that leaves an
//! ASSIGN unanswered for `--revoke-timeout` loses it (see `group.rs`).
//!
//! Groups, members and partitions are kept in ordered maps so that assignment and
//! timer firing are deterministic for a given input sequence.

mod config;
mod group;
mod manage;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::wire::limits::{MAX_GROUP_LEN_BYTES, SUB_PARTITION_ANY};
use crate::wire::ops::{
    Ack, ControlAck, Credit, CreditResult, DeliveryRef, Heartbeat, Nack, Notice, Pull, Sub,
    SubResult, MSG_FRAME_FIXED_BYTES, OK_EMPTY_FRAME_BYTES,
};
use crate::wire::{
    AckFlags, ControlResult, CreditMode, ErrorCode, HeartbeatState, NackReason, NoticeKind,
    OriginReason, StartPolicy, SubFlags,
};

pub use config::ConsumeConfig;
use group::{Group, Member, PendingPull};
pub use manage::GroupRefusal;

/// The reactor's connection id.
pub type ConnId = u32;

// What SUB credit 0 means is the protocol's (clients need it too), so wire owns it.
pub use crate::wire::limits::{DEFAULT_CREDIT_BYTES, DEFAULT_CREDIT_COUNT};

/// What the coordinator needs to know about the log, supplied by the broker at each
/// call. The coordinator never holds record bytes; it asks for sizes when it delivers.
pub trait Records {
    /// Partition count of a topic; `None` = unknown topic.
    fn partition_count(&self, topic_id: u16) -> Option<u16>;
    /// Oldest retained sequence.
    fn first_sequence(&self, topic_id: u16, partition: u16) -> u64;
    /// One past the newest deliverable record.
    fn next_sequence(&self, topic_id: u16, partition: u16) -> u64;
    /// Size for credit accounting (key + value), or why there is none.
    fn record_bytes(&mut self, topic_id: u16, partition: u16, sequence: u64) -> RecordBytes;
}

/// What [`Records::record_bytes`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordBytes {
    /// The record is there: its key + value bytes.
    Size(u32),
    /// It can never be delivered: removed by retention, or corrupt (its CRC failed).
    Gone,
    /// It could not be read just now (EIO, EMFILE, ENOMEM): the group waits and tries
    /// again after [`READ_RETRY_MS`]; the record is never skipped for it.
    Unreadable,
}

/// A partition whose next record could not be read is tried again after this long.
pub const READ_RETRY_MS: u64 = 100;
/// A group due for removal while one of its dead letters is not yet durable is looked at
/// again after this long (the append settles it; removing the group first would let the
/// completion land on a group that reused its id).
pub const GROUP_EXPIRY_RETRY_MS: u64 = 1_000;
/// Group ids are u16 (NOTICE `group_id`); this many can be handed out before freed ones
/// are reused.
pub const GROUP_IDS_MAX: u32 = u16::MAX as u32;

/// How many more bytes a connection's output may take before `--max-output-size` closes
/// it (what waits unsent and what waits behind an earlier answer both count). A PULL
/// answer is cut to fit (`man/mortarmq.7`, PULL), so a client that reads what it asked
/// for is never closed for the size of the answer.
pub trait OutputRoom {
    fn room_bytes(&self, conn: ConnId) -> u64;
}

impl<F: Fn(ConnId) -> u64> OutputRoom for F {
    fn room_bytes(&self, conn: ConnId) -> u64 {
        self(conn)
    }
}

/// For callers without connections (tests, tools): no answer is ever cut for room.
pub fn unlimited_room(_conn: ConnId) -> u64 {
    u64::MAX
}

/// One send of one record to one member (`man/mortarmq.7`, CONSUMER GROUPS): what the
/// MSG names, and which attempt it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub reference: DeliveryRef,
    pub attempt: u16,
}

/// Work for the broker, queued by every call and drained with
/// [`Coordinator::drain_effects`] / [`Coordinator::take_effects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Push a NOTICE to this connection (never takes a response slot).
    Notice { conn: ConnId, notice: Notice },
    /// Push MSG for this record to this connection; the broker reads the record.
    Deliver { conn: ConnId, delivery: Delivery },
    /// Answer a pending PULL: MSG×N (in order) then OK, in that PULL's response slot.
    /// `bytes` bounds the encoded answer (each MSG frame at most
    /// [`MSG_FRAME_FIXED_BYTES`] + the record's key and value, then the OK).
    PullAnswer {
        conn: ConnId,
        pull_id: u64,
        deliveries: Vec<Delivery>,
        bytes: u64,
    },
    /// Append this record to the source topic's `.dlq` twin with the origin trailer;
    /// when the append is durable the broker calls [`Coordinator::dead_lettered`].
    DeadLetter {
        group_id: u16,
        topic_id: u16,
        partition: u16,
        sequence: u64,
        attempts: u16,
        reason: OriginReason,
    },
    /// A group without members was removed after `--group-ttl`, its positions with it
    /// (a live group, or one restored from disk or from a cluster leader before). A
    /// single node has nothing more to do; a cluster leader removes it from every node's
    /// replicated positions (`docs/REPLICATION.md` §7.4).
    GroupExpired { group: Vec<u8>, topic_id: u16 },
}

/// A committed position to persist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupPosition {
    pub group: Vec<u8>,
    pub topic_id: u16,
    pub partition: u16,
    /// Every record up to and including this sequence is settled (0 = none).
    pub committed: u64,
}

/// Counters for `/metrics` and `/stats`; they only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeStats {
    /// MSGs sent (pushed or pulled), first attempts and redeliveries.
    pub deliveries: u64,
    /// Of those, attempt > 1.
    pub redeliveries: u64,
    /// Deliveries that reached their ack-wait deadline.
    pub expired: u64,
    /// DeadLetter effects emitted.
    pub dead_letters: u64,
    /// Records skipped because retention removed them before delivery, or corrupt.
    pub skipped_records: u64,
    /// Reads that failed and were retried later (nothing skipped for them).
    pub read_retries: u64,
    /// NOTICEs sent.
    pub notices: u64,
    /// Groups removed after `--group-ttl` without members.
    pub groups_expired: u64,
    /// ASSIGNs not CONTROL_ACKed within `--revoke-timeout`, taken back.
    pub assigns_taken_back: u64,
}

/// A partition's ownership phase, for `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnershipState {
    Unowned,
    /// ASSIGN sent, CONTROL_ACK(OK) not yet received: no MSG flows.
    Assigning,
    Owned,
    /// REVOKE sent to the owner; released on its CONTROL_ACK or the revoke timeout.
    Revoking,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSnapshot {
    pub member_id: u64,
    pub membership_epoch: u32,
    pub assignment_epoch: u32,
    pub conn: ConnId,
    pub subscription_id: u16,
    pub pull_mode: bool,
    pub credit_count: u16,
    pub credit_bytes: u32,
    pub credit_epoch: u64,
    pub outstanding_count: u32,
    pub outstanding_bytes: u64,
    pub pending_pulls: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSnapshot {
    pub partition: u16,
    pub owner: Option<u64>,
    pub state: OwnershipState,
    pub ownership_epoch: u64,
    pub committed: u64,
    /// Next never-delivered sequence (lag = log next_sequence − this).
    pub next_sequence: u64,
    pub outstanding: usize,
    pub pending_redeliveries: usize,
    pub dead_letter_pending: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// [`RESTORED_GROUP_ID`] for a group read back at start that no member rejoined yet.
    pub group_id: u16,
    pub name: Vec<u8>,
    pub topic_id: u16,
    pub members: Vec<MemberSnapshot>,
    pub partitions: Vec<PartitionSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoordinatorSnapshot {
    pub groups: Vec<GroupSnapshot>,
    pub stats: ConsumeStats,
}

/// One timer. The set holds each live timer exactly once, at its current deadline:
/// whoever moves or cancels a deadline removes the old entry, so
/// `next_deadline_ms` is never an already-handled instant (no busy polling). The one
/// exception is a partition's AckWait, which an ACK leaves where it is: it may fire
/// once with nothing due, and is then set at the next deadline (`group.rs`).
/// Handlers still re-check state when a timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Session {
        group_id: u16,
        member_id: u64,
    },
    Revoke {
        group_id: u16,
        partition: u16,
    },
    /// An ASSIGN not CONTROL_ACKed by its deadline is taken back.
    Assign {
        group_id: u16,
        partition: u16,
    },
    /// One per partition, at or before its earliest ack-wait deadline (`group.rs`).
    AckWait {
        group_id: u16,
        partition: u16,
    },
    Retry {
        group_id: u16,
        partition: u16,
        seq: u64,
    },
    Pull {
        group_id: u16,
        member_id: u64,
        pull_id: u64,
    },
    /// A read failed: look at the group's partitions again.
    ReadRetry {
        group_id: u16,
    },
    /// The group has had no member since `--group-ttl` ago: remove it.
    GroupExpiry {
        group_id: u16,
    },
    /// Positions read at start that no SUB claimed within `--group-ttl`: forget them.
    RestoredExpiry,
}

impl Timer {
    fn group_id(self) -> Option<u16> {
        match self {
            Timer::Session { group_id, .. }
            | Timer::Revoke { group_id, .. }
            | Timer::Assign { group_id, .. }
            | Timer::AckWait { group_id, .. }
            | Timer::Retry { group_id, .. }
            | Timer::Pull { group_id, .. }
            | Timer::ReadRetry { group_id }
            | Timer::GroupExpiry { group_id } => Some(group_id),
            Timer::RestoredExpiry => None,
        }
    }
}

/// A NOTICE awaiting its CONTROL_ACK.
#[derive(Debug, Clone, Copy)]
struct PendingNotice {
    conn: ConnId,
    subscription_id: u16,
    group_id: u16,
    member_id: u64,
    kind: NoticeKind,
    partition: u16,
}

/// State every group touches: split from the group map so a `&mut Group` and this
/// can be borrowed together.
struct Shared {
    config: ConsumeConfig,
    timers: BTreeSet<(u64, Timer)>,
    effects: Vec<Effect>,
    notices: HashMap<u64, PendingNotice>,
    /// Groups where a delivery may have become possible since the last pump.
    dirty: BTreeSet<u16>,
    next_notice_id: u64,
    next_delivery_id: u64,
    stats: ConsumeStats,
    /// Bytes of PULL answers emitted per connection since the caller last said its
    /// outputs caught up: the room it reports does not show them yet.
    answered_bytes: HashMap<ConnId, u64>,
}

impl Shared {
    fn timer_set(&mut self, at_ms: u64, timer: Timer) {
        self.timers.insert((at_ms, timer));
    }

    fn timer_clear(&mut self, at_ms: u64, timer: Timer) {
        self.timers.remove(&(at_ms, timer));
    }

    /// What a connection's output can still take, PULL answers emitted since the
    /// caller's last look included.
    fn room_left(&self, room: &dyn OutputRoom, conn: ConnId) -> u64 {
        let answered = self.answered_bytes.get(&conn).copied().unwrap_or(0);
        room.room_bytes(conn).saturating_sub(answered)
    }
}

/// One subscription on a connection.
#[derive(Debug, Clone, Copy)]
struct SubEntry {
    group_id: u16,
    member_id: u64,
    /// False once the member left (LEAVE or session expiry): the id stays open so the
    /// client learns 0x0026 "SUB again" rather than 0x0020.
    live: bool,
}

struct ConnSubs {
    /// u32 so that exhaustion of the u16 id space is visible (→ 0x0025).
    next_subscription_id: u32,
    subs: BTreeMap<u16, SubEntry>,
}

impl Default for ConnSubs {
    fn default() -> Self {
        ConnSubs {
            next_subscription_id: 1,
            subs: BTreeMap::new(),
        }
    }
}

/// Persisted state read at start, applied when the group is first created by a SUB;
/// until then `/stats` shows it as a group without members ([`RESTORED_GROUP_ID`]).
#[derive(Default)]
struct Restored {
    committed: BTreeMap<u16, u64>,
    dead_lettered: BTreeMap<u16, BTreeSet<u64>>,
}

/// The consumer-group coordinator. See the module doc.
pub struct Coordinator {
    sh: Shared,
    groups: BTreeMap<u16, Group>,
    group_ids: HashMap<(Vec<u8>, u16), u16>,
    conns: HashMap<ConnId, ConnSubs>,
    restored: BTreeMap<(Vec<u8>, u16), Restored>,
    /// A cluster follower: restored groups do not expire ([`Coordinator::set_following`]).
    following: bool,
    /// Restored groups do not expire before this (a new leader's grace).
    restored_kept_until_ms: u64,
    /// u32 so that exhaustion of the u16 group id space is visible.
    next_group_id: u32,
    /// Ids of removed groups, reused (lowest first) once `next_group_id` ran out.
    free_group_ids: BTreeSet<u16>,
    next_member_id: u64,
    next_membership_epoch: u32,
    /// The floor of member ids and ownership epochs handed out from now on: a cluster
    /// leader's `term << 32` (`raise_epochs`), 0 on a single node.
    epoch_base: u64,
}

/// Marks, in a [`GroupSnapshot`], a group read back at start that no SUB has recreated
/// yet: live ids start at 1, and the group gets a real one when a member joins.
pub const RESTORED_GROUP_ID: u16 = 0;

/// A group read back at start, as `/stats` shows it: no members, no owners, nothing in
/// flight, and per persisted partition its committed position (the next delivery follows
/// it, as `Group::new` will make it when a member joins).
fn restored_snapshot((name, topic_id): &(Vec<u8>, u16), r: &Restored) -> GroupSnapshot {
    let partitions = r
        .committed
        .iter()
        .map(|(&partition, &committed)| PartitionSnapshot {
            partition,
            owner: None,
            state: OwnershipState::Unowned,
            ownership_epoch: 0,
            committed,
            next_sequence: committed.saturating_add(1),
            outstanding: 0,
            pending_redeliveries: 0,
            dead_letter_pending: 0,
        })
        .collect();
    GroupSnapshot {
        group_id: RESTORED_GROUP_ID,
        name: name.clone(),
        topic_id: *topic_id,
        members: Vec::new(),
        partitions,
    }
}

/// Group names: 1..=255 bytes of `[A-Za-z0-9._-]` (emptiness is checked first and is
/// 0x0024, not 0x2002).
fn group_name_valid(name: &[u8]) -> bool {
    name.len() <= MAX_GROUP_LEN_BYTES
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl Coordinator {
    pub fn new(config: ConsumeConfig) -> Self {
        Coordinator {
            sh: Shared {
                config,
                timers: BTreeSet::new(),
                effects: Vec::new(),
                notices: HashMap::new(),
                dirty: BTreeSet::new(),
                next_notice_id: 1,
                next_delivery_id: 1,
                stats: ConsumeStats::default(),
                answered_bytes: HashMap::new(),
            },
            groups: BTreeMap::new(),
            group_ids: HashMap::new(),
            conns: HashMap::new(),
            restored: BTreeMap::new(),
            following: false,
            restored_kept_until_ms: 0,
            next_group_id: 1,
            free_group_ids: BTreeSet::new(),
            next_member_id: 1,
            next_membership_epoch: 1,
            epoch_base: 0,
        }
    }

    /// A cluster node became leader in a term: member ids and ownership epochs it hands
    /// out from now on start at `base` (`term << 32`), above any an earlier leader gave,
    /// so a member never takes a new leader's ASSIGN for a stale one (`man/mortarmq.7`).
    pub fn raise_epochs(&mut self, base: u64) {
        self.epoch_base = self.epoch_base.max(base);
        self.next_member_id = self.next_member_id.max(self.epoch_base + 1);
        for group in self.groups.values_mut() {
            group.raise_epochs(self.epoch_base);
        }
    }

    /// A cluster node says each pass whether it follows. Groups restored from the
    /// leader's replicated positions do not expire while it follows, and get a whole
    /// `--group-ttl` from the moment it starts leading.
    pub fn set_following(&mut self, following: bool, now_ms: u64) {
        if self.following && !following {
            self.restored_kept_until_ms = now_ms.saturating_add(self.sh.config.group_ttl_ms);
        }
        if following && !self.following {
            self.stop_leading(now_ms);
        }
        self.following = following;
    }

    pub fn following(&self) -> bool {
        self.following
    }

    /// A cluster node stopped leading (`docs/REPLICATION.md` §7.4): its groups become
    /// groups without members at their committed positions, as on any follower; waiting
    /// PULLs are answered empty and nothing more is delivered from here, so the records
    /// the new leader replicates are not pushed twice to one group. Members are told
    /// nothing: their next request meets the role gate (NOT_LEADER) and they SUB again
    /// on the new leader. A dead letter not yet settled is the new leader's to write.
    /// The positions kept are the groups' own; a cluster node then undoes the operator
    /// changes not applied yet ([`Coordinator::follow_replicated`]).
    fn stop_leading(&mut self, now_ms: u64) {
        let positions = self.positions();
        for (group_id, group) in std::mem::take(&mut self.groups) {
            group.answer_pulls_empty(&mut self.sh);
            self.free_group_ids.insert(group_id);
        }
        self.sh.timers.retain(|(_, t)| t.group_id().is_none());
        self.group_ids.clear();
        self.sh.dirty.clear();
        self.sh.notices.clear();
        self.conns.clear();
        for p in positions {
            self.restore_position((&p.group, p.topic_id), p.partition, p.committed, now_ms);
        }
    }

    /// A cluster node that stopped leading (its groups ended, [`Coordinator::set_following`])
    /// and had changed the `changed` groups (name, topic id) when it proposed an operator
    /// change not applied yet: they hold exactly their positions in `applied`, its applied
    /// log's, as every follower does, not those they had, which hold the change; its entry
    /// may be truncated (`docs/REPLICATION.md` §4, "Operator changes"). Lower is fine
    /// (records are delivered again), higher than the log would skip records never
    /// acknowledged. The dead letters it knows stay settled. Other groups keep their
    /// own positions: they never move back but for an operator change.
    pub fn follow_replicated(
        &mut self,
        changed: &[(Vec<u8>, u16)],
        applied: &[GroupPosition],
        now_ms: u64,
    ) {
        assert!(self.groups.is_empty(), "live groups on a node that follows");
        for key in changed {
            if let Some(r) = self.restored.get_mut(key) {
                r.committed.clear();
            }
        }
        for p in applied {
            if !changed
                .iter()
                .any(|(g, t)| *g == p.group && *t == p.topic_id)
            {
                continue;
            }
            let r = self.restored_entry(&p.group, p.topic_id, now_ms);
            r.expect("no live group")
                .committed
                .insert(p.partition, p.committed);
        }
        for key in changed {
            let Some(r) = self.restored.get_mut(key) else {
                continue;
            };
            for (p, dead) in &mut r.dead_lettered {
                let committed = r.committed.get(p).copied().unwrap_or(0);
                *dead = dead.split_off(&committed.saturating_add(1));
            }
            r.dead_lettered.retain(|_, dead| !dead.is_empty());
            if r.committed.is_empty() && r.dead_lettered.is_empty() {
                self.restored.remove(key);
            }
        }
    }

    pub fn config(&self) -> &ConsumeConfig {
        &self.sh.config
    }

    // ---- ops -------------------------------------------------------------------------

    /// SUB: join (or create) the group `(sub.group, sub.topic_id)`. The new member gets
    /// its share of partitions through NOTICE ASSIGN effects (after REVOKEs elsewhere).
    pub fn subscribe(
        &mut self,
        conn: ConnId,
        sub: &Sub,
        now_ms: u64,
        recs: &mut dyn Records,
    ) -> Result<SubResult, ErrorCode> {
        let start_policy = StartPolicy::from_code(sub.start_policy);
        let Some(start_policy) =
            start_policy.filter(|_| sub.partition == SUB_PARTITION_ANY && !sub.group.is_empty())
        else {
            return Err(ErrorCode::InvalidSubscription);
        };
        if !group_name_valid(sub.group) {
            return Err(ErrorCode::InvalidGroupName);
        }
        let partition_count = recs
            .partition_count(sub.topic_id)
            .ok_or(ErrorCode::UnknownTopic)?;
        let credit = self.initial_credit(sub)?;
        self.check_room_on(conn)?;
        let key = (sub.group.to_vec(), sub.topic_id);
        let group_id = match self.group_ids.get(&key) {
            Some(&id) => {
                if self.groups[&id].members.len() >= self.sh.config.max_members_per_group {
                    return Err(ErrorCode::GroupLimitReached);
                }
                id
            }
            None => {
                if !self.room_for_group(&key) {
                    return Err(ErrorCode::GroupLimitReached);
                }
                self.create_group(key, partition_count, start_policy, recs)
            }
        };
        // Accepted: nothing below can fail.
        let pull_mode = sub.flags.contains(SubFlags::PULL_MODE);
        Ok(self.add_member(conn, group_id, pull_mode, credit, now_ms))
    }

    /// Whether the group `key` may be created: `--max-groups` counts live groups and the
    /// positions read at start that no SUB has claimed yet (they are groups without
    /// members), and a group id must be free.
    fn room_for_group(&self, key: &(Vec<u8>, u16)) -> bool {
        let claims_restored = usize::from(self.restored.contains_key(key));
        let held = self.groups.len() + self.restored.len() - claims_restored;
        let id_left = self.next_group_id <= GROUP_IDS_MAX || !self.free_group_ids.is_empty();
        held < self.sh.config.max_groups && id_left && self.sh.config.max_members_per_group > 0
    }

    /// The SUB's credit window: 0 means the default, above the cap is CREDIT_LIMIT.
    fn initial_credit(&self, sub: &Sub) -> Result<(u16, u32), ErrorCode> {
        let config = &self.sh.config;
        let count = match sub.credit_count {
            0 => DEFAULT_CREDIT_COUNT.min(config.max_credit_count),
            n if n > config.max_credit_count => return Err(ErrorCode::CreditLimit),
            n => n,
        };
        let bytes = match sub.credit_bytes {
            0 => DEFAULT_CREDIT_BYTES.min(config.max_credit_bytes),
            n if n > config.max_credit_bytes => return Err(ErrorCode::CreditLimit),
            n => n,
        };
        Ok((count, bytes))
    }

    /// A connection may hold `max_subscriptions_per_conn` live subscriptions, and
    /// subscription ids are u16.
    fn check_room_on(&self, conn: ConnId) -> Result<(), ErrorCode> {
        let max = self.sh.config.max_subscriptions_per_conn;
        let full = match self.conns.get(&conn) {
            Some(cs) => {
                cs.subs.values().filter(|s| s.live).count() >= max
                    || cs.next_subscription_id > u32::from(u16::MAX)
            }
            None => max == 0,
        };
        if full {
            return Err(ErrorCode::TooManySubscriptions);
        }
        Ok(())
    }

    /// A new member of `group_id` on `conn`: its subscription, its session timer, and a
    /// rebalance that offers it partitions.
    fn add_member(
        &mut self,
        conn: ConnId,
        group_id: u16,
        pull_mode: bool,
        (credit_count, credit_bytes): (u16, u32),
        now_ms: u64,
    ) -> SubResult {
        let member_id = self.next_member_id;
        self.next_member_id += 1;
        let membership_epoch = self.next_membership_epoch;
        self.next_membership_epoch = self.next_membership_epoch.checked_add(1).unwrap_or(1);
        let cs = self.conns.entry(conn).or_default();
        // An expelled subscription of the same group on this connection is superseded
        // by the rejoin; dropping it keeps a flapping client from growing the table.
        cs.subs.retain(|_, s| s.live || s.group_id != group_id);
        let subscription_id = cs.next_subscription_id as u16;
        cs.next_subscription_id += 1;
        let entry = SubEntry {
            group_id,
            member_id,
            live: true,
        };
        cs.subs.insert(subscription_id, entry);
        let session_deadline_ms = now_ms.saturating_add(self.sh.config.session_timeout_ms);
        let timer = Timer::Session {
            group_id,
            member_id,
        };
        self.sh.timer_set(session_deadline_ms, timer);
        let group = self.groups.get_mut(&group_id).expect("group exists");
        if let Some(at_ms) = group.expires_at_ms.take() {
            self.sh.timer_clear(at_ms, Timer::GroupExpiry { group_id });
        }
        let member = Member::new(
            member_id,
            membership_epoch,
            conn,
            subscription_id,
            pull_mode,
            credit_count,
            credit_bytes,
            session_deadline_ms,
        );
        group.members.insert(member_id, member);
        group.rebalance(&mut self.sh, now_ms);
        SubResult {
            subscription_id,
            member_id,
            membership_epoch,
            assignment_epoch: 0,
        }
    }

    /// The group and the outstanding delivery an ACK or NACK names, after the checks
    /// both share: open subscription (0x0020), current ownership (0x0022), outstanding
    /// delivery (0x0023). Any op on the subscription keeps the session alive.
    fn named_delivery(
        &mut self,
        conn: ConnId,
        named: &DeliveryRef,
        now_ms: u64,
    ) -> Result<(u16, (usize, u64)), ErrorCode> {
        let entry = self.sub_entry(conn, named.subscription_id)?;
        self.touch(entry, now_ms);
        let group = self
            .groups
            .get(&entry.group_id)
            .ok_or(ErrorCode::UnknownSubscription)?;
        let found = group.find_delivery(entry.member_id, named)?;
        Ok((entry.group_id, found))
    }

    /// ACK: settle a delivery, or with PROGRESS extend its deadline.
    pub fn ack(&mut self, conn: ConnId, ack: &Ack, now_ms: u64) -> Result<(), ErrorCode> {
        let (group_id, found) = self.named_delivery(conn, &ack.delivery_ref(), now_ms)?;
        let group = self.groups.get_mut(&group_id).expect("found above");
        if ack.flags.contains(AckFlags::PROGRESS) {
            group.extend_deadline(&mut self.sh, found, now_ms);
        } else {
            group.settle(&mut self.sh, found);
        }
        Ok(())
    }

    /// NACK: RETRY redelivers after the nack delay; REJECT dead-letters now.
    pub fn nack(&mut self, conn: ConnId, nack: &Nack, now_ms: u64) -> Result<(), ErrorCode> {
        let reason = NackReason::from_code(nack.reason).ok_or(ErrorCode::InvalidArgument)?;
        let (group_id, found) = self.named_delivery(conn, &nack.delivery_ref(), now_ms)?;
        let group = self.groups.get_mut(&group_id).expect("found above");
        let attempt = group.settle(&mut self.sh, found);
        match reason {
            NackReason::Reject => {
                group.dead_letter(
                    &mut self.sh,
                    found.0,
                    found.1,
                    attempt,
                    OriginReason::Rejected,
                );
            }
            NackReason::Retry => {
                let ready_at_ms = now_ms.saturating_add(self.sh.config.nack_delay_ms);
                group.fail(&mut self.sh, found.0, found.1, attempt, now_ms, ready_at_ms);
            }
        }
        Ok(())
    }

    /// HEARTBEAT: keep the session alive, or LEAVE.
    pub fn heartbeat(
        &mut self,
        conn: ConnId,
        hb: &Heartbeat,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let state = HeartbeatState::from_code(hb.state).ok_or(ErrorCode::InvalidArgument)?;
        let (entry, member) = self.live_member(conn, hb.subscription_id)?;
        if hb.member_id != member.member_id || hb.membership_epoch != member.membership_epoch {
            return Err(ErrorCode::UnknownMember);
        }
        if state == HeartbeatState::Leave {
            self.member_leaves(entry.group_id, entry.member_id, now_ms, true);
        } else {
            self.touch(entry, now_ms);
        }
        Ok(())
    }

    /// CONTROL_ACK of a NOTICE. The subscription is the one the notice went to.
    pub fn control_ack(
        &mut self,
        conn: ConnId,
        ca: &ControlAck,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let result = ControlResult::from_code(ca.result).ok_or(ErrorCode::InvalidArgument)?;
        let notice = match self.sh.notices.get(&ca.notice_id) {
            Some(n) if n.conn == conn => *n,
            _ => return Err(ErrorCode::UnknownNotice),
        };
        self.sh.notices.remove(&ca.notice_id);
        // After DELETE of the topic the subscription is gone: "later ops on those
        // subscriptions get 0x0020", the CONTROL_ACK of the final REVOKE included.
        let entry = self.sub_entry(conn, notice.subscription_id)?;
        self.touch(entry, now_ms);
        let Some(group) = self.groups.get_mut(&notice.group_id) else {
            return Err(ErrorCode::UnknownSubscription);
        };
        group.control_ack(
            &mut self.sh,
            (ca.notice_id, notice.kind, notice.partition),
            notice.member_id,
            result == ControlResult::Ok,
            now_ms,
        );
        Ok(())
    }

    /// CREDIT: SET or ADD the subscription's window.
    pub fn credit(
        &mut self,
        conn: ConnId,
        c: &Credit,
        now_ms: u64,
    ) -> Result<CreditResult, ErrorCode> {
        let mode = CreditMode::from_code(c.mode).ok_or(ErrorCode::InvalidArgument)?;
        let (entry, member) = self.live_member(conn, c.subscription_id)?;
        if c.membership_epoch != member.membership_epoch {
            return Err(ErrorCode::StaleEpoch);
        }
        self.touch(entry, now_ms);
        let config = &self.sh.config;
        let group = self
            .groups
            .get_mut(&entry.group_id)
            .expect("live member's group");
        let member = group
            .members
            .get_mut(&entry.member_id)
            .expect("live member");
        let (count, bytes) = if mode == CreditMode::Set {
            let count = if c.credit_count == 0 {
                member.credit_count
            } else {
                c.credit_count
            };
            let bytes = if c.credit_bytes == 0 {
                member.credit_bytes
            } else {
                c.credit_bytes
            };
            (u64::from(count), u64::from(bytes))
        } else {
            (
                u64::from(member.credit_count) + u64::from(c.credit_count),
                u64::from(member.credit_bytes) + u64::from(c.credit_bytes),
            )
        };
        if count > u64::from(config.max_credit_count) || bytes > u64::from(config.max_credit_bytes)
        {
            return Err(ErrorCode::CreditLimit);
        }
        let (count, bytes) = (count as u16, bytes as u32);
        if (count, bytes) != (member.credit_count, member.credit_bytes) {
            member.credit_count = count;
            member.credit_bytes = bytes;
            member.credit_epoch += 1;
            self.sh.dirty.insert(entry.group_id);
        }
        Ok(member.credit_result())
    }

    /// PULL: answered through [`Effect::PullAnswer`], at once when satisfied or when
    /// `wait_ms` is 0, else when satisfied later or when `wait_ms` passes. The answer
    /// fits what `room` says the connection's output can take (`group.rs`).
    pub fn pull(
        &mut self,
        conn: ConnId,
        pull_id: u64,
        p: &Pull,
        now_ms: u64,
        recs: &mut dyn Records,
        room: &dyn OutputRoom,
    ) -> Result<(), ErrorCode> {
        if p.max_msgs == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        let (entry, member) = self.live_member(conn, p.subscription_id)?;
        if p.member_id != member.member_id || p.membership_epoch != member.membership_epoch {
            return Err(ErrorCode::UnknownMember);
        }
        if p.assignment_epoch != member.assignment_epoch() {
            return Err(ErrorCode::StaleEpoch);
        }
        self.touch(entry, now_ms);
        let config = &self.sh.config;
        let group = (self.groups.get_mut(&entry.group_id)).expect("live member's group");
        let only = group.pull_only(entry.member_id, &p.ownership_epochs);
        let member = group
            .members
            .get_mut(&entry.member_id)
            .expect("live member");
        let max_bytes = match p.max_bytes {
            0 => member.credit_bytes,
            n => n,
        };
        let deadline_ms = now_ms.saturating_add(u64::from(p.wait_ms));
        member.pulls.push_back(PendingPull {
            pull_id,
            only,
            max_msgs: p.max_msgs.min(config.max_credit_count),
            max_bytes: max_bytes.min(config.max_credit_bytes),
            min_bytes: p.min_bytes,
            deadline_ms,
        });
        if deadline_ms > now_ms {
            let timer = Timer::Pull {
                group_id: entry.group_id,
                member_id: entry.member_id,
                pull_id,
            };
            self.sh.timer_set(deadline_ms, timer);
        }
        group.serve_pulls(&mut self.sh, entry.member_id, now_ms, recs, room);
        Ok(())
    }

    // ---- reactor events --------------------------------------------------------------

    /// The connection is gone: its members leave (no REVOKE to a gone member, no
    /// answers to its PULLs), its pending notices are forgotten.
    pub fn connection_closed(&mut self, conn: ConnId, now_ms: u64) {
        let Some(cs) = self.conns.remove(&conn) else {
            return;
        };
        for entry in cs.subs.values().filter(|e| e.live) {
            self.member_leaves(entry.group_id, entry.member_id, now_ms, false);
        }
        self.sh.notices.retain(|_, n| n.conn != conn);
    }

    /// New records were appended (or became durable): wake delivery for the topic.
    pub fn records_available(&mut self, topic_id: u16, _partition: u16) {
        for g in self.groups.values().filter(|g| g.topic_id == topic_id) {
            if !g.members.is_empty() {
                self.sh.dirty.insert(g.id);
            }
        }
    }

    /// DELETE of the pair: every owner gets NOTICE REVOKE for its partitions, waiting
    /// PULLs are answered empty, the groups and their positions are dropped, and later
    /// ops on those subscriptions get 0x0020.
    pub fn topic_deleted(&mut self, topic_id: u16, _now_ms: u64) {
        let ids: Vec<u16> = self
            .groups
            .values()
            .filter(|g| g.topic_id == topic_id)
            .map(|g| g.id)
            .collect();
        for gid in ids {
            let mut group = self.groups.remove(&gid).expect("listed");
            group.revoke_all_for_delete(&mut self.sh);
            self.group_ids.remove(&(group.name.clone(), topic_id));
            self.sh.timers.retain(|(_, t)| t.group_id() != Some(gid));
            self.sh.dirty.remove(&gid);
            self.free_group_ids.insert(gid);
            for cs in self.conns.values_mut() {
                cs.subs.retain(|_, s| s.group_id != gid);
            }
            // The REVOKEs just sent stay pending so their CONTROL_ACK finds the
            // (now closed) subscription and gets 0x0020; other notices are moot.
            self.sh
                .notices
                .retain(|_, n| n.group_id != gid || n.kind == NoticeKind::Revoke);
        }
        self.restored.retain(|(_, t), _| *t != topic_id);
    }

    /// The DeadLetter append for this record is durable: it is settled.
    pub fn dead_lettered(&mut self, group_id: u16, topic_id: u16, partition: u16, sequence: u64) {
        if let Some(g) = self.groups.get_mut(&group_id) {
            if g.topic_id == topic_id {
                g.dead_lettered(partition, sequence);
            }
        }
    }

    /// Runs due timers (session expiry, revoke and assign timeouts, ack-wait expiry,
    /// nack delay, PULL wait, group expiry) and pushes deliveries within credit for
    /// groups that changed.
    pub fn pump(&mut self, now_ms: u64, recs: &mut dyn Records, room: &dyn OutputRoom) {
        self.run_timers(now_ms);
        while let Some(gid) = self.sh.dirty.pop_first() {
            if let Some(g) = self.groups.get_mut(&gid) {
                g.deliver(&mut self.sh, now_ms, recs, room);
            }
        }
    }

    /// Runs due timers and delivers nothing: the groups they changed stay marked for the
    /// next [`Coordinator::pump`]. A cluster leader whose lease lapsed does this, since
    /// another leader may already have moved its groups on (`docs/REPLICATION.md` §7.4).
    pub fn run_timers(&mut self, now_ms: u64) {
        while let Some(&(at_ms, timer)) = self.sh.timers.first() {
            if at_ms > now_ms {
                break;
            }
            self.sh.timers.pop_first();
            self.fire(timer, at_ms, now_ms);
        }
    }

    /// The PULL answers emitted so far are in their connections' outputs (or waiting
    /// behind earlier answers there): the room the caller reports now counts them.
    pub fn outputs_caught_up(&mut self) {
        self.sh.answered_bytes.clear();
    }

    /// Moves the queued effects into `out` (keeps both allocations).
    pub fn drain_effects(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.sh.effects);
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.sh.effects)
    }

    /// The earliest timer deadline, for the reactor's poll timeout.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.sh.timers.first().map(|&(at_ms, _)| at_ms)
    }

    // ---- persistence and observation ------------------------------------------------

    /// Committed positions to persist, in (group, topic, partition) order; includes
    /// restored positions of groups no SUB has recreated yet, so they are not lost.
    pub fn positions(&self) -> Vec<GroupPosition> {
        let mut out = Vec::new();
        for g in self.groups.values() {
            for p in 0..g.partitions.len() {
                out.push(GroupPosition {
                    group: g.name.clone(),
                    topic_id: g.topic_id,
                    partition: p as u16,
                    committed: g.committed(p),
                });
            }
        }
        for ((name, topic_id), r) in &self.restored {
            for (&partition, &committed) in &r.committed {
                out.push(GroupPosition {
                    group: name.clone(),
                    topic_id: *topic_id,
                    partition,
                    committed,
                });
            }
        }
        out.sort();
        out
    }

    /// At start, before any SUB, and on a cluster follower for every replicated change:
    /// the group's committed position, kept if higher than the one held. Ignored for a
    /// group that already exists (its live position wins). Forgotten if no SUB recreates
    /// the group within `--group-ttl`.
    pub fn restore_position(
        &mut self,
        (group, topic_id): (&[u8], u16),
        partition: u16,
        committed: u64,
        now_ms: u64,
    ) {
        if let Some(r) = self.restored_entry(group, topic_id, now_ms) {
            // Never backwards: a cluster follower is told positions in commit order, but
            // a new leader may send its whole (older) view once.
            let at = r.committed.entry(partition).or_insert(committed);
            *at = (*at).max(committed);
            let committed = *at;
            // Dead letters at or below the position matter no more: a follower told of
            // every dead letter would otherwise keep them all.
            if let Some(dead) = r.dead_lettered.get_mut(&partition) {
                *dead = dead.split_off(&committed.saturating_add(1));
            }
        }
    }

    /// What start-up restores for a group, unless the group already lives (its live
    /// state wins over anything read back from disk).
    fn restored_entry(
        &mut self,
        group: &[u8],
        topic_id: u16,
        now_ms: u64,
    ) -> Option<&mut Restored> {
        let key = (group.to_vec(), topic_id);
        if self.group_ids.contains_key(&key) {
            return None;
        }
        if self.restored.is_empty() {
            // Restored groups have had no member since start: one timer for them all.
            let at_ms = now_ms.saturating_add(self.sh.config.group_ttl_ms);
            self.sh.timer_set(at_ms, Timer::RestoredExpiry);
        }
        Some(self.restored.entry(key).or_default())
    }

    /// At start: a DLQ record of this group already appended above the committed
    /// point. It counts as settled, so a record is dead-lettered at most once per
    /// group even across a crash.
    pub fn restore_dead_lettered(
        &mut self,
        (group, topic_id): (&[u8], u16),
        partition: u16,
        sequence: u64,
        now_ms: u64,
    ) {
        if let Some(r) = self.restored_entry(group, topic_id, now_ms) {
            r.dead_lettered
                .entry(partition)
                .or_default()
                .insert(sequence);
        }
    }

    /// For `/stats`.
    /// A live group's name (dead letters record it).
    pub fn group_name(&self, group_id: u16) -> Option<&[u8]> {
        self.groups.get(&group_id).map(|g| g.name.as_slice())
    }

    /// Whether any group on `topic_id` has a member (DECLARE DELETE with IF_UNUSED).
    pub fn topic_has_members(&self, topic_id: u16) -> bool {
        self.groups
            .values()
            .any(|g| g.topic_id == topic_id && !g.members.is_empty())
    }

    /// Live groups in id order, then the groups read back at start that no SUB has
    /// recreated yet: they are groups without members (they hold a `--max-groups` slot and
    /// their positions are persisted), so operators see them and their lag until a member
    /// joins or `--group-ttl` removes them (docs/DECISIONS.md, "Groups after a restart").
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        let live = self.groups.values().map(Group::snapshot);
        let restored = self
            .restored
            .iter()
            .map(|(key, r)| restored_snapshot(key, r));
        CoordinatorSnapshot {
            groups: live.chain(restored).collect(),
            stats: self.sh.stats,
        }
    }

    pub fn stats(&self) -> ConsumeStats {
        self.sh.stats
    }

    // ---- internals -------------------------------------------------------------------

    fn create_group(
        &mut self,
        key: (Vec<u8>, u16),
        partition_count: u16,
        start_policy: StartPolicy,
        recs: &mut dyn Records,
    ) -> u16 {
        let id = if self.next_group_id <= GROUP_IDS_MAX {
            self.next_group_id += 1;
            (self.next_group_id - 1) as u16
        } else {
            // Reused lowest first; the caller checked that one is free.
            self.free_group_ids.pop_first().expect("a free group id")
        };
        let restored = self.restored.remove(&key).unwrap_or_default();
        let mut group = Group::new(
            id,
            key.0.clone(),
            key.1,
            partition_count,
            start_policy,
            restored,
            recs,
        );
        group.raise_epochs(self.epoch_base);
        self.groups.insert(id, group);
        self.group_ids.insert(key, id);
        id
    }

    fn sub_entry(&self, conn: ConnId, subscription_id: u16) -> Result<SubEntry, ErrorCode> {
        self.conns
            .get(&conn)
            .and_then(|cs| cs.subs.get(&subscription_id))
            .copied()
            .ok_or(ErrorCode::UnknownSubscription)
    }

    /// The subscription's member, which must still be in its group (else 0x0026).
    fn live_member(
        &self,
        conn: ConnId,
        subscription_id: u16,
    ) -> Result<(SubEntry, &Member), ErrorCode> {
        let entry = self.sub_entry(conn, subscription_id)?;
        self.groups
            .get(&entry.group_id)
            .and_then(|g| g.members.get(&entry.member_id))
            .filter(|_| entry.live)
            .map(|m| (entry, m))
            .ok_or(ErrorCode::UnknownMember)
    }

    /// Any op on a live subscription keeps its session alive (`man/mortarmq.7`, CONSUMER GROUPS).
    fn touch(&mut self, entry: SubEntry, now_ms: u64) {
        if !entry.live {
            return;
        }
        let Some(member) = self
            .groups
            .get_mut(&entry.group_id)
            .and_then(|g| g.members.get_mut(&entry.member_id))
        else {
            return;
        };
        let deadline_ms = now_ms.saturating_add(self.sh.config.session_timeout_ms);
        // Every ACK lands here: the hundreds a pass carries share one `now_ms`, so the
        // timer set is only touched when the deadline moves.
        if deadline_ms == member.session_deadline_ms {
            return;
        }
        let timer = Timer::Session {
            group_id: entry.group_id,
            member_id: entry.member_id,
        };
        self.sh.timer_clear(member.session_deadline_ms, timer);
        member.session_deadline_ms = deadline_ms;
        self.sh.timer_set(member.session_deadline_ms, timer);
    }

    /// The member leaves: its partitions are freed at once (no REVOKE to a gone
    /// member), its outstanding deliveries become redeliverable, the group rebalances.
    fn member_leaves(&mut self, group_id: u16, member_id: u64, now_ms: u64, conn_open: bool) {
        let Some(group) = self.groups.get_mut(&group_id) else {
            return;
        };
        let Some(member) = group.remove_member(&mut self.sh, member_id, now_ms, conn_open) else {
            return;
        };
        self.sh
            .notices
            .retain(|_, n| !(n.group_id == group_id && n.member_id == member_id));
        if let Some(e) = self
            .conns
            .get_mut(&member.conn)
            .and_then(|cs| cs.subs.get_mut(&member.subscription_id))
        {
            e.live = false;
        }
        group.rebalance(&mut self.sh, now_ms);
        if group.members.is_empty() {
            let at_ms = now_ms.saturating_add(self.sh.config.group_ttl_ms);
            group.expires_at_ms = Some(at_ms);
            self.sh.timer_set(at_ms, Timer::GroupExpiry { group_id });
        }
    }

    /// Removes a group without members once `--group-ttl` passed: its positions go with
    /// it (docs/DECISIONS.md), its id is free again. Waits while one of its dead letters
    /// is not yet durable.
    fn expire_group(&mut self, group_id: u16, now_ms: u64) {
        let Some(g) = self.groups.get_mut(&group_id) else {
            return;
        };
        if !g.members.is_empty() || g.expires_at_ms.is_none_or(|at_ms| at_ms > now_ms) {
            return;
        }
        if g.dead_letters_pending() {
            let at_ms = now_ms.saturating_add(GROUP_EXPIRY_RETRY_MS);
            g.expires_at_ms = Some(at_ms);
            self.sh.timer_set(at_ms, Timer::GroupExpiry { group_id });
            return;
        }
        let g = self.groups.remove(&group_id).expect("found above");
        g.clear_timers(&mut self.sh);
        let key = (g.name, g.topic_id);
        self.group_ids.remove(&key);
        self.sh.dirty.remove(&group_id);
        self.free_group_ids.insert(group_id);
        self.sh.stats.groups_expired += 1;
        let (group, topic_id) = key;
        self.sh
            .effects
            .push(Effect::GroupExpired { group, topic_id });
    }

    fn fire(&mut self, timer: Timer, at_ms: u64, now_ms: u64) {
        match timer {
            Timer::Session {
                group_id,
                member_id,
            } => {
                let expired = self
                    .groups
                    .get(&group_id)
                    .and_then(|g| g.members.get(&member_id))
                    .is_some_and(|m| m.session_deadline_ms <= now_ms);
                if expired {
                    self.member_leaves(group_id, member_id, now_ms, true);
                }
            }
            Timer::Revoke {
                group_id,
                partition,
            } => {
                if let Some(g) = self.groups.get_mut(&group_id) {
                    g.revoke_timed_out(&mut self.sh, usize::from(partition), now_ms);
                }
            }
            Timer::Assign {
                group_id,
                partition,
            } => {
                if let Some(g) = self.groups.get_mut(&group_id) {
                    g.assign_timed_out(&mut self.sh, usize::from(partition), now_ms);
                }
            }
            Timer::AckWait {
                group_id,
                partition,
            } => {
                if let Some(g) = self.groups.get_mut(&group_id) {
                    g.ack_wait_fired(&mut self.sh, usize::from(partition), at_ms, now_ms);
                }
            }
            Timer::GroupExpiry { group_id } => self.expire_group(group_id, now_ms),
            Timer::RestoredExpiry if self.following || now_ms < self.restored_kept_until_ms => {
                // A cluster follower keeps what its leader replicated for the day it
                // leads, and a new leader gives the members of the last one a whole
                // `--group-ttl` to come back (`docs/REPLICATION.md` §7.4).
                let at_ms = match self.following {
                    true => now_ms.saturating_add(self.sh.config.group_ttl_ms),
                    false => self.restored_kept_until_ms,
                };
                self.sh.timer_set(at_ms, Timer::RestoredExpiry);
            }
            Timer::RestoredExpiry => {
                // They were shown as groups without members: their removal counts as such.
                self.sh.stats.groups_expired += self.restored.len() as u64;
                for (group, topic_id) in std::mem::take(&mut self.restored).into_keys() {
                    self.sh
                        .effects
                        .push(Effect::GroupExpired { group, topic_id });
                }
            }
            // Redeliveries and PULL deadlines are served by the delivery pass.
            Timer::Retry { group_id, .. }
            | Timer::Pull { group_id, .. }
            | Timer::ReadRetry { group_id } => {
                self.sh.dirty.insert(group_id);
            }
        }
    }

    /// Every phase that ends at a deadline has its timer: an ASSIGN or REVOKE waiting
    /// for its CONTROL_ACK, and a group without members (and only such a group).
    #[cfg(test)]
    fn check_group_timers(&self, g: &Group) {
        let has = |at_ms, timer| self.sh.timers.contains(&(at_ms, timer));
        for (p, part) in g.partitions.iter().enumerate() {
            let (group_id, partition) = (g.id, p as u16);
            if let Some(at_ms) = part.ack_timer_ms() {
                let timer = Timer::AckWait {
                    group_id,
                    partition,
                };
                assert!(has(at_ms, timer), "an ack-wait time without its timer");
            }
            match part.ownership {
                group::Ownership::Assigning { deadline_ms, .. } => {
                    let timer = Timer::Assign {
                        group_id,
                        partition,
                    };
                    assert!(has(deadline_ms, timer), "ASSIGN without its timer");
                }
                group::Ownership::Revoking { deadline_ms, .. } => {
                    let timer = Timer::Revoke {
                        group_id,
                        partition,
                    };
                    assert!(has(deadline_ms, timer), "REVOKE without its timer");
                }
                _ => {}
            }
        }
        match g.expires_at_ms {
            Some(at_ms) => {
                assert!(g.members.is_empty(), "a group with members expires");
                let timer = Timer::GroupExpiry { group_id: g.id };
                assert!(has(at_ms, timer), "expiry without its timer");
            }
            None => assert!(
                !g.members.is_empty(),
                "a group without members never expires"
            ),
        }
    }

    /// Debug check of the bookkeeping every test runs after each step.
    #[cfg(test)]
    fn check_invariants(&self) {
        for g in self.groups.values() {
            g.check_invariants();
            self.check_group_timers(g);
            let key = (g.name.clone(), g.topic_id);
            assert_eq!(self.group_ids.get(&key), Some(&g.id), "group id map");
            assert!(
                !self.free_group_ids.contains(&g.id),
                "a live group's id is free"
            );
        }
        assert_eq!(self.group_ids.len(), self.groups.len());
        assert!(self.groups.len() <= self.sh.config.max_groups);
        if !self.restored.is_empty() {
            let expiry = self
                .sh
                .timers
                .iter()
                .any(|(_, t)| *t == Timer::RestoredExpiry);
            assert!(expiry, "restored positions without their expiry");
        }
        for n in self.sh.notices.values() {
            if let Some(g) = self.groups.get(&n.group_id) {
                assert!(
                    g.members.contains_key(&n.member_id),
                    "notice for a gone member"
                );
            }
        }
    }
}
