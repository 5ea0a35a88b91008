//! Seeded runs of the three in-process brokers of `cluster_sim`: idempotent producers,
//! a consumer group that acknowledges and rejects, operator changes (group reset and
//! delete, purge), isolation, restarts and power cuts, each drawn from one seed; every
//! node checks its invariants after every pass. After healing, the checker asks what
//! applying one log must give: every node holds the same records and dead letters, the
//! same applied group positions and the same tombstone; every acknowledged record is at
//! its sequence exactly once, on every node, unless a purge was asked for below it or
//! its producer expired between its copies; record timestamps never go back along a
//! partition; every node would deduplicate a resend of any producer's record alike.
//! Variants add disk faults that stop nodes, a second partition, more members, wall
//! clocks set wrong, and a `--producer-ttl` of a second.
//!
//! `MORTAR_CLUSTER_SIM_SEEDS=N` runs seeds 1..=N, `MORTAR_CLUSTER_SIM_SEED=S` one; a
//! failure prints `cluster simulation FAILED at seed S` with the seed's steps. Election
//! timeouts come from the seed too, so a seed replays (`docs/REPLICATION.md` §9.5).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::*;
use crate::broker::producers::Idempotence;
use crate::broker::replica::simnet::env_u64;
use crate::broker::PartitionKey;
use crate::log::simdisk::{FaultRates, SimRng};

const SEEDS_DEFAULT: u64 = 100;
const STEPS: usize = 150;
const PRODUCERS: u64 = 2;
const VALUE_PADDING_MAX: u64 = 6_000;
/// A leader keeps this much journal for a node that fell behind, then offers a snapshot:
/// two of the harness's 64 KiB journal files.
const JOURNAL_RETAIN_BYTES: u64 = 2 * JOURNAL_FILE_BYTES;
/// A PUB not answered within this many steps is sent again, as a client times out.
const RESEND_AFTER_STEPS: usize = 6;
/// Rounds the healed cluster may take to agree.
const HEAL_ROUNDS_MAX: usize = 400;
/// A failing disk fails about one write or fdatasync in fifty, for up to this many steps.
const DISK_FAULT_STEPS_MAX: u64 = 8;
const DISK_FAULTS: FaultRates = FaultRates {
    write_eio: 10_000,
    write_enospc: 10_000,
    sync_eio: 20_000,
    read_eio: 0,
};
/// A crash point stops a node at one of its disk's next this many changes: inside a
/// Ready's journal write, a persist job, a checkpoint or an install as well as between
/// them (`SimDisk::crash_after`).
const CRASH_WITHIN_CHANGES: u64 = 40;
/// Per start, a node's first one included (in the variants with start crashes), one
/// chance in this many that the new process dies within its first
/// `START_CRASH_WITHIN_CHANGES` disk changes (the data directory and journal made, install
/// resume, the raft journal's replay, the checkpoint): any number of times in a row.
const START_CRASH_ONE_IN: u64 = 4;
const START_CRASH_WITHIN_CHANGES: u64 = 40;
/// A stepped wall clock stands up to this far behind (twice the harness's
/// `--producer-ttl`, so a record stamped with it would look expired)...
const CLOCK_BEHIND_MAX_MS: u64 = 120_000;
/// ...or up to this far ahead: further ahead, a leader's clock ages producers past the
/// TTL by design, and a resend after that is a new record (`docs/DECISIONS.md`, "The
/// log's clock"), which the checker would count as acknowledged twice.
const CLOCK_AHEAD_MAX_MS: u64 = 15_000;

/// One idempotent producer: its next record waits until the one before is acknowledged.
struct Producer {
    id: u64,
    seq: u64,
    /// The record in flight: (producer_seq, value, step it was last sent at).
    pending: Option<(u64, String, usize)>,
}

/// What the seeds did, summed, so that a run that exercised nothing shows.
#[derive(Debug, Default)]
struct Stats {
    acknowledged: usize,
    dead_letters: u64,
    changes_answered_ok: usize,
    reopened: usize,
    installs: usize,
    /// Nodes that stopped on a failed write or sync (disk faults).
    failed: usize,
    /// Nodes stopped at a crash point (then restarted, half of them after a power cut).
    crash_points: usize,
    /// Restarts that died at a crash point before they finished.
    start_crashes: usize,
    clock_steps: usize,
    /// Producers forgotten after `--producer-ttl` (counted by nodes since their start).
    producers_expired: u64,
    /// Records appended again after their producer expired (a new record by design).
    resent_after_expiry: usize,
    /// Groups removed after `--group-ttl` without members (counted by nodes since their
    /// start).
    groups_expired: u64,
    /// Deliveries checked against a settled position of group `g` above 0.
    deliveries_above_settled: usize,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.acknowledged += other.acknowledged;
        self.dead_letters += other.dead_letters;
        self.changes_answered_ok += other.changes_answered_ok;
        self.reopened += other.reopened;
        self.installs += other.installs;
        self.failed += other.failed;
        self.crash_points += other.crash_points;
        self.start_crashes += other.start_crashes;
        self.clock_steps += other.clock_steps;
        self.producers_expired += other.producers_expired;
        self.resent_after_expiry += other.resent_after_expiry;
        self.groups_expired += other.groups_expired;
        self.deliveries_above_settled += other.deliveries_above_settled;
    }
}

struct World {
    net: Net,
    rng: SimRng,
    topic: u16,
    producers: Vec<Producer>,
    /// Every PUB sent: (node, slot) -> (producer index, producer_seq, value).
    sent: BTreeMap<(usize, u64), (usize, u64, String)>,
    partitions: u16,
    members: u8,
    clock_steps: bool,
    producer_ttl_ms: u64,
    group_ttl_ms: Option<u64>,
    operator_changes: bool,
    crash_points: bool,
    start_crashes: bool,
    /// Group `g`'s committed position per partition, the highest any node applied: every
    /// record up to it was settled and the ACK replicated, so no leader may deliver it
    /// again. `None` from the first group reset, delete or expiry on, which move
    /// positions back by design, and from the first purge, which moves them forward
    /// without an ACK.
    settled: Option<BTreeMap<u16, u64>>,
    /// Acknowledged records: (partition, sequence) -> value.
    acked: BTreeMap<(u16, u64), String>,
    next_slot: u64,
    next_ticket: u64,
    purge_asked: bool,
    /// Whether steps may make a disk fail, and the nodes whose disk fails until a step.
    disk_faults: bool,
    faulty: Vec<(usize, usize)>,
    stats: Stats,
    step: usize,
    trace: Vec<String>,
}

impl World {
    fn new(
        seed: u64,
        Variant {
            disk_faults,
            partitions,
            members,
            clock_steps,
            producer_ttl_ms,
            group_ttl_ms,
            operator_changes,
            crash_points,
            start_crashes,
        }: Variant,
    ) -> World {
        let kept = Kept {
            journal_retain_bytes: JOURNAL_RETAIN_BYTES,
            producer_ttl_ms,
            group_ttl_ms: group_ttl_ms.unwrap_or(Kept::default().group_ttl_ms),
        };
        let disk_seed = seed.wrapping_mul(1_000);
        let mut rng = SimRng::new(seed);
        let mut stats = Stats::default();
        let mut trace = Vec::new();
        let first_starts = |net: &mut Net, id, disk: &SimDisk| {
            if start_crashes {
                crash_starts(net, &mut rng, id, disk, (&mut stats, &mut trace, "start"));
            }
        };
        let seeds = (disk_seed, Some(seed));
        let mut net = Net::opened_after(kept, seeds, LogConfig::default(), first_starts);
        if clock_steps {
            net.now.wall_ms = WALL_CLOCK_START_MS;
        }
        let l = net.settled_leader();
        let topic = net.declare_partitions(l, "orders", partitions);
        let producers = (0..PRODUCERS).map(|i| Producer {
            id: 100 + i,
            seq: 0,
            pending: None,
        });
        World {
            net,
            rng,
            topic,
            producers: producers.collect(),
            sent: BTreeMap::new(),
            partitions,
            members,
            clock_steps,
            producer_ttl_ms,
            group_ttl_ms,
            operator_changes,
            crash_points,
            start_crashes,
            settled: group_ttl_ms.is_none().then(BTreeMap::new),
            acked: BTreeMap::new(),
            next_slot: 10_000,
            next_ticket: 1,
            purge_asked: false,
            disk_faults,
            faulty: Vec::new(),
            stats,
            step: 0,
            trace,
        }
    }

    fn run(&mut self) {
        for step in 0..STEPS {
            self.step = step;
            self.random_step();
            for _ in 0..=self.rng.below(3) {
                self.net.tick();
                self.net.deliver();
                self.harvest();
            }
            if self.disk_faults {
                self.stop_crashed();
                self.after_disk_faults();
            }
        }
        self.step = usize::MAX;
        self.stop_crashed();
        for node in &self.net.nodes {
            node.disk.restarted(); // a crash point not reached yet is dropped
        }
        self.after_disk_faults();
        self.heal();
        self.check();
    }

    fn random_step(&mut self) {
        let roll = self.rng.below(100);
        let leader = self.net.serving_leader(None);
        match (roll, leader) {
            (0..=39, Some(l)) => self.publish(l),
            (40..=59, Some(l)) => self.consume(l),
            (60..=69, Some(l)) if self.operator_changes => self.operator_change(l),
            (60..=69, Some(l)) => self.consume(l),
            (70..=77, _) => self.isolate(),
            (78..=91, _) => {
                let i = self.rng.below(NODES) as usize;
                self.reopen(i, roll >= 86);
            }
            (92..=95, _) if self.disk_faults => self.start_disk_faults(),
            (96..=99, _) if self.clock_steps => self.step_clock(),
            (96..=99, _) if self.crash_points => self.set_crash_point(),
            _ => {}
        }
    }

    /// Each producer sends its next record, or again the one not answered yet.
    fn publish(&mut self, l: usize) {
        for p in 0..self.producers.len() {
            let step = self.step;
            // Up to 6 KB, so that journal files fill and checkpoints compact.
            let padding = "x".repeat(self.rng.below(VALUE_PADDING_MAX) as usize);
            let producer = &mut self.producers[p];
            let (seq, value) = match &mut producer.pending {
                Some((_, _, sent)) if step - *sent < RESEND_AFTER_STEPS => continue,
                Some((seq, value, sent)) => {
                    *sent = step;
                    (*seq, value.clone())
                }
                None => {
                    producer.seq += 1;
                    let value = format!("p{}-{}{padding}", producer.id, producer.seq);
                    producer.pending = Some((producer.seq, value.clone(), step));
                    (producer.seq, value)
                }
            };
            let (slot, id) = (self.next_slot, producer.id);
            self.next_slot += 1;
            let shown = format!("p{id}-{seq}");
            self.trace
                .push(format!("{step}: PUB {shown} (slot {slot}) on node {l}"));
            let partition = (p as u16) % self.partitions;
            self.net
                .publish_to(l, slot, (self.topic, partition), (id, seq), &value);
            self.sent.insert((l, slot), (p, seq, value));
        }
    }

    /// Collects the answers every node gave: an OK acknowledges its record; an error
    /// leaves it to be sent again.
    fn harvest(&mut self) {
        self.note_settled();
        for i in 0..self.net.nodes.len() {
            for (slot, response) in std::mem::take(&mut self.net.nodes[i].answers) {
                let Some((p, seq, value)) = self.sent.remove(&(i, slot)) else {
                    continue;
                };
                let Response::Pub(ok) = response else {
                    let code = response.error_code();
                    self.trace.push(format!("slot {slot}: {code:?}"));
                    continue;
                };
                self.trace
                    .push(format!("slot {slot}: OK at {}", ok.sequence));
                let partition = (p as u16) % self.partitions;
                if let Some(before) = self.acked.insert((partition, ok.sequence), value.clone()) {
                    assert_eq!(before, value, "two records acknowledged at {}", ok.sequence);
                }
                let pending = &mut self.producers[p].pending;
                if pending.as_ref().is_some_and(|(s, _, _)| *s == seq) {
                    *pending = None;
                }
            }
        }
    }

    /// Raises `settled` to what any node applied: applied means committed.
    fn note_settled(&mut self) {
        let Some(settled) = &mut self.settled else {
            return;
        };
        for node in &self.net.nodes {
            let cluster = node.broker.cluster.as_deref().unwrap();
            for p in cluster.applied.positions() {
                if p.group == b"g" && p.topic_id == self.topic {
                    let at = settled.entry(p.partition).or_default();
                    *at = (*at).max(p.committed);
                }
            }
        }
    }

    /// No leader delivers again a record of group `g` whose settling a node applied.
    fn check_not_settled(&mut self, l: usize, delivery: &crate::consume::Delivery) {
        let r = &delivery.reference;
        let Some(&settled) = (self.settled.as_ref()).and_then(|s| s.get(&r.partition)) else {
            return;
        };
        assert!(
            r.sequence > settled,
            "node {l} delivered {}/{} (attempt {}) to group g, settled up to {settled} \
             on a node",
            r.partition,
            r.sequence,
            delivery.attempt
        );
        self.stats.deliveries_above_settled += usize::from(settled > 0);
    }

    /// Group `g` joins on the leader, takes what comes for a few rounds, acknowledges
    /// most, rejects some into the twin, leaves some in flight, and its connection
    /// closes.
    fn consume(&mut self, l: usize) {
        // One member, or (a variant) up to `members` on connections of their own.
        let count = match self.members {
            1 => 1,
            m => 1 + self.rng.below(u64::from(m)) as u32,
        };
        let conns: Vec<ConnRef> = (1..=count).map(|id| ConnRef { id, serial: 1 }).collect();
        for &conn in &conns {
            self.net.join_g_on(l, self.topic, conn);
        }
        let (mut acked, mut rejected, mut left) = (0, 0, 0);
        for _ in 0..=self.rng.below(4) {
            self.net.deliver();
            self.note_settled();
            for push in std::mem::take(&mut self.net.nodes[l].pushes) {
                if let Effect::Deliver { delivery, .. } = &push {
                    self.check_not_settled(l, delivery);
                }
                let roll = self.rng.below(10);
                let now = self.net.now_of(l);
                let broker = &mut self.net.nodes[l].broker;
                match push {
                    Effect::Notice { conn, notice } => {
                        let answer = ControlAck::answering(&notice, ControlResult::Ok);
                        let _ = broker.control_ack(conn, &answer, now);
                    }
                    Effect::Deliver { conn, delivery } if roll < 7 => {
                        acked += 1;
                        let _ = broker.ack(conn, &delivery.reference.ack(AckFlags::empty()), now);
                    }
                    Effect::Deliver { conn, delivery } if roll < 9 => {
                        rejected += 1;
                        let nack = delivery.reference.nack(NackReason::Reject);
                        let _ = broker.nack(conn, &nack, now);
                    }
                    _ => left += 1,
                }
            }
            self.net.tick();
        }
        let now = self.net.now_of(l);
        for &conn in &conns {
            self.net.nodes[l].broker.connection_closed(conn, now);
        }
        self.net.nodes[l].pushes.clear();
        let step = self.step;
        let what = format!("{acked} acknowledged, {rejected} rejected, {left} left");
        self.trace.push(format!(
            "{step}: group g ({count} members) on node {l}: {what}"
        ));
    }

    /// A reset of group `g` (earliest, latest or a sequence), its delete, or a purge.
    fn operator_change(&mut self, l: usize) {
        let (group, topic) = (String::from("g"), String::from("orders"));
        let change = match self.rng.below(10) {
            0..=2 => {
                self.settled = None;
                Change::DeleteGroup { group, topic }
            }
            3..=8 => {
                self.settled = None;
                let to = match self.rng.below(3) {
                    0 => ResetTo::Earliest,
                    1 => ResetTo::Latest,
                    _ => ResetTo::Sequence(1 + self.rng.below(self.acked.len() as u64 + 2)),
                };
                let partition = None;
                Change::ResetGroup {
                    group,
                    topic,
                    to,
                    partition,
                }
            }
            _ => {
                // A purge moves positions too, forward to the new first sequence, which no
                // ACK settled: a delivery made before it applied, seen after, would look
                // like one of a settled record.
                self.purge_asked = true;
                self.settled = None;
                Change::Purge { topic }
            }
        };
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let now = self.net.now_of(l);
        let broker = &mut self.net.nodes[l].broker;
        let taken = broker.change(ticket, &change, now).map_err(|e| e.kind);
        self.trace
            .push(format!("{}: {change:?} on node {l}: {taken:?}", self.step));
    }

    /// One node is cut off, or every node reachable again.
    fn isolate(&mut self) {
        let i = self.rng.below(NODES) as usize;
        for (n, node) in self.net.nodes.iter_mut().enumerate() {
            node.isolated = n == i && !node.isolated;
        }
        self.trace
            .push(format!("{}: node {i} isolated (others joined)", self.step));
    }

    /// One node's wall clock is set anew, behind or ahead of the others'.
    fn step_clock(&mut self) {
        let i = self.rng.below(NODES) as usize;
        let drawn = self.rng.below(CLOCK_BEHIND_MAX_MS + CLOCK_AHEAD_MAX_MS + 1);
        let skew = drawn as i64 - CLOCK_BEHIND_MAX_MS as i64;
        self.net.nodes[i].wall_skew_ms = skew;
        self.stats.clock_steps += 1;
        self.trace.push(format!(
            "{}: node {i}'s wall clock at {skew:+} ms",
            self.step
        ));
    }

    /// One node's disk fails some writes (EIO, ENOSPC) and fdatasyncs (EIO) for a few
    /// steps.
    fn start_disk_faults(&mut self) {
        let i = self.rng.below(NODES) as usize;
        let until = self.step + 1 + self.rng.below(DISK_FAULT_STEPS_MAX) as usize;
        self.net.nodes[i].disk.set_faults(DISK_FAULTS);
        self.faulty.push((i, until));
        self.trace.push(format!(
            "{}: node {i}'s disk fails until step {until}",
            self.step
        ));
    }

    /// One node will crash at one of its disk's next `CRASH_WITHIN_CHANGES` changes.
    fn set_crash_point(&mut self) {
        let i = self.rng.below(NODES) as usize;
        let changes = self.rng.below(CRASH_WITHIN_CHANGES);
        self.net.nodes[i].disk.crash_after(changes);
        self.trace.push(format!(
            "{}: node {i} crashes at its disk's change {changes} from now",
            self.step
        ));
    }

    /// Starts again the nodes that reached their crash point, half of them after a
    /// power cut.
    fn stop_crashed(&mut self) {
        for i in 0..self.net.nodes.len() {
            if self.net.nodes[i].disk.crashed() {
                self.stats.crash_points += 1;
                let power_cut = self.rng.below(2) == 0;
                self.trace.push(format!("{}: node {i} crashed", self.step));
                self.reopen(i, power_cut);
            }
        }
    }

    /// Ends the disk faults that are due and restarts the nodes they stopped.
    fn after_disk_faults(&mut self) {
        let step = self.step;
        for &(i, _) in self.faulty.iter().filter(|&&(_, until)| until <= step) {
            self.net.nodes[i].disk.set_faults(FaultRates::default());
        }
        self.faulty.retain(|&(_, until)| until > step);
        self.restart_failed();
    }

    /// Starts again a node that stopped on a failed write or sync, as its supervisor
    /// would; its disk heals first.
    fn restart_failed(&mut self) {
        let step = self.step;
        for i in 0..self.net.nodes.len() {
            let failed = self.net.cluster(i).failed.clone();
            let Some(why) = failed else {
                continue;
            };
            self.trace.push(format!("{step}: node {i} failed: {why}"));
            assert!(
                self.disk_faults,
                "node {i} stopped with no disk fault: {why}"
            );
            self.net.nodes[i].disk.set_faults(FaultRates::default());
            self.faulty.retain(|&(n, _)| n != i);
            self.stats.failed += 1;
            self.reopen(i, false);
        }
    }

    /// Node `i` stops and starts again on its disk, as it is or after a power cut.
    fn reopen(&mut self, i: usize, power_cut: bool) {
        self.harvest();
        self.sent.retain(|&(n, _), _| n != i);
        self.count_node(i);
        self.stats.reopened += 1;
        let (disk, isolated) = (self.net.nodes[i].disk.clone(), self.net.nodes[i].isolated);
        // Raft hands a node only entries it persisted to apply: whatever stops it, those
        // must come back. An install in progress is the exception by design: it wiped
        // the log for the leader's snapshot, past all of them, and votes for no one until
        // that is in (`install.rs`).
        let applied = self.net.cluster(i).applied_index;
        let promised = self.net.nodes[i].promised;
        if power_cut {
            disk.power_cut();
        }
        if self.start_crashes {
            let step = self.step.to_string();
            let log = (&mut self.stats, &mut self.trace, step.as_str());
            crash_starts(&mut self.net, &mut self.rng, i as u64 + 1, &disk, log);
        }
        self.net.nodes[i] = self.net.open(i as u64 + 1, disk);
        let status = self.net.nodes[i].broker.cluster_status().unwrap();
        assert!(
            status.role == "installing" || status.last_index >= applied,
            "node {i} came back with its log ending at {}, behind entry {applied} it had \
             applied: what it had made durable was lost",
            status.last_index
        );
        promised.check_kept(i, &self.net.nodes[i]);
        self.net.nodes[i].promised = promised;
        self.net.nodes[i].isolated = isolated;
        self.net.links_up(i);
        let how = if power_cut { "lost power" } else { "restarted" };
        self.trace.push(format!("{}: node {i} {how}", self.step));
    }

    /// Counts what node `i` did before it is replaced (or the run ends): its install
    /// restarts and the operator changes it answered.
    fn count_node(&mut self, i: usize) {
        let node = &mut self.net.nodes[i];
        self.stats.installs += node.restarts.len();
        let changes = std::mem::take(&mut node.changes);
        self.stats.changes_answered_ok += changes.values().filter(|r| r.is_ok()).count();
        self.stats.producers_expired += node.broker.counters.producers_expired;
        self.stats.groups_expired += node.broker.coordinator().stats().groups_expired;
    }

    /// A node restarted since it applied the last record-less BATCH (an idle tick's, a
    /// consumer's positions) reads its log's clock from its newest record, behind that
    /// BATCH's stamp, until it applies the next BATCH (`docs/DECISIONS.md`, "The log's
    /// clock"): the idle leader's tick, here, which every node applies.
    fn clocks_caught_up(&mut self) {
        let applied = |w: &World, i: usize| w.net.cluster(i).applied_index;
        let before = applied(self, 0);
        self.net.now.mono_ms += super::super::cluster::LOG_CLOCK_TICK_MS;
        for _ in 0..HEAL_ROUNDS_MAX {
            self.net.tick();
            self.net.deliver();
            let now = applied(self, 0);
            if now > before && (1..self.net.nodes.len()).all(|i| applied(self, i) == now) {
                return;
            }
        }
        panic!("no BATCH applied everywhere after healing");
    }

    /// Every node reachable, until a leader serves and every node applied what it did.
    fn heal(&mut self) {
        for node in &mut self.net.nodes {
            node.isolated = false;
        }
        for _ in 0..HEAL_ROUNDS_MAX {
            self.net.tick();
            self.net.deliver();
            self.harvest();
            self.restart_failed();
            let Some(l) = self.net.serving_leader(None) else {
                continue;
            };
            let applied = self.net.cluster(l).applied_index;
            if (0..self.net.nodes.len()).all(|i| self.net.cluster(i).applied_index == applied) {
                return;
            }
        }
        let status = |n: &Node| {
            let s = n.broker.cluster_status().unwrap();
            let failed = &n.broker.cluster.as_deref().unwrap().failed;
            format!(
                "node {}: {} term {} leader {:?} commit {} applied {} last {} first {} \
                 checkpoint {} install {:?} match {:?} failed {failed:?}\n  {}",
                s.node_id,
                s.role,
                s.term,
                s.leader_id,
                s.commit_index,
                s.applied_index,
                s.last_index,
                s.first_index,
                s.checkpoint_index,
                s.install_bytes,
                s.match_indexes,
                n.broker
                    .cluster
                    .as_deref()
                    .unwrap()
                    .replica
                    .progress_debug()
            )
        };
        let nodes: Vec<String> = self.net.nodes.iter().map(status).collect();
        panic!("the healed cluster never agreed:\n{}", nodes.join("\n"));
    }

    fn check(&mut self) {
        let twin = crate::wire::dlq_twin_id(self.topic);
        for i in 0..self.net.nodes.len() {
            self.count_node(i);
        }
        let mut values = BTreeMap::new();
        for p in 0..self.partitions {
            self.stats.dead_letters += self.net.next_sequence_at(0, (twin, p)).saturating_sub(1);
            let twin_floor = self.same_records((twin, p));
            self.in_time_order((twin, p), twin_floor);
            let floor = self.same_records((self.topic, p));
            assert!(
                self.purge_asked || floor == 1,
                "partition {p}: records below {floor} gone without a purge"
            );
            self.in_time_order((self.topic, p), floor);
            for sequence in floor..self.net.next_sequence_at(0, (self.topic, p)) {
                let node = &mut self.net.nodes[0].broker;
                let record = node
                    .read_record(self.topic, p, sequence)
                    .unwrap()
                    .expect("held");
                let value = String::from_utf8(record.value).unwrap();
                let Some(first_ms) = values.insert(value.clone(), record.timestamp_ms) else {
                    continue;
                };
                // Held twice only if its producer had expired between the two: its
                // newest record, at best this one's first copy, over a TTL old.
                assert!(
                    record.timestamp_ms.saturating_sub(first_ms) > self.producer_ttl_ms,
                    "{value} twice, again at {p}/{sequence}"
                );
                self.stats.resent_after_expiry += 1;
            }
            let acked: Vec<_> = self.acked.range((p, floor)..(p + 1, 0)).collect();
            let acked: Vec<(u64, String)> =
                acked.into_iter().map(|(k, v)| (k.1, v.clone())).collect();
            for (sequence, value) in acked {
                let held = self.value(0, (self.topic, p), sequence);
                assert_eq!(held, Some(value), "acknowledged at {p}/{sequence}");
            }
        }
        // A purge writes the producer snapshots before it removes files, so a node
        // that rebuilds its producers after one knows those of the purged records.
        // Expiry is housekeeping's: every node's runs on the same log's clock.
        self.clocks_caught_up();
        self.net.housekeeping_everywhere();
        // Housekeeping may have stopped a node (a checkpoint it retried found a partition
        // a disk fault had failed): its supervisor starts it again before it is compared.
        if (0..self.net.nodes.len()).any(|i| self.net.cluster(i).failed.is_some()) {
            self.heal();
        }
        self.same_producers();
        let applied = |net: &Net, i: usize| net.cluster(i).applied.positions();
        let tombstone = |w: &mut World, i| tombstone_marks(&mut w.net, i, w.topic);
        let (positions, marks) = (applied(&self.net, 0), tombstone(self, 0));
        for i in 1..self.net.nodes.len() {
            let theirs = applied(&self.net, i);
            assert_eq!(theirs, positions, "node {i}'s applied positions");
            assert_eq!(tombstone(self, i), marks, "node {i}'s tombstone");
        }
        if let Some(ttl_ms) = self.group_ttl_ms {
            self.groups_expire_everywhere(ttl_ms);
        }
    }

    /// Group `g` has no member now: once the leader lets it go after `--group-ttl`,
    /// every node forgets its positions, so that no failover or restart brings back a
    /// group the leader removed.
    fn groups_expire_everywhere(&mut self, ttl_ms: u64) {
        let held = |net: &Net| {
            let nodes = 0..net.nodes.len();
            nodes
                .map(|i| net.cluster(i).applied.positions())
                .collect::<Vec<_>>()
        };
        self.net.now.mono_ms += ttl_ms;
        for _ in 0..HEAL_ROUNDS_MAX {
            self.net.tick();
            self.net.deliver();
            if held(&self.net).iter().all(|positions| positions.is_empty()) {
                return;
            }
        }
        let held = held(&self.net);
        panic!("group positions outlived --group-ttl: {held:?}");
    }

    /// Every node would append, or refuse to append, a resend of any record of every
    /// producer alike: the same dedup after any failover.
    fn same_producers(&mut self) {
        for p in 0..self.partitions {
            let answers = |net: &Net, i: usize| {
                let part = net.nodes[i].broker.partition(self.topic, p);
                let producers = &part.expect("open").producers;
                (self.producers.iter())
                    .flat_map(|pr| (1..=pr.seq + 1).map(move |seq| (pr.id, seq)))
                    .map(|(id, seq)| (id, seq, producers.check(id, seq) == Idempotence::Fresh))
                    .collect::<Vec<_>>()
            };
            let ours = answers(&self.net, 0);
            for i in 1..self.net.nodes.len() {
                let theirs = answers(&self.net, i);
                let differ = ours.iter().zip(&theirs).find(|(a, b)| a != b);
                assert!(
                    differ.is_none(),
                    "node {i} vs node 0, partition {p}: {differ:?}"
                );
            }
        }
    }

    /// Node `i`'s record of `key` at `sequence`: its flags and value.
    fn stored(
        &mut self,
        i: usize,
        (topic_id, p): PartitionKey,
        sequence: u64,
    ) -> Option<(u16, Vec<u8>)> {
        let record = self.net.nodes[i]
            .broker
            .read_record(topic_id, p, sequence)
            .unwrap();
        record.map(|r| (r.flags, r.value))
    }

    fn value(&mut self, i: usize, key: PartitionKey, sequence: u64) -> Option<String> {
        let (_, value) = self.stored(i, key, sequence)?;
        Some(String::from_utf8(value).unwrap())
    }

    /// A leader stamps records (a dead letter's too) with its wall clock, never behind
    /// the log's nor what it proposed before: timestamps never go back along a
    /// partition (node 0's records stand for every node's, `same_records`).
    fn in_time_order(&mut self, (topic, partition): PartitionKey, floor: u64) {
        let mut stamped = 0;
        for sequence in floor..self.net.next_sequence_at(0, (topic, partition)) {
            let node = &mut self.net.nodes[0].broker;
            let record = node.read_record(topic, partition, sequence).unwrap();
            let record = record.expect("held");
            assert!(
                record.timestamp_ms >= stamped,
                "{topic}/{partition}/{sequence} stamped back"
            );
            stamped = record.timestamp_ms;
        }
    }

    /// Every node holds the same records of `key` from the highest first sequence among
    /// them to the same end; returns that first sequence.
    fn same_records(&mut self, key: PartitionKey) -> u64 {
        let first = |net: &Net, i: usize| {
            let part = net.nodes[i].broker.partition(key.0, key.1);
            part.map_or(1, |p| p.log.first_sequence())
        };
        let nodes = self.net.nodes.len();
        let floor = (0..nodes).map(|i| first(&self.net, i)).max().unwrap();
        let next = self.net.next_sequence_at(0, key);
        for i in 1..nodes {
            assert_eq!(self.net.next_sequence_at(i, key), next, "node {i}, {key:?}");
            for sequence in floor..next {
                let (theirs, ours) = (self.stored(i, key, sequence), self.stored(0, key, sequence));
                assert_eq!(theirs, ours, "node {i}, {key:?}, sequence {sequence}");
            }
        }
        floor
    }
}

/// The starts of node `id` on `disk` that die before the one that lives: one start in
/// `START_CRASH_ONE_IN` dies within its first `START_CRASH_WITHIN_CHANGES` disk changes,
/// any number of times in a row, and the next starts over the page cache or after a power
/// cut. A first start counts too: the data directory, the journal and its spares, the
/// registry are all made then, and a node that dies making them must start again as a
/// node that never ran. Each crashed start is counted and traced at `when`.
fn crash_starts(
    net: &mut Net,
    rng: &mut SimRng,
    id: u64,
    disk: &SimDisk,
    (stats, trace, when): (&mut Stats, &mut Vec<String>, &str),
) {
    while rng.below(START_CRASH_ONE_IN) == 0 {
        let changes = rng.below(START_CRASH_WITHIN_CHANGES);
        if !net.start_crashed(id, disk, changes) {
            break;
        }
        stats.start_crashes += 1;
        let cut = rng.below(2) == 0;
        trace.push(format!(
            "{when}: node {}'s start crashed at change {changes} (power cut: {cut})",
            id - 1
        ));
        if cut {
            disk.power_cut();
        }
    }
}

/// What a seed's run may draw besides the plain steps.
#[derive(Debug, Clone, Copy)]
struct Variant {
    disk_faults: bool,
    /// Of topic `orders`; producer `p` publishes to partition `p % partitions`.
    partitions: u16,
    /// Group `g` joins with up to this many members, each on its own connection.
    members: u8,
    clock_steps: bool,
    producer_ttl_ms: u64,
    /// `None`: the flag's default, so no group expires within a run.
    group_ttl_ms: Option<u64>,
    /// Whether steps reset and delete group `g` and purge; without, they consume.
    operator_changes: bool,
    /// Whether steps set crash points (`set_crash_point`); only with disk faults, where a
    /// node may stop.
    crash_points: bool,
    /// Whether a restart may die within its first `START_CRASH_WITHIN_CHANGES` changes.
    start_crashes: bool,
}

impl Variant {
    /// As the variant ran before crash points: a seed found then replays its history.
    const fn before_crash_points(self) -> Variant {
        Variant {
            crash_points: false,
            ..self.before_start_crashes()
        }
    }

    /// As the variant ran before starts could crash.
    const fn before_start_crashes(self) -> Variant {
        Variant {
            start_crashes: false,
            ..self
        }
    }
}

const PLAIN: Variant = Variant {
    disk_faults: false,
    partitions: 1,
    members: 1,
    clock_steps: false,
    producer_ttl_ms: PRODUCER_TTL_MS,
    group_ttl_ms: None,
    operator_changes: true,
    crash_points: false,
    start_crashes: false,
};
const DISK_FAULTS_ON: Variant = Variant {
    disk_faults: true,
    crash_points: true,
    start_crashes: true,
    ..PLAIN
};
const TWO_PARTITIONS: Variant = Variant {
    partitions: 2,
    ..DISK_FAULTS_ON
};
const THREE_MEMBERS: Variant = Variant {
    members: 3,
    ..TWO_PARTITIONS
};
const CLOCK_STEPS: Variant = Variant {
    clock_steps: true,
    ..PLAIN
};
/// Producers idle for a second of the log's clock are forgotten: several times a run
/// (a few steps without a PUB), and a resend after that may be a second copy. Wall
/// clocks set wrong as well: each node must still forget on the log's clock.
const PRODUCERS_EXPIRING: Variant = Variant {
    producer_ttl_ms: 1_000,
    ..CLOCK_STEPS
};
/// Group `g` is removed 250 ms after its last member left, many times a run, on
/// whichever node leads then; members join it again as a new group. Up to three members
/// over two partitions, disk faults on.
const GROUPS_EXPIRING: Variant = Variant {
    group_ttl_ms: Some(250),
    ..THREE_MEMBERS
};
/// No operator change ever moves group `g` back, so every delivery of every run is
/// checked against what the group settled: up to three members over two partitions
/// across failovers, restarts and disk faults.
const NO_OPERATOR_CHANGES: Variant = Variant {
    operator_changes: false,
    ..THREE_MEMBERS
};

fn run_seed(seed: u64, variant: Variant) -> Result<Stats, String> {
    let mut world = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        world = Some(World::new(seed, variant));
        let w = world.as_mut().unwrap();
        w.run();
        w.stats.acknowledged = w.acked.len();
        std::mem::take(&mut w.stats)
    }));
    outcome.map_err(|panic| {
        let violation = (panic.downcast_ref::<String>().cloned())
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_string());
        let trace = world.map(|w| w.trace.join("\n")).unwrap_or_default();
        format!(
            "cluster simulation FAILED at seed {seed} ({variant:?}): {violation}\n\
             (replay: MORTAR_CLUSTER_SIM_SEED={seed})\nsteps:\n{trace}"
        )
    })
}

/// Seeds 1..=`MORTAR_CLUSTER_SIM_SEEDS` (or the one `MORTAR_CLUSTER_SIM_SEED`).
fn run_seeds(variant: Variant) {
    let seeds: Vec<u64> = match env_u64("MORTAR_CLUSTER_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_u64("MORTAR_CLUSTER_SIM_SEEDS").unwrap_or(SEEDS_DEFAULT)).collect(),
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    for &seed in &seeds {
        let stats = run_seed(seed, variant).unwrap_or_else(|failure| panic!("{failure}"));
        total.add(&stats);
    }
    eprintln!(
        "cluster simulation ({variant:?}): {} seeds in {:.1} s, violations 0; {total:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(total.acknowledged > 0, "nothing was ever acknowledged");
    let stopped = total.failed > 0;
    assert!(
        !variant.disk_faults || stopped,
        "no disk fault stopped a node"
    );
    assert!(
        !variant.crash_points || total.crash_points > 0,
        "no crash point was reached"
    );
    assert!(
        !variant.start_crashes || total.start_crashes > 0,
        "no start was crashed"
    );
    assert!(
        !variant.clock_steps || total.clock_steps > 0,
        "no wall clock was stepped"
    );
    let expiring = variant.producer_ttl_ms < PRODUCER_TTL_MS;
    assert!(
        !expiring || total.producers_expired > 0,
        "no producer expired"
    );
    assert!(
        variant.group_ttl_ms.is_none() || total.groups_expired > 0,
        "no group expired"
    );
    assert!(
        variant.operator_changes || total.deliveries_above_settled > 0,
        "no delivery was checked against a settled position"
    );
}

#[test]
fn no_seed_leaves_the_nodes_disagreeing_or_an_acknowledged_record_lost() {
    run_seeds(PLAIN);
}

#[test]
fn nor_with_disk_faults_that_stop_nodes() {
    run_seeds(DISK_FAULTS_ON);
}

#[test]
fn nor_over_two_partitions_with_disk_faults() {
    run_seeds(TWO_PARTITIONS);
}

#[test]
fn nor_with_up_to_three_members() {
    run_seeds(THREE_MEMBERS);
}

#[test]
fn nor_with_wall_clocks_set_wrong() {
    run_seeds(CLOCK_STEPS);
}

#[test]
fn nor_with_producers_expiring() {
    run_seeds(PRODUCERS_EXPIRING);
}

#[test]
fn nor_with_groups_expiring() {
    run_seeds(GROUPS_EXPIRING);
}

#[test]
fn nor_delivers_again_what_a_replicated_ack_settled() {
    run_seeds(NO_OPERATOR_CHANGES);
}

/// Seeds that found a hole, each fixed since (`docs/REPLICATION.md` §9.5): 2, a group
/// delete applied again at a restart buried the group above a re-created group's dead
/// letter; 549, a leader sent a snapshot offered for an earlier ask, older than its
/// journal, and waited for it forever; 3340, a snapshot dropped at send (the link could
/// not take it) left the leader waiting for it forever; 2525 with disk faults, a purge
/// whose file job failed left old segments that a later purge put before a gap, and the
/// node never started again; 524 with producers expiring, a node restarted after a purge
/// of every record aged its snapshot's producers from its log's clock, which had no
/// record to start from, and forgot them; 1363 without operator changes, a leader cut
/// off delivered to a member that joined it records another leader had since seen
/// settled; 1097 with three members, a node killed after cutting back its journal's
/// next-to-last file took the file, unsynced, as durable at its restart, and a later
/// power cut undid the cut: replay ended there, behind entries it had reported
/// persisted, and the cluster never agreed again; 7 with disk faults and crash points, a
/// node whose disk had stopped took a new checkpoint in every pass its failed one
/// started, forever; 92 with disk faults, found by the durable-log check of `reopen`
/// once first starts could crash (the hole was fixed already, for the single node's
/// simulator): a first start died after making the data directory and before syncing its
/// parent, the next start found the directory and synced nothing, and a later power cut
/// took the whole node. Seeds found before crash points replay as they ran then.
#[test]
fn the_seeds_that_once_found_a_hole_stay_clean() {
    let seeds = [
        (2, PLAIN),
        (549, PLAIN),
        (3340, PLAIN),
        (2525, DISK_FAULTS_ON.before_crash_points()),
        (524, PRODUCERS_EXPIRING),
        (1363, NO_OPERATOR_CHANGES.before_crash_points()),
        (1097, THREE_MEMBERS.before_crash_points()),
        (7, DISK_FAULTS_ON.before_start_crashes()),
        (92, DISK_FAULTS_ON),
    ];
    for (seed, variant) in seeds {
        run_seed(seed, variant).unwrap_or_else(|failure| panic!("{failure}"));
    }
}
