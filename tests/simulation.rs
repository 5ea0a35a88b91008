//! Deterministic simulation of the broker over a simulated disk (in the spirit of
//! TigerBeetle's VOPR and FoundationDB's simulation testing).
//!
//! From one seed it drives the broker's state machine with random clients (declares,
//! idempotent FSYNC and WRITTEN publishes, subscribes, acks, nacks, rejects, leaves),
//! completes its durable-I/O jobs in random order, injects I/O faults, cuts the power (the
//! simulated disk keeps what a real one may keep, `src/log/simdisk.rs`) and kills the
//! process (the page cache keeps everything written, synced or not), at step boundaries
//! and at a disk change drawn at random, which may fall inside a job (between a rename
//! and its directory sync, inside a checkpoint or a spare's fill). After each the
//! broker is opened again over what the disk kept and the checker verifies:
//! every FSYNC-acknowledged record present byte-exact at its sequence; sequences
//! contiguous; exactly one copy per idempotent (producer_id, producer_seq); the leader
//! epoch strictly greater; committed positions never ahead of what the group settled;
//! every dead letter there at most once, and none lost; no topic half-created.
//!
//! `MORTAR_SIM_SEEDS=N` runs N seeds from a random start, `MORTAR_SIM_SEED=S` replays one;
//! a failure prints the seed. The cargo feature `sim-bug-early-ack` puts a durability
//! hole back on purpose; with it, this test must fail (`tools/test.sh` checks that).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mortarmq::broker::dlq::{dlq_producer_id, split_dead_letter};
use mortarmq::broker::{
    unlimited_room, Broker, BrokerConfig, ConnRef, DurableJob, Effect, Handled, JobSink, Now, Work,
};
use mortarmq::consume::{ConsumeConfig, Delivery};
use mortarmq::fsync::{Completion, Job};
use mortarmq::log::simdisk::{FaultRates, SimDisk, SimRng};
use mortarmq::log::LogConfig;
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::{Ack, ControlAck, Declare, Frame, Nack, Pub, PubResult, Sub, SubResult};
use mortarmq::wire::{
    AckFlags, ControlResult, DeclareFlags, Durability, ErrorCode, NackReason, Op, PubFlags,
    PubResultFlags, Response, StartPolicy, SubFlags,
};

/// Seeds a plain `cargo test` runs (about a minute in a debug build on two cores).
const SEEDS_DEFAULT: u64 = 300;
/// Steps per seed: client requests, job completions, timer passes.
const STEPS_PER_SEED: u32 = 2_500;
/// Per step, one chance in this many of a power cut.
const POWER_CUT_ONE_IN: u64 = 250;
/// Per step without a power cut, one chance in this many of the process being killed.
const KILL_ONE_IN: u64 = 500;
/// Per step without a crash point set, one chance in this many of setting one: the
/// process dies at one of the next `CRASH_WITHIN_CHANGES` disk changes, then the power
/// is cut or not.
const CRASH_POINT_ONE_IN: u64 = 250;
const CRASH_WITHIN_CHANGES: u64 = 60;
/// Per start, one chance in this many that the process dies again within its first
/// `START_CRASH_WITHIN_CHANGES` disk changes (replay, segment syncs, the checkpoint, file
/// removals): recovery must survive being cut short, any number of times in a row.
const START_CRASH_ONE_IN: u64 = 4;
const START_CRASH_WITHIN_CHANGES: u64 = 40;
/// Per step without a crash point set, one chance in this many that the disk stops taking
/// writes (full), or writes and syncs (dead): every held job is run and the broker passed
/// again, at one instant, until no job is left; then the process is stopped, as a
/// supervisor would.
const DRAIN_ONE_IN: u64 = 100;
/// The same while a checkpoint or a registry write is held: those are few, and a failed
/// one is what a broker might take again at once.
const DRAIN_ONE_IN_WHILE_RARE_JOB_HELD: u64 = 4;
/// A disk that has stopped: every write and sync fails, reads still work.
const DEAD_DISK: FaultRates = FaultRates {
    write_eio: 1_000_000,
    write_enospc: 0,
    sync_eio: 1_000_000,
    read_eio: 0,
};
/// A full disk: every write fails, syncs of what was written still work.
const FULL_DISK: FaultRates = FaultRates {
    write_eio: 0,
    write_enospc: 1_000_000,
    sync_eio: 0,
    read_eio: 0,
};
/// A drain that runs more jobs than this at one instant found a busy loop: a broker that
/// takes a failed job again in the pass its failure ends (on a real reactor, a loop that
/// spins until the disk comes back).
const DRAIN_JOBS_MAX: u64 = 1_000;
const TOPICS_MAX: usize = 3;
const PARTITIONS_MAX: u16 = 3;
const PRODUCERS: usize = 3;
const CONSUMERS: usize = 2;
/// Small segments so that rolls (and syncs straddling them) happen often.
const SEGMENT_BYTES: u64 = 4 * 1024;
/// Small journal files: new files, checkpoints and removals happen often too.
const JOURNAL_FILE_BYTES: u64 = 16 * 1024;
const VALUE_BYTES_MAX: u64 = 600;
const DATA_DIR: &str = "/sim/data";
const GROUP: &[u8] = b"sim-group";
/// Faults per million operations of each kind while clients run.
const FAULTS: FaultRates = FaultRates {
    write_eio: 2_000,
    write_enospc: 2_000,
    sync_eio: 5_000,
    read_eio: 2_000,
};

#[derive(Clone, Default)]
struct HeldJobs(Rc<RefCell<Vec<DurableJob>>>);

impl JobSink for HeldJobs {
    fn submit(&self, job: DurableJob) {
        self.0.borrow_mut().push(job);
    }
}

/// What a request was, so its answer can be checked against the model.
#[derive(Debug, Clone)]
enum Req {
    Declare { name: String, partitions: u16 },
    Pub { client: usize, publish: Publish },
    Sub { client: usize },
    Settle { key: (u16, u16, u64), how: Settle },
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack,
    Retry,
    Reject,
}

/// One PUB a producer sent; resent unchanged until it is answered.
#[derive(Debug, Clone)]
struct Publish {
    topic_id: u16,
    partition: u16,
    producer_id: u64,
    producer_seq: u64,
    need: Durability,
}

fn value_of(producer_id: u64, producer_seq: u64) -> Vec<u8> {
    let mut rng = SimRng::new(producer_id ^ producer_seq.rotate_left(17));
    let len = 1 + rng.below(VALUE_BYTES_MAX) as usize;
    let stamp = format!("{producer_id:x}:{producer_seq};");
    stamp.bytes().cycle().take(len).collect()
}

struct Producer {
    conn: ConnRef,
    producer_id: u64,
    next_seq: u64,
    /// Sent and not answered: resent (same producer_seq) after a restart.
    in_flight: Vec<Publish>,
}

struct Consumer {
    conn: ConnRef,
    topic_id: u16,
    member: Option<SubResult>,
    joining: bool,
    /// Deliveries received and not yet settled.
    held: Vec<Delivery>,
}

/// What the clients know for certain, across power cuts.
#[derive(Default)]
struct Model {
    /// Topics whose DECLARE was answered CREATED or IDEMPOTENT_OK: name -> (id, count).
    topics: BTreeMap<String, (u16, u16)>,
    /// FSYNC-acknowledged records: (topic, partition, sequence) -> (pid, pseq).
    durable: BTreeMap<(u16, u16, u64), (u64, u64)>,
    /// Records the group ACKed (answer OK), and REJECTed (answer OK).
    acked: BTreeSet<(u16, u16, u64)>,
    rejected: BTreeSet<(u16, u16, u64)>,
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    PowerCut,
    Kill,
}

#[derive(Default)]
struct Tally {
    steps: u64,
    power_cuts: u64,
    kills: u64,
    /// Stops at a crash point inside a pass or a job (counted in power cuts or kills too).
    crash_points: u64,
    /// Starts that died at a crash point before they finished (not counted above).
    start_crashes: u64,
    /// Drains at one instant, and the jobs they ran.
    drains: u64,
    drained_jobs: u64,
    records_checked: u64,
    fsync_acks: u64,
    deduplicated: u64,
    positions_checked: u64,
    dead_letters_checked: u64,
    jobs_run: u64,
    jobs_failed: u64,
}

impl Tally {
    fn add(&mut self, t: &Tally) {
        self.steps += t.steps;
        self.power_cuts += t.power_cuts;
        self.kills += t.kills;
        self.crash_points += t.crash_points;
        self.start_crashes += t.start_crashes;
        self.drains += t.drains;
        self.drained_jobs += t.drained_jobs;
        self.records_checked += t.records_checked;
        self.fsync_acks += t.fsync_acks;
        self.deduplicated += t.deduplicated;
        self.positions_checked += t.positions_checked;
        self.dead_letters_checked += t.dead_letters_checked;
        self.jobs_run += t.jobs_run;
        self.jobs_failed += t.jobs_failed;
    }
}

struct Sim {
    seed: u64,
    /// What the harness does; older seeds replay under the harness they were found with.
    era: Era,
    rng: SimRng,
    disk: SimDisk,
    broker: Option<Broker>,
    jobs: HeldJobs,
    mono_ms: u64,
    wall_ms: u64,
    epoch: u64,
    next_serial: u64,
    next_slot: u64,
    pending: BTreeMap<(u32, u64), Req>,
    producers: Vec<Producer>,
    consumers: Vec<Consumer>,
    model: Model,
    tally: Tally,
}

fn config() -> BrokerConfig {
    BrokerConfig {
        data_dir: DATA_DIR.into(),
        durability: Durability::Fsynced,
        log: LogConfig {
            segment_size_bytes: SEGMENT_BYTES,
            ..LogConfig::default()
        },
        max_partitions: PARTITIONS_MAX,
        producer_ttl_ms: 7 * 24 * 3_600_000,
        max_producers_per_partition: BrokerConfig::default().max_producers_per_partition,
        max_data_bytes: 0,
        consume: ConsumeConfig {
            ack_wait_ms: 2_000,
            nack_delay_ms: 50,
            max_attempts: 3,
            session_timeout_ms: 60_000,
            ..ConsumeConfig::default()
        },
        commit_interval_ms: 200,
        journal_file_bytes: JOURNAL_FILE_BYTES,
    }
}

impl Sim {
    fn new(seed: u64, era: Era) -> Sim {
        let mut sim = Sim {
            seed,
            era,
            rng: SimRng::new(seed),
            disk: SimDisk::seeded(seed ^ 0xD15C),
            broker: None,
            jobs: HeldJobs::default(),
            mono_ms: 0,
            wall_ms: 1_700_000_000_000,
            epoch: 0,
            next_serial: 1,
            next_slot: 1,
            pending: BTreeMap::new(),
            producers: Vec::new(),
            consumers: Vec::new(),
            model: Model::default(),
            tally: Tally::default(),
        };
        sim.open();
        for i in 0..PRODUCERS {
            let conn = sim.new_conn();
            sim.producers.push(Producer {
                conn,
                producer_id: (seed << 8) | (i as u64 + 1),
                next_seq: 1,
                in_flight: Vec::new(),
            });
        }
        for _ in 0..CONSUMERS {
            let conn = sim.new_conn();
            sim.consumers.push(Consumer {
                conn,
                topic_id: 0,
                member: None,
                joining: false,
                held: Vec::new(),
            });
        }
        sim
    }

    fn fail(&self, why: &str) -> ! {
        panic!(
            "simulation seed {} step {}: {why}",
            self.seed, self.tally.steps
        );
    }

    fn now(&self) -> Now {
        Now {
            mono_ms: self.mono_ms,
            wall_ms: self.wall_ms,
        }
    }

    fn broker(&mut self) -> &mut Broker {
        self.broker.as_mut().expect("the broker is open")
    }

    fn new_conn(&mut self) -> ConnRef {
        self.next_serial += 1;
        ConnRef {
            id: self.next_serial as u32,
            serial: self.next_serial,
        }
    }

    /// Opens the broker over the disk with faults off (a start that fails on injected
    /// I/O would test nothing about what was kept), then checks what it found. Some
    /// starts die at a crash point first, and the power may go with them.
    fn open(&mut self) {
        self.disk.set_faults(FaultRates::default());
        let broker = loop {
            let crash =
                self.era > Era::BeforeStartCrashes && self.rng.below(START_CRASH_ONE_IN) == 0;
            if crash {
                self.disk
                    .crash_after(self.rng.below(START_CRASH_WITHIN_CHANGES));
            }
            self.jobs = HeldJobs::default();
            self.mono_ms = 0;
            let storage = Arc::new(self.disk.clone());
            let opened = Broker::open(config(), storage, Box::new(self.jobs.clone()), self.now());
            if self.disk.crashed() {
                // The process died inside the start, whatever `open` made of the error.
                self.tally.start_crashes += 1;
                drop(opened);
                let cut = matches!(self.either_stop(), Stop::PowerCut);
                if trace() {
                    eprintln!("step {} start crashed, power cut: {cut}", self.tally.steps);
                }
                if cut {
                    self.disk.power_cut();
                }
                self.disk.restarted();
                continue;
            }
            if crash {
                // The start made fewer changes than the crash point: no crash this time.
                self.disk.restarted();
            }
            match opened {
                Ok((broker, _)) => break broker,
                Err(e) => self.fail(&format!("the broker did not start: {e}")),
            }
        };
        if broker.leader_epoch() <= self.epoch {
            self.fail("the leader epoch did not grow across a restart");
        }
        self.epoch = broker.leader_epoch();
        self.broker = Some(broker);
        self.check_after_restart();
        self.disk.set_faults(FAULTS);
    }

    // ---- requests ------------------------------------------------------------------

    /// Hands `handled` back: an answer now, or the slot it will come in.
    fn sent(&mut self, conn: ConnRef, slot: u64, req: Req, handled: Handled) {
        match handled {
            Handled::Answer(response) => self.answered(req, response),
            Handled::Wait => {
                self.pending.insert((conn.id, slot), req);
            }
        }
    }

    fn slot(&mut self) -> u64 {
        self.next_slot += 1;
        self.next_slot
    }

    fn declare(&mut self) {
        let n = self.rng.below(TOPICS_MAX as u64);
        let name = format!("t{n}");
        let partitions = 1 + (n as u16 % PARTITIONS_MAX);
        let d = Declare {
            topic: name.as_bytes(),
            partition_count: partitions,
            flags: DeclareFlags::empty(),
        };
        let (conn, slot, now) = (self.producers[0].conn, self.slot(), self.now());
        let handled = self.broker().declare(conn, slot, &d, now);
        self.sent(conn, slot, Req::Declare { name, partitions }, handled);
    }

    fn publish(&mut self, client: usize) {
        if self.model.topics.is_empty() {
            return self.declare();
        }
        let topics: Vec<(u16, u16)> = self.model.topics.values().copied().collect();
        let (topic_id, count) = topics[self.rng.below(topics.len() as u64) as usize];
        let partition = self.rng.below(u64::from(count)) as u16;
        let need = if self.rng.chance(300_000) {
            Durability::Written
        } else {
            Durability::Fsynced
        };
        let p = &mut self.producers[client];
        let publish = Publish {
            topic_id,
            partition,
            producer_id: p.producer_id,
            producer_seq: p.next_seq,
            need,
        };
        p.next_seq += 1;
        p.in_flight.push(publish.clone());
        self.send_pub(client, publish);
    }

    fn send_pub(&mut self, client: usize, publish: Publish) {
        let value = value_of(publish.producer_id, publish.producer_seq);
        let p = Pub {
            topic_id: publish.topic_id,
            partition: publish.partition,
            producer_id: publish.producer_id,
            producer_seq: publish.producer_seq,
            flags: PubFlags::requesting(Some(publish.need)),
            key: b"",
            value: &value,
        };
        let (conn, slot, now) = (self.producers[client].conn, self.slot(), self.now());
        let handled = self.broker().publish(conn, slot, &p, now);
        self.sent(conn, slot, Req::Pub { client, publish }, handled);
    }

    fn subscribe(&mut self, client: usize) {
        let Some(&(topic_id, _)) = self.model.topics.values().next() else {
            return;
        };
        let c = &mut self.consumers[client];
        c.topic_id = topic_id;
        c.joining = true;
        let sub = Sub {
            group: GROUP,
            topic_id,
            partition: SUB_PARTITION_ANY,
            start_policy: StartPolicy::Earliest.as_code(),
            credit_count: 16,
            credit_bytes: 0,
            flags: SubFlags::empty(),
        };
        let (conn, slot, now) = (c.conn, self.slot(), self.now());
        let handled = self.broker().subscribe(conn, &sub, now);
        self.sent(conn, slot, Req::Sub { client }, handled);
    }

    /// Settles one held delivery: ACK mostly, sometimes NACK RETRY or REJECT.
    fn settle(&mut self, client: usize) {
        let c = &mut self.consumers[client];
        if c.held.is_empty() {
            return;
        }
        let d = c.held.remove(self.rng.below(c.held.len() as u64) as usize);
        let how = match self.rng.below(10) {
            0 => Settle::Retry,
            1 => Settle::Reject,
            _ => Settle::Ack,
        };
        let r = d.reference;
        let key = (r.topic_id, r.partition, r.sequence);
        let (conn, slot, now) = (c.conn, self.slot(), self.now());
        let handled = match how {
            Settle::Ack => {
                let ack: Ack = r.ack(AckFlags::empty());
                self.broker().ack(conn, &ack, now)
            }
            Settle::Retry | Settle::Reject => {
                let reason = if how == Settle::Retry {
                    NackReason::Retry
                } else {
                    NackReason::Reject
                };
                let nack: Nack = r.nack(reason);
                self.broker().nack(conn, &nack, now)
            }
        };
        self.sent(conn, slot, Req::Settle { key, how }, handled);
    }

    /// A consumer drops its connection; its deliveries go back to the group.
    fn leave(&mut self, client: usize) {
        let old = self.consumers[client].conn;
        let now = self.now();
        self.broker().connection_closed(old, now);
        let conn = self.new_conn();
        let c = &mut self.consumers[client];
        c.conn = conn;
        c.member = None;
        c.joining = false;
        c.held.clear();
    }

    // ---- answers and pushes ------------------------------------------------------------

    fn answered(&mut self, req: Req, response: Response) {
        match req {
            Req::Declare { name, partitions } => {
                if let Response::Declare(r) = response {
                    if r.partition_count != partitions {
                        self.fail("DECLARE answered another partition count");
                    }
                    self.model.topics.insert(name, (r.topic_id, partitions));
                }
            }
            Req::Pub { client, publish } => self.pub_answered(client, publish, response),
            Req::Sub { client } => {
                let c = &mut self.consumers[client];
                c.joining = false;
                if let Response::Sub(r) = response {
                    c.member = Some(r);
                }
            }
            Req::Settle { key, how, .. } => {
                if response.error_code().is_none() {
                    match how {
                        Settle::Ack => self.model.acked.insert(key),
                        Settle::Reject => self.model.rejected.insert(key),
                        Settle::Retry => false,
                    };
                }
            }
            Req::Other => {}
        }
    }

    fn pub_answered(&mut self, client: usize, publish: Publish, response: Response) {
        let p = &mut self.producers[client];
        let code = response.error_code();
        let resend = matches!(
            code,
            Some(
                ErrorCode::Backpressure
                    | ErrorCode::StorageFull
                    | ErrorCode::InternalError
                    | ErrorCode::UnknownTopic
                    | ErrorCode::MemoryLimit
            )
        );
        if resend {
            // Resent later, unchanged: the broker deduplicates what it already has.
            return;
        }
        p.in_flight.retain(|q| {
            (q.producer_id, q.producer_seq) != (publish.producer_id, publish.producer_seq)
        });
        match response {
            Response::Pub(r) => self.pub_ok(publish, r),
            _ if code == Some(ErrorCode::SequenceOutOfOrder) => {
                // A WRITTEN record lost in a power cut: the broker's producer state is
                // behind ours. A client starts a new producer id.
                let p = &mut self.producers[client];
                p.producer_id += 1 << 32;
                p.next_seq = 1;
                p.in_flight.clear();
            }
            other => self.fail(&format!("PUB answered {other:?}")),
        }
    }

    fn pub_ok(&mut self, publish: Publish, r: PubResult) {
        if trace() {
            eprintln!("step {} PUB {publish:?} -> {r:?}", self.tally.steps);
        }
        if r.durability < publish.need.as_code() {
            self.fail("PUB answered below the durability it asked for");
        }
        let key = (publish.topic_id, publish.partition, r.sequence);
        let identity = (publish.producer_id, publish.producer_seq);
        if r.durability >= Durability::Fsynced.as_code() {
            self.tally.fsync_acks += 1;
            if let Some(seen) = self.model.durable.insert(key, identity) {
                if seen != identity {
                    self.fail(&format!(
                        "sequence {key:?} acknowledged for {seen:?} and {identity:?}"
                    ));
                }
            }
        }
        if r.result_flags.contains(PubResultFlags::DEDUPLICATED) {
            self.tally.deduplicated += 1;
        }
    }

    fn push(&mut self, conn: ConnRef, effect: Effect) {
        let Some(client) = self.consumers.iter().position(|c| c.conn == conn) else {
            return;
        };
        match effect {
            Effect::Notice { notice, .. } => {
                let ca = ControlAck::answering(&notice, ControlResult::Ok);
                let (slot, now) = (self.slot(), self.now());
                let handled = self.broker().control_ack(conn, &ca, now);
                self.sent(conn, slot, Req::Other, handled);
            }
            Effect::Deliver { delivery, .. } => {
                let mut out = Vec::new();
                if !self.broker().encode_delivery(&delivery, &mut out) {
                    return;
                }
                self.check_msg(&out);
                self.consumers[client].held.push(delivery);
            }
            Effect::Answer { .. } | Effect::PullAnswer { .. } => {
                unreachable!("answers are taken before pushes")
            }
        }
    }

    /// Every delivered value is the one its producer sent.
    fn check_msg(&self, frame: &[u8]) {
        let Ok(Frame::Msg(m)) = Frame::decode(Op::Msg, &frame[5..]) else {
            self.fail("the broker encoded a MSG that does not decode");
        };
        if m.value != value_of(m.producer_id, m.producer_seq).as_slice() {
            self.fail(&format!("MSG {} carries the wrong value", m.sequence));
        }
    }

    fn take_effects(&mut self) {
        let mut effects = Vec::new();
        self.broker().drain_effects(&mut effects);
        for effect in effects {
            match effect {
                Effect::Answer {
                    conn,
                    slot,
                    response,
                } => {
                    if let Some(req) = self.pending.remove(&(conn.id, slot)) {
                        self.answered(req, response);
                    }
                }
                Effect::Notice { conn, .. } | Effect::Deliver { conn, .. } => {
                    self.push(conn, effect)
                }
                Effect::PullAnswer { .. } => self.fail("a PULL answered though none was sent"),
            }
        }
    }

    // ---- the world ---------------------------------------------------------------------

    /// Runs one held job, chosen at random: completions come in any order.
    fn run_job(&mut self) {
        let n = self.jobs.0.borrow().len();
        if n == 0 {
            return;
        }
        let i = self.rng.below(n as u64) as usize;
        let mut job = self.jobs.0.borrow_mut().remove(i);
        let result = job.run();
        if trace() {
            eprintln!(
                "step {} job {:?} -> {:?}",
                self.tally.steps, job.work, result
            );
        }
        self.tally.jobs_run += 1;
        self.tally.jobs_failed += u64::from(result.is_err());
        let done = Completion {
            job,
            result,
            elapsed: Duration::from_micros(100),
        };
        let now = self.now();
        self.broker().job_done(done, now);
    }

    fn pass(&mut self) {
        self.mono_ms += self.rng.below(20);
        self.wall_ms += self.rng.below(20);
        let housekeeping = self.mono_ms % 1_000 < 20;
        self.pass_at_this_instant(housekeeping);
    }

    /// A pass at the current time, with housekeeping or not.
    fn pass_at_this_instant(&mut self, housekeeping: bool) {
        let now = self.now();
        let broker = self.broker();
        broker.end_pass(now, &unlimited_room);
        if housekeeping {
            broker.housekeeping(now);
        }
        broker.check_invariants();
        self.take_effects();
    }

    /// How a dead process goes: with the power or alone, half and half.
    fn either_stop(&mut self) -> Stop {
        match self.rng.below(2) {
            0 => Stop::PowerCut,
            _ => Stop::Kill,
        }
    }

    fn step(&mut self) {
        self.tally.steps += 1;
        match self.rng.below(100) {
            0..=29 => {
                let client = self.rng.below(PRODUCERS as u64) as usize;
                self.publish(client);
            }
            30..=34 => self.declare(),
            35..=59 => self.run_job(),
            60..=79 => {
                let client = self.rng.below(CONSUMERS as u64) as usize;
                let c = &self.consumers[client];
                if c.member.is_none() && !c.joining {
                    self.subscribe(client);
                } else {
                    self.settle(client);
                }
            }
            80 => {
                let client = self.rng.below(CONSUMERS as u64) as usize;
                self.leave(client);
            }
            _ => {}
        }
        self.pass();
        if self.disk.crashed() {
            self.tally.crash_points += 1;
            let how = self.either_stop();
            self.stop(how);
        } else if self.rng.below(POWER_CUT_ONE_IN) == 0 {
            self.power_cut();
        } else if self.rng.below(KILL_ONE_IN) == 0 {
            self.stop(Stop::Kill);
        } else if !self.disk.crash_armed() && self.rng.below(CRASH_POINT_ONE_IN) == 0 {
            self.disk.crash_after(self.rng.below(CRASH_WITHIN_CHANGES));
        } else if self.era > Era::BeforeDrains && !self.disk.crash_armed() {
            let rare =
                self.jobs.0.borrow().iter().any(|j| {
                    matches!(j.work, Work::Checkpoint { .. } | Work::WriteRegistry { .. })
                });
            let one_in = match rare {
                true => DRAIN_ONE_IN_WHILE_RARE_JOB_HELD,
                false => DRAIN_ONE_IN,
            };
            if self.rng.below(one_in) == 0 {
                self.drain_at_one_instant();
            }
        }
    }

    /// The disk stops: every held job is run, in any order, and the broker passes again
    /// at the same instant, until no job is left. Every retry the broker makes waits for
    /// time to pass (housekeeping, `REGISTRY_RETRY_MS`), so this ends unless something is
    /// taken again as soon as it failed. Then the process stops (its disk is gone).
    fn drain_at_one_instant(&mut self) {
        self.tally.drains += 1;
        let stopped = match self.rng.below(2) {
            0 => DEAD_DISK,
            _ => FULL_DISK,
        };
        self.disk.set_faults(stopped);
        if trace() {
            eprintln!("step {} drain, the disk stopped", self.tally.steps);
        }
        let mut ran = 0;
        while !self.jobs.0.borrow().is_empty() {
            while !self.jobs.0.borrow().is_empty() {
                if ran == DRAIN_JOBS_MAX {
                    self.fail("jobs were taken again at one instant without end (a busy loop)");
                }
                self.run_job();
                ran += 1;
            }
            self.pass_at_this_instant(false);
        }
        self.tally.drained_jobs += ran;
        let how = self.either_stop();
        self.stop(how);
    }

    fn power_cut(&mut self) {
        self.stop(Stop::PowerCut);
    }

    /// The broker and its unfinished jobs vanish; after a power cut the disk keeps what
    /// it keeps, after a kill everything written (the page cache outlives the process).
    /// Then it starts again and the clients reconnect and resend.
    fn stop(&mut self, how: Stop) {
        if trace() {
            eprintln!("step {} {how:?}", self.tally.steps);
        }
        self.broker = None;
        self.jobs.0.borrow_mut().clear();
        self.pending.clear();
        match how {
            Stop::PowerCut => {
                self.tally.power_cuts += 1;
                self.disk.power_cut();
            }
            Stop::Kill => self.tally.kills += 1,
        }
        self.disk.restarted();
        self.open();
        for client in 0..PRODUCERS {
            let conn = self.new_conn();
            self.producers[client].conn = conn;
            for publish in self.producers[client].in_flight.clone() {
                self.send_pub(client, publish);
            }
        }
        for client in 0..CONSUMERS {
            let conn = self.new_conn();
            let c = &mut self.consumers[client];
            c.conn = conn;
            c.member = None;
            c.joining = false;
            c.held.clear();
        }
    }

    // ---- the checker -------------------------------------------------------------------

    fn check_after_restart(&mut self) {
        self.check_topics();
        let keys: Vec<(u16, u16)> = self
            .model
            .topics
            .values()
            .flat_map(|&(id, count)| (0..count).flat_map(move |p| [(id, p), (id + 1, p)]))
            .collect();
        for (topic_id, partition) in keys {
            self.check_partition(topic_id, partition);
        }
        self.check_positions();
    }

    /// Every acknowledged topic is there, whole.
    fn check_topics(&mut self) {
        let topics = self.model.topics.clone();
        let broker = self.broker();
        for (name, (id, count)) in topics {
            let Some(pair) = broker.registry().lookup(&name) else {
                self.fail(&format!("acknowledged topic {name} is gone"));
            };
            if (pair.source_id(), pair.partition_count) != (id, count) {
                self.fail(&format!("topic {name} came back changed"));
            }
        }
        let broker = self.broker();
        let half: Option<String> = broker.registry().pairs().find_map(|pair| {
            let whole = pair.topics().iter().all(|(topic_id, _)| {
                (0..pair.partition_count).all(|p| broker.partition(*topic_id, p).is_some())
            });
            (!whole).then(|| pair.name.clone())
        });
        if let Some(name) = half {
            self.fail(&format!("topic {name} half created"));
        }
    }

    /// Contiguous, acknowledged records byte-exact, one copy per idempotent PUB, and
    /// dead letters at most once per (group, origin).
    fn check_partition(&mut self, topic_id: u16, partition: u16) {
        let (first, written) = {
            let part = self
                .broker()
                .partition(topic_id, partition)
                .expect("checked");
            (part.log.first_sequence(), part.log.written_sequence())
        };
        let mut seen = BTreeSet::new();
        for sequence in first..=written {
            let record = match self.broker().read_record(topic_id, partition, sequence) {
                Ok(Some(r)) => r,
                other => self.fail(&format!("{topic_id}/{partition} seq {sequence}: {other:?}")),
            };
            self.tally.records_checked += 1;
            let identity = (record.producer_id, record.producer_seq);
            if topic_id.is_multiple_of(2) {
                // A twin: at most one dead letter per (group, origin sequence).
                if record.producer_id == dlq_producer_id(GROUP) && !seen.insert(identity) {
                    self.fail(&format!("dead letter {identity:?} doubled"));
                }
                continue;
            }
            if record.value != value_of(record.producer_id, record.producer_seq) {
                self.fail(&format!(
                    "{topic_id}/{partition} seq {sequence} has wrong bytes"
                ));
            }
            if !seen.insert(identity) {
                self.fail(&format!(
                    "{identity:?} stored twice in {topic_id}/{partition}"
                ));
            }
        }
        let durable: Vec<(u64, (u64, u64))> = self
            .model
            .durable
            .range((topic_id, partition, 0)..=(topic_id, partition, u64::MAX))
            .map(|(&(_, _, s), &id)| (s, id))
            .collect();
        for (sequence, identity) in durable {
            if sequence > written {
                self.fail(&format!(
                    "FSYNC-acknowledged {topic_id}/{partition} seq {sequence} lost \
                     (the log ends at {written})"
                ));
            }
            let record = self.broker().read_record(topic_id, partition, sequence);
            let stored = record
                .ok()
                .flatten()
                .map(|r| (r.producer_id, r.producer_seq));
            if stored != Some(identity) {
                self.fail(&format!(
                    "FSYNC-acknowledged {topic_id}/{partition} seq {sequence} is {stored:?}"
                ));
            }
        }
    }

    /// A group's committed position is never past a record it did not settle, and what it
    /// settled by REJECT is in the twin.
    fn check_positions(&mut self) {
        let positions = self.broker().coordinator().positions();
        for pos in positions.iter().filter(|p| p.group == GROUP) {
            let (t, p) = (pos.topic_id, pos.partition);
            let mut twin = BTreeSet::new();
            let twin_written = self
                .broker()
                .partition(t + 1, p)
                .map_or(0, |x| x.log.written_sequence());
            for s in 1..=twin_written {
                if let Ok(Some(r)) = self.broker().read_record(t + 1, p, s) {
                    if let (_, Some((origin, _))) = split_dead_letter(r.flags, &r.value) {
                        twin.insert(origin.origin_sequence);
                    }
                }
            }
            self.tally.positions_checked += 1;
            self.tally.dead_letters_checked += twin.len() as u64;
            let first = self
                .broker()
                .partition(t, p)
                .map_or(1, |x| x.log.first_sequence());
            for s in first..=pos.committed {
                let key = (t, p, s);
                if !self.model.acked.contains(&key) && !twin.contains(&s) {
                    self.fail(&format!(
                        "group position {t}/{p} committed {} past seq {s}, which was neither \
                         acknowledged nor dead-lettered",
                        pos.committed
                    ));
                }
            }
        }
    }

    fn finish(&mut self) {
        // Let everything in flight finish, then cut the power once more and check.
        for _ in 0..200 {
            self.run_job();
            self.pass();
        }
        self.power_cut();
    }
}

/// The harness a seed was found with, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Era {
    /// Before starts could die at a crash point.
    BeforeStartCrashes,
    /// Before the drains at one instant.
    BeforeDrains,
    Current,
}

fn run_seed(seed: u64, era: Era) -> Tally {
    if trace() {
        let _ = env_logger::builder().is_test(true).try_init();
    }
    let mut sim = Sim::new(seed, era);
    for _ in 0..STEPS_PER_SEED {
        sim.step();
    }
    sim.finish();
    sim.tally
}

/// `MORTAR_SIM_TRACE=1` prints the jobs, acknowledgements and power cuts of a replay.
fn trace() -> bool {
    std::env::var_os("MORTAR_SIM_TRACE").is_some()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Seeds that once found a hole, replayed on every run under the harness of their time.
const REGRESSION_SEEDS: [(u64, Era); 3] = [
    // 2026-12-02: a journal write hit ENOSPC and poisoned the partitions waiting on it;
    // a checkpoint then passed their records, which only the journal held durably.
    (1_796_214_053_653_319_091, Era::BeforeStartCrashes),
    // 2026-12-02: entries an earlier epoch left at the checkpoint's own LSN (in a spare
    // whose rename a power cut undid) were replayed after the next cut: stored twice.
    (1_796_286_794_289_416_690, Era::BeforeStartCrashes),
    // 2026-12-04: the first start died after its mkdir of the data directory, before
    // the parent's sync; the next start found the directory and synced nothing above
    // it, and a power cut took the data directory away (the epoch write: ENOENT).
    (1_796_373_877_509_390_686, Era::BeforeDrains),
];

#[test]
fn the_seeds_that_once_found_a_hole_stay_clean() {
    for (seed, era) in REGRESSION_SEEDS {
        run_seed(seed, era);
    }
}

#[test]
fn every_acknowledged_record_survives_power_cuts_in_any_order_of_syncs() {
    let seeds: Vec<u64> = match env_u64("MORTAR_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let n = env_u64("MORTAR_SIM_SEEDS").unwrap_or(SEEDS_DEFAULT);
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            (0..n)
                .map(|i| start.wrapping_add(i.wrapping_mul(0x9E37_79B9)))
                .collect()
        }
    };
    let started = Instant::now();
    let mut total = Tally::default();
    for (i, &seed) in seeds.iter().enumerate() {
        let run = std::panic::catch_unwind(|| run_seed(seed, Era::Current));
        let tally = match run {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "simulation FAILED at seed {seed} ({} of {}); replay: MORTAR_SIM_SEED={seed}",
                    i + 1,
                    seeds.len()
                );
                std::panic::resume_unwind(e);
            }
        };
        total.add(&tally);
    }
    println!(
        "simulation: {} seeds, {} steps, {} power cuts and {} kills ({} of them at a crash point \
         inside a pass or job), {} starts cut short at a crash point, {} drains at one instant \
         ({} jobs), {} FSYNC acks ({} deduplicated), \
         {} records, {} committed positions and {} dead letters checked, {} jobs run \
         ({} failed by injected faults), 0 violations, in {:?}",
        seeds.len(),
        total.steps,
        total.power_cuts,
        total.kills,
        total.crash_points,
        total.start_crashes,
        total.drains,
        total.drained_jobs,
        total.fsync_acks,
        total.deduplicated,
        total.records_checked,
        total.positions_checked,
        total.dead_letters_checked,
        total.jobs_run,
        total.jobs_failed,
        started.elapsed()
    );
}
