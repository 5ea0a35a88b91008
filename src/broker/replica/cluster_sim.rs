//! Three cluster-mode [`Broker`]s in one process (`docs/REPLICATION.md` §10 increment
//! 4), each over its own `SimDisk`: the test carries their peer messages (or loses them),
//! ticks them, and runs every job they submit as soon as it is submitted.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::machine::{test_address, test_config, ReplicaConfig, ReplicaOptions};
use super::PeerMessage;
use crate::broker::dlq::split_origin;
use crate::broker::manage::{Change, ChangeDone, ManageError, ManageErrorKind, ResetTo};
use crate::broker::{
    unlimited_room, Broker, BrokerConfig, ConnRef, DurableJob, Effect, Handled, JobSink, Now,
};
use crate::fsync::{Completion, Job as _};
use crate::log::simdisk::SimDisk;
use crate::log::{LogConfig, Storage};
use crate::wire::limits::SUB_PARTITION_ANY;
use crate::wire::ops::{ControlAck, Declare, DeliveryRef, Heartbeat, Pub, PubResult, Sub};
use crate::wire::AckFlags;
use crate::wire::{
    ControlResult, DeclareFlags, Durability, ErrorCode, HeartbeatState, NackReason, Op, PubFlags,
    PubResultFlags, Response,
};

const NODES: u64 = 3;
const ELECTION_TICKS: usize = 10;
const TICK_MS: u64 = 50;
const HOUSEKEEPING_INTERVAL_MS: u64 = 1_000;
/// Rounds (a tick, then messages and jobs until quiet) a test may take to reach its
/// condition.
const ROUNDS_MAX: usize = 500;
/// Passes of every node within one round before the harness calls the network busy
/// forever.
const PASSES_PER_ROUND_MAX: usize = 10_000;
/// A node's passes at one instant that each leave new jobs: far more than any real
/// chain of completions (a topic's files, then its registry write) needs.
const PASSES_WITH_JOBS_MAX: usize = 1_000;
const CONN: ConnRef = ConnRef { id: 1, serial: 1 };
/// Small journal files, so that a few hundred KiB of records fill several.
const JOURNAL_FILE_BYTES: u64 = 64 * 1024;

/// Holds what a broker submits until the harness runs it.
#[derive(Clone, Default)]
struct Jobs(Rc<RefCell<Vec<DurableJob>>>);

impl JobSink for Jobs {
    fn submit(&self, job: DurableJob) {
        self.0.borrow_mut().push(job);
    }
}

/// What a node told its peers that a restart must not take back: the highest term of a
/// message it sent and the last vote it granted. Raft sends a node's messages only once
/// its term and vote are persisted (a leader's appends in a term it persisted when it
/// campaigned), so a node that comes back below them could vote twice in one term.
/// Pre-votes are left out: they carry a term the sender has not taken.
#[derive(Debug, Default, Clone, Copy)]
struct Promised {
    term: u64,
    /// (term, candidate) of the last vote granted.
    vote: Option<(u64, u64)>,
}

impl Promised {
    fn note(&mut self, m: &PeerMessage) {
        use raft::eraftpb::MessageType;
        let kind = m.get_msg_type();
        if matches!(
            kind,
            MessageType::MsgRequestPreVote | MessageType::MsgRequestPreVoteResponse
        ) {
            return;
        }
        self.term = self.term.max(m.term);
        if kind == MessageType::MsgRequestVoteResponse && !m.reject {
            self.vote = Some((m.term, m.to));
        }
    }

    /// Node `i`, just started again, kept these promises (a node installing a snapshot
    /// keeps its term and vote in the install marker and runs no raft until it is in).
    fn check_kept(&self, i: usize, node: &Node) {
        let status = node.broker.cluster_status().unwrap();
        if status.role == "installing" {
            return;
        }
        assert!(
            status.term >= self.term,
            "node {i} came back at term {}, below term {} it had sent messages in",
            status.term,
            self.term
        );
        if let Some((term, candidate)) = self.vote.filter(|&(t, _)| t == status.term) {
            let vote = node.broker.cluster.as_deref().unwrap().replica.vote();
            assert_eq!(
                vote, candidate,
                "node {i} came back in term {term} having voted for {vote}, not for node \
                 {candidate} as it had"
            );
        }
    }
}

struct Node {
    disk: SimDisk,
    broker: Broker,
    jobs: Jobs,
    inbox: VecDeque<PeerMessage>,
    /// INSTALL frames' bodies, with their sender's id.
    install_inbox: VecDeque<(u64, Vec<u8>)>,
    /// Process restarts the broker asked for (`restart_requested`), each with what the
    /// role gate said right after it.
    restarts: Vec<Result<(), (ErrorCode, String)>>,
    /// Partitioned away: what it sends and what is sent to it is lost.
    isolated: bool,
    /// Its raft messages, both ways, are lost; INSTALL frames still pass.
    raft_cut: bool,
    promised: Promised,
    /// Answers by slot.
    answers: BTreeMap<u64, Response>,
    /// NOTICEs and MSGs pushed, in order.
    pushes: Vec<Effect>,
    /// Operator changes answered, by ticket.
    changes: BTreeMap<u64, Result<ChangeDone, ManageError>>,
    /// How far this node's wall clock stands from the net's (a clock set wrong, a step).
    wall_skew_ms: i64,
}

fn open_node_on(id: u64, disk: SimDisk) -> Node {
    open_node_with(id, disk, ReplicaOptions::default())
}

fn open_node_with(id: u64, disk: SimDisk, options: ReplicaOptions) -> Node {
    open_node_retaining(id, disk, options, Kept::default(), LogConfig::default())
}

/// The harness's `--producer-ttl`.
pub(super) const PRODUCER_TTL_MS: u64 = 60_000;

/// What a node keeps, and for how long.
#[derive(Debug, Clone, Copy)]
struct Kept {
    /// Journal a leader keeps for a laggard before it offers a snapshot.
    journal_retain_bytes: u64,
    /// `--producer-ttl`.
    producer_ttl_ms: u64,
    /// `--group-ttl`.
    group_ttl_ms: u64,
}

impl Default for Kept {
    fn default() -> Kept {
        Kept {
            journal_retain_bytes: u64::MAX,
            producer_ttl_ms: PRODUCER_TTL_MS,
            group_ttl_ms: crate::consume::ConsumeConfig::default().group_ttl_ms,
        }
    }
}

/// A node that keeps what `kept` says.
fn open_node_retaining(
    id: u64,
    disk: SimDisk,
    options: ReplicaOptions,
    kept: Kept,
    log: LogConfig,
) -> Node {
    try_open_node(id, disk, options, kept, log).unwrap()
}

fn try_open_node(
    id: u64,
    disk: SimDisk,
    options: ReplicaOptions,
    kept: Kept,
    log: LogConfig,
) -> Result<Node, String> {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let config = BrokerConfig {
        data_dir: Path::new("/data").to_path_buf(),
        durability: Durability::Replicated,
        max_partitions: 8,
        journal_file_bytes: JOURNAL_FILE_BYTES,
        producer_ttl_ms: kept.producer_ttl_ms,
        consume: crate::consume::ConsumeConfig {
            group_ttl_ms: kept.group_ttl_ms,
            ..crate::consume::ConsumeConfig::default()
        },
        log,
        // Only a checkpoint writes the positions file within a test.
        commit_interval_ms: 3_600_000,
        ..BrokerConfig::default()
    };
    let replica = ReplicaConfig {
        election_ticks: ELECTION_TICKS,
        journal_file_bytes: JOURNAL_FILE_BYTES,
        journal_retain_bytes: kept.journal_retain_bytes,
        ..test_config(id, NODES)
    };
    let jobs = Jobs::default();
    let sink = Box::new(jobs.clone());
    let (broker, _) =
        Broker::open_cluster(config, (replica, options), storage, sink, Now::default())?;
    Ok(Node {
        disk,
        broker,
        jobs,
        inbox: VecDeque::new(),
        install_inbox: VecDeque::new(),
        restarts: Vec::new(),
        isolated: false,
        raft_cut: false,
        promised: Promised::default(),
        answers: BTreeMap::new(),
        pushes: Vec::new(),
        changes: BTreeMap::new(),
        wall_skew_ms: 0,
    })
}

struct Net {
    nodes: Vec<Node>,
    now: Now,
    /// INSTALL frames still delivered; `None`: all are.
    install_frames_left: Option<usize>,
    /// What every node keeps (journal for a laggard, producers, groups), from its next
    /// start on.
    kept: Kept,
    /// Election timeouts drawn from this seed (and the count of nodes opened) instead of
    /// raft's own generator, so that a seeded run replays.
    election_seed: Option<u64>,
    opened: u64,
    /// Every node's segment size and retention.
    log_config: LogConfig,
}

impl Net {
    fn new() -> Net {
        Net::with_options(ReplicaOptions::default())
    }

    fn with_options(options: ReplicaOptions) -> Net {
        let open = |id| open_node_with(id, SimDisk::seeded(id), options.clone());
        let nodes = (1..=NODES).map(open).collect();
        Net {
            nodes,
            now: Now::default(),
            install_frames_left: None,
            kept: Kept::default(),
            election_seed: None,
            opened: 0,
            log_config: LogConfig::default(),
        }
    }

    /// Nodes whose leader keeps `journal_retain_bytes` of journal for a laggard, node
    /// `id`'s disk seeded with `disk_seed + id`.
    fn retaining(journal_retain_bytes: u64, disk_seed: u64, election_seed: Option<u64>) -> Net {
        let log_config = LogConfig::default();
        let kept = Kept {
            journal_retain_bytes,
            ..Kept::default()
        };
        Net::opened(kept, disk_seed, election_seed, log_config)
    }

    /// Nodes whose partitions have `log_config`'s segment size and retention.
    fn with_log(log_config: LogConfig) -> Net {
        Net::opened(Kept::default(), 0, None, log_config)
    }

    /// Nodes opened with what they keep.
    fn opened(
        kept: Kept,
        disk_seed: u64,
        election_seed: Option<u64>,
        log_config: LogConfig,
    ) -> Net {
        let no_crash = |_: &mut Net, _: u64, _: &SimDisk| {};
        Net::opened_after(kept, (disk_seed, election_seed), log_config, no_crash)
    }

    /// [`Net::opened`], with `before_start(net, id, disk)` run before each node's first
    /// start that lives (the seeds crash some starts there).
    fn opened_after(
        kept: Kept,
        (disk_seed, election_seed): (u64, Option<u64>),
        log_config: LogConfig,
        mut before_start: impl FnMut(&mut Net, u64, &SimDisk),
    ) -> Net {
        let mut net = Net {
            nodes: Vec::new(),
            now: Now::default(),
            install_frames_left: None,
            kept,
            election_seed,
            opened: 0,
            log_config,
        };
        for id in 1..=NODES {
            let disk = SimDisk::seeded(disk_seed + id);
            before_start(&mut net, id, &disk);
            let node = net.open(id, disk);
            net.nodes.push(node);
        }
        net
    }

    /// Node `id` opened on `disk` with what the net keeps and its election seed.
    /// A disk that was failing heals first: a start that failed on it would be tried
    /// again by the node's supervisor until it succeeds. A crash point set and not
    /// reached goes too (start-up is not crashed), and one reached was the old process's.
    fn open(&mut self, id: u64, disk: SimDisk) -> Node {
        let options = self.next_start(id, &disk);
        open_node_retaining(id, disk, options, self.kept, self.log_config)
    }

    /// Node `id` starts on `disk` and dies at its disk's change `changes` from now, if
    /// the start makes that many: whether it did (the start is gone either way).
    fn start_crashed(&mut self, id: u64, disk: &SimDisk, changes: u64) -> bool {
        let options = self.next_start(id, disk);
        disk.crash_after(changes);
        let opened = try_open_node(id, disk.clone(), options, self.kept, self.log_config);
        let crashed = disk.crashed();
        assert!(
            crashed || opened.is_ok(),
            "node {id} did not start: {:?}",
            opened.err()
        );
        disk.restarted();
        crashed
    }

    /// A start of node `id` on `disk`: the disk healed, the old process's crash point
    /// gone, and the options of this start (its own election seed).
    fn next_start(&mut self, id: u64, disk: &SimDisk) -> ReplicaOptions {
        disk.set_faults(crate::log::simdisk::FaultRates::default());
        disk.restarted();
        self.opened += 1;
        ReplicaOptions {
            election_seed: self.election_seed.map(|s| s ^ (self.opened << 40) ^ id),
            ..ReplicaOptions::default()
        }
    }

    /// Node `i` reads its inbox and ends its pass, its jobs run and it passes again until
    /// none is left; what it sends is routed.
    fn pass(&mut self, i: usize) {
        for _ in 0..PASSES_WITH_JOBS_MAX {
            let now = self.now_of(i);
            let node = &mut self.nodes[i];
            while let Some(m) = node.inbox.pop_front() {
                // An honest node's message is never taken for a lie (`replica::vet`).
                if let Err(refused) = node.broker.peer_message(m) {
                    panic!("node {i} refused an honest peer's message: {refused:?}");
                }
            }
            while let Some((from, body)) = node.install_inbox.pop_front() {
                node.broker.peer_install(from, &body, now);
            }
            node.broker.end_pass(now, &unlimited_room);
            node.broker.check_invariants();
            let mut effects = Vec::new();
            node.broker.drain_effects(&mut effects);
            for e in effects {
                match e {
                    Effect::Answer { slot, response, .. } => assert!(
                        node.answers.insert(slot, response).is_none(),
                        "slot {slot} twice"
                    ),
                    push @ (Effect::Notice { .. } | Effect::Deliver { .. }) => {
                        node.pushes.push(push)
                    }
                    Effect::PullAnswer { .. } => {}
                }
            }
            for (ticket, result) in node.broker.take_manage_done() {
                let twice = node.changes.insert(ticket, result);
                assert!(twice.is_none(), "ticket {ticket} answered twice");
            }
            let mut out = Vec::new();
            node.broker.drain_peer_messages(&mut out);
            let mut frames = Vec::new();
            node.broker.drain_install_frames(&mut frames);
            let lost = node.isolated;
            self.route_raft(i, out);
            for (to, body) in frames {
                let to = &mut self.nodes[to as usize - 1];
                let budget = self.install_frames_left.as_mut();
                if budget.is_some_and(|left| left.checked_sub(1).map(|l| *left = l).is_none()) {
                    continue;
                }
                if !lost && !to.isolated {
                    to.install_inbox.push_back((i as u64 + 1, body));
                }
            }
            let jobs: Vec<DurableJob> = self.nodes[i].jobs.0.borrow_mut().drain(..).collect();
            if jobs.is_empty() {
                return self.restart_if_asked(i);
            }
            for mut job in jobs {
                let result = job.run();
                let elapsed = Duration::from_micros(50);
                let done = Completion {
                    job,
                    result,
                    elapsed,
                };
                self.nodes[i].broker.job_done(done, now);
            }
        }
        panic!(
            "node {i} took new jobs in {PASSES_WITH_JOBS_MAX} passes at one instant: a job \
             that fails is taken again by the pass its failure starts"
        );
    }

    /// Node `i`'s raft messages to their inboxes, unless a link is down: then the
    /// sender's reactor cannot queue one, and says so.
    fn route_raft(&mut self, i: usize, out: Vec<PeerMessage>) {
        let raft_lost = self.nodes[i].isolated || self.nodes[i].raft_cut;
        for m in out {
            self.nodes[i].promised.note(&m);
            let to = &mut self.nodes[m.to as usize - 1];
            if !raft_lost && !to.isolated && !to.raft_cut {
                to.inbox.push_back(m);
            } else {
                self.nodes[i].broker.peer_unreachable(&m);
            }
        }
    }

    /// `mortard` re-executes itself when its broker asks: here the node opens again on
    /// its disk, as it is (no power cut).
    fn restart_if_asked(&mut self, i: usize) {
        if !self.nodes[i].broker.restart_requested() {
            return;
        }
        let failed = &self.cluster(i).failed;
        assert!(
            failed.is_none(),
            "node {i} restarts after failing: {failed:?}"
        );
        let (disk, isolated) = (self.nodes[i].disk.clone(), self.nodes[i].isolated);
        let (raft_cut, wall_skew_ms) = (self.nodes[i].raft_cut, self.nodes[i].wall_skew_ms);
        let mut restarts = std::mem::take(&mut self.nodes[i].restarts);
        let promised = self.nodes[i].promised;
        self.nodes[i] = self.open(i as u64 + 1, disk);
        promised.check_kept(i, &self.nodes[i]);
        self.nodes[i].promised = promised;
        restarts.push(self.nodes[i].broker.admit(Op::Pub, self.now));
        self.nodes[i].restarts = restarts;
        self.nodes[i].isolated = isolated;
        self.nodes[i].raft_cut = raft_cut;
        self.nodes[i].wall_skew_ms = wall_skew_ms;
        self.links_up(i);
    }

    /// Node `i` started again and its links came up: each side's HELLO names its log's
    /// end.
    fn links_up(&mut self, i: usize) {
        let id = i as u64 + 1;
        let last = |n: &Node| n.broker.cluster_status().unwrap().last_index;
        let restarted_last = last(&self.nodes[i]);
        for j in (0..self.nodes.len()).filter(|&j| j != i) {
            let other_last = last(&self.nodes[j]);
            self.nodes[j].broker.peer_up(id, None, Some(restarted_last));
            self.nodes[i]
                .broker
                .peer_up(j as u64 + 1, None, Some(other_last));
        }
    }

    /// Passes every node until no inbox holds anything.
    fn deliver(&mut self) {
        for _ in 0..PASSES_PER_ROUND_MAX {
            for i in 0..self.nodes.len() {
                self.pass(i);
            }
            if (self.nodes.iter()).all(|n| n.inbox.is_empty() && n.install_inbox.is_empty()) {
                return;
            }
        }
        panic!("the network never quietens");
    }

    /// One raft tick; every [`HOUSEKEEPING_INTERVAL_MS`], housekeeping too, as the
    /// reactor runs it (dead letters proposed again, expiry).
    fn tick(&mut self) {
        self.now.mono_ms += TICK_MS;
        self.now.wall_ms += TICK_MS;
        for n in &mut self.nodes {
            n.broker.raft_tick();
        }
        if self.now.mono_ms.is_multiple_of(HOUSEKEEPING_INTERVAL_MS) {
            self.housekeeping_everywhere();
        }
    }

    /// What node `i`'s clocks read: the net's, its wall clock off by its skew.
    fn now_of(&self, i: usize) -> Now {
        let skew = self.nodes[i].wall_skew_ms;
        Now {
            wall_ms: self.now.wall_ms.saturating_add_signed(skew),
            ..self.now
        }
    }

    /// Ticks and delivers until `done`, at most `ROUNDS_MAX` times.
    fn run_until(&mut self, what: &str, done: impl Fn(&Net) -> bool) {
        self.deliver();
        for _ in 0..ROUNDS_MAX {
            if done(self) {
                return;
            }
            self.tick();
            self.deliver();
        }
        panic!("never: {what}");
    }

    /// A node that leads and serves (its log applied), other than `not`.
    fn serving_leader(&self, not: Option<usize>) -> Option<usize> {
        (0..self.nodes.len())
            .find(|&i| Some(i) != not && self.nodes[i].broker.admit(Op::Pub, self.now).is_ok())
    }

    fn settled_leader(&mut self) -> usize {
        self.run_until("a serving leader", |n| n.serving_leader(None).is_some());
        self.serving_leader(None).unwrap()
    }

    /// A serving leader and topic "orders" on it, holding one record at sequence 1: from
    /// `producer_id` (its producer_seq 1) with `value`.
    fn leader_with_one_record(&mut self, producer_id: u64, value: &str) -> (usize, u16) {
        let l = self.settled_leader();
        let topic = self.declare(l, "orders");
        self.publish(l, 1, topic, (producer_id, 1), value);
        assert_eq!(pub_ok(&self.wait_answer(l, 1)).sequence, 1);
        (l, topic)
    }

    /// DECLAREs a one-partition topic on node `i` and waits for its answer.
    fn declare(&mut self, i: usize, name: &str) -> u16 {
        self.declare_partitions(i, name, 1)
    }

    /// DECLAREs a topic of `partitions` on node `i` and waits for its answer.
    fn declare_partitions(&mut self, i: usize, name: &str, partitions: u16) -> u16 {
        let d = Declare {
            topic: name.as_bytes(),
            partition_count: partitions,
            flags: DeclareFlags::empty(),
        };
        let slot = 1_000 + self.nodes[i].answers.len() as u64;
        let now = self.now_of(i);
        let handled = self.nodes[i].broker.declare(CONN, slot, &d, now);
        assert!(matches!(handled, Handled::Wait));
        self.run_until("the DECLARE's answer", |n| {
            n.nodes[i].answers.contains_key(&slot)
        });
        match &self.nodes[i].answers[&slot] {
            Response::Declare(r) => r.topic_id,
            other => panic!("DECLARE answered {other:?}"),
        }
    }

    fn publish(&mut self, i: usize, slot: u64, topic: u16, producer: (u64, u64), value: &str) {
        self.publish_to(i, slot, (topic, 0), producer, value);
    }

    fn publish_to(
        &mut self,
        i: usize,
        slot: u64,
        (topic, partition): (u16, u16),
        producer: (u64, u64),
        value: &str,
    ) {
        let p = Pub {
            topic_id: topic,
            partition,
            flags: PubFlags::empty(),
            producer_id: producer.0,
            producer_seq: producer.1,
            key: b"",
            value: value.as_bytes(),
        };
        let now = self.now_of(i);
        match self.nodes[i].broker.publish(CONN, slot, &p, now) {
            Handled::Wait => {}
            Handled::Answer(r) => {
                self.nodes[i].answers.insert(slot, r);
            }
        }
    }

    fn wait_answer(&mut self, i: usize, slot: u64) -> Response {
        self.run_until("an answer", |n| n.nodes[i].answers.contains_key(&slot));
        self.nodes[i].answers[&slot].clone()
    }

    /// The next sequence node `i`'s partition 0 of `topic` appends at.
    fn next_sequence(&self, i: usize, topic: u16) -> u64 {
        self.next_sequence_of(i, topic)
    }

    /// The same for any topic id, a twin's included; 0 where the partition is not open
    /// (a node wiped or installing).
    fn next_sequence_of(&self, i: usize, topic_id: u16) -> u64 {
        self.next_sequence_at(i, (topic_id, 0))
    }

    /// The same for any partition.
    fn next_sequence_at(&self, i: usize, (topic_id, partition): (u16, u16)) -> u64 {
        let part = self.nodes[i].broker.partition(topic_id, partition);
        part.map_or(0, |p| p.log.next_sequence())
    }

    /// Every node's partition 0 of `topic` holds records up to `next − 1`.
    fn all_at(&self, topic: u16, next: u64) -> bool {
        (0..self.nodes.len()).all(|i| self.next_sequence(i, topic) == next)
    }

    /// Node `i`'s record at `sequence` of partition 0: `(producer_id, value)`.
    fn record(&mut self, i: usize, topic: u16, sequence: u64) -> Option<(u64, String)> {
        let r = self.nodes[i]
            .broker
            .read_record(topic, 0, sequence)
            .unwrap()?;
        Some((r.producer_id, String::from_utf8(r.value).unwrap()))
    }

    /// The timestamp node `i`'s record at `sequence` of partition 0 carries.
    fn record_timestamp(&mut self, i: usize, topic: u16, sequence: u64) -> u64 {
        let r = self.nodes[i]
            .broker
            .read_record(topic, 0, sequence)
            .unwrap();
        r.expect("the record").timestamp_ms
    }

    /// Housekeeping on every node now, each on its own clocks.
    fn housekeeping_everywhere(&mut self) {
        for i in 0..self.nodes.len() {
            let now = self.now_of(i);
            self.nodes[i].broker.housekeeping(now);
        }
    }

    /// The producers node `i` knows on partition 0 of `topic`.
    fn producers_known(&self, i: usize, topic: u16) -> usize {
        let part = self.nodes[i].broker.partition(topic, 0).unwrap();
        part.producers.len()
    }

    /// Node `l` leads again while `n` is cut off: the third node must first be out of
    /// `n`'s lease to vote (check-quorum), then `l` campaigns.
    fn lead_again(&mut self, l: usize, n: usize) {
        let third = (0..3).find(|&i| i != l && i != n).unwrap();
        self.nodes[n].isolated = true;
        self.nodes[third].isolated = true;
        for _ in 0..ELECTION_TICKS {
            self.nodes[third].broker.raft_tick();
            self.pass(third);
        }
        self.nodes[third].isolated = false;
        let cluster = self.nodes[l].broker.cluster.as_deref_mut().unwrap();
        cluster.replica_mut().campaign().unwrap();
        self.run_until("the old leader serves again", |net| {
            net.serving_leader(Some(n)) == Some(l)
        });
    }

    /// Subscribes `CONN` to group `g` of `topic` on node `i`, any partition.
    fn join_g(&mut self, i: usize, topic: u16) {
        self.join_g_on(i, topic, CONN);
    }

    /// The same on connection `conn`.
    fn join_g_on(&mut self, i: usize, topic: u16, conn: ConnRef) {
        let sub = Sub {
            group: b"g",
            topic_id: topic,
            partition: SUB_PARTITION_ANY,
            ..Sub::default()
        };
        let _ = self.nodes[i].broker.subscribe(conn, &sub, self.now);
    }

    /// Joins group `g` on node `i` and returns its first MSG, CONTROL_ACKing the
    /// NOTICEs that come before it.
    fn first_delivery(&mut self, i: usize, topic: u16) -> DeliveryRef {
        self.join_g(i, topic);
        loop {
            self.deliver();
            if let Some(&first) = self.take_deliveries(i).first() {
                return first;
            }
            self.tick();
        }
    }

    /// The MSGs node `i` pushed since the last call, CONTROL_ACKing its NOTICEs.
    fn take_deliveries(&mut self, i: usize) -> Vec<DeliveryRef> {
        let mut delivered = Vec::new();
        for push in std::mem::take(&mut self.nodes[i].pushes) {
            match push {
                Effect::Notice { notice, .. } => {
                    let answer = ControlAck::answering(&notice, ControlResult::Ok);
                    let _ = self.nodes[i].broker.control_ack(CONN, &answer, self.now);
                }
                Effect::Deliver { delivery, .. } => delivered.push(delivery.reference),
                _ => {}
            }
        }
        delivered
    }

    /// Node `i`'s dead letter at `sequence` of `twin` partition 0: its original value
    /// and origin sequence.
    fn dead_letter(&mut self, i: usize, twin: u16, sequence: u64) -> (Vec<u8>, u64) {
        let broker = &mut self.nodes[i].broker;
        let record = broker.read_record(twin, 0, sequence).unwrap().unwrap();
        let (value, origin) = split_origin(record.flags, &record.value);
        (
            value.to_vec(),
            origin.expect("a dead letter").origin_sequence,
        )
    }

    fn cluster(&self, i: usize) -> &super::cluster::Cluster {
        self.nodes[i].broker.cluster.as_deref().unwrap()
    }

    /// Node `i`'s raft journal files.
    fn journal_files(&self, i: usize) -> usize {
        let dir = Path::new("/data").join(super::storage::RAFT_JOURNAL_DIR);
        let names = self.nodes[i].disk.list_dir(&dir).unwrap();
        names.iter().filter(|n| n.ends_with(".jnl")).count()
    }

    /// PUBs `count` records of 4,000 bytes on node `l` from producer 3, from `first`,
    /// each answered OK before the next.
    fn publish_many(&mut self, l: usize, topic: u16, first: u64, count: u64) {
        let value = "v".repeat(4_000);
        for seq in first..first + count {
            self.publish(l, seq, topic, (3, seq), &value);
            assert_eq!(pub_ok(&self.wait_answer(l, seq)).sequence, seq);
        }
    }

    /// Node `i`'s committed position of group `g` on `topic` partition 0, live or
    /// restored.
    fn position(&self, i: usize, topic: u16) -> Option<u64> {
        let positions = self.nodes[i].broker.coordinator().positions();
        let p = positions
            .iter()
            .find(|p| p.group == b"g" && p.topic_id == topic)?;
        Some(p.committed)
    }

    fn term(&self, i: usize) -> u64 {
        self.nodes[i].broker.cluster_status().unwrap().term
    }

    /// An operator change on node `i` as `ticket`, and its answer once durable.
    fn change(&mut self, i: usize, ticket: u64, change: Change) -> Result<ChangeDone, ManageError> {
        self.nodes[i].broker.change(ticket, &change, self.now)?;
        self.run_until("the change's answer", |n| {
            n.nodes[i].changes.contains_key(&ticket)
        });
        self.nodes[i].changes.remove(&ticket).unwrap()
    }

    /// Joins group `g` on leader `l` and acknowledges every record delivered until its
    /// committed position is `upto`; then the member's connection closes, leaving a group
    /// without members that an operator may change.
    fn consume_upto(&mut self, l: usize, topic: u16, upto: u64) {
        self.join_g(l, topic);
        for _ in 0..ROUNDS_MAX {
            self.deliver();
            if self.position(l, topic) == Some(upto) {
                let now = self.now;
                self.nodes[l].broker.connection_closed(CONN, now);
                return self.deliver();
            }
            for push in std::mem::take(&mut self.nodes[l].pushes) {
                let (broker, now) = (&mut self.nodes[l].broker, self.now);
                match push {
                    Effect::Notice { notice, .. } => {
                        let answer = ControlAck::answering(&notice, ControlResult::Ok);
                        let _ = broker.control_ack(CONN, &answer, now);
                    }
                    Effect::Deliver { delivery, .. } => {
                        let ack = delivery.reference.ack(AckFlags::empty());
                        let _ = broker.ack(CONN, &ack, now);
                    }
                    _ => {}
                }
            }
            self.tick();
        }
        panic!("never acknowledged up to {upto}");
    }
}

fn pub_ok(response: &Response) -> PubResult {
    match response {
        Response::Pub(r) => *r,
        other => panic!("PUB answered {other:?}"),
    }
}

fn error_code(response: &Response) -> Option<ErrorCode> {
    response.error_code()
}

#[test]
fn a_pub_on_the_leader_is_answered_only_after_commit_and_every_node_holds_it() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let followers: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    for &f in &followers {
        net.nodes[f].isolated = true;
    }
    net.publish(l, 1, topic, (5, 1), "a");
    net.publish(l, 2, topic, (5, 2), "b");
    for _ in 0..3 {
        net.tick();
        net.deliver();
    }
    assert!(
        !net.nodes[l].answers.contains_key(&1),
        "answered before a majority had it"
    );
    assert_eq!(
        net.record(l, topic, 1),
        None,
        "written to a segment before commit"
    );
    for &f in &followers {
        net.nodes[f].isolated = false;
    }
    let (a, b) = (net.wait_answer(l, 1), net.wait_answer(l, 2));
    let (a, b) = (pub_ok(&a), pub_ok(&b));
    assert_eq!((a.sequence, b.sequence), (1, 2));
    assert_eq!(a.durability, Durability::Replicated.as_code());
    assert_eq!(a.leader_epoch, net.term(l));
    assert!(a.commit_seq >= 1 && b.commit_seq >= 2);
    assert!(a.result_flags.is_empty());
    net.run_until("every node applied both", |n| n.all_at(topic, 3));
    for i in 0..3 {
        assert_eq!(net.record(i, topic, 1), Some((5, "a".into())), "node {i}");
        assert_eq!(net.record(i, topic, 2), Some((5, "b".into())), "node {i}");
    }
}

#[test]
fn a_follower_turns_requests_away_naming_the_leader() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let leader_id = l as u64 + 1;
    for f in (0..3).filter(|&i| i != l) {
        let broker = &net.nodes[f].broker;
        for op in [Op::Pub, Op::Declare, Op::Sub, Op::Ack] {
            let (code, text) = broker.admit(op, net.now).unwrap_err();
            assert_eq!(code, ErrorCode::NotLeader);
            assert_eq!(
                text,
                format!("leader {leader_id} {}", test_address(leader_id))
            );
        }
        assert_eq!(broker.admit(Op::Ping, net.now), Ok(()));
        let status = broker.cluster_status().unwrap();
        assert_eq!(status.leader_id, Some(leader_id));
        assert!(!status.is_leader);
    }
    assert_eq!(net.nodes[l].broker.admit(Op::Pub, net.now), Ok(()));
}

#[test]
fn a_producer_resending_after_a_failover_is_deduplicated() {
    let mut net = Net::new();
    let (l, topic) = net.leader_with_one_record(9, "x");
    net.run_until("every node applied it", |n| {
        (0..3).all(|i| n.nodes[i].broker.cluster_status().unwrap().applied_index > 0)
            && n.all_at(topic, 2)
    });
    // The leader dies (cut off); the producer, unsure, resends to the new one.
    net.nodes[l].isolated = true;
    net.run_until("a new leader", |n| n.serving_leader(Some(l)).is_some());
    let n = net.serving_leader(Some(l)).unwrap();
    net.publish(n, 2, topic, (9, 1), "x");
    let again = pub_ok(&net.wait_answer(n, 2));
    assert_eq!(again.sequence, 1);
    assert_eq!(again.result_flags, PubResultFlags::DEDUPLICATED);
    assert_eq!(again.leader_epoch, net.term(n));
    net.publish(n, 3, topic, (9, 2), "y");
    assert_eq!(pub_ok(&net.wait_answer(n, 3)).sequence, 2);
    net.nodes[l].isolated = false;
    net.run_until("the old leader caught up", |net| {
        net.next_sequence(l, topic) == 3
    });
    for i in 0..3 {
        assert_eq!(net.record(i, topic, 1), Some((9, "x".into())), "node {i}");
        assert_eq!(net.record(i, topic, 2), Some((9, "y".into())), "node {i}");
    }
}

#[test]
fn a_truncated_proposals_sequences_and_producer_seqs_are_handed_out_again() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    // Cut off, the leader takes two PUBs into an entry nobody else gets.
    net.nodes[l].isolated = true;
    net.publish(l, 1, topic, (7, 1), "old-1");
    net.publish(l, 2, topic, (7, 2), "old-2");
    net.run_until("a new leader, the old one deposed", |net| {
        net.serving_leader(Some(l)).is_some()
            && !net.nodes[l].broker.cluster_status().unwrap().is_leader
    });
    for slot in [1, 2] {
        let code = error_code(&net.nodes[l].answers[&slot]);
        assert_eq!(code, Some(ErrorCode::NotEnoughReplicasAfterAppend));
    }
    let n = net.serving_leader(Some(l)).unwrap();
    net.publish(n, 3, topic, (8, 1), "new-1");
    assert_eq!(pub_ok(&net.wait_answer(n, 3)).sequence, 1);
    net.nodes[l].isolated = false;
    net.run_until("the old leader took the new entries", |net| {
        net.next_sequence(l, topic) == 2
    });
    net.lead_again(l, n);
    net.publish(l, 4, topic, (7, 1), "again-1");
    net.publish(l, 5, topic, (7, 2), "again-2");
    let (a, b) = (
        pub_ok(&net.wait_answer(l, 4)),
        pub_ok(&net.wait_answer(l, 5)),
    );
    assert_eq!((a.sequence, b.sequence), (2, 3));
    assert!(
        a.result_flags.is_empty(),
        "a truncated PUB counted as stored"
    );
    net.nodes[n].isolated = false;
    net.run_until("every node applied it", |net| net.all_at(topic, 4));
    for i in 0..3 {
        assert_eq!(
            net.record(i, topic, 1),
            Some((8, "new-1".into())),
            "node {i}"
        );
        assert_eq!(
            net.record(i, topic, 2),
            Some((7, "again-1".into())),
            "node {i}"
        );
        assert_eq!(
            net.record(i, topic, 3),
            Some((7, "again-2".into())),
            "node {i}"
        );
    }
}

#[test]
fn a_replicated_pub_on_a_leader_that_hears_no_majority_gets_not_enough_replicas() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.nodes[l].isolated = true;
    let p = |flags| Pub {
        topic_id: topic,
        partition: 0,
        flags,
        producer_id: 0,
        producer_seq: 0,
        key: b"",
        value: b"v",
    };
    let replicated = PubFlags::requesting(Some(Durability::Replicated));
    let refused = loop {
        let status = net.nodes[l].broker.cluster_status().unwrap();
        assert!(status.is_leader, "stepped down before refusing");
        let now = net.now;
        match net.nodes[l].broker.publish(CONN, 1, &p(replicated), now) {
            Handled::Answer(r) => break r,
            Handled::Wait => {}
        }
        net.tick();
        net.pass(l);
    };
    assert_eq!(error_code(&refused), Some(ErrorCode::NotEnoughReplicas));
}

#[test]
fn a_delete_is_applied_on_every_node() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish(l, 1, topic, (0, 0), "gone");
    pub_ok(&net.wait_answer(l, 1));
    let d = Declare {
        topic: b"orders",
        partition_count: 0,
        flags: DeclareFlags::DELETE,
    };
    let handled = net.nodes[l].broker.declare(CONN, 2, &d, net.now);
    assert!(matches!(handled, Handled::Wait));
    match net.wait_answer(l, 2) {
        Response::Declare(r) => assert_eq!(r.topic_id, topic),
        other => panic!("DELETE answered {other:?}"),
    }
    net.run_until("every node deleted it", |net| {
        net.nodes
            .iter()
            .all(|n| n.broker.registry().lookup("orders").is_none())
    });
    for i in 0..3 {
        assert!(
            net.nodes[i].broker.partition(topic, 0).is_none(),
            "node {i}"
        );
    }
}

#[test]
fn a_restarted_node_applies_the_log_again_without_doubling_a_record() {
    let mut net = Net::new();
    let (l, topic) = net.leader_with_one_record(3, "a");
    let f = (0..3).find(|&i| i != l).unwrap();
    let next = |net: &Net| net.next_sequence(f, topic);
    net.run_until("the follower applied it", |net| next(net) == 2);
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    assert_eq!(next(&net), 2, "the segment kept what was applied");
    net.publish(l, 2, topic, (3, 2), "b");
    assert_eq!(pub_ok(&net.wait_answer(l, 2)).sequence, 2);
    net.run_until("the restarted follower applied the log again", |net| {
        net.nodes[f].broker.cluster_status().unwrap().applied_index
            == net.nodes[l].broker.cluster_status().unwrap().applied_index
    });
    assert_eq!(next(&net), 3);
    let gate = net.nodes[f].broker.admit(Op::Pub, net.now);
    assert_eq!(
        gate.unwrap_err().0,
        ErrorCode::NotLeader,
        "the restarted node failed"
    );
    assert_eq!(net.record(f, topic, 1), Some((3, "a".into())));
    assert_eq!(net.record(f, topic, 2), Some((3, "b".into())));
}

#[test]
fn a_deposed_leader_ends_its_groups_and_leading_again_redelivers_what_they_had_not_settled() {
    let mut net = Net::new();
    let (l, topic) = net.leader_with_one_record(7, "poison");
    let delivery = net.first_delivery(l, topic);
    // Cut off, the leader proposes the dead letter in an entry nobody else gets.
    net.nodes[l].isolated = true;
    let nack = delivery.nack(NackReason::Reject);
    let _ = net.nodes[l].broker.nack(CONN, &nack, net.now);
    net.run_until("a new leader, the old one deposed", |net| {
        net.serving_leader(Some(l)).is_some()
            && !net.nodes[l].broker.cluster_status().unwrap().is_leader
    });
    let groups = net.nodes[l].broker.coordinator().snapshot().groups;
    assert!(
        groups.iter().all(|g| g.members.is_empty()),
        "a deposed leader keeps its members"
    );
    let n = net.serving_leader(Some(l)).unwrap();
    net.nodes[l].isolated = false;
    net.run_until("the old leader follows the new term", |net| {
        net.term(l) == net.term(n)
    });
    net.lead_again(l, n);
    // The truncated dead letter is nobody's: the record comes again, and is rejected again.
    let again = net.first_delivery(l, topic);
    assert_eq!(again.sequence, 1);
    let nack = again.nack(NackReason::Reject);
    let _ = net.nodes[l].broker.nack(CONN, &nack, net.now);
    let twin = topic + 1;
    let third = (0..3).find(|&i| i != l && i != n).unwrap();
    net.run_until("a majority applied the dead letter", |net| {
        net.next_sequence(l, twin) == 2 && net.next_sequence(third, twin) == 2
    });
    assert_eq!(net.dead_letter(third, twin, 1), (b"poison".to_vec(), 1));
    net.run_until("the group settled it", |net| {
        net.nodes[l].broker.coordinator().positions()[0].committed == 1
    });
}

/// A leader out of its lease (`docs/REPLICATION.md` §7.3) delivers nothing: another
/// leader may already have settled, and replicated the ACKs of, what its groups would
/// deliver (§7.4). It delivers again once a majority answers it within the lease.
#[test]
fn a_leader_out_of_its_lease_delivers_nothing_until_a_majority_answers_it_again() {
    let mut net = Net::new();
    let (l, topic) = net.leader_with_one_record(7, "v");
    net.nodes[l].isolated = true;
    while net.cluster(l).delivers(net.now.mono_ms) {
        net.tick();
        net.pass(l);
    }
    assert!(net.cluster(l).replica.is_leader(), "stepped down first");
    net.join_g(l, topic);
    for _ in 0..3 {
        net.pass(l);
        let delivered = net.take_deliveries(l);
        assert!(delivered.is_empty(), "out of the lease: {delivered:?}");
    }
    net.nodes[l].isolated = false;
    let delivered = loop {
        net.tick();
        net.deliver();
        if let Some(&first) = net.take_deliveries(l).first() {
            break first;
        }
    };
    assert_eq!(delivered.sequence, 1);
    assert!(net.cluster(l).replica.is_leader(), "still the leader");
}

/// A clean LEAVE sends the group's committed positions in its own pass (`docs/REPLICATION.md`
/// §7.4), not up to `POSITIONS_REPLICATE_INTERVAL_MS` later: a consumer that stopped and
/// then saw the leader die is not given what it ACKed again.
#[test]
fn a_member_that_leaves_has_its_acknowledgements_on_every_node_before_the_interval_ends() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish_many(l, topic, 1, 3);
    // Joined, delivered and acknowledged at one instant: the positions' interval began at
    // the first pass of that instant or before, so only the LEAVE can send them now.
    let sub = Sub {
        group: b"g",
        topic_id: topic,
        partition: SUB_PARTITION_ANY,
        ..Sub::default()
    };
    let joined = match net.nodes[l].broker.subscribe(CONN, &sub, net.now) {
        Handled::Answer(Response::Sub(joined)) => joined,
        Handled::Answer(other) => panic!("SUB answered {other:?}"),
        _ => panic!("SUB not answered at once"),
    };
    for _ in 0..ROUNDS_MAX {
        if net.position(l, topic) == Some(3) {
            break;
        }
        net.deliver();
        for delivery in net.take_deliveries(l) {
            let ack = delivery.ack(AckFlags::empty());
            let _ = net.nodes[l].broker.ack(CONN, &ack, net.now);
        }
    }
    assert_eq!(
        net.position(l, topic),
        Some(3),
        "the leader settled all three"
    );
    net.deliver();
    let applied = |net: &Net, i: usize| {
        let positions = net.cluster(i).applied.positions();
        positions
            .iter()
            .find(|p| p.group == b"g")
            .map(|p| p.committed)
    };
    let followers: Vec<usize> = (0..NODES as usize).filter(|&i| i != l).collect();
    assert!(
        followers.iter().all(|&f| applied(&net, f) != Some(3)),
        "no positions proposal was due yet at this instant"
    );
    let leave = Heartbeat {
        subscription_id: joined.subscription_id,
        member_id: joined.member_id,
        membership_epoch: joined.membership_epoch,
        assignment_epoch: 0,
        state: HeartbeatState::Leave.as_code(),
    };
    let now = net.now;
    let handled = net.nodes[l].broker.heartbeat(CONN, &leave, now);
    assert!(
        matches!(handled, Handled::Answer(Response::Ok { .. })),
        "LEAVE refused"
    );
    net.deliver();
    for f in followers {
        assert_eq!(
            applied(&net, f),
            Some(3),
            "node {f} applied the group's position in the LEAVE's instant"
        );
    }
}

/// A group the leader removed after `--group-ttl` without members leaves every node's
/// positions (`docs/REPLICATION.md` §7.4): a new leader does not bring it back at its
/// old position, and a SUB of its name there starts a new group, as it would have on the
/// leader that let it go.
#[test]
fn a_group_the_leader_expired_is_gone_from_every_node_and_a_new_leader_starts_it_anew() {
    let kept = Kept {
        group_ttl_ms: 1_000,
        ..Kept::default()
    };
    let mut net = Net::opened(kept, 0, None, LogConfig::default());
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish_many(l, topic, 1, 3);
    net.consume_upto(l, topic, 3);
    net.publish_many(l, topic, 4, 2);
    let held = |net: &Net, i: usize| net.cluster(i).applied.positions().len();
    net.run_until("every node holds the group's position", |net| {
        (0..NODES as usize).all(|i| held(net, i) == 1)
    });
    net.now.mono_ms += kept.group_ttl_ms;
    net.run_until("every node let the group go", |net| {
        (0..NODES as usize).all(|i| held(net, i) == 0)
    });
    net.nodes[l].isolated = true;
    net.run_until("another leader", |net| {
        net.serving_leader(Some(l)).is_some()
    });
    let n = net.serving_leader(Some(l)).unwrap();
    assert_eq!(
        net.position(n, topic),
        None,
        "the new leader knows no group g"
    );
    let first = net.first_delivery(n, topic);
    assert_eq!(
        first.sequence, 1,
        "a new group, from its start policy (earliest)"
    );
}

#[test]
fn declares_queued_behind_a_registry_proposal_all_run_and_are_answered() {
    let mut net = Net::new();
    let l = net.settled_leader();
    // Three DECLAREs in one pass: the second and third queue behind the first's
    // REGISTRY proposal (not behind a topic creation, as on a single node), and the
    // pass's invariant check must accept that.
    for (slot, name) in [(1, "a"), (2, "b"), (3, "a")] {
        let d = Declare {
            topic: name.as_bytes(),
            partition_count: 1,
            flags: DeclareFlags::empty(),
        };
        let handled = net.nodes[l].broker.declare(CONN, slot, &d, net.now);
        assert!(matches!(handled, Handled::Wait), "DECLARE {slot}");
    }
    let ids: Vec<u16> = (1..=3)
        .map(|slot| match net.wait_answer(l, slot) {
            Response::Declare(r) => r.topic_id,
            other => panic!("DECLARE {slot} answered {other:?}"),
        })
        .collect();
    assert_eq!(ids[0], ids[2], "the same topic declared twice");
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn journals_are_compacted_to_what_every_node_holds_and_a_restart_applies_from_the_checkpoint() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    // 80 records of 4 KB: about five 64 KiB journal files.
    net.publish_many(l, topic, 1, 80);
    net.run_until("every node checkpointed and dropped journal files", |net| {
        (0..3).all(|i| net.cluster(i).replica.first_index() > 1 && net.journal_files(i) <= 2)
    });
    // A follower loses power and starts from its checkpoint, not from entry 1.
    let f = (0..3).find(|&i| i != l).unwrap();
    let disk = net.nodes[f].disk.clone();
    disk.power_cut();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    let c = net.cluster(f);
    let checkpoint = c.replica.checkpoint().index;
    assert!(checkpoint > 0);
    assert_eq!(
        c.applied_index, checkpoint,
        "applied from the checkpoint on"
    );
    assert_eq!(
        net.next_sequence(f, topic),
        81,
        "the synced segment held them"
    );
    net.publish_many(l, topic, 81, 1);
    net.run_until("the restarted follower has the new record", |net| {
        net.next_sequence(f, topic) == 82
    });
    for seq in [1, 40, 81] {
        let (producer, value) = net.record(f, topic, seq).unwrap();
        assert_eq!((producer, value.len()), (3, 4_000), "record {seq}");
    }
}

#[test]
fn a_node_that_falls_behind_holds_every_journal_at_its_match_and_catches_up_after() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let f = (0..3).find(|&i| i != l).unwrap();
    let held = net.nodes[f].broker.cluster_status().unwrap().last_index;
    net.nodes[f].isolated = true;
    net.publish_many(l, topic, 1, 80);
    for _ in 0..3 * super::compaction::FLOOR_INTERVAL_MS / TICK_MS {
        net.tick();
        net.deliver();
    }
    for i in 0..3 {
        let first = net.cluster(i).replica.first_index();
        assert!(
            first <= held + 1,
            "node {i} dropped entry {} the laggard needs",
            first - 1
        );
    }
    net.nodes[f].isolated = false;
    net.run_until("the laggard caught up from the journals", |net| {
        net.next_sequence(f, topic) == 81
    });
    net.run_until("the floor moved on and every node compacted", |net| {
        (0..3).all(|i| net.cluster(i).replica.first_index() > held + 1)
    });
}

#[test]
fn a_checkpoint_keeps_the_replicated_group_positions_whose_entries_it_compacts() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish_many(l, topic, 1, 1);
    let delivery = net.first_delivery(l, topic);
    let _ = net.nodes[l]
        .broker
        .ack(CONN, &delivery.ack(AckFlags::empty()), net.now);
    let committed = net.position(l, topic).unwrap();
    assert!(committed > 0);
    let f = (0..3).find(|&i| i != l).unwrap();
    net.run_until("the follower has the position", |net| {
        net.position(f, topic) == Some(committed)
    });
    let replicated_by = net.cluster(l).replica.last_index();
    net.publish_many(l, topic, 2, 80);
    net.run_until(
        "the follower's checkpoint passed the position's entry",
        |net| net.cluster(f).replica.checkpoint().index > replicated_by,
    );
    let disk = net.nodes[f].disk.clone();
    disk.power_cut();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    assert_eq!(
        net.position(f, topic),
        Some(committed),
        "lost with the entries"
    );
}

#[test]
fn a_dead_letter_whose_proposal_raft_refused_is_proposed_again_and_written_once() {
    // Raft wants it above one message's bytes; 15 records of 128 KB stay below it.
    const BUDGET_BYTES: u64 = 2 * super::machine::MSG_BYTES_MAX;
    const VALUE_BYTES: usize = 128_000;
    let options = ReplicaOptions {
        uncommitted_bytes_max: BUDGET_BYTES,
        ..ReplicaOptions::default()
    };
    let mut net = Net::with_options(options);
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let twin = crate::wire::dlq_twin_id(topic);
    net.publish(l, 1, topic, (7, 1), "poison");
    assert_eq!(pub_ok(&net.wait_answer(l, 1)).sequence, 1);
    let delivery = net.first_delivery(l, topic);
    // Cut off (and not ticked, so it still leads), the leader fills raft's budget for
    // uncommitted entries, one pass each.
    for i in (0..3).filter(|&i| i != l) {
        net.nodes[i].isolated = true;
    }
    for seq in 2..=16 {
        net.publish(l, seq, topic, (8, seq), &"x".repeat(VALUE_BYTES));
        net.deliver();
        assert!(!net.nodes[l].answers.contains_key(&seq), "{seq} answered");
    }
    // One pass: a PUB past the budget and the NACK whose dead letter rides with it.
    net.publish(l, 17, topic, (8, 17), &"x".repeat(2 * VALUE_BYTES));
    let nack = delivery.nack(NackReason::Reject);
    let _ = net.nodes[l].broker.nack(CONN, &nack, net.now);
    net.deliver();
    assert_eq!(
        error_code(&net.nodes[l].answers[&17]),
        Some(ErrorCode::Backpressure),
        "the pass's BATCH was refused"
    );
    for i in (0..3).filter(|&i| i != l) {
        net.nodes[i].isolated = false;
    }
    net.run_until("every node holds the dead letter", |net| {
        (0..3).all(|i| net.next_sequence_of(i, twin) == 2)
    });
    for _ in 0..ELECTION_TICKS {
        net.tick();
        net.deliver();
    }
    for i in 0..3 {
        assert_eq!(net.next_sequence_of(i, twin), 2, "node {i}: written twice");
        assert_eq!(net.dead_letter(i, twin, 1), (b"poison".to_vec(), 1));
    }
}

#[test]
fn a_follower_that_applied_a_producers_record_late_forgets_it_when_the_leader_does() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let f = (0..3).find(|&i| i != l).unwrap();
    net.nodes[f].isolated = true;
    net.publish(l, 1, topic, (9, 1), "a");
    assert_eq!(pub_ok(&net.wait_answer(l, 1)).sequence, 1);
    // Most of --producer-ttl (60 s here) later the follower gets the record.
    net.now.mono_ms += 50_000;
    net.now.wall_ms += 50_000;
    net.nodes[f].isolated = false;
    net.run_until("the late follower applied it", |net| {
        net.next_sequence(f, topic) == 2
    });
    net.housekeeping_everywhere();
    assert_eq!(
        net.producers_known(f, topic),
        1,
        "the follower aged it from its apply"
    );
    // Past the TTL from the leader's PUB, on an idle cluster: the leader's empty BATCH
    // moves the log's clock on and every node forgets producer 9 alike.
    net.now.mono_ms += 20_000;
    net.now.wall_ms += 20_000;
    net.run_until("every node forgot the producer", |net| {
        (0..3).all(|i| net.producers_known(i, topic) == 0)
    });
}

/// Twice the nodes' `--producer-ttl`: a wall clock this far off ages any record past it.
const CLOCK_STEP_MS: i64 = 120_000;

/// A wall clock far from the epoch, so that one set back stays after it.
const WALL_CLOCK_START_MS: u64 = 1_764_600_000_000;

#[test]
fn a_follower_whose_wall_clock_runs_ahead_keeps_the_producers_the_leader_keeps() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let f = (0..3).find(|&i| i != l).unwrap();
    net.nodes[f].wall_skew_ms = CLOCK_STEP_MS;
    net.publish(l, 1, topic, (9, 1), "a");
    assert_eq!(pub_ok(&net.wait_answer(l, 1)).sequence, 1);
    net.run_until("every node applied it", |n| n.all_at(topic, 2));
    net.housekeeping_everywhere();
    assert_eq!(
        net.producers_known(f, topic),
        1,
        "aged on the follower's own clock"
    );
    // Started again, it reads the log's clock from its newest record.
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = net.open(f as u64 + 1, disk);
    net.nodes[f].wall_skew_ms = CLOCK_STEP_MS;
    let stamped = net.record_timestamp(l, topic, 1);
    let clock = net.nodes[f].broker.partitions.log_clock_ms();
    assert!(
        clock >= Some(stamped),
        "{clock:?} before the newest record, {stamped}"
    );
    net.links_up(f);
    net.run_until("the restarted follower serves its part", |n| {
        n.all_at(topic, 2)
    });
    net.housekeeping_everywhere();
    assert_eq!(
        net.producers_known(f, topic),
        1,
        "aged on the follower's own clock"
    );
}

#[test]
fn a_follower_whose_wall_clock_runs_ahead_deletes_no_segment_the_leader_keeps() {
    // A record per segment, and half the follower's lead as --retention-age.
    let log = LogConfig {
        segment_size_bytes: 256,
        retention_age_ms: 60_000,
        ..LogConfig::default()
    };
    let mut net = Net::with_log(log);
    net.now.wall_ms = WALL_CLOCK_START_MS;
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let f = (0..3).find(|&i| i != l).unwrap();
    net.nodes[f].wall_skew_ms = CLOCK_STEP_MS;
    for seq in 1..=3 {
        net.publish(l, seq, topic, (9, seq), &"r".repeat(200));
        assert_eq!(pub_ok(&net.wait_answer(l, seq)).sequence, seq);
    }
    net.run_until("every node applied them", |n| n.all_at(topic, 4));
    net.housekeeping_everywhere();
    let first = |net: &Net, i: usize| {
        let part = net.nodes[i].broker.partition(topic, 0).unwrap();
        part.log.first_sequence()
    };
    for i in 0..3 {
        assert_eq!(
            first(&net, i),
            1,
            "node {i} deleted segments the leader keeps"
        );
    }
    // Past the retention age on an idle cluster, the log's clock deletes them everywhere
    // (the active segment stays).
    net.now.mono_ms += 61_000;
    net.now.wall_ms += 61_000;
    net.run_until("every node deleted the two closed segments", |net| {
        (0..3).all(|i| first(net, i) == 3)
    });
}

#[test]
fn a_leader_whose_wall_clock_was_set_back_stamps_no_record_older_than_the_log() {
    let mut net = Net::new();
    net.now.wall_ms = WALL_CLOCK_START_MS;
    let (l, topic) = net.leader_with_one_record(9, "a");
    let first = net.record_timestamp(l, topic, 1);
    net.nodes[l].wall_skew_ms = -CLOCK_STEP_MS;
    net.publish(l, 2, topic, (10, 1), "b");
    assert_eq!(pub_ok(&net.wait_answer(l, 2)).sequence, 2);
    assert!(
        net.record_timestamp(l, topic, 2) >= first,
        "a record older than the log"
    );
    net.run_until("every node applied it", |n| n.all_at(topic, 3));
    net.housekeeping_everywhere();
    for i in 0..3 {
        assert_eq!(
            net.producers_known(i, topic),
            2,
            "node {i} forgot producer 10"
        );
    }
    net.publish(l, 3, topic, (10, 1), "b");
    let again = pub_ok(&net.wait_answer(l, 3));
    assert_eq!(
        (again.sequence, again.result_flags),
        (2, PubResultFlags::DEDUPLICATED)
    );
    // The leader's own stamps, at the log's clock, show its clock behind; the others'
    // clocks are right.
    let skewed = |net: &Net, i: usize| {
        let status = net.nodes[i].broker.cluster_status().unwrap();
        status.clock_skewed_batches
    };
    assert!(
        skewed(&net, l) > 0,
        "the leader's clock set back went unnoticed"
    );
    for i in (0..3).filter(|&i| i != l) {
        assert_eq!(skewed(&net, i), 0, "node {i}'s clock is right");
    }
}

#[test]
fn a_leader_whose_wall_clock_is_set_back_while_a_batch_is_in_flight_stamps_no_record_older() {
    let mut net = Net::new();
    net.now.wall_ms = WALL_CLOCK_START_MS;
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    // "a" is stamped past every stamp the log's clock has applied…
    net.now.wall_ms += IN_FLIGHT_STAMP_AHEAD_MS;
    net.publish(l, 1, topic, (9, 1), "a");
    net.pass(l);
    // …and is still in flight, on no follower yet, when the leader's clock goes back.
    net.nodes[l].wall_skew_ms = -CLOCK_STEP_MS;
    net.publish(l, 2, topic, (10, 1), "b");
    net.pass(l);
    assert_eq!(pub_ok(&net.wait_answer(l, 1)).sequence, 1);
    assert_eq!(pub_ok(&net.wait_answer(l, 2)).sequence, 2);
    net.run_until("every node applied it", |n| n.all_at(topic, 3));
    for i in 0..3 {
        let (a, b) = (
            net.record_timestamp(i, topic, 1),
            net.record_timestamp(i, topic, 2),
        );
        assert!(
            b >= a,
            "node {i}: record 2 stamped {b}, before record 1's {a}"
        );
    }
}

/// How far a record in flight is stamped past what the log's clock applied.
const IN_FLIGHT_STAMP_AHEAD_MS: u64 = 1_000;

/// A vote request from node `from` for `term`, its log ending at `(index, log_term)`.
fn vote_request(from: u64, to: u64, term: u64, index: u64, log_term: u64) -> PeerMessage {
    let mut m = PeerMessage::default();
    m.set_msg_type(raft::eraftpb::MessageType::MsgRequestVote);
    (m.from, m.to, m.term, m.index, m.log_term) = (from, to, term, index, log_term);
    m
}

/// Whether node `i`, stepping `request`, grants its vote (the answer goes out once the
/// vote is on disk): after its first election timeout, within which a restarted node
/// grants none anyway (§7.3).
fn grants(net: &mut Net, i: usize, request: PeerMessage) -> bool {
    let candidate = request.from as usize - 1;
    for _ in 0..ELECTION_TICKS {
        net.nodes[i].broker.raft_tick();
    }
    net.nodes[candidate].inbox.clear();
    net.nodes[i].broker.peer_message(request).unwrap();
    net.pass(i);
    let vote = raft::eraftpb::MessageType::MsgRequestVoteResponse;
    let inbox = &net.nodes[candidate].inbox;
    inbox
        .iter()
        .any(|m| m.get_msg_type() == vote && m.from == i as u64 + 1 && !m.reject)
}

#[test]
fn a_node_that_lost_its_data_directory_votes_in_no_election_until_it_caught_up() {
    let mut net = Net::new();
    let (l, _) = net.leader_with_one_record(3, "a");
    let status = net.nodes[l].broker.cluster_status().unwrap();
    let (last, term) = (status.last_index, status.term);
    let f = (0..3).find(|&i| i != l).unwrap();
    let candidate = (0..3).find(|&i| i != l && i != f).unwrap() as u64 + 1;
    let request = || vote_request(candidate, f as u64 + 1, term + 1, last, term);
    // Its disk replaced: the HELLO of a peer with a log tells it so.
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(99));
    net.nodes[f].broker.peer_up(l as u64 + 1, None, Some(last));
    assert!(!grants(&mut net, f, request()), "voted with a lost past");
    // A node of a new cluster (no peer holds a log) votes.
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(98));
    net.nodes[f].broker.peer_up(l as u64 + 1, None, Some(0));
    assert!(grants(&mut net, f, request()), "a new node must vote");
}

#[test]
fn a_follower_that_cannot_create_a_committed_topic_stops_and_a_restart_creates_it() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let f = (0..3).find(|&i| i != l).unwrap();
    // A file where the follower's topic directory goes: its creation fails there only.
    let pair = net.nodes[l].broker.next_pair().unwrap();
    let source = crate::broker::topics::source_id(pair);
    let blocker = crate::broker::topics::topic_dir(Path::new("/data/topics"), source, "orders");
    net.nodes[f].disk.write(&blocker, b"in the way").unwrap();
    let topic = net.declare(l, "orders");
    net.run_until("the follower failed", |net| net.cluster(f).failed.is_some());
    let applied = |net: &Net| net.nodes[f].broker.cluster_status().unwrap().applied_index;
    let stopped_at = applied(&net);
    net.publish(l, 1, topic, (3, 1), "a");
    assert_eq!(pub_ok(&net.wait_answer(l, 1)).sequence, 1);
    for _ in 0..5 {
        net.tick();
        net.deliver();
    }
    assert_eq!(
        applied(&net),
        stopped_at,
        "a failed node applies nothing more"
    );
    net.nodes[f].disk.remove_file(&blocker).unwrap();
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    net.run_until("the restarted follower has the record", |net| {
        net.next_sequence(f, topic) == 2
    });
    assert_eq!(net.record(f, topic, 1), Some((3, "a".into())));
}

#[test]
fn a_leader_whose_journal_sync_fails_answers_its_waiters_at_once_and_another_node_leads() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let every_sync = crate::log::simdisk::FaultRates {
        sync_eio: 1_000_000,
        ..Default::default()
    };
    net.nodes[l].disk.set_faults(every_sync);
    net.publish(l, 1, topic, (3, 1), "a");
    net.deliver();
    // Answered in the pass that learnt of the failure, not at a restart: the outcome is
    // unknown to this node (the followers may have the entry), so 0x6005.
    assert_eq!(
        error_code(&net.nodes[l].answers[&1]),
        Some(ErrorCode::NotEnoughReplicasAfterAppend)
    );
    // It does not lead any more and names no leader: clients move on to other nodes.
    let gate = net.nodes[l].broker.admit(Op::Pub, net.now).unwrap_err();
    assert_eq!(gate.0, ErrorCode::NotLeader);
    assert!(!gate.1.starts_with("leader "), "{}", gate.1);
    net.run_until("another node serves", |net| {
        net.serving_leader(Some(l)).is_some()
    });
}

#[test]
fn a_node_that_lost_its_data_directory_after_compaction_installs_a_snapshot_and_catches_up() {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish_many(l, topic, 1, 1);
    let delivery = net.first_delivery(l, topic);
    let _ = net.nodes[l]
        .broker
        .ack(CONN, &delivery.ack(AckFlags::empty()), net.now);
    let committed = net.position(l, topic).unwrap();
    // About five 64 KiB journal files: every node compacts past entry 1.
    net.publish_many(l, topic, 2, 80);
    net.run_until("every node compacted", |net| {
        (0..3).all(|i| net.cluster(i).replica.first_index() > 1)
    });
    let f = (0..3).find(|&i| i != l).unwrap();
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(99));
    // Its HELLO tells the leader its log is empty.
    net.nodes[l].broker.peer_up(f as u64 + 1, None, Some(0));
    net.run_until("the wiped node installed and holds every record", |net| {
        net.nodes[f].restarts.len() >= 2 && net.next_sequence(f, topic) == 82
    });
    let restarts = &net.nodes[f].restarts;
    assert_eq!(restarts.len(), 2, "into the install and out of it");
    let (code, text) = restarts[0]
        .clone()
        .expect_err("turned away while installing");
    assert_eq!(code, ErrorCode::SnapshotInProgress, "{text}");
    let c = net.cluster(f);
    assert!(
        c.replica.checkpoint().index > 1,
        "the log starts after the snapshot"
    );
    let sent = net.nodes[l]
        .broker
        .cluster_status()
        .unwrap()
        .snapshot_bytes_sent;
    assert!(sent > 81 * 4_000, "the leader counted {sent} bytes sent");
    for seq in [1, 2, 40, 81] {
        assert_eq!(
            net.record(f, topic, seq),
            net.record(l, topic, seq),
            "record {seq}"
        );
    }
    assert_eq!(
        net.position(f, topic),
        Some(committed),
        "the group's position came along"
    );
    // It takes part again: appends after the snapshot, and a majority with the leader.
    let other = (0..3).find(|&i| i != l && i != f).unwrap();
    net.nodes[other].isolated = true;
    net.publish_many(l, topic, 82, 1);
    assert_eq!(net.next_sequence(f, topic), 83);
}

/// Wipes a follower of a cluster whose journals were compacted past entry 1, holding 81
/// records of 4 KB; returns the leader and the follower.
fn wiped_follower_after_compaction(net: &mut Net) -> (usize, usize, u16) {
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    net.publish_many(l, topic, 1, 81);
    net.run_until("every node compacted", |net| {
        (0..3).all(|i| net.cluster(i).replica.first_index() > 1)
    });
    let f = (0..3).find(|&i| i != l).unwrap();
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(99));
    net.nodes[l].broker.peer_up(f as u64 + 1, None, Some(0));
    (l, f, topic)
}

#[test]
fn an_install_cut_by_a_power_loss_starts_over_and_completes() {
    let mut net = Net::new();
    let (l, f, topic) = wiped_follower_after_compaction(&mut net);
    // A few chunks land, then the links fall silent and the node loses power.
    net.install_frames_left = Some(3);
    net.run_until("the node restarted into the install", |net| {
        net.nodes[f].restarts.len() == 1 && net.install_frames_left == Some(0)
    });
    let disk = net.nodes[f].disk.clone();
    disk.power_cut();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    let gate = net.nodes[f].broker.admit(Op::Pub, net.now);
    assert_eq!(
        gate.unwrap_err().0,
        ErrorCode::SnapshotInProgress,
        "the marker survived"
    );
    let status = net.nodes[f].broker.cluster_status().unwrap();
    assert_eq!(status.role, "installing");
    // The start wiped what it wrote and pulls the manifest again before any file.
    assert_eq!(status.install_bytes, (0, 0));
    net.install_frames_left = None;
    net.run_until("the manifest came again", |net| {
        let status = net.nodes[f].broker.cluster_status().unwrap();
        status.role != "installing" || status.install_bytes.1 > 81 * 4_000
    });
    net.run_until("the install completed", |net| {
        net.next_sequence(f, topic) == 82
    });
    for seq in [1, 81] {
        assert_eq!(
            net.record(f, topic, seq),
            net.record(l, topic, seq),
            "record {seq}"
        );
    }
}

#[test]
fn an_install_whose_leader_falls_silent_is_given_up_and_a_new_snapshot_installed() {
    let mut net = Net::new();
    let (l, f, topic) = wiped_follower_after_compaction(&mut net);
    net.install_frames_left = Some(2);
    net.run_until(
        "the node gave the install up and restarted without it",
        |net| net.nodes[f].restarts.len() == 2,
    );
    let gate = net.nodes[f].restarts[1].clone().map_err(|(code, _)| code);
    assert_ne!(
        gate,
        Err(ErrorCode::SnapshotInProgress),
        "restarted without the marker"
    );
    net.install_frames_left = None;
    net.run_until("a second snapshot installed", |net| {
        net.next_sequence(f, topic) == 82
    });
    assert_eq!(
        net.nodes[f].restarts.len(),
        4,
        "out, into the second install, out of it"
    );
    assert_eq!(net.record(f, topic, 81), net.record(l, topic, 81));
}

#[test]
fn past_journal_retain_a_laggard_gets_a_snapshot_and_the_others_compact_past_it() {
    const RETAIN_BYTES: u64 = 2 * JOURNAL_FILE_BYTES;
    let mut net = Net::retaining(RETAIN_BYTES, 0, None);
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    let f = (0..3).find(|&i| i != l).unwrap();
    let held = net.nodes[f].broker.cluster_status().unwrap().last_index;
    net.nodes[f].isolated = true;
    // About five 64 KiB journal files: past what the leader retains for the laggard.
    net.publish_many(l, topic, 1, 80);
    net.run_until("the others compacted past the laggard's log", |net| {
        (0..3)
            .filter(|&i| i != f)
            .all(|i| net.cluster(i).replica.first_index() > held + 1)
    });
    net.nodes[f].isolated = false;
    net.run_until("the laggard installed a snapshot and caught up", |net| {
        net.next_sequence(f, topic) == 81
    });
    assert_eq!(
        net.nodes[f].restarts.len(),
        2,
        "into the install and out of it"
    );
    for seq in [1, 80] {
        assert_eq!(
            net.record(f, topic, seq),
            net.record(l, topic, seq),
            "record {seq}"
        );
    }
}

#[test]
fn a_node_installing_under_load_installs_once_and_then_follows_by_appends() {
    let mut net = Net::new();
    let (l, f, topic) = wiped_follower_after_compaction(&mut net);
    let value = "v".repeat(4_000);
    // Records keep coming while the node installs and after; its links go down and up.
    for seq in 82..82 + ROUNDS_MAX as u64 {
        if net.nodes[f].restarts.len() >= 2 && net.next_sequence(f, topic) > 160 {
            break;
        }
        net.publish(l, seq, topic, (3, seq), &value);
        if seq % 7 == 0 {
            net.nodes[l].broker.peer_down(f as u64 + 1);
            let last = net.nodes[f].broker.cluster_status().unwrap().last_index;
            net.nodes[l].broker.peer_up(f as u64 + 1, None, Some(last));
        }
        if seq % 3 == 0 {
            // A message to it dropped (a full output buffer): raft probes from its match.
            let append = PeerMessage {
                to: f as u64 + 1,
                msg_type: raft::eraftpb::MessageType::MsgAppend,
                ..PeerMessage::default()
            };
            net.nodes[l].broker.peer_unreachable(&append);
        }
        net.tick();
        net.deliver();
    }
    assert!(net.next_sequence(f, topic) > 160, "never caught up");
    assert_eq!(
        net.nodes[f].restarts.len(),
        2,
        "one install: into it and out of it"
    );
}

#[test]
fn records_published_while_a_node_installs_do_not_replace_the_snapshot_it_pulls() {
    let mut net = Net::new();
    let (l, f, topic) = wiped_follower_after_compaction(&mut net);
    // No chunk gets through while the leader appends: raft probes the installing node
    // from its empty log, finds those entries compacted and wants a snapshot again.
    net.install_frames_left = Some(0);
    for seq in 82..90 {
        net.publish(l, seq, topic, (3, seq), "v");
        net.tick();
        net.deliver();
    }
    assert_eq!(net.nodes[f].restarts.len(), 1, "restarted into the install");
    net.install_frames_left = None;
    net.run_until("the install completed", |net| {
        net.next_sequence(f, topic) == 90
    });
    assert_eq!(
        net.nodes[f].restarts.len(),
        2,
        "the first install went through, not given up for a newer snapshot"
    );
}

#[test]
fn a_leader_that_forgot_the_snapshot_refuses_its_chunks_and_the_install_is_given_up_once() {
    let mut net = Net::new();
    let (l, f, topic) = wiped_follower_after_compaction(&mut net);
    net.install_frames_left = Some(0);
    net.run_until("the node restarted into the install", |net| {
        net.nodes[f].restarts.len() == 1
    });
    // The leader restarts: the snapshot it offered is gone, every chunk asked is REFUSED.
    let disk = net.nodes[l].disk.clone();
    net.nodes[l] = open_node_on(l as u64 + 1, disk);
    net.install_frames_left = None;
    net.run_until("a second snapshot installed", |net| {
        net.next_sequence(f, topic) == 82
    });
    let restarts = net.nodes[f].restarts.len();
    assert_eq!(
        restarts, 4,
        "given up once (out), into the second install, out of it"
    );
}

/// A 3-node cluster with `orders` and records 1..=`records` on every node, each
/// acknowledged to its producer: (net, leader, topic id).
fn cluster_with_records(records: u64) -> (Net, usize, u16) {
    let mut net = Net::new();
    let l = net.settled_leader();
    let topic = net.declare(l, "orders");
    for seq in 1..=records {
        net.publish(l, seq, topic, (3, seq), &format!("v{seq}"));
        assert_eq!(pub_ok(&net.wait_answer(l, seq)).sequence, seq);
    }
    net.run_until("every node holds the records", |n| {
        n.all_at(topic, records + 1)
    });
    (net, l, topic)
}

/// [`cluster_with_records`], all consumed by group "g", whose position every node holds.
fn cluster_with_consumed(records: u64) -> (Net, usize, u16) {
    let (mut net, l, topic) = cluster_with_records(records);
    net.consume_upto(l, topic, records);
    net.run_until("every node has the position", |n| {
        (0..3).all(|i| n.position(i, topic) == Some(records))
    });
    (net, l, topic)
}

/// Node `i`'s first sequence of `topic` partition 0.
fn first_sequence(net: &Net, i: usize, topic: u16) -> u64 {
    net.nodes[i]
        .broker
        .partition(topic, 0)
        .unwrap()
        .log
        .first_sequence()
}

#[test]
fn a_purge_on_the_leader_removes_the_records_on_every_node_and_a_restart_keeps_later_ones() {
    let (mut net, l, topic) = cluster_with_records(3);
    let purge = Change::Purge {
        topic: "orders".into(),
    };
    let done = net.change(l, 1, purge);
    assert_eq!(done, Ok(ChangeDone::Purged(vec![(0, 4, 3)])));
    net.run_until("every node purged", |n| {
        (0..3).all(|i| first_sequence(n, i, topic) == 4)
    });
    for i in 0..3 {
        assert_eq!(
            net.record(i, topic, 3),
            None,
            "node {i} kept a purged record"
        );
    }
    // Sequences go on; a follower restarted applies the log again from its start,
    // the purge included, and keeps the record that came after it.
    net.publish(l, 4, topic, (3, 4), "after");
    assert_eq!(pub_ok(&net.wait_answer(l, 4)).sequence, 4);
    let f = (0..3).find(|&i| i != l).unwrap();
    net.run_until("the follower applied it", |n| {
        n.next_sequence(f, topic) == 5
    });
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    net.run_until("the restarted follower applied the log again", |n| {
        n.cluster(f).applied_index == n.cluster(l).applied_index
    });
    assert_eq!(first_sequence(&net, f, topic), 4);
    assert_eq!(net.record(f, topic, 4), Some((3, "after".into())));
}

#[test]
fn a_group_reset_moves_the_position_back_on_every_node_and_a_new_leader_delivers_from_it() {
    let (mut net, l, topic) = cluster_with_consumed(3);
    let reset = Change::ResetGroup {
        group: "g".into(),
        topic: "orders".into(),
        to: ResetTo::Sequence(2),
        partition: None,
    };
    assert_eq!(
        net.change(l, 1, reset),
        Ok(ChangeDone::GroupReset(vec![(0, 2)]))
    );
    // Later BATCHes carry positions again: none of them raises it back.
    for _ in 0..ELECTION_TICKS {
        net.tick();
        net.deliver();
    }
    for i in 0..3 {
        assert_eq!(net.position(i, topic), Some(1), "node {i}");
    }
    net.nodes[l].isolated = true;
    net.run_until("another node leads, the old one deposed", |n| {
        n.serving_leader(Some(l)).is_some() && !n.cluster(l).replica.is_leader()
    });
    assert_eq!(net.position(l, topic), Some(1), "the deposed leader");
    let n = net.serving_leader(Some(l)).unwrap();
    assert_eq!(net.first_delivery(n, topic).sequence, 2);
}

#[test]
fn a_group_delete_is_gone_on_every_node_and_after_a_restart() {
    let (mut net, l, topic) = cluster_with_consumed(2);
    let delete = Change::DeleteGroup {
        group: "g".into(),
        topic: "orders".into(),
    };
    assert_eq!(net.change(l, 1, delete), Ok(ChangeDone::GroupDeleted));
    net.run_until("every node deleted it", |n| {
        (0..3).all(|i| n.position(i, topic).is_none())
    });
    // Deposed, the leader holds what its applied log says: no group.
    net.nodes[l].isolated = true;
    net.run_until("the leader deposed", |n| !n.cluster(l).replica.is_leader());
    assert_eq!(net.position(l, topic), None, "the deposed leader");
    net.nodes[l].isolated = false;
    // A restart applies the BATCH that carried the position, then the delete.
    let f = (0..3).find(|&i| i != l).unwrap();
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    net.run_until("the restarted follower applied the log again", |n| {
        n.cluster(f).applied_index == n.cluster(l).applied_index
    });
    assert_eq!(net.position(f, topic), None);
}

/// Joins group `g` on leader `l`, rejects its first delivery into the twin and waits
/// until every node holds that dead letter at `twin_sequence` and the group settled it;
/// then the member's connection closes.
fn dead_letter_first_delivery(net: &mut Net, l: usize, topic: u16, twin_sequence: u64) {
    let delivery = net.first_delivery(l, topic);
    let nack = delivery.nack(NackReason::Reject);
    let _ = net.nodes[l].broker.nack(CONN, &nack, net.now);
    let twin = crate::wire::dlq_twin_id(topic);
    net.run_until("every node holds the dead letter", |n| {
        (0..3).all(|i| n.next_sequence_of(i, twin) == twin_sequence + 1)
    });
    net.run_until("the group settled it", |n| {
        n.position(l, topic) == Some(delivery.sequence)
    });
    let now = net.now;
    net.nodes[l].broker.connection_closed(CONN, now);
    net.deliver();
}

/// Node `i`'s tombstone marks of group `g` on `topic`.
fn tombstone_marks(net: &mut Net, i: usize, topic: u16) -> Option<Vec<(u16, u64)>> {
    let (_, positions) = net.nodes[i].broker.consume.parts_mut();
    positions.tombstone_of(b"g", topic).map(|t| t.marks.clone())
}

#[test]
fn a_restart_that_applies_a_group_delete_again_buries_the_group_where_the_leader_did() {
    let (mut net, l, topic) = cluster_with_records(2);
    dead_letter_first_delivery(&mut net, l, topic, 1);
    let delete = Change::DeleteGroup {
        group: "g".into(),
        topic: "orders".into(),
    };
    assert_eq!(net.change(l, 1, delete), Ok(ChangeDone::GroupDeleted));
    // Re-created under the same name, the group rejects a record into the twin again:
    // that dead letter is the new group's, above the tombstone.
    dead_letter_first_delivery(&mut net, l, topic, 2);
    for i in 0..3 {
        assert_eq!(
            tombstone_marks(&mut net, i, topic),
            Some(vec![(0, 2)]),
            "node {i}"
        );
    }
    // A restart applies the delete again, its twin already holding the new dead letter.
    let f = (0..3).find(|&i| i != l).unwrap();
    let disk = net.nodes[f].disk.clone();
    net.nodes[f] = open_node_on(f as u64 + 1, disk);
    net.run_until("the restarted follower applied the log again", |n| {
        n.cluster(f).applied_index == n.cluster(l).applied_index
    });
    assert_eq!(
        tombstone_marks(&mut net, f, topic),
        Some(vec![(0, 2)]),
        "after the restart"
    );
}

#[test]
fn a_follower_refuses_admin_changes_naming_the_leader() {
    let (mut net, l, topic) = cluster_with_records(1);
    let leader = format!("leader {} {}", l + 1, test_address(l as u64 + 1));
    let f = (0..3).find(|&i| i != l).unwrap();
    let changes = [
        Change::Purge {
            topic: "orders".into(),
        },
        Change::DeleteGroup {
            group: "g".into(),
            topic: "orders".into(),
        },
        Change::ResetGroup {
            group: "g".into(),
            topic: "orders".into(),
            to: ResetTo::Earliest,
            partition: None,
        },
    ];
    for (ticket, change) in (1..).zip(changes) {
        let refused = net.nodes[f].broker.change(ticket, &change, net.now);
        let e = refused.unwrap_err();
        assert_eq!(
            e.kind,
            ManageErrorKind::Cluster(ErrorCode::NotLeader),
            "{change:?}"
        );
        assert!(e.message.contains(&leader), "{}", e.message);
    }
    net.deliver();
    assert!(net.nodes[f].changes.is_empty());
    assert_eq!(first_sequence(&net, f, topic), 1, "nothing purged");
}

#[test]
fn a_reset_holds_through_a_snapshot_install_and_a_restart_from_a_checkpoint() {
    let (mut net, l, topic) = cluster_with_consumed(3);
    let reset = Change::ResetGroup {
        group: "g".into(),
        topic: "orders".into(),
        to: ResetTo::Earliest,
        partition: None,
    };
    assert_eq!(
        net.change(l, 1, reset),
        Ok(ChangeDone::GroupReset(vec![(0, 1)]))
    );
    // About five 64 KiB journal files: every node compacts past the reset's entry.
    net.publish_many(l, topic, 4, 80);
    let reset_applied = net.cluster(l).applied_index;
    net.run_until("every node checkpointed past the reset", |n| {
        (0..3).all(|i| n.cluster(i).replica.checkpoint().index > reset_applied)
    });
    let f = (0..3).find(|&i| i != l).unwrap();
    let other = (0..3).find(|&i| i != l && i != f).unwrap();
    // One follower loses power and starts from its checkpoint's positions file...
    let disk = net.nodes[other].disk.clone();
    disk.power_cut();
    net.nodes[other] = open_node_on(other as u64 + 1, disk);
    assert_eq!(net.position(other, topic), Some(0), "after a restart");
    // ...the other loses its data directory and installs the leader's snapshot.
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(99));
    net.nodes[l].broker.peer_up(f as u64 + 1, None, Some(0));
    net.run_until("the wiped node installed and holds every record", |n| {
        n.nodes[f].restarts.len() >= 2 && n.next_sequence(f, topic) == 84
    });
    assert_eq!(net.position(f, topic), Some(0), "after an install");
}

#[test]
fn a_reset_refused_while_the_group_has_members_and_acks_after_it_land_on_every_node() {
    let (mut net, l, topic) = cluster_with_records(3);
    net.consume_upto(l, topic, 3);
    net.publish(l, 4, topic, (3, 4), "v4");
    assert_eq!(pub_ok(&net.wait_answer(l, 4)).sequence, 4);
    let reset = |to| Change::ResetGroup {
        group: "g".into(),
        topic: "orders".into(),
        to,
        partition: None,
    };
    // A member with a delivery outstanding: refused before anything is proposed.
    let last = net.cluster(l).replica.last_index();
    assert_eq!(net.first_delivery(l, topic).sequence, 4);
    let refused = net.nodes[l]
        .broker
        .change(1, &reset(ResetTo::Earliest), net.now);
    assert_eq!(refused.unwrap_err().kind, ManageErrorKind::GroupHasMembers);
    let now = net.now;
    net.nodes[l].broker.connection_closed(CONN, now);
    net.deliver();
    // The followers cannot commit the reset for a while; meanwhile a member joins at the
    // reset position and acknowledges a record after it.
    for f in (0..3).filter(|&i| i != l) {
        net.nodes[f].isolated = true;
    }
    net.nodes[l]
        .broker
        .change(2, &reset(ResetTo::Earliest), net.now)
        .unwrap();
    assert!(net.cluster(l).replica.last_index() > last, "proposed");
    assert_eq!(
        net.position(l, topic),
        Some(0),
        "made on the leader at once"
    );
    let delivery = net.first_delivery(l, topic);
    assert_eq!(delivery.sequence, 1);
    let _ = (net.nodes[l].broker).ack(CONN, &delivery.ack(AckFlags::empty()), net.now);
    assert_eq!(net.position(l, topic), Some(1));
    for f in (0..3).filter(|&i| i != l) {
        assert_eq!(net.position(f, topic), Some(3), "node {f} before commit");
        net.nodes[f].isolated = false;
    }
    net.run_until("the reset's answer", |n| {
        n.nodes[l].changes.contains_key(&2)
    });
    assert_eq!(
        net.nodes[l].changes[&2],
        Ok(ChangeDone::GroupReset(vec![(0, 1)]))
    );
    // Every node: the reset, then the acknowledgement after it, in log order.
    net.run_until("every node has the acknowledged position", |n| {
        (0..3).all(|i| n.position(i, topic) == Some(1))
    });
}

/// Group "g" committed at 1 on every node, records 1 to 4 held by all; then leader `l`,
/// cut off, proposes a reset of the group (no member) to `to`, which it makes in its
/// live group at once and which nobody else gets, and is deposed. Returns `l` and the
/// topic; `l` is still cut off.
fn reset_proposed_by_a_leader_cut_off(to: ResetTo) -> (Net, usize, u16) {
    let (mut net, l, topic) = cluster_with_consumed(1);
    net.publish_many(l, topic, 2, 3);
    net.run_until("every node holds the records", |n| n.all_at(topic, 5));
    net.nodes[l].isolated = true;
    let reset = Change::ResetGroup {
        group: "g".into(),
        topic: "orders".into(),
        to,
        partition: None,
    };
    net.nodes[l].broker.change(1, &reset, net.now).unwrap();
    assert_ne!(
        net.position(l, topic),
        Some(1),
        "made on the leader at once"
    );
    // Only the old leader ticks: it steps down (check-quorum), nobody else campaigns.
    while net.cluster(l).replica.is_leader() {
        net.nodes[l].broker.raft_tick();
        net.pass(l);
    }
    (net, l, topic)
}

/// While `l` is cut off with an entry nobody else holds (at the end of a log whose
/// `topic` ends at 4), another node leads and truncates it with a record of its own
/// (sequence 5); `l` comes back and takes that log. Returns the new leader.
fn truncated_by_a_new_leader(net: &mut Net, l: usize, topic: u16) -> usize {
    net.run_until("another node leads", |n| {
        n.serving_leader(Some(l)).is_some()
    });
    let n = net.serving_leader(Some(l)).unwrap();
    net.publish(n, 5, topic, (3, 5), "v5");
    assert_eq!(pub_ok(&net.wait_answer(n, 5)).sequence, 5);
    net.nodes[l].isolated = false;
    net.run_until("the old leader took the new leader's log", |net| {
        net.term(l) == net.term(n) && net.next_sequence(l, topic) == 6
    });
    n
}

#[test]
fn a_forward_reset_truncated_with_its_deposed_leader_is_undone_there_and_skips_nothing() {
    let (mut net, l, topic) = reset_proposed_by_a_leader_cut_off(ResetTo::Sequence(4));
    // Deposed, it holds what its applied log says, as every follower does.
    assert_eq!(
        net.position(l, topic),
        Some(1),
        "the uncommitted reset stayed"
    );
    let n = truncated_by_a_new_leader(&mut net, l, topic);
    let answer = net.nodes[l]
        .changes
        .remove(&1)
        .expect("the reset was answered");
    let kind = answer.unwrap_err().kind;
    assert!(matches!(kind, ManageErrorKind::Cluster(_)), "{kind:?}");
    assert_eq!(net.position(l, topic), Some(1));
    // Leading again, the group resumes at its committed position: 2 and 3 were never
    // acknowledged and must be delivered.
    net.lead_again(l, n);
    assert_eq!(net.first_delivery(l, topic).sequence, 2);
}

#[test]
fn a_backward_reset_truncated_with_its_deposed_leader_is_undone_there_at_once() {
    let (mut net, l, topic) = reset_proposed_by_a_leader_cut_off(ResetTo::Earliest);
    assert_eq!(
        net.position(l, topic),
        Some(1),
        "the uncommitted reset stayed"
    );
    net.run_until("another node leads", |n| {
        n.serving_leader(Some(l)).is_some()
    });
    let n = net.serving_leader(Some(l)).unwrap();
    net.nodes[l].isolated = false;
    // Its log must have taken the new leader's too, or the third node, which holds the
    // new term's entries, refuses it its vote in `lead_again`.
    net.run_until("the old leader took the new leader's log", |net| {
        let replica = |i: usize| &net.cluster(i).replica;
        net.term(l) == net.term(n) && replica(l).last_term() == replica(n).last_term()
    });
    net.lead_again(l, n);
    assert_eq!(net.first_delivery(l, topic).sequence, 2);
}

#[test]
fn a_leader_deposed_and_elected_again_at_once_applies_its_reset_when_it_commits() {
    let (mut net, l, topic) = reset_proposed_by_a_leader_cut_off(ResetTo::Sequence(4));
    assert_eq!(net.position(l, topic), Some(1), "ahead of its applied log");
    // No other node led in between: its log, the reset's entry in it, is the longest,
    // and the entry commits in its next term.
    net.nodes[l].isolated = false;
    let f = (0..3).find(|&i| i != l).unwrap();
    net.lead_again(l, f);
    net.nodes[f].isolated = false;
    net.run_until("every node applied the reset", |n| {
        (0..3).all(|i| n.position(i, topic) == Some(3))
    });
    assert_eq!(net.first_delivery(l, topic).sequence, 4);
}

/// Leader `l` resets group "g" of "orders" to deliver from `sequence` on (operator
/// change 1), which it makes in its live groups at once, before the entry commits.
fn reset_forwards_on(net: &mut Net, l: usize, topic: u16, sequence: u64) {
    let reset = Change::ResetGroup {
        group: "g".into(),
        topic: "orders".into(),
        to: ResetTo::Sequence(sequence),
        partition: None,
    };
    net.nodes[l].broker.change(1, &reset, net.now).unwrap();
    let made = net.position(l, topic);
    assert_eq!(made, Some(sequence - 1), "made on the leader at once");
}

/// Leader `l`, cut off, proposes a reset forwards of "g" (committed at 1), then
/// `write_positions` writes its positions file while it still leads, the power goes and
/// it starts again, all before the entry commits. It must hold what its applied log
/// says, and once another leader truncated the entry, deliver from the committed
/// position when it leads again.
fn restarted_before_a_forward_reset_commits(write_positions: fn(&mut Net, usize)) {
    let (mut net, l, topic) = cluster_with_consumed(1);
    net.publish_many(l, topic, 2, 3);
    net.run_until("every node holds the records", |n| n.all_at(topic, 5));
    // Cut off, the leader proposes a reset forwards, which nobody else gets...
    net.nodes[l].isolated = true;
    reset_forwards_on(&mut net, l, topic, 4);
    // ...and writes its positions file while it still leads; then the power goes.
    write_positions(&mut net, l);
    assert!(net.cluster(l).replica.is_leader(), "written while it leads");
    let disk = net.nodes[l].disk.clone();
    disk.power_cut();
    net.nodes[l] = open_node_on(l as u64 + 1, disk);
    net.nodes[l].isolated = true;
    assert_eq!(
        net.position(l, topic),
        Some(1),
        "read back a reset no entry committed"
    );
    let n = truncated_by_a_new_leader(&mut net, l, topic);
    assert_eq!(net.position(l, topic), Some(1));
    // Leading again, the group resumes at its committed position: 2 and 3 were never
    // acknowledged and must be delivered.
    net.lead_again(l, n);
    assert_eq!(net.first_delivery(l, topic).sequence, 2);
}

#[test]
fn a_leader_shut_down_before_its_forward_reset_commits_does_not_read_it_back_nor_skip() {
    restarted_before_a_forward_reset_commits(|net, l| {
        net.nodes[l].broker.shutdown_sync(net.now).unwrap();
    });
}

#[test]
fn a_leader_that_lost_power_after_a_positions_write_does_not_read_back_its_unapplied_reset() {
    // The write an interval, a checkpoint or an operator's wait starts.
    restarted_before_a_forward_reset_commits(|net, l| {
        let write = net.nodes[l].broker.positions_job(net.now, true);
        let write = write.expect("a write: the file does not hold these positions yet");
        net.nodes[l].jobs.0.borrow_mut().push(write);
        net.pass(l);
    });
}

#[test]
fn a_snapshot_carries_the_applied_positions_not_a_reset_its_leader_has_not_committed() {
    let (mut net, l, topic) = cluster_with_consumed(1);
    // About five 64 KiB journal files: every node compacts past the group's position.
    net.publish_many(l, topic, 2, 80);
    net.run_until("every node compacted", |net| {
        (0..3).all(|i| net.cluster(i).replica.first_index() > 1)
    });
    let f = (0..3).find(|&i| i != l).unwrap();
    let other = (0..3).find(|&i| i != l && i != f).unwrap();
    // One follower cut off, the other wiped: nothing the leader proposes now commits.
    net.nodes[other].isolated = true;
    net.nodes[f] = open_node_on(f as u64 + 1, SimDisk::seeded(99));
    reset_forwards_on(&mut net, l, topic, 40);
    // The wiped node installs the leader's snapshot; raft's messages to it after the
    // snapshot's are lost, so the reset's entry does not reach it.
    net.install_frames_left = Some(0);
    net.nodes[l].broker.peer_up(f as u64 + 1, None, Some(0));
    net.run_until("the wiped node restarted into the install", |n| {
        n.nodes[f].restarts.len() == 1
    });
    net.nodes[f].raft_cut = true;
    net.install_frames_left = None;
    net.run_until("the wiped node installed", |n| {
        n.nodes[f].restarts.len() >= 2
    });
    assert_eq!(net.next_sequence(f, topic), 82, "installed, not given up");
    assert_eq!(
        net.position(f, topic),
        Some(1),
        "the snapshot carried a reset no entry committed"
    );
    // The reset is truncated: the other two lead without the old leader, and the
    // installed node, leading, delivers from the committed position.
    net.nodes[f].raft_cut = false;
    net.nodes[other].isolated = false;
    net.nodes[l].isolated = true;
    net.run_until("another node leads", |n| {
        n.serving_leader(Some(l)).is_some()
    });
    let n = net.serving_leader(Some(l)).unwrap();
    if n != f {
        net.lead_again(f, n);
    }
    assert_eq!(net.first_delivery(f, topic).sequence, 2);
}

mod seeds;
