//! The broker in cluster mode (`docs/REPLICATION.md` §4, §5.2, §7.1; §10 increment 4): a
//! [`Broker`] opened with [`Broker::open_cluster`] owns a [`Replica`] and changes its
//! partitions, producers and registry only by applying committed entries, on every node
//! alike, leader included.
//!
//! - **Leader, PUB**: today's checks; then the dedup check and the sequence run against
//!   the applied state plus a *pending overlay* of this term's proposals, and the record
//!   is encoded, as a segment holds it, into the pass's run for its partition.
//!   [`Broker::end_pass`] turns the pass's runs into ONE BATCH proposal whose waiters are
//!   the pass's PUBs. A REPLICATED PUB first asks `check_replicas` (0x6004).
//! - **Leader, DECLARE / DELETE**: a REGISTRY proposal naming the pair the leader chose;
//!   one at a time (later ones queue as they do behind a topic creation).
//! - **Every node, apply**: BATCH parts through the journal-replay path
//!   (`PartitionLog::replay`, which skips sequences already held) into the segments,
//!   producers from the records appended; REGISTRY changes through today's DECLARE and
//!   DELETE machinery. Segments are written on apply only: consumers never see an
//!   uncommitted record. Apply waits while a topic's files are being made.
//! - **Answers**: a PUB of any durability is answered when its entry is committed and
//!   applied (`docs/DECISIONS.md`), with the entry's term as `leader_epoch` and the
//!   partition's highest applied sequence as `commit_seq`; a DECLARE once its pair's
//!   files and registry write are done on the leader, as on a single node.
//!
//! The overlay is dropped when the node stops leading or its term changes, so a
//! truncated entry's sequences and producer seqs are handed out again. A new leader (and
//! one whose proposal raft dropped) serves nothing until it has applied its whole log
//! (0x6002 meanwhile): entries of earlier terms may still commit, and their sequences
//! must be known before any is handed out again.
//!
//! The reactor drives it with [`Broker::peer_message`], [`Broker::raft_tick`],
//! [`Broker::admit`], `job_done` (persist jobs travel as `Work::Persist`) and `end_pass`
//! (which polls the replica), and sends what [`Broker::drain_peer_messages`] hands it.
//!
//! - **Group positions**: every `POSITIONS_REPLICATE_INTERVAL_MS`, and in the pass where
//!   a member leaves cleanly, the leader's BATCH carries the committed positions that
//!   moved; followers keep them as restored
//!   positions for the day they lead (§7.4), and do not expire them while following. A
//!   node that stops leading ends its groups' memberships (`Coordinator::stop_leading`)
//!   and gives those it changed for operator entries not applied yet its applied log's
//!   positions (`replica::applied`), not their own. Those applied positions are also
//!   what it writes to its positions file and puts in a snapshot.
//! - **Dead letters**: the leader's go into the pass's BATCH as records of the twin
//!   (taking their sequence from the overlay, like a PUB's) and settle in their group
//!   once applied, if the record found at their sequence is theirs; every node counts
//!   the dead letters it applies as settled for the day it leads, as start-up does.
//!
//! - **Compaction** (`replica::compaction`): FLOOR entries and checkpoints; a start
//!   applies from the journal's checkpoint (replay skips what the segments hold).
//!
//! - **Producers** age on the records' timestamps, the leader's wall clock when it took
//!   them, so every node evicts and expires the same ones (`--producer-ttl`).
//!
//! - **INSTALL** (`replica::install`): snapshots for a node whose log is gone.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::Arc;

use super::applied::AppliedPositions;
use super::compaction::Compaction;
use super::entry::{Batch, BatchPart, EntryData, PositionChange, RegistryChange};
use super::install::Installs;
use super::machine::{
    Effect as ReplicaEffect, PersistJob, Replica, ReplicaConfig, ReplicaError, ReplicaOptions,
    Replicated, Waiter,
};
use super::PeerMessage;
use crate::broker::jobs::{DurableJob, JobSink, Work};
use crate::broker::partition::Partition;
use crate::broker::producers::Idempotence;
use crate::broker::publish::{refuse_fields, Partitions};
use crate::broker::registry::{declare_err, declared, TopicRegistry};
use crate::broker::topics::{pair_of, TopicPair};
use crate::broker::Broker;
use crate::broker::{
    BrokerConfig, BrokerCounters, ConnRef, Effect, Handled, Now, OutputRoom, PartitionKey,
    StartupReport, TOPICS_DIR,
};
use crate::consume::GroupPosition;
use crate::log::{encode_record, RecordView, Storage};
use crate::wire::ops::{Pub, PubResult};
use crate::wire::{DeclareCreated, Durability, ErrorCode, Op, PubResultFlags, Response};

/// A PUB waiting for its entry: what its answer needs besides the replica's fields.
struct PubWait {
    sequence: u64,
    deduplicated: bool,
}

/// One partition's records proposed in this term and not applied yet.
struct PendingPart {
    next_sequence: u64,
    /// Producer id → `(producer_seq, sequence)`, contiguous in `producer_seq`.
    producers: HashMap<u64, VecDeque<(u64, u64)>>,
}

/// One partition's records of this pass, encoded as a segment holds them.
struct PassPart {
    first_sequence: u64,
    count: u32,
    records: Vec<u8>,
}

/// How often the leader puts the committed positions that moved into a BATCH (§7.4): a
/// failover redelivers at most this much of the last acknowledgements (at-least-once).
pub const POSITIONS_REPLICATE_INTERVAL_MS: u64 = 100;

/// How long a serving leader goes without proposing before it proposes an empty BATCH:
/// its stamp moves the log's clock on every node, so producers expire and retention runs
/// on an idle cluster too (`docs/DECISIONS.md`, "The log's clock"). The cost is one small
/// entry and one fdatasync per node at this interval.
pub const LOG_CLOCK_TICK_MS: u64 = 10_000;

/// A BATCH stamped this far ahead of a node's wall clock means a clock set wrong (NTP
/// keeps them within milliseconds): counted, and logged.
pub const CLOCK_SKEW_WARN_MS: u64 = 30_000;
/// At most one such warning in the log per this interval.
const CLOCK_SKEW_WARN_INTERVAL_MS: u64 = 60_000;

/// A group's committed position on one partition: (group, topic id, partition).
type PositionKey = (Vec<u8>, u16, u16);

/// What a cluster node holds beside the broker's state.
pub struct Cluster {
    pub(super) replica: Replica,
    overlay: HashMap<PartitionKey, PendingPart>,
    /// The term the overlay belongs to; 0 while not leading.
    leading_term: u64,
    /// The newest stamp this leader put on what it proposed in the overlay's term. Its
    /// entries move the log's clock only once applied, so a leader whose wall clock is
    /// set back while they are in flight stamps no later record older than them.
    proposed_stamp_ms: u64,
    pass: BTreeMap<PartitionKey, PassPart>,
    pass_waiters: Vec<Waiter>,
    pubs: HashMap<(ConnRef, u64), PubWait>,
    /// DECLAREs proposed, by (conn, slot), with their entry's index.
    declares: HashMap<(ConnRef, u64), u64>,
    /// The REGISTRY entry proposed and neither applied nor failed.
    registry_in_flight: Option<u64>,
    /// Committed entries not applied yet (apply waits while a topic's files are made).
    applying: VecDeque<(u64, EntryData)>,
    pub(super) applied_index: u64,
    /// Leading, but requests wait until the log is applied up to this index.
    catching_up: Option<u64>,
    peer_out: Vec<PeerMessage>,
    /// The committed positions this leader last proposed, to send only what moved.
    positions_sent: HashMap<PositionKey, u64>,
    next_positions_ms: u64,
    /// When a serving leader that proposed nothing since proposes an empty BATCH.
    next_clock_tick_ms: u64,
    /// BATCHes applied with a stamp over `CLOCK_SKEW_WARN_MS` ahead of this node's wall
    /// clock, and when the next warning may be logged.
    clock_skewed_batches: u64,
    next_clock_warning_ms: u64,
    /// Peers whose link is down: a leader among them is not "known" (§7.1).
    links_down: std::collections::BTreeSet<u64>,
    /// The raft journal failed or an entry could not be applied: the node refuses all.
    pub(super) failed: Option<String>,
    pub(super) compaction: Compaction,
    pub(super) installs: Installs,
    /// Operator changes proposed here and waited for: ticket → the entry's index
    /// (`replica::admin`).
    pub(super) admin_tickets: HashMap<u64, u64>,
    /// Entries whose group change this leader made when it proposed them, in this
    /// leadership, with the group (name, topic id): applying them leaves its live groups
    /// alone; stopping to lead before they apply undoes the change.
    pub(super) admin_made: HashMap<u64, (Vec<u8>, u16)>,
    /// The group positions as the applied log says them, for the day it stops leading.
    pub(super) applied: AppliedPositions,
}

/// A cluster node's place in the group, for /stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    pub node_id: u64,
    pub is_leader: bool,
    pub term: u64,
    /// The leader this node can reach: raft's, unless its links are down (§7.1).
    pub leader_id: Option<u64>,
    pub commit_index: u64,
    /// The last entry applied to this broker's state.
    pub applied_index: u64,
    /// `leader`, `follower`, `candidate`, `pre-candidate`, or `installing` while a
    /// snapshot comes in (`replica::install`).
    pub role: &'static str,
    /// The last entry in this node's log, committed or not.
    pub last_index: u64,
    /// The journal's checkpoint and its first entry kept (`replica::compaction`).
    pub checkpoint_index: u64,
    pub first_index: u64,
    /// Entry bytes the journal still holds on disk.
    pub journal_bytes: u64,
    /// The log's clock (Unix ms; 0 before any stamp): `Partitions::log_clock_ms`.
    pub log_clock_ms: u64,
    /// BATCHes applied stamped over `CLOCK_SKEW_WARN_MS` ahead of this node's clock.
    pub clock_skewed_batches: u64,
    /// INSTALL (`replica::install`): chunk bytes sent as a leader since start, and while
    /// installing, bytes written of all.
    pub snapshot_bytes_sent: u64,
    pub install_bytes: (u64, u64),
    /// While leading: each peer's id and the last entry known in its log.
    pub match_indexes: Vec<(u64, u64)>,
}

impl Cluster {
    fn new(replica: Replica) -> Cluster {
        // A start from a checkpoint: the broker's state holds everything up to it.
        let applied_index = replica.applied();
        let checkpoint = replica.checkpoint().index;
        Cluster {
            replica,
            overlay: HashMap::new(),
            proposed_stamp_ms: 0,
            leading_term: 0,
            pass: BTreeMap::new(),
            pass_waiters: Vec::new(),
            pubs: HashMap::new(),
            declares: HashMap::new(),
            registry_in_flight: None,
            applying: VecDeque::new(),
            applied_index,
            catching_up: None,
            peer_out: Vec::new(),
            links_down: std::collections::BTreeSet::new(),
            positions_sent: HashMap::new(),
            next_positions_ms: 0,
            next_clock_tick_ms: 0,
            clock_skewed_batches: 0,
            next_clock_warning_ms: 0,
            failed: None,
            compaction: Compaction::from_checkpoint(checkpoint),
            installs: Installs::default(),
            admin_tickets: HashMap::new(),
            admin_made: HashMap::new(),
            applied: AppliedPositions::default(),
        }
    }

    pub fn term(&self) -> u64 {
        self.replica.term()
    }

    pub(in crate::broker) fn check_invariants(&self) {
        let (checkpoint, first) = (self.replica.checkpoint().index, self.replica.first_index());
        self.compaction.check(checkpoint, first, self.applied_index);
    }

    /// Leading, with its log applied: what it proposes now rests on everything before.
    pub(super) fn serving(&self) -> bool {
        self.replica.is_leader() && self.catching_up.is_none() && self.failed.is_none()
    }

    #[cfg(test)]
    pub(super) fn replica_mut(&mut self) -> &mut Replica {
        &mut self.replica
    }

    /// Raft's leader, unless it is a peer whose links are down: the leader "known" of
    /// §7.1, for the gate, `/stats` and `/healthz` alike.
    fn reachable_leader(&self) -> Option<u64> {
        if self.failed.is_some() {
            return None; // it no longer hears from any leader
        }
        let leader = self.replica.leader_id()?;
        let reachable = leader == self.replica.id() || !self.links_down.contains(&leader);
        reachable.then_some(leader)
    }

    /// Whether the node's groups may deliver: it follows (and has none), or it leads
    /// within its lease (§7.3), so that no other leader can exist.
    pub(in crate::broker) fn delivers(&self, now_ms: u64) -> bool {
        !self.replica.is_leader() || self.replica.lease_valid(now_ms)
    }

    /// The role gate: leader, applied up to its term's start, log healthy.
    pub(super) fn gate(&self, now_ms: u64) -> Result<(), (ErrorCode, String)> {
        if let Some(why) = &self.failed {
            // It takes no part in raft any more, so it does not lead; NOT_LEADER naming
            // no leader sends a client with other addresses to them (man/mortarmq.7).
            let text = format!("this node stopped serving until it is restarted: {why}");
            return Err((ErrorCode::NotLeader, text));
        }
        if let Some(refused) = self.installs.refusal() {
            return Err(refused);
        }
        if let Err(r) = self.replica.admit(now_ms) {
            // A leader whose link is down may be gone: sending the client there would
            // cost it a connect timeout, so it backs off and asks again (§7.1).
            if r.code == ErrorCode::NotLeader && self.reachable_leader().is_none() {
                let last = self.replica.leader_id().unwrap_or(0);
                let text = format!("no link to the last leader {last}");
                return Err((ErrorCode::LeaderUnknown, text));
            }
            return Err((r.code, r.text));
        }
        if self.catching_up.is_some() {
            let id = self.replica.id();
            let text = format!("node {id} leads but is still applying its log");
            return Err((ErrorCode::LeaderUnknown, text));
        }
        Ok(())
    }

    /// Dedup against the overlay, then the applied state; `true` with a duplicate whose
    /// original is not known applied yet.
    fn check_producer(
        &self,
        key: PartitionKey,
        part: &Partition,
        p: &Pub<'_>,
    ) -> (Idempotence, bool) {
        let (id, seq) = (p.producer_id, p.producer_seq);
        let pending = self.overlay.get(&key).and_then(|o| o.producers.get(&id));
        if let Some((&(first, _), &(last, _))) = pending.and_then(|l| l.front().zip(l.back())) {
            if seq == last + 1 {
                return (Idempotence::Fresh, false);
            }
            if seq > last + 1 {
                let expected = last + 1;
                return (
                    Idempotence::OutOfOrder {
                        expected,
                        too_old: false,
                    },
                    false,
                );
            }
            if seq >= first {
                let sequence = pending.expect("found")[(seq - first) as usize].1;
                return (Idempotence::Duplicate { sequence }, true);
            }
        }
        (part.producers.check(id, seq), false)
    }

    /// The idempotence check of a PUB (`man/mortarmq.7`): `None` lets it append; a
    /// duplicate of an applied record is answered now, one of a pending record waits
    /// with this pass (whose entry commits after the original's).
    fn dedup(
        &mut self,
        conn: ConnRef,
        slot: u64,
        key: PartitionKey,
        part: &Partition,
        p: &Pub<'_>,
        counters: &mut BrokerCounters,
    ) -> Option<Handled> {
        if p.producer_id == 0 {
            counters.pubs_non_idempotent += 1;
            return None;
        }
        match self.check_producer(key, part, p) {
            (Idempotence::Fresh, _) => None,
            (Idempotence::Duplicate { sequence }, pending) => {
                counters.pubs_deduplicated += 1;
                if !pending {
                    return Some(Handled::Answer(self.duplicate_ok(key, sequence)));
                }
                let wait = PubWait {
                    sequence,
                    deduplicated: true,
                };
                self.wait(conn, slot, key, wait);
                Some(Handled::Wait)
            }
            (Idempotence::OutOfOrder { expected, too_old }, _) => {
                let why = match too_old {
                    true => "older than the dedup window",
                    false => "skips ahead",
                };
                let text = format!("producer_seq {} {why}; expected {expected}", p.producer_seq);
                Some(pub_err(ErrorCode::SequenceOutOfOrder, text))
            }
        }
    }

    /// The next sequence of `key`: past what is applied and what is pending.
    fn take_sequence(&mut self, key: PartitionKey, applied_next: u64) -> u64 {
        let pending = self.overlay.entry(key).or_insert_with(|| PendingPart {
            next_sequence: applied_next,
            producers: HashMap::new(),
        });
        let sequence = pending.next_sequence.max(applied_next);
        pending.next_sequence = sequence + 1;
        sequence
    }

    fn note_producer(&mut self, key: PartitionKey, id: u64, seq: u64, sequence: u64) {
        let pending = self.overlay.get_mut(&key).expect("take_sequence made it");
        pending
            .producers
            .entry(id)
            .or_default()
            .push_back((seq, sequence));
    }

    fn encode(&mut self, key: PartitionKey, record: &RecordView<'_>) {
        let run = self.pass.entry(key).or_insert_with(|| PassPart {
            first_sequence: record.sequence,
            count: 0,
            records: Vec::new(),
        });
        encode_record(&mut run.records, record);
        run.count += 1;
    }

    fn wait(&mut self, conn: ConnRef, slot: u64, key: PartitionKey, pub_wait: PubWait) {
        self.pubs.insert((conn, slot), pub_wait);
        let part = Some(key);
        self.pass_waiters.push(Waiter { conn, slot, part });
    }

    /// The OK of a duplicate whose original is applied: now, under the current term.
    fn duplicate_ok(&self, key: PartitionKey, sequence: u64) -> Response {
        Response::Pub(PubResult {
            sequence,
            durability: Durability::Replicated.as_code(),
            leader_epoch: self.replica.term(),
            commit_seq: self.replica.commit_seq(key.0, key.1),
            result_flags: PubResultFlags::DEDUPLICATED,
        })
    }

    /// The committed positions that moved go into this pass's BATCH rather than one up to
    /// `POSITIONS_REPLICATE_INTERVAL_MS` later: a member left its group cleanly (HEARTBEAT
    /// LEAVE), so a consumer that stopped, and then saw the leader die, resumes after what
    /// it ACKed instead of getting the interval's records again.
    pub(in crate::broker) fn replicate_positions_now(&mut self) {
        self.next_positions_ms = 0;
    }

    /// The group's positions go into the next BATCH whatever they are: an operator
    /// change moved them on every node, perhaps back to what was sent last.
    pub(super) fn resend_positions(&mut self, group: &[u8], topic_id: u16) {
        self.positions_sent
            .retain(|(g, t, _), _| !(g == group && *t == topic_id));
    }

    /// A truncated or never-proposed entry's sequences may be handed out again.
    fn drop_overlay(&mut self) {
        self.overlay.clear();
        // The entries it stamped are applied before this node serves again, or never.
        self.proposed_stamp_ms = 0;
    }

    /// The stamp for what this leader proposes now: the log's clock or its wall clock
    /// (`Partitions::stamp_ms`), and never behind what it proposed before in this term.
    fn stamp_ms(&mut self, partitions: &Partitions, now: Now) -> u64 {
        self.proposed_stamp_ms = self.proposed_stamp_ms.max(partitions.stamp_ms(now));
        self.proposed_stamp_ms
    }

    /// Forgets what apply has caught up with (the applied state says it), so the overlay
    /// stays as small as the uncommitted tail under a steady load.
    fn prune_overlay(&mut self, partitions: &Partitions) {
        self.overlay.retain(|key, pending| {
            let Some(applied_next) = partitions.get(*key).map(|p| p.log.next_sequence()) else {
                return false;
            };
            pending.producers.retain(|_, list| {
                while list
                    .front()
                    .is_some_and(|&(_, sequence)| sequence < applied_next)
                {
                    list.pop_front();
                }
                !list.is_empty()
            });
            applied_next < pending.next_sequence
        });
        if self.catching_up.is_some_and(|i| self.applied_index >= i) {
            self.catching_up = None;
        }
    }

    /// After a poll: a new term as leader starts an empty overlay and waits for apply; a
    /// node that stopped leading forgets its overlay. Returns the term this node just
    /// started leading in, if it did.
    fn note_leadership(&mut self) -> Option<u64> {
        let (leader, term) = (self.replica.is_leader(), self.replica.term());
        if leader && self.leading_term == term {
            return None;
        }
        self.drop_overlay();
        // Its groups become restored ones (`Coordinator::stop_leading`), or a new term's
        // leader applies its earlier entries: the changes go to whatever groups it holds.
        self.admin_made.clear();
        if leader {
            self.leading_term = term;
            self.catching_up = Some(self.replica.last_index());
            Some(term)
        } else {
            self.leading_term = 0;
            self.catching_up = None;
            None
        }
    }

    /// Where the records this term proposed to `key` end (0: none), on a leader that has
    /// applied all it proposed before; `None` otherwise, while an entry it proposed may
    /// still commit or be truncated.
    pub(in crate::broker) fn proposed_end(&self, key: PartitionKey) -> Option<u64> {
        self.serving()
            .then(|| self.overlay.get(&key).map_or(0, |o| o.next_sequence))
    }

    /// The group positions as this node's applied log says them, which it makes durable
    /// (`broker::durable_positions`).
    pub(in crate::broker) fn applied_positions(&self) -> Vec<GroupPosition> {
        self.applied.positions()
    }

    fn take_declare(&mut self, index: u64) -> Option<(ConnRef, u64)> {
        if self.registry_in_flight == Some(index) {
            self.registry_in_flight = None;
        }
        let reply = self
            .declares
            .iter()
            .find(|(_, &i)| i == index)
            .map(|(&k, _)| k)?;
        self.declares.remove(&reply);
        Some(reply)
    }
}

fn pub_err(code: ErrorCode, text: String) -> Handled {
    Handled::Answer(Response::err(code, Op::Pub as u8, text))
}

/// The text of a waiter's failure (`man/mortarmq.7`, the 0x6xxx codes).
pub(super) fn waiter_text(code: ErrorCode) -> String {
    match code {
        ErrorCode::LogTruncated => "the entry was replaced by a newer leader's; resend".into(),
        ErrorCode::NotEnoughReplicasAfterAppend => {
            "appended, but this node stopped leading before a majority had it".into()
        }
        ErrorCode::ReplicationTimeout => {
            "no majority within --replication-timeout; the entry may still commit".into()
        }
        ErrorCode::Backpressure => "replication backlog full".into(),
        other => format!("{other:?}"),
    }
}

impl Broker {
    /// Opens a cluster node's data directory (blocking: start-up): registry, partitions
    /// and producers as a single node does, then the raft journal (format 2) and
    /// `raft-state` under `config.data_dir`. No format 1 journal and no `epoch` file:
    /// raft's term is the epoch. The caller holds the [`DataDirLock`](super::super::DataDirLock).
    pub fn open_cluster(
        config: BrokerConfig,
        replica: (ReplicaConfig, ReplicaOptions),
        storage: Arc<dyn Storage>,
        sink: Box<dyn JobSink>,
        now: Now,
    ) -> Result<(Broker, StartupReport), String> {
        let dir = config.data_dir.clone();
        let topics_dir = dir.join(TOPICS_DIR);
        crate::log::storage::create_data_dir_durable(&*storage, &topics_dir)
            .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
        // An install under way starts over from a wiped directory, before anything reads it.
        let install = super::install::resume(&*storage, &dir)?;
        let (topics, _) = TopicRegistry::load(Arc::clone(&storage), &dir)?;
        let (replica, options) = replica;
        let (replica, _) = Replica::open_with(&storage, &dir, replica, options, now.mono_ms)
            .map_err(|e| format!("raft journal: {e}"))?;
        let mut broker = Broker::assemble(config, storage, topics, sink, 0);
        broker.partitions.run_on_log_clock();
        broker.cluster = Some(Box::new(Cluster::new(replica)));
        let mut report = StartupReport {
            topics: broker.topics.registry().len(),
            ..StartupReport::default()
        };
        let pairs: Vec<TopicPair> = broker.topics.registry().pairs().cloned().collect();
        for pair in &pairs {
            report.partitions += broker.open_pair(pair)?;
        }
        broker
            .partitions
            .rebuild_all_producers(now, &mut broker.counters);
        report.group_positions = broker.restore_groups(now)?;
        let held = broker.consume.coordinator().positions();
        broker.cluster_mut().applied = AppliedPositions::from_start(held);
        if let Some(marker) = install {
            broker.resume_install(marker);
        }
        Ok((broker, report))
    }

    pub(super) fn cluster_mut(&mut self) -> &mut Cluster {
        self.cluster.as_deref_mut().expect("cluster mode")
    }

    /// The role gate of `docs/REPLICATION.md` §7.1 for `op`: DECLARE, PUB, SUB, PULL,
    /// ACK, NACK, CREDIT and HEARTBEAT reach a cluster node's state only on a leader that
    /// has applied its log; the error is the ERR frame's code and text (0x6001 NOT_LEADER
    /// `leader <id> <host:port>`, 0x6002, 0x600C). Always `Ok` on a single node.
    pub fn admit(&self, op: Op, now: Now) -> Result<(), (ErrorCode, String)> {
        let Some(c) = self.cluster.as_deref() else {
            return Ok(());
        };
        match op {
            Op::Declare
            | Op::Pub
            | Op::Sub
            | Op::Pull
            | Op::Ack
            | Op::Nack
            | Op::Credit
            | Op::Heartbeat => c.gate(now.mono_ms),
            _ => Ok(()),
        }
    }

    /// A message from peer `msg.from`, decoded by the `peer` room. A stale or foreign one
    /// is dropped (raft tolerates loss). Its effects come out of the next `end_pass`.
    /// `Err`: a lie (`replica::vet`), with the reason label of
    /// `mortar_peer_refused_total` and what to log; the caller counts it.
    pub fn peer_message(&mut self, msg: PeerMessage) -> Result<(), (&'static str, String)> {
        let Some(c) = self.cluster.as_deref_mut() else {
            return Ok(());
        };
        match c.replica.step(msg) {
            Err(ReplicaError::Refused { lie, why }) => Err((lie.label(), why)),
            Err(e) => {
                log::debug!("raft message dropped: {e}");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Peer `id`'s links came up; `client_addr` from its HELLO names it in NOT_LEADER,
    /// `last_index` (its log's end then) tells a node that started empty whether it
    /// lost a log it may have voted with (`Replica::peer_log`).
    pub fn peer_up(&mut self, id: u64, client_addr: Option<String>, last_index: Option<u64>) {
        if let Some(c) = self.cluster.as_deref_mut() {
            c.links_down.remove(&id);
            // A snapshot sent over the old link went to a process that is gone.
            c.replica.report_snapshot_failure(id);
            if let Some(last_index) = last_index {
                c.replica.peer_log(id, last_index);
            }
            if let Some(addr) = client_addr {
                c.replica.set_node_addr(id, addr);
            }
            self.install_link_up(id);
        }
    }

    /// Peer `id`'s links went down: as leader it is no longer "known" (§7.1).
    pub fn peer_down(&mut self, id: u64) {
        if let Some(c) = self.cluster.as_deref_mut() {
            c.links_down.insert(id);
            // What was queued on the link went with it: raft, counting those appends in
            // flight, would otherwise send one message per heartbeat until they time out.
            c.replica.report_unreachable(id);
            c.replica.report_snapshot_failure(id);
        }
    }

    /// `msg` could not be queued (its link is down or its output full): raft probes its
    /// peer again later. A snapshot dropped so is reported failed too: raft waits in its
    /// Snapshot state for a report that nothing else would send while the link stays up,
    /// and sends no append to that peer until then.
    pub fn peer_unreachable(&mut self, msg: &PeerMessage) {
        if let Some(c) = self.cluster.as_deref_mut() {
            c.replica.report_unreachable(msg.to);
            if msg.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
                c.replica.report_snapshot_failure(msg.to);
            }
        }
    }

    /// One `--raft-tick`; its effects come out of the next `end_pass`.
    pub fn raft_tick(&mut self) {
        if let Some(c) = self.cluster.as_deref_mut() {
            c.replica.tick();
        }
    }

    /// Moves the messages for peers (each names its `to`) that the last `end_pass`
    /// released into `out`. A follower's append and vote responses come out only after
    /// the persist job they depend on was reported through `job_done`.
    pub fn drain_peer_messages(&mut self, out: &mut Vec<PeerMessage>) {
        if let Some(c) = self.cluster.as_deref_mut() {
            out.append(&mut c.peer_out);
        }
    }

    /// Where this node's raft log ends, `(index, term)`, for the HELLOs of the links it
    /// dials (`docs/REPLICATION.md` §5.6): a peer learns from it whether this node lost
    /// entries, and where to probe it from. `None` on a single node.
    pub fn raft_log_end(&self) -> Option<(u64, u64)> {
        let c = self.cluster.as_deref()?;
        Some((c.replica.last_index(), c.replica.last_term()))
    }

    /// Role, term, leader, commit and applied index; `None` on a single node.
    pub fn cluster_status(&self) -> Option<ClusterStatus> {
        let c = self.cluster.as_deref()?;
        Some(ClusterStatus {
            node_id: c.replica.id(),
            is_leader: c.replica.is_leader(),
            term: c.replica.term(),
            leader_id: c.reachable_leader(),
            commit_index: c.replica.commit_index(),
            applied_index: c.applied_index,
            role: match c.installs.refusal() {
                Some(_) => "installing",
                None => c.replica.role(),
            },
            last_index: c.replica.last_index(),
            checkpoint_index: c.replica.checkpoint().index,
            first_index: c.replica.first_index(),
            journal_bytes: c.replica.journal_bytes(),
            log_clock_ms: self.partitions.log_clock_ms().unwrap_or(0),
            clock_skewed_batches: c.clock_skewed_batches,
            snapshot_bytes_sent: c.installs.bytes_sent(),
            install_bytes: c.installs.progress(),
            match_indexes: c.replica.match_indexes(),
        })
    }

    /// PUB in a cluster (the caller checked topic and partition): into this pass's BATCH.
    pub(in crate::broker) fn publish_replicated(
        &mut self,
        conn: ConnRef,
        slot: u64,
        p: &Pub<'_>,
        need: Durability,
        now: Now,
    ) -> Handled {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        if let Err((code, text)) = c.gate(now.mono_ms) {
            return pub_err(code, text);
        }
        if need == Durability::Replicated {
            if let Err(r) = c.replica.check_replicas() {
                return pub_err(r.code, r.text);
            }
        }
        if let Some(refused) = refuse_fields(p) {
            return refused;
        }
        let key = (p.topic_id, p.partition);
        let Some(part) = self.partitions.get(key) else {
            return pub_err(ErrorCode::InternalError, "partition not open".into());
        };
        self.counters.pubs += 1;
        if let Some(answered) = c.dedup(conn, slot, key, part, p, &mut self.counters) {
            return answered;
        }
        let record_bytes = (p.key.len() + p.value.len()) as u64;
        if let Some(cap) = self.partitions.over_data_cap(record_bytes) {
            let text = format!("data directory cap of {cap} bytes reached");
            return pub_err(ErrorCode::StorageFull, text);
        }
        let sequence = c.take_sequence(key, part.log.next_sequence());
        let timestamp_ms = c.stamp_ms(&self.partitions, now);
        c.encode(
            key,
            &RecordView {
                sequence,
                timestamp_ms,
                producer_id: p.producer_id,
                producer_seq: p.producer_seq,
                flags: 0,
                key: p.key,
                value: p.value,
            },
        );
        if p.producer_id != 0 {
            c.note_producer(key, p.producer_id, p.producer_seq, sequence);
        }
        let wait = PubWait {
            sequence,
            deduplicated: false,
        };
        c.wait(conn, slot, key, wait);
        Handled::Wait
    }

    /// A dead letter on a leader: into this pass's BATCH like a PUB's record (the twin is
    /// replicated like any partition); its sequence, or `None` while this node does not
    /// serve (the consume plane tries again at housekeeping).
    pub(in crate::broker) fn propose_dead_letter(
        &mut self,
        twin: PartitionKey,
        record: &RecordView<'_>,
        now: Now,
    ) -> Option<u64> {
        let c = self.cluster.as_deref_mut()?;
        c.gate(now.mono_ms).ok()?;
        let part = self.partitions.get(twin)?;
        let sequence = c.take_sequence(twin, part.log.next_sequence());
        let timestamp_ms = c.stamp_ms(&self.partitions, now);
        c.encode(
            twin,
            &RecordView {
                sequence,
                timestamp_ms,
                ..*record
            },
        );
        Some(sequence)
    }

    /// DECLARE of a new topic in a cluster: a REGISTRY entry with the pair chosen here.
    pub(in crate::broker) fn propose_declare(
        &mut self,
        conn: ConnRef,
        slot: u64,
        name: &str,
        partition_count: u16,
        now: Now,
    ) -> Handled {
        let pair = match self.next_pair() {
            Ok(pair) => pair,
            Err(code) => return declare_err(code, "all 32767 topic pairs are in use".into()),
        };
        let name = name.as_bytes().to_vec();
        let change = RegistryChange::Declare {
            pair,
            partition_count,
            name,
        };
        self.propose_registry(conn, slot, change, now)
    }

    /// DECLARE with DELETE in a cluster (IF_UNUSED already checked here).
    pub(in crate::broker) fn propose_delete(
        &mut self,
        conn: ConnRef,
        slot: u64,
        pair: &TopicPair,
        now: Now,
    ) -> Handled {
        let name = pair.name.as_bytes().to_vec();
        let change = RegistryChange::Delete {
            pair: pair.pair,
            name,
        };
        self.propose_registry(conn, slot, change, now)
    }

    fn propose_registry(
        &mut self,
        conn: ConnRef,
        slot: u64,
        change: RegistryChange,
        now: Now,
    ) -> Handled {
        let c = self.cluster_mut();
        if let Err((code, text)) = c.gate(now.mono_ms) {
            return declare_err(code, text);
        }
        if let Err(r) = c.replica.check_replicas() {
            return declare_err(r.code, r.text);
        }
        let waiter = Waiter {
            conn,
            slot,
            part: None,
        };
        let entry = EntryData::Registry(change);
        match c.replica.propose(&entry, vec![waiter], now.mono_ms) {
            Ok(index) => {
                c.declares.insert((conn, slot), index);
                c.registry_in_flight = Some(index);
                Handled::Wait
            }
            Err(r) => declare_err(r.code, r.text),
        }
    }

    /// A REGISTRY entry is proposed and neither applied nor failed.
    pub(in crate::broker) fn registry_in_flight(&self) -> bool {
        self.cluster
            .as_deref()
            .is_some_and(|c| c.registry_in_flight.is_some())
    }

    /// `end_pass` in a cluster: the pass's BATCH, the Ready loop, apply, answers; then
    /// the consume plane and registry writes as on a single node.
    pub(in crate::broker) fn end_pass_cluster(&mut self, now: Now, room: &dyn OutputRoom) {
        self.pull_turn(now);
        if self.cluster_mut().installs.refusal().is_some() {
            // Installing: nothing else of this node's state is touched until it restarts.
            return self.submit_jobs();
        }
        self.propose_pass(now);
        self.propose_floor(now);
        self.poll_replica(now);
        self.run_queued_declares(now);
        self.jobs.extend(self.topics.take_write_job(now.mono_ms));
        let c = self.cluster.as_deref().expect("cluster mode");
        let proposed_end = |twin| c.proposed_end(twin);
        self.consume
            .settle_replicated_dead_letters(&mut self.partitions, &proposed_end);
        self.pump_consume(now, room);
        self.take_cluster_checkpoint(now);
        self.take_raft_spare(None);
        self.offer_snapshots(now);
        let write = self.positions_job(now, false);
        self.jobs.extend(write);
        self.submit_jobs();
    }

    /// The pass's records become one BATCH proposal waited on by the pass's PUBs.
    pub(super) fn propose_pass(&mut self, now: Now) {
        let positions = self.moved_positions(now);
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        let tick = c.serving() && now.mono_ms >= c.next_clock_tick_ms;
        if c.pass.is_empty() && c.pass_waiters.is_empty() && positions.is_empty() && !tick {
            return;
        }
        let stamp_ms = c.stamp_ms(&self.partitions, now);
        c.next_clock_tick_ms = now.mono_ms + LOG_CLOCK_TICK_MS;
        let parts = std::mem::take(&mut c.pass)
            .into_iter()
            .map(|((topic_id, partition), run)| BatchPart {
                topic_id,
                partition,
                first_sequence: run.first_sequence,
                count: run.count,
                records: run.records,
            })
            .collect();
        // A pass of duplicates only proposes an empty BATCH: its commit follows theirs.
        let entry = EntryData::Batch(Batch {
            leader_wall_ms: stamp_ms,
            parts,
            positions,
        });
        let waiters = std::mem::take(&mut c.pass_waiters);
        let Err(refused) = c.replica.propose(&entry, waiters.clone(), now.mono_ms) else {
            return;
        };
        // The overlay names this pass's records, which are in no entry: it goes, and the
        // node serves again once it applied what it proposed before.
        c.drop_overlay();
        // The positions were in the refused entry too: send them all again.
        c.positions_sent.clear();
        c.catching_up = Some(c.replica.last_index());
        for w in waiters {
            c.pubs.remove(&(w.conn, w.slot));
            let response = Response::err(refused.code, Op::Pub as u8, refused.text.clone());
            self.effects.push(Effect::Answer {
                conn: w.conn,
                slot: w.slot,
                response,
            });
        }
    }

    /// On a leader serving requests, every `POSITIONS_REPLICATE_INTERVAL_MS`: the
    /// committed positions that moved since it last proposed them. Bounded by the
    /// groups' partitions (`--max-groups`), and only on that timer.
    fn moved_positions(&mut self, now: Now) -> Vec<PositionChange> {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        let serving = c.serving();
        if !serving {
            c.positions_sent.clear();
            return Vec::new();
        }
        if now.mono_ms < c.next_positions_ms {
            return Vec::new();
        }
        c.next_positions_ms = now.mono_ms + POSITIONS_REPLICATE_INTERVAL_MS;
        let mut moved = Vec::new();
        for p in self.consume.coordinator().positions() {
            let key = (p.group, p.topic_id, p.partition);
            if c.positions_sent.get(&key) == Some(&p.committed) {
                continue;
            }
            moved.push(PositionChange {
                topic_id: key.1,
                partition: key.2,
                committed: p.committed,
                group: key.0.clone(),
            });
            c.positions_sent.insert(key, p.committed);
        }
        moved
    }

    /// The replica's Ready loop: messages out, persist jobs to the pool, committed
    /// entries applied in order, waiters answered.
    fn poll_replica(&mut self, now: Now) {
        if self.cluster_mut().failed.is_some() {
            return; // it takes no further part: raft's own error is sticky
        }
        let effects = match self.cluster_mut().replica.poll(now.mono_ms) {
            Ok(effects) => effects,
            Err(e) => return self.cluster_failed(format!("raft: {e}")),
        };
        for effect in effects {
            match effect {
                ReplicaEffect::Send(msg) => self.cluster_mut().peer_out.push(msg),
                ReplicaEffect::Persist(job) => self.jobs.push(DurableJob {
                    storage: Arc::clone(&self.storage),
                    work: Work::Persist { job },
                }),
                ReplicaEffect::Apply { index, entry, .. } => {
                    self.cluster_mut().applying.push_back((index, entry));
                    self.apply_queued(now);
                }
                ReplicaEffect::Answer { waiter, result } => self.answer_waiter(waiter, result),
                ReplicaEffect::Install { data, hard_state } => {
                    self.begin_install(&data, hard_state)
                }
            }
        }
        let c = self.cluster_mut();
        let led_before = c.leading_term != 0;
        // Groups changed at proposal whose entry has not applied: it may be truncated.
        let changed: Vec<(Vec<u8>, u16)> = c.admin_made.values().cloned().collect();
        let new_term = c.note_leadership();
        let following = !c.replica.is_leader();
        // A vote goes out only in a pass that sees the node not leading, so a new term
        // follows such a pass; were it not so, the last term's groups end all the same.
        if !self.consume.following() && (following || (new_term.is_some() && led_before)) {
            let applied = self.cluster_mut().applied.positions();
            self.consume.stop_leading(&changed, &applied, now);
        }
        if let Some(term) = new_term {
            self.consume.leading_in(term);
        }
        self.consume.set_following(following, now);
        self.apply_queued(now);
    }

    /// A persist job came back from the pool (`job_done`).
    pub(in crate::broker) fn persist_done(&mut self, job: &PersistJob, result: io::Result<()>) {
        if let Err(e) = self.cluster_mut().replica.persist_done(job, result) {
            self.cluster_failed(format!("raft journal: {e}"));
        }
    }

    /// After a topic's files were made: the entries that waited for them.
    pub(in crate::broker) fn creation_done(&mut self, now: Now) {
        if self.cluster.is_some() {
            self.apply_queued(now);
        }
    }

    /// The raft journal failed or an entry could not be applied: said once, and the
    /// node's waiters, whose outcome it can no longer learn, get 0x6005 at once (the
    /// entries may still commit under another leader; an idempotent resend finds out)
    /// rather than waiting for a restart.
    pub(in crate::broker) fn cluster_failed(&mut self, why: String) {
        let c = self.cluster_mut();
        if c.failed.is_some() {
            return;
        }
        log::error!("cluster node stops serving until restarted: {why}");
        c.failed = Some(why);
        let mut waiters = c.replica.take_waiters();
        waiters.append(&mut c.pass_waiters);
        c.pass.clear();
        for waiter in waiters {
            self.answer_waiter(waiter, Err(ErrorCode::NotEnoughReplicasAfterAppend));
        }
    }

    fn answer_waiter(&mut self, waiter: Waiter, result: Result<Replicated, ErrorCode>) {
        if waiter.conn == super::admin::ADMIN_CONN {
            return self.admin_waiter(waiter.slot, result);
        }
        let c = self.cluster_mut();
        let key = (waiter.conn, waiter.slot);
        let response = if let Some(w) = c.pubs.remove(&key) {
            match result {
                Ok(r) => Response::Pub(PubResult {
                    sequence: w.sequence,
                    durability: Durability::Replicated.as_code(),
                    leader_epoch: r.leader_epoch,
                    commit_seq: r.commit_seq,
                    result_flags: match w.deduplicated {
                        true => PubResultFlags::DEDUPLICATED,
                        false => PubResultFlags::empty(),
                    },
                }),
                Err(code) => Response::err(code, Op::Pub as u8, waiter_text(code)),
            }
        } else if c.declares.contains_key(&key) {
            // Committed: apply answers it, once the pair's files and registry are done.
            let Err(code) = result else {
                return;
            };
            let index = c.declares.remove(&key);
            if c.registry_in_flight == index {
                c.registry_in_flight = None;
            }
            Response::err(code, Op::Declare as u8, waiter_text(code))
        } else {
            return;
        };
        self.effects.push(Effect::Answer {
            conn: waiter.conn,
            slot: waiter.slot,
            response,
        });
    }

    /// Applies committed entries in order, until one needs a topic still being made.
    fn apply_queued(&mut self, now: Now) {
        // A node that failed applies nothing more: what it would apply rests on what failed.
        // A partition with too many unsynced files waits for their sync, taken at the end
        // of this pass (`take_cluster_checkpoint`), and its completion's pass goes on.
        while self.topics.creating.is_none()
            && self.cluster_mut().failed.is_none()
            && !self.partitions.segment_files_crowded()
        {
            let Some((index, entry)) = self.cluster_mut().applying.pop_front() else {
                break;
            };
            match entry {
                EntryData::Batch(batch) => self.apply_batch(&batch, now),
                EntryData::Registry(change) => self.apply_registry(index, change, now),
                EntryData::Floor(floor) => self.apply_floor(floor),
                EntryData::Admin(change) => self.apply_admin(index, change, now),
                EntryData::Noop => {}
            }
            self.cluster_mut().applied_index = index;
        }
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        if c.applying.is_empty() {
            // The replica hands out no Apply for a no-op: past the last one, all is done.
            c.applied_index = c.applied_index.max(c.replica.applied());
        }
        c.prune_overlay(&self.partitions);
    }

    fn apply_batch(&mut self, batch: &Batch, now: Now) {
        self.partitions.log_clock_reads(batch.leader_wall_ms);
        self.check_clock_skew(batch.leader_wall_ms, now);
        // A leader's own groups are live and ignore these; a follower keeps them for
        // the day it leads (§7.4).
        for pc in &batch.positions {
            let change = (&pc.group[..], pc.topic_id, pc.partition, pc.committed);
            self.consume.replicated_position(change, now);
            let applied = &mut self.cluster_mut().applied;
            applied.raise(&pc.group, pc.topic_id, pc.partition, pc.committed);
        }
        for p in &batch.parts {
            let key = (p.topic_id, p.partition);
            let applied =
                self.partitions
                    .apply_part(key, p.first_sequence, &p.records, &mut self.counters);
            if pair_of(key.0).is_some_and(|(_, twin)| twin) {
                self.consume
                    .replicated_dead_letters(p.first_sequence, &p.records, now);
            }
            match applied {
                Ok(_) => self.consume.records_available(key.0, key.1),
                Err(e) => {
                    let why = format!("applying topic {} partition {}: {e}", key.0, key.1);
                    self.cluster_failed(why);
                }
            }
        }
    }

    /// A stamp far ahead of this node's wall clock: this node's clock is behind, or a
    /// leader's (which moved the log's clock) ahead. On a leader set back, its own
    /// stamps, which stay at the log's clock, show it. A stamp from the past is no sign:
    /// a node catching up applies old entries.
    fn check_clock_skew(&mut self, stamp_ms: u64, now: Now) {
        let ahead_ms = stamp_ms.saturating_sub(now.wall_ms);
        if ahead_ms <= CLOCK_SKEW_WARN_MS {
            return;
        }
        let c = self.cluster_mut();
        c.clock_skewed_batches += 1;
        if now.mono_ms < c.next_clock_warning_ms {
            return;
        }
        c.next_clock_warning_ms = now.mono_ms + CLOCK_SKEW_WARN_INTERVAL_MS;
        log::warn!(
            "the log's clock (the leaders' stamps) is {} s ahead of this node's wall clock: \
             a clock is set wrong (check NTP); records are stamped, producers expire and \
             segments age on the log's clock",
            ahead_ms / 1_000
        );
    }

    fn apply_registry(&mut self, index: u64, change: RegistryChange, now: Now) {
        let reply = self.cluster_mut().take_declare(index);
        match change {
            RegistryChange::Declare {
                pair,
                partition_count,
                name,
            } => self.apply_declare(pair, partition_count, &name, reply),
            RegistryChange::Delete { pair, name } => self.apply_delete(pair, &name, reply, now),
        }
    }

    fn apply_declare(&mut self, pair: u16, count: u16, name: &[u8], reply: Option<(ConnRef, u64)>) {
        let name = String::from_utf8_lossy(name).into_owned();
        if let Some(existing) = self.registry().lookup(&name).cloned() {
            // Applied before this start (a start applies the log again), or declared
            // twice before either committed.
            let Some(reply) = reply else {
                return;
            };
            let response = if existing.pair == pair && existing.partition_count == count {
                declared(&existing, DeclareCreated::IdempotentOk)
            } else {
                let n = existing.partition_count;
                let text = format!("topic '{name}' exists with {n} partitions");
                Response::err(ErrorCode::TopicConfigConflict, Op::Declare as u8, text)
            };
            let version = self.pair_version(existing.pair);
            return self.answer_registry_at(version, reply, response);
        }
        match self.register_at(pair, &name, count) {
            Some(pair) => self.start_creation(pair, reply),
            None => {
                let Some((conn, slot)) = reply else {
                    return;
                };
                let text = format!("topic pair {pair} was taken by another DECLARE; retry");
                let response = Response::err(ErrorCode::InternalError, Op::Declare as u8, text);
                self.effects.push(Effect::Answer {
                    conn,
                    slot,
                    response,
                });
            }
        }
    }

    fn apply_delete(&mut self, pair: u16, name: &[u8], reply: Option<(ConnRef, u64)>, now: Now) {
        let name = String::from_utf8_lossy(name).into_owned();
        let found = self
            .registry()
            .lookup(&name)
            .filter(|p| p.pair == pair)
            .cloned();
        let response = match found {
            Some(found) => {
                self.delete_pair(&found, now);
                let applied = &mut self.cluster_mut().applied;
                applied.topic_deleted(found.source_id());
                applied.topic_deleted(found.twin_id());
                let Some(reply) = reply else {
                    return;
                };
                let version = self.registry_version();
                let response = declared(&found, DeclareCreated::Deleted);
                return self.answer_registry_at(version, reply, response);
            }
            None => {
                let text = format!("no topic '{name}'");
                Response::err(ErrorCode::UnknownTopic, Op::Declare as u8, text)
            }
        };
        if let Some((conn, slot)) = reply {
            self.effects.push(Effect::Answer {
                conn,
                slot,
                response,
            });
        }
    }
}
