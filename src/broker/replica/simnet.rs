//! The seeded replica simulator of `docs/REPLICATION.md` §9.3: three [`Replica`]s, each over
//! its own `SimDisk`, joined by a simulated network that loses, delays, duplicates and
//! reorders messages, with partitions (one-way too), pauses (SIGSTOP) and power cuts
//! drawn from one seed; ticks come from the simulated clock, persist jobs complete after
//! seeded delays. Clients propose BATCH entries with waiters at whichever node leads.
//!
//! The checker: every entry whose waiter got OK is applied on every node after healing,
//! at its index, with its bytes; no two nodes (nor one node across restarts) apply
//! different entries at one index; no OK carries a `leader_epoch` lower than one already
//! returned; a node's commit index never goes backwards while it runs, and after a power
//! cut its log still holds every committed entry it acknowledged as persisted.
//!
//! `MORTAR_REPLICA_SIM_SEEDS=N` runs seeds 1..=N, `MORTAR_REPLICA_SIM_SEED=S` replays one;
//! a failure prints `replica simulation FAILED at seed S` and the seed's trace. The cargo
//! feature `sim-bug-ack-before-follower-fsync` puts a hole in on purpose; with it, this
//! must fail (`tools/test.sh` checks that).

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use raft::eraftpb::{Message, MessageType};

use super::entry::{Batch, BatchPart, EntryData};
use super::machine::{
    test_config, Effect, PersistJob, Replica, ReplicaConfig, ReplicaOptions, Waiter,
};
use crate::broker::ConnRef;
use crate::log::simdisk::{SimDisk, SimRng};
use crate::log::Storage;
use crate::wire::ErrorCode;

/// Seeds a plain `cargo test` runs (a few seconds in a debug build).
const SEEDS_DEFAULT: u64 = 20;
const NODES: usize = 3;
/// The simulated clock's step; every event happens on a step.
const STEP_MS: u64 = 5;
const TICK_MS: u64 = 50;
const ELECTION_TICKS: usize = 10;
const HEARTBEAT_TICKS: usize = 2;
const REPLICATION_TIMEOUT_MS: u64 = 3_000;
/// Small journal files, so that new files (and syncs across them) are common.
const JOURNAL_FILE_BYTES: u64 = 16 * 1024;
/// Faults and clients run this long, then the cluster heals and must converge.
const FAULTY_MS: u64 = 20_000;
const HEAL_MS_MAX: u64 = 30_000;
/// Per step, one chance in this many of a new fault.
const FAULT_ONE_IN: u64 = 300;
/// Per step, one chance in this many of a client proposal.
const PROPOSE_ONE_IN: u64 = 4;
const FAULT_MS_MIN: u64 = 100;
const FAULT_MS_MAX: u64 = 3_000;
const RECORD_BYTES_MAX: u64 = 300;
/// Trace lines printed with a failure (the newest).
const TRACE_LINES_MAX: usize = 300;
const DATA_DIR: &str = "/data";

/// One seed's network, drawn from the seed.
struct NetParams {
    loss_per_million: u32,
    dup_per_million: u32,
    delay_ms_max: u64,
    persist_ms_max: u64,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Stats {
    proposals: u64,
    oks: u64,
    refusals: u64,
    errors: BTreeMap<u16, u64>,
    messages: u64,
    lost: u64,
    duplicated: u64,
    partitions: u64,
    pauses: u64,
    power_cuts: u64,
    elections_won: u64,
    max_term: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.proposals += o.proposals;
        self.oks += o.oks;
        self.refusals += o.refusals;
        for (code, n) in &o.errors {
            *self.errors.entry(*code).or_default() += n;
        }
        self.messages += o.messages;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.partitions += o.partitions;
        self.pauses += o.pauses;
        self.power_cuts += o.power_cuts;
        self.elections_won += o.elections_won;
        self.max_term = self.max_term.max(o.max_term);
    }
}

struct Node {
    disk: SimDisk,
    replica: Replica,
    incarnation: u64,
    inbox: VecDeque<Message>,
    /// Persist jobs in flight, with the time each completes.
    jobs: Vec<(u64, PersistJob)>,
    paused_until: u64,
    /// This incarnation's highest commit index seen.
    commit: u64,
    /// `(term, index)`: the highest index this incarnation acknowledged as persisted (an
    /// accepting append response) in its newest term. Within a term the leader never
    /// replaces what a follower accepted from it, so a power cut must leave it in place.
    acked: (u64, u64),
    /// What this incarnation applied: index → entry bytes.
    applied: BTreeMap<u64, Vec<u8>>,
    role: (bool, u64),
    tick_phase_ms: u64,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    now: u64,
    nodes: Vec<Node>,
    net: NetParams,
    /// In flight: (arrival, sequence) → (from, message).
    wire: BTreeMap<(u64, u64), (usize, Message)>,
    wire_seq: u64,
    /// Directed links cut until the time given.
    cuts: Vec<(usize, usize, u64)>,
    /// Proposal slot → its entry's bytes.
    proposals: BTreeMap<u64, Vec<u8>>,
    /// Slot → (index, leader_epoch) of its OK.
    oks: BTreeMap<u64, (u64, u64)>,
    /// Slot → its answer's error code, `None` for OK.
    answered: BTreeMap<u64, Option<ErrorCode>>,
    /// Every node, every incarnation: index → (term, entry bytes).
    applied: BTreeMap<u64, (u64, Vec<u8>)>,
    max_epoch: u64,
    faulty: bool,
    stats: Stats,
    trace: VecDeque<String>,
    full_trace: Option<Vec<String>>,
}

fn config(id: u64) -> ReplicaConfig {
    ReplicaConfig {
        election_ticks: ELECTION_TICKS,
        heartbeat_ticks: HEARTBEAT_TICKS,
        journal_file_bytes: JOURNAL_FILE_BYTES,
        replication_timeout_ms: REPLICATION_TIMEOUT_MS,
        ..test_config(id, NODES as u64)
    }
}

fn open(seed: u64, i: usize, incarnation: u64, disk: &SimDisk, now: u64) -> Replica {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let options = ReplicaOptions {
        tick_ms: TICK_MS,
        election_seed: Some(seed.rotate_left(20) ^ (incarnation << 8) ^ i as u64),
        ..ReplicaOptions::default()
    };
    let config = config(i as u64 + 1);
    Replica::open_with(&storage, Path::new(DATA_DIR), config, options, now)
        .expect("the replica opens over what its disk kept")
        .0
}

fn between(rng: &mut SimRng, lo: u64, hi: u64) -> u64 {
    lo + rng.below(hi - lo + 1)
}

impl Sim {
    fn new(seed: u64, keep_full_trace: bool) -> Sim {
        let mut rng = SimRng::new(seed);
        let net = NetParams {
            loss_per_million: between(&mut rng, 0, 50_000) as u32,
            dup_per_million: between(&mut rng, 0, 30_000) as u32,
            delay_ms_max: between(&mut rng, 1, 150),
            persist_ms_max: between(&mut rng, 1, 60),
        };
        let nodes = (0..NODES)
            .map(|i| {
                let disk = SimDisk::seeded(seed.rotate_left(8) ^ i as u64);
                let replica = open(seed, i, 0, &disk, 0);
                let tick_phase_ms = STEP_MS * rng.below(TICK_MS / STEP_MS);
                Node {
                    disk,
                    replica,
                    incarnation: 0,
                    inbox: VecDeque::new(),
                    jobs: Vec::new(),
                    paused_until: 0,
                    commit: 0,
                    acked: (0, 0),
                    applied: BTreeMap::new(),
                    role: (false, 0),
                    tick_phase_ms,
                }
            })
            .collect();
        Sim {
            seed,
            rng,
            now: 0,
            nodes,
            net,
            wire: BTreeMap::new(),
            wire_seq: 0,
            cuts: Vec::new(),
            proposals: BTreeMap::new(),
            oks: BTreeMap::new(),
            answered: BTreeMap::new(),
            applied: BTreeMap::new(),
            max_epoch: 0,
            faulty: true,
            stats: Stats::default(),
            trace: VecDeque::new(),
            full_trace: keep_full_trace.then(Vec::new),
        }
    }

    fn note(&mut self, line: String) {
        let line = format!("t={} {line}", self.now);
        if let Some(full) = &mut self.full_trace {
            full.push(line.clone());
        }
        if self.trace.len() == TRACE_LINES_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    fn paused(&self, i: usize) -> bool {
        self.nodes[i].paused_until > self.now
    }

    fn link_cut(&self, from: usize, to: usize) -> bool {
        let now = self.now;
        self.cuts
            .iter()
            .any(|&(f, t, until)| f == from && t == to && until > now)
    }

    /// One step of the simulated clock: faults and clients (while faulty), ticks,
    /// arrivals, finished persist jobs, then a pass of every running node.
    fn step(&mut self) -> Result<(), String> {
        self.now += STEP_MS;
        if self.faulty {
            if self.rng.below(FAULT_ONE_IN) == 0 {
                self.fault()?;
            }
            if self.rng.below(PROPOSE_ONE_IN) == 0 {
                self.propose();
            }
        }
        for i in 0..NODES {
            let tick = (self.now + self.nodes[i].tick_phase_ms).is_multiple_of(TICK_MS);
            if tick && !self.paused(i) {
                self.nodes[i].replica.tick();
            }
        }
        self.arrive();
        for i in 0..NODES {
            if !self.paused(i) {
                self.complete_jobs(i)?;
                self.pass(i)?;
            }
        }
        Ok(())
    }

    fn fault(&mut self) -> Result<(), String> {
        let k = self.rng.below(NODES as u64) as usize;
        let until = self.now + between(&mut self.rng, FAULT_MS_MIN, FAULT_MS_MAX);
        match self.rng.below(4) {
            0 => {
                for j in (0..NODES).filter(|&j| j != k) {
                    self.cuts.push((k, j, until));
                    self.cuts.push((j, k, until));
                }
                self.stats.partitions += 1;
                self.note(format!("fault: node {} isolated until {until}", k + 1));
            }
            1 => {
                let to = (k + 1 + self.rng.below(NODES as u64 - 1) as usize) % NODES;
                self.cuts.push((k, to, until));
                self.stats.partitions += 1;
                self.note(format!("fault: {} -> {} cut until {until}", k + 1, to + 1));
            }
            2 => {
                self.nodes[k].paused_until = self.nodes[k].paused_until.max(until);
                self.stats.pauses += 1;
                self.note(format!("fault: node {} paused until {until}", k + 1));
            }
            _ => self.power_cut(k)?,
        }
        Ok(())
    }

    /// The node's process dies with its disk's unsynced writes and comes back over what
    /// the disk kept; its log must still hold what it acknowledged in its current term.
    fn power_cut(&mut self, k: usize) -> Result<(), String> {
        let (seed, now) = (self.seed, self.now);
        let node = &mut self.nodes[k];
        let term = node.replica.term();
        let must_keep = if node.acked.0 == term {
            node.acked.1
        } else {
            0
        };
        node.disk.power_cut();
        node.incarnation += 1;
        node.replica = open(seed, k, node.incarnation, &node.disk, now);
        node.jobs.clear();
        node.inbox.clear();
        node.paused_until = 0;
        node.applied.clear();
        let kept = node.replica.last_index();
        node.commit = node.replica.commit_index();
        node.acked = (0, 0);
        node.role = (false, node.replica.term());
        self.stats.power_cuts += 1;
        self.note(format!(
            "fault: node {} power cut; log ends at {kept}, commit {}, must keep {must_keep}",
            k + 1,
            self.nodes[k].commit
        ));
        if kept < must_keep {
            return Err(format!(
                "node {} lost entries it acknowledged as persisted: log ends at {kept} \
                 after a power cut, it acknowledged {must_keep} in term {term}",
                k + 1
            ));
        }
        Ok(())
    }

    /// A client sends a BATCH of one record to a node that believes it leads.
    fn propose(&mut self) {
        let leaders: Vec<usize> = (0..NODES)
            .filter(|&i| !self.paused(i) && self.nodes[i].replica.is_leader())
            .collect();
        if leaders.is_empty() {
            return;
        }
        let i = leaders[self.rng.below(leaders.len() as u64) as usize];
        let slot = self.stats.proposals;
        let len = 1 + self.rng.below(RECORD_BYTES_MAX) as usize;
        let stamp = format!("{}:{slot};", self.seed);
        let entry = EntryData::Batch(Batch {
            leader_wall_ms: self.now,
            parts: vec![BatchPart {
                topic_id: 1,
                partition: 0,
                first_sequence: slot + 1,
                count: 1,
                records: stamp.bytes().cycle().take(len).collect(),
            }],
            positions: Vec::new(),
        });
        let waiter = Waiter {
            conn: ConnRef { id: 1, serial: 1 },
            slot,
            part: Some((1, 0)),
        };
        self.stats.proposals += 1;
        match self.nodes[i]
            .replica
            .propose(&entry, vec![waiter], self.now)
        {
            Ok(index) => {
                self.proposals.insert(slot, entry.encode());
                let term = self.nodes[i].replica.term();
                self.note(format!(
                    "node {} proposes slot {slot} at {index}/{term}",
                    i + 1
                ));
            }
            Err(_) => self.stats.refusals += 1,
        }
    }

    fn arrive(&mut self) {
        while let Some(entry) = self.wire.first_entry() {
            if entry.key().0 > self.now {
                return;
            }
            let (from, msg) = entry.remove();
            let to = msg.to as usize - 1;
            // A partition cuts what is still on the wire too.
            if self.link_cut(from, to) {
                self.stats.lost += 1;
                continue;
            }
            self.nodes[to].inbox.push_back(msg);
        }
    }

    fn send(&mut self, from: usize, msg: Message) {
        self.stats.messages += 1;
        let to = msg.to as usize;
        if to == 0 || to > NODES {
            return;
        }
        let lost = self.rng.chance(self.net.loss_per_million) && self.faulty;
        if lost || self.link_cut(from, to - 1) {
            self.stats.lost += 1;
            return;
        }
        let copies = match self.faulty && self.rng.chance(self.net.dup_per_million) {
            true => 2,
            false => 1,
        };
        self.stats.duplicated += copies - 1;
        for _ in 0..copies {
            // Seeded delays reorder messages on a link, as reconnects would.
            let at = self.now + between(&mut self.rng, 1, self.net.delay_ms_max);
            self.wire.insert((at, self.wire_seq), (from, msg.clone()));
            self.wire_seq += 1;
        }
    }

    fn complete_jobs(&mut self, i: usize) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[i];
        let (mut due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut node.jobs)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        node.jobs = rest;
        // In the order they finish, which need not be the order they were taken.
        due.sort_by_key(|(at, _)| *at);
        for (_, job) in due {
            let result = job.run();
            let done = node.replica.persist_done(&job, result);
            done.map_err(|e| format!("node {}: {e}", i + 1))?;
        }
        Ok(())
    }

    fn pass(&mut self, i: usize) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[i];
        while let Some(m) = node.inbox.pop_front() {
            // A stale or duplicate message is the peer's problem, as over TCP; but an
            // honest node's is never taken for a lie (`replica::vet`).
            if let Err(e @ super::machine::ReplicaError::Refused { .. }) = node.replica.step(m) {
                return Err(format!(
                    "node {} refused an honest peer's message: {e}",
                    i + 1
                ));
            }
        }
        let effects = node.replica.poll(now);
        let effects = effects.map_err(|e| format!("node {} failed: {e}", i + 1))?;
        for effect in effects {
            self.effect(i, effect)?;
        }
        self.check_node(i)
    }

    fn effect(&mut self, i: usize, effect: Effect) -> Result<(), String> {
        match effect {
            Effect::Send(m) => {
                let accepts = m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject;
                let acked = &mut self.nodes[i].acked;
                if accepts && (m.term, m.index) > *acked {
                    *acked = (m.term, m.index);
                }
                self.send(i, m);
            }
            Effect::Persist(job) => {
                let at = self.now + between(&mut self.rng, 1, self.net.persist_ms_max);
                self.nodes[i].jobs.push((at, job));
            }
            Effect::Apply { index, term, entry } => self.applied(i, index, term, &entry)?,
            Effect::Answer { waiter, result } => self.answer(i, waiter, result)?,
            Effect::Install { .. } => unreachable!("this harness never compacts"),
        }
        Ok(())
    }

    fn applied(
        &mut self,
        i: usize,
        index: u64,
        term: u64,
        entry: &EntryData,
    ) -> Result<(), String> {
        let bytes = entry.encode();
        match self.applied.get(&index) {
            Some((t, b)) if (*t, b) != (term, &bytes) => {
                return Err(format!(
                    "node {} applied {index}/{term}, another node {index}/{t} (bytes {})",
                    i + 1,
                    if *b == bytes { "equal" } else { "differ" }
                ))
            }
            Some(_) => {}
            None => {
                self.applied.insert(index, (term, bytes.clone()));
            }
        }
        self.nodes[i].applied.insert(index, bytes);
        Ok(())
    }

    fn answer(
        &mut self,
        i: usize,
        waiter: Waiter,
        result: Result<super::machine::Replicated, ErrorCode>,
    ) -> Result<(), String> {
        let slot = waiter.slot;
        if let Some(code) = self.answered.get(&slot) {
            return Err(format!("slot {slot} answered twice (first {code:?})"));
        }
        let ok = match result {
            Ok(ok) => ok,
            Err(code) => {
                self.answered.insert(slot, Some(code));
                *self.stats.errors.entry(code as u16).or_default() += 1;
                self.note(format!("node {} answers slot {slot}: {code:?}", i + 1));
                return Ok(());
            }
        };
        self.answered.insert(slot, None);
        self.stats.oks += 1;
        let (index, epoch) = (ok.index, ok.leader_epoch);
        self.note(format!(
            "node {} answers slot {slot}: OK {index}/{epoch}",
            i + 1
        ));
        if epoch < self.max_epoch {
            return Err(format!(
                "node {} answered slot {slot} OK under epoch {epoch} after an OK under {}",
                i + 1,
                self.max_epoch
            ));
        }
        self.max_epoch = epoch;
        let holds = self.applied.get(&index).map(|(t, b)| (*t, b));
        if holds != Some((epoch, &self.proposals[&slot])) {
            return Err(format!(
                "slot {slot} OK at {index}/{epoch}, which holds another entry"
            ));
        }
        self.oks.insert(slot, (index, epoch));
        Ok(())
    }

    fn check_node(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let commit = node.replica.commit_index();
        if commit < node.commit {
            return Err(format!(
                "node {} commit went back {} -> {commit}",
                i + 1,
                node.commit
            ));
        }
        node.commit = commit;
        let role = (node.replica.is_leader(), node.replica.term());
        if role != node.role {
            node.role = role;
            self.stats.max_term = self.stats.max_term.max(role.1);
            if role.0 {
                self.stats.elections_won += 1;
                self.note(format!("node {} leads in term {}", i + 1, role.1));
            }
        }
        Ok(())
    }

    /// Faults end: links mend, paused nodes resume, the network stops losing. Every node
    /// must then apply all of the leader's log, and every OK'd entry must be there.
    fn heal(&mut self) -> Result<(), String> {
        self.faulty = false;
        self.cuts.clear();
        for n in &mut self.nodes {
            n.paused_until = 0;
        }
        self.note("healed".to_string());
        let deadline = self.now + HEAL_MS_MAX;
        while !self.converged() {
            if self.now >= deadline {
                return Err("no convergence after healing".to_string());
            }
            self.step()?;
        }
        for (slot, (index, epoch)) in &self.oks {
            for (i, n) in self.nodes.iter().enumerate() {
                if n.applied.get(index) != Some(&self.proposals[slot]) {
                    return Err(format!(
                        "slot {slot} (OK at {index}/{epoch}) not applied at {index} on node {}",
                        i + 1
                    ));
                }
            }
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        let Some(l) = self.nodes.iter().find(|n| n.replica.is_leader()) else {
            return false;
        };
        let last = l.replica.last_index();
        l.replica.commit_index() == last && self.nodes.iter().all(|n| n.replica.applied() == last)
    }
}

/// Runs one seed; a violation comes back with the trace's newest lines.
fn run_seed(seed: u64, faulty_ms: u64) -> Result<Stats, String> {
    let mut sim = Sim::new(seed, false);
    let run = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        while sim.now < faulty_ms {
            sim.step()?;
        }
        sim.heal()
    }));
    let violation = match run {
        Ok(Ok(())) => return Ok(sim.stats),
        Ok(Err(v)) => v,
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_string()),
    };
    let trace: Vec<&str> = sim.trace.iter().map(String::as_str).collect();
    Err(format!(
        "replica simulation FAILED at seed {seed}: {violation}\n\
         (replay: MORTAR_REPLICA_SIM_SEED={seed})\ntrace, newest {} lines:\n{}",
        trace.len(),
        trace.join("\n")
    ))
}

pub(super) fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

#[test]
fn no_seed_loses_an_acknowledged_entry_or_acknowledges_under_an_older_epoch() {
    let seeds: Vec<u64> = match env_u64("MORTAR_REPLICA_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_u64("MORTAR_REPLICA_SIM_SEEDS").unwrap_or(SEEDS_DEFAULT)).collect(),
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    for &seed in &seeds {
        match run_seed(seed, FAULTY_MS) {
            Ok(stats) => total.add(&stats),
            Err(failure) => panic!("{failure}"),
        }
    }
    eprintln!(
        "replica simulation: {} seeds in {:.1} s, violations 0; {total:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        total.oks > 0,
        "no proposal was ever acknowledged: {total:?}"
    );
}

#[test]
fn one_seed_replays_one_history() {
    const SEED: u64 = 7;
    const MS: u64 = 5_000;
    let history = || {
        let mut sim = Sim::new(SEED, true);
        while sim.now < MS {
            sim.step().unwrap();
        }
        (sim.full_trace.take().unwrap(), sim.stats)
    };
    let (first, stats) = history();
    assert!(stats.elections_won > 0 && stats.oks > 0, "{stats:?}");
    let (second, _) = history();
    assert_eq!(first, second, "seed {SEED} played out differently");
}
