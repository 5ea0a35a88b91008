//! `mortar-soak`: a long run of producers and churning consumers against a broker this
//! tool starts itself (issue 8), ending with an audit.
//!
//! The tool starts `mortard` (`--mortard PATH`) with a temporary data directory, declares
//! one topic, and runs for `--duration`: `--producers` idempotent producers (FSYNC PUBs,
//! pipelined 8 at a time, resent with the same producer_seq after any error), and
//! `--consumers` group members that settle every MSG — ACK, NACK RETRY on a first
//! attempt, or NACK REJECT (dead letter), chosen by a hash of the record so that a
//! record's fate is the same on every delivery. Members leave (HEARTBEAT LEAVE) and drop
//! their connections and come back throughout. At `--restart-at` (a fraction of the
//! duration) the broker is stopped with SIGTERM and started again on the same data
//! directory; every client reconnects.
//!
//! The audit (exit 1 on a violation): every PUB answered OK has a distinct sequence,
//! sequences are contiguous per partition; every published record ends up acknowledged
//! or in the `.dlq` twin (read back by another group): nothing lost; no record
//! dead-lettered twice; a record acknowledged twice on one broker incarnation is a
//! violation, across the restart it is a duplicate at-least-once allows (counted);
//! the broker never exits on its own. Memory: mortard's RSS (`/proc/PID/status`) is
//! sampled every second; after a warm-up it is reported as min/max/last with a "flat"
//! verdict (last <= 1.2 x the max of the first half after warm-up).

use mortarmq::config::parse_duration;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use getopts::Options;
use mortarmq::client::{Client, ClientError, Delivery, Push};
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::*;
use mortarmq::wire::{
    AckFlags, ControlResult, DeclareFlags, Durability, ErrorCode, HeartbeatState, NackReason,
    PubFlags, PubResultFlags, StartPolicy, SubFlags,
};

/// PUBs a producer has in flight at once.
const PUB_WINDOW: u64 = 8;
/// How long a client keeps trying to reach the broker (e.g. across the restart).
const RECONNECT_FOR: Duration = Duration::from_secs(30);
/// Read timeout while waiting for an answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// After production stops, how long settling everything may take.
const SETTLE_FOR: Duration = Duration::from_secs(45);
const HEARTBEAT_EVERY: Duration = Duration::from_millis(200);
/// Broker timers: short, so churn settles quickly.
const BROKER_FLAGS: &[&str] = &[
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
    "--admin-listen",
    "off",
];
/// Percent of records rejected (dead-lettered), and NACK RETRY'd on a first attempt.
const REJECT_PERCENT: u64 = 3;
const RETRY_PERCENT: u64 = 7;

struct Opts {
    duration: Duration,
    producers: u64,
    consumers: u64,
    partitions: u16,
    restart_at: Option<f64>,
    mortard: PathBuf,
    seed: u64,
}

fn default_mortard() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("mortard")));
    let candidates = [
        beside,
        Some(PathBuf::from("target/release/mortard")),
        Some(PathBuf::from("target/debug/mortard")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("target/release/mortard"))
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Options::new();
    o.optopt(
        "",
        "duration",
        "how long producers run (default 60s)",
        "DUR",
    );
    o.optopt("", "producers", "producer connections (default 3)", "N");
    o.optopt("", "consumers", "group members (default 3)", "M");
    o.optopt("", "partitions", "partitions of the topic (default 4)", "P");
    o.optopt(
        "",
        "restart-at",
        "restart point, 0..1; 'off' = none (0.5)",
        "FRACTION",
    );
    o.optopt(
        "",
        "mortard",
        "broker binary (default: beside this one)",
        "PATH",
    );
    o.optopt("", "seed", "seed of the record fates (default 1)", "N");
    o.optflag("h", "help", "this text");
    let m = o
        .parse(std::env::args().skip(1))
        .map_err(|e| e.to_string())?;
    if m.opt_present("help") {
        print!("{}", o.usage("Usage: mortar-soak [options]"));
        std::process::exit(0);
    }
    let num = |name: &str, default: u64| -> Result<u64, String> {
        m.opt_str(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v}"))
        })
    };
    let restart_at = match m.opt_str("restart-at").as_deref() {
        None => Some(0.5),
        Some("off") => None,
        Some(v) => {
            let f: f64 = v.parse().map_err(|_| format!("--restart-at: {v}"))?;
            if !(0.0..1.0).contains(&f) {
                return Err("--restart-at must be in 0..1".into());
            }
            Some(f)
        }
    };
    let opts = Opts {
        duration: parse_duration(&m.opt_str("duration").unwrap_or_else(|| "60s".into()))?,
        producers: num("producers", 3)?.max(1),
        consumers: num("consumers", 3)?.max(1),
        partitions: num("partitions", 4)?.clamp(1, 64) as u16,
        restart_at,
        mortard: m
            .opt_str("mortard")
            .map_or_else(default_mortard, PathBuf::from),
        seed: num("seed", 1)?,
    };
    Ok(opts)
}

// ---- the broker process ---------------------------------------------------------------

struct Broker {
    bin: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
}

impl Broker {
    fn start(&mut self) -> Result<SocketAddr, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("mortard.log"))
            .map_err(|e| e.to_string())?;
        let mut child = Command::new(&self.bin)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(BROKER_FLAGS)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("listening ") {
                    let _ = tx.send(a.to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20));
        self.child = Some(child);
        let addr = addr.map_err(|_| "mortard did not print its listening address".to_string())?;
        addr.parse()
            .map_err(|e| format!("listening address {addr}: {e}"))
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// None while running; the exit status text once it has exited.
    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// SIGTERM, then wait; true on a clean exit (status 0).
    fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        child.wait().is_ok_and(|s| s.success())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// VmRSS, RssAnon and RssFile of a process, in bytes (`/proc/PID/status`).
fn rss_bytes(pid: u32) -> [u64; 3] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    ["VmRSS:", "RssAnon:", "RssFile:"].map(|key| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    })
}

/// min/max/last after the warm-up and the "flat" verdict (last <= 1.2 x the max of the
/// first half after warm-up); None with too few samples.
fn memory_verdict(what: &str, samples: &[(f64, u64)], warm: f64) -> Option<(bool, String)> {
    let after: Vec<(f64, u64)> = samples.iter().copied().filter(|s| s.0 >= warm).collect();
    if after.len() < 2 {
        return None;
    }
    let mid = warm + (after.last().unwrap().0 - warm) / 2.0;
    let first_half_max = after.iter().filter(|s| s.0 <= mid).map(|s| s.1).max();
    let first_half_max = first_half_max.unwrap_or(after[0].1);
    let last = after.last().unwrap().1;
    let min = after.iter().map(|s| s.1).min().unwrap();
    let max = after.iter().map(|s| s.1).max().unwrap();
    let flat = last as f64 <= 1.2 * first_half_max as f64;
    Some((
        flat,
        format!(
            "{what} after {warm:.0}s warm-up ({} samples): min {:.1} MiB, max {:.1} MiB, \
             last {:.1} MiB; first-half max {:.1} MiB -> {}",
            after.len(),
            mib(min),
            mib(max),
            mib(last),
            mib(first_half_max),
            if flat { "flat" } else { "GROWING" }
        ),
    ))
}

// ---- shared state ---------------------------------------------------------------------

/// What every thread shares.
struct Shared {
    /// The broker's address and its incarnation (0 before the restart, 1 after).
    target: RwLock<(SocketAddr, u64)>,
    stop_producing: AtomicBool,
    stop_all: AtomicBool,
    started: Instant,
    duration: Duration,
    topic: u16,
    seed: u64,
    tally: Mutex<Tally>,
    produced: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }

    /// Connects (retrying across a restart); the connection's incarnation with it.
    fn connect(&self) -> Option<(Client, u64)> {
        let deadline = Instant::now() + RECONNECT_FOR;
        while Instant::now() < deadline {
            let (addr, incarnation) = *self.target.read().unwrap();
            if let Ok(c) = Client::connect(addr, b"") {
                let _ = c.set_read_timeout(Some(ANSWER_TIMEOUT));
                return Some((c, incarnation));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

/// What is known of one record (partition, sequence): kept dense, 24 bytes a record,
/// so that a 10-minute run at full speed fits in memory.
#[derive(Default, Clone, Copy)]
struct Slot {
    /// (producer_id, producer_seq) from the PUB answer; (0, 0) = not published.
    id: (u64, u64),
    /// Bit i: an ACK was answered OK on broker incarnation i.
    acked: u8,
    /// Times read back from the twin.
    dead: u8,
    rejected: bool,
}

#[derive(Default)]
struct Tally {
    /// Per partition, indexed by sequence - 1.
    slots: Vec<Vec<Slot>>,
    published: u64,
    ack_answers: u64,
    dedup_answers: u64,
    pub_retries: u64,
    deliveries: u64,
    redeliveries: u64,
    retried: u64,
    duplicates_across_restart: u64,
    leaves: u64,
    drops: u64,
}

impl Tally {
    fn slot(&mut self, partition: u16, sequence: u64) -> &mut Slot {
        let p = usize::from(partition);
        if self.slots.len() <= p {
            self.slots.resize(p + 1, Vec::new());
        }
        let v = &mut self.slots[p];
        let i = sequence.saturating_sub(1) as usize;
        if v.len() <= i {
            v.resize(i + 1, Slot::default());
        }
        &mut v[i]
    }

    /// Every (partition, sequence, slot) known, in order.
    fn all(&self) -> impl Iterator<Item = (u16, u64, &Slot)> {
        self.slots.iter().enumerate().flat_map(|(p, v)| {
            v.iter()
                .enumerate()
                .map(move |(i, s)| (p as u16, i as u64 + 1, s))
        })
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Ack,
    Retry,
    Reject,
}

/// A record's fate depends only on the record, so every delivery of it agrees.
fn fate(seed: u64, m: &Delivery) -> Action {
    let h = mix(seed ^ (u64::from(m.partition) << 48) ^ m.sequence) % 100;
    if h < REJECT_PERCENT {
        Action::Reject
    } else if h < REJECT_PERCENT + RETRY_PERCENT && m.attempt == 1 {
        Action::Retry
    } else {
        Action::Ack
    }
}

// ---- producers ------------------------------------------------------------------------

struct Item {
    partition: u16,
    producer_id: u64,
    producer_seq: u64,
    value: String,
}

fn producer(shared: Arc<Shared>, index: u64, partitions: u16) {
    let mut next_seq = vec![1u64; usize::from(partitions)];
    let mut pending: VecDeque<Item> = VecDeque::new();
    let mut conn: Option<Client> = None;
    let mut n = index;
    loop {
        if pending.is_empty() {
            if shared.stop_producing.load(Ordering::Relaxed) {
                return;
            }
            for _ in 0..PUB_WINDOW {
                n = n.wrapping_add(1);
                let partition = (mix(n ^ (index << 32)) % u64::from(partitions)) as u16;
                let seq = &mut next_seq[usize::from(partition)];
                pending.push_back(Item {
                    partition,
                    producer_id: ((index + 1) << 16) | u64::from(partition),
                    producer_seq: *seq,
                    value: format!("p{index}-{partition}-{seq}"),
                });
                *seq += 1;
            }
        }
        if shared.stop_all.load(Ordering::Relaxed) {
            shared.violation(format!(
                "producer {index}: {} PUBs never answered",
                pending.len()
            ));
            return;
        }
        if conn.is_none() {
            match shared.connect() {
                Some((c, _)) => conn = Some(c),
                None => {
                    shared.violation(format!("producer {index}: broker unreachable"));
                    return;
                }
            }
        }
        let c = conn.as_mut().unwrap();
        for it in &pending {
            c.queue(&Frame::Pub(Pub {
                topic_id: shared.topic,
                partition: it.partition,
                producer_id: it.producer_id,
                producer_seq: it.producer_seq,
                flags: PubFlags::requesting(Some(Durability::Fsynced)),
                key: b"soak",
                value: it.value.as_bytes(),
            }));
        }
        if c.flush().is_err() {
            conn = None;
            continue;
        }
        let mut failed = VecDeque::new();
        let mut lost = false;
        for it in pending.drain(..) {
            if lost {
                failed.push_back(it);
                continue;
            }
            match c.recv_reply().and_then(|r| r.typed::<PubResult>()) {
                Ok(r) => {
                    let mut t = shared.tally.lock().unwrap();
                    if r.result_flags.contains(PubResultFlags::DEDUPLICATED) {
                        t.dedup_answers += 1;
                    }
                    let id = (it.producer_id, it.producer_seq);
                    let slot = t.slot(it.partition, r.sequence);
                    let old = slot.id;
                    if old == (0, 0) {
                        slot.id = id;
                        t.published += 1;
                        shared.produced.fetch_add(1, Ordering::Relaxed);
                    } else if old != id {
                        drop(t);
                        shared.violation(format!(
                            "sequence {}/{} given to {old:?} and {id:?}",
                            it.partition, r.sequence
                        ));
                    }
                }
                Err(e)
                    if matches!(
                        e.code(),
                        Some(
                            ErrorCode::Backpressure
                                | ErrorCode::MemoryLimit
                                | ErrorCode::SequenceOutOfOrder
                        )
                    ) =>
                {
                    failed.push_back(it)
                }
                Err(e) if e.code() == Some(ErrorCode::ShuttingDown) => {
                    lost = true;
                    failed.push_back(it);
                }
                Err(ClientError::Broker { code, message, .. }) => {
                    shared.violation(format!(
                        "producer {index}: PUB refused 0x{code:04X}: {message}"
                    ));
                    failed.push_back(it);
                    lost = true;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(_) => {
                    lost = true;
                    failed.push_back(it);
                }
            }
        }
        if lost {
            conn = None;
        }
        if !failed.is_empty() {
            shared.tally.lock().unwrap().pub_retries += failed.len() as u64;
            std::thread::sleep(Duration::from_millis(20));
        }
        pending = failed;
    }
}

// ---- consumers ------------------------------------------------------------------------

struct Joined {
    c: Client,
    incarnation: u64,
    sub: SubResult,
    assignment_epoch: u32,
    last_heartbeat: Instant,
}

/// A group member: `dlq` members read the twin and record the origins.
struct Member {
    shared: Arc<Shared>,
    name: String,
    group: &'static str,
    topic_id: u16,
    dlq: bool,
    joined: Option<Joined>,
}

fn is_timeout(e: &ClientError) -> bool {
    matches!(e, ClientError::Io(io)
        if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

impl Member {
    fn join(&mut self) -> bool {
        let Some((mut c, incarnation)) = self.shared.connect() else {
            self.shared
                .violation(format!("{}: broker unreachable", self.name));
            return false;
        };
        let sub = c
            .request(&Frame::Sub(Sub {
                group: self.group.as_bytes(),
                topic_id: self.topic_id,
                partition: SUB_PARTITION_ANY,
                start_policy: StartPolicy::Earliest.as_code(),
                credit_count: 0,
                credit_bytes: 0,
                flags: SubFlags::empty(),
            }))
            .and_then(|r| r.typed::<SubResult>());
        match sub {
            Ok(sub) => {
                self.joined = Some(Joined {
                    c,
                    incarnation,
                    sub,
                    assignment_epoch: 0,
                    last_heartbeat: Instant::now(),
                });
                true
            }
            Err(_) => false,
        }
    }

    fn heartbeat(&mut self, state: HeartbeatState) -> Result<(), ClientError> {
        let j = self.joined.as_mut().unwrap();
        j.last_heartbeat = Instant::now();
        j.c.request(&Frame::Heartbeat(Heartbeat {
            subscription_id: j.sub.subscription_id,
            member_id: j.sub.member_id,
            membership_epoch: j.sub.membership_epoch,
            assignment_epoch: j.assignment_epoch,
            state: state.as_code(),
        }))
        .map(|_| ())
    }

    /// HEARTBEAT LEAVE and close; the next step joins again.
    fn leave(&mut self) {
        if self.joined.is_some() {
            let _ = self.heartbeat(HeartbeatState::Leave);
            self.joined = None;
            self.shared.tally.lock().unwrap().leaves += 1;
        }
    }

    /// Closes the connection without a word (the broker notices the close).
    fn drop_connection(&mut self) {
        if self.joined.take().is_some() {
            self.shared.tally.lock().unwrap().drops += 1;
        }
    }

    /// Handles at most one push within `wait`. Any connection trouble: join again later.
    fn step(&mut self, wait: Duration) {
        if self.joined.is_none() && !self.join() {
            std::thread::sleep(Duration::from_millis(100));
            return;
        }
        // Any error (connection lost, SHUTTING_DOWN, expelled): join again.
        if self.try_step(wait).is_err() {
            self.joined = None;
        }
    }

    fn try_step(&mut self, wait: Duration) -> Result<(), ClientError> {
        if self.joined.as_ref().unwrap().last_heartbeat.elapsed() >= HEARTBEAT_EVERY {
            self.heartbeat(HeartbeatState::Active)?;
        }
        let j = self.joined.as_mut().unwrap();
        let push = match j.c.kept_pushes().pop_front() {
            Some(p) => p,
            None => {
                j.c.set_read_timeout(Some(wait))?;
                let r = j.c.next_push();
                j.c.set_read_timeout(Some(ANSWER_TIMEOUT))?;
                match r {
                    Ok(p) => p,
                    Err(e) if is_timeout(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        };
        match push {
            Push::Notice(n) if n.member_id != j.sub.member_id => Ok(()),
            Push::Notice(n) => {
                j.assignment_epoch = j.assignment_epoch.max(n.assignment_epoch);
                j.c.request(&Frame::ControlAck(ControlAck::answering(
                    &n,
                    ControlResult::Ok,
                )))
                .map(|_| ())
            }
            Push::Msg(m) if m.subscription_id != j.sub.subscription_id => Ok(()),
            Push::Msg(m) => self.settle(m),
        }
    }

    fn settle(&mut self, m: Delivery) -> Result<(), ClientError> {
        let shared = Arc::clone(&self.shared);
        let j = self.joined.as_mut().unwrap();
        let action = if self.dlq {
            Action::Ack
        } else {
            fate(shared.seed, &m)
        };
        let key = (m.partition, m.sequence);
        {
            let mut t = shared.tally.lock().unwrap();
            if !self.dlq {
                t.deliveries += 1;
                if m.attempt > 1 {
                    t.redeliveries += 1;
                }
            }
        }
        let r = match action {
            Action::Ack => j.c.request(&Frame::Ack(m.ack(AckFlags::empty()))),
            Action::Retry => j.c.request(&Frame::Nack(m.nack(NackReason::Retry))),
            Action::Reject => j.c.request(&Frame::Nack(m.nack(NackReason::Reject))),
        };
        match r {
            Ok(_) => {
                let mut t = shared.tally.lock().unwrap();
                if self.dlq {
                    match m.origin {
                        Some(o) => {
                            let slot = t.slot(o.origin_partition, o.origin_sequence);
                            slot.dead = slot.dead.saturating_add(1);
                        }
                        None => {
                            drop(t);
                            shared.violation(format!("dead letter {key:?} without origin"));
                        }
                    }
                    return Ok(());
                }
                match action {
                    Action::Ack => {
                        t.ack_answers += 1;
                        let bit = 1u8 << j.incarnation.min(7);
                        let slot = t.slot(key.0, key.1);
                        let again = slot.acked & bit != 0;
                        let before = slot.acked != 0;
                        slot.acked |= bit;
                        if again {
                            drop(t);
                            shared.violation(format!(
                                "{key:?} acknowledged twice on incarnation {}",
                                j.incarnation
                            ));
                        } else if before {
                            t.duplicates_across_restart += 1;
                        }
                    }
                    Action::Retry => t.retried += 1,
                    Action::Reject => t.slot(key.0, key.1).rejected = true,
                }
                Ok(())
            }
            // Moved or expired: the group redelivers it.
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::OwnershipFenced | ErrorCode::UnknownDelivery)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

fn consumer(shared: Arc<Shared>, index: u64, consumers: u64, dlq: bool) {
    let mut m = Member {
        shared: Arc::clone(&shared),
        name: if dlq {
            "dlq reader".into()
        } else {
            format!("consumer {index}")
        },
        group: if dlq { "soak-dlq" } else { "soak" },
        topic_id: if dlq { shared.topic + 1 } else { shared.topic },
        dlq,
        joined: None,
    };
    // Churn: each member leaves or drops its connection every `period`, staggered.
    let period = (shared.duration / 5).max(Duration::from_secs(2));
    let mut next_churn = period + period * index as u32 / consumers.max(1) as u32;
    let mut churns = 0u64;
    while !shared.stop_all.load(Ordering::Relaxed) {
        let now = shared.started.elapsed();
        if !dlq && now >= next_churn && !shared.stop_producing.load(Ordering::Relaxed) {
            if churns.is_multiple_of(2) {
                m.leave();
            } else {
                m.drop_connection();
            }
            churns += 1;
            next_churn = now + period;
            std::thread::sleep(Duration::from_millis(300));
        }
        m.step(Duration::from_millis(20));
    }
    m.leave();
}

// ---- main -----------------------------------------------------------------------------

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn run(opts: Opts) -> Result<bool, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("mortar-soak-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut broker = Broker {
        bin: opts.mortard.clone(),
        dir: dir.clone(),
        child: None,
    };
    let addr = broker.start()?;
    let topic = Client::connect(addr, b"")
        .and_then(|mut c| c.declare("soak", opts.partitions, DeclareFlags::empty()))
        .map_err(|e| format!("DECLARE: {e}"))?
        .topic_id;
    println!(
        "soak: {} for {:?}: {} producers, {} consumers, {} partitions, restart at {:?}, \
         data {}",
        opts.mortard.display(),
        opts.duration,
        opts.producers,
        opts.consumers,
        opts.partitions,
        opts.restart_at,
        dir.display()
    );
    let shared = Arc::new(Shared {
        target: RwLock::new((addr, 0)),
        stop_producing: AtomicBool::new(false),
        stop_all: AtomicBool::new(false),
        started: Instant::now(),
        duration: opts.duration,
        topic,
        seed: opts.seed,
        tally: Mutex::new(Tally::default()),
        produced: AtomicU64::new(0),
        violations: Mutex::new(Vec::new()),
    });
    let mut consumers = Vec::new();
    for i in 0..opts.consumers {
        let s = Arc::clone(&shared);
        let n = opts.consumers;
        consumers.push(std::thread::spawn(move || consumer(s, i, n, false)));
    }
    let s = Arc::clone(&shared);
    consumers.push(std::thread::spawn(move || consumer(s, 0, 1, true)));
    let producers: Vec<_> = (0..opts.producers)
        .map(|i| {
            let s = Arc::clone(&shared);
            let p = opts.partitions;
            std::thread::spawn(move || producer(s, i, p))
        })
        .collect();

    // Samples: (seconds since start, RSS bytes).
    let mut samples: Vec<(f64, [u64; 3])> = Vec::new();
    let mut restarted = false;
    let mut crashed = false;
    let mut last_report = Instant::now();
    let sample = |broker: &mut Broker, samples: &mut Vec<(f64, [u64; 3])>| {
        if let Some(status) = broker.exited() {
            shared.violation(format!("mortard exited on its own: {status}"));
            return true;
        }
        if let Some(pid) = broker.pid() {
            samples.push((shared.started.elapsed().as_secs_f64(), rss_bytes(pid)));
        }
        false
    };
    while shared.started.elapsed() < opts.duration && !crashed {
        std::thread::sleep(Duration::from_secs(1).min(opts.duration / 8));
        crashed = sample(&mut broker, &mut samples);
        let at = shared.started.elapsed().as_secs_f64() / opts.duration.as_secs_f64();
        if let Some(f) = opts.restart_at.filter(|&f| !restarted && at >= f) {
            restarted = true;
            let clean = broker.terminate();
            if !clean {
                shared.violation("mortard did not exit 0 on SIGTERM".into());
            }
            let addr = broker.start()?;
            let mut target = shared.target.write().unwrap();
            *target = (addr, target.1 + 1);
            println!("soak: restarted the broker at {f} of the run (SIGTERM, clean: {clean})");
        }
        if last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            let t = shared.tally.lock().unwrap();
            println!(
                "soak: {:.0}s published {} ACK answers {} rss {:.1} MiB",
                shared.started.elapsed().as_secs_f64(),
                t.published,
                t.ack_answers,
                mib(samples.last().map_or(0, |s| s.1[0]))
            );
        }
    }
    let produce_secs = shared.started.elapsed().as_secs_f64();
    shared.stop_producing.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + RECONNECT_FOR;
    while producers.iter().any(|p| !p.is_finished()) && Instant::now() < deadline && !crashed {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Settle: every published record acknowledged or dead-lettered.
    let settle_from = Instant::now();
    let mut last_sample = Instant::now();
    let missing = loop {
        let missing: Vec<(u16, u64)> = {
            let t = shared.tally.lock().unwrap();
            t.all()
                .filter(|(_, _, s)| s.id != (0, 0) && s.acked == 0 && s.dead == 0)
                .map(|(p, q, _)| (p, q))
                .collect()
        };
        if missing.is_empty() || settle_from.elapsed() > SETTLE_FOR || crashed {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(250));
        if last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            crashed = sample(&mut broker, &mut samples);
        }
    };
    let settle_secs = settle_from.elapsed().as_secs_f64();
    // Late dead letters (none expected) would show up as doubles.
    std::thread::sleep(Duration::from_millis(300));
    shared.stop_all.store(true, Ordering::Relaxed);
    for h in producers.into_iter().chain(consumers) {
        let _ = h.join();
    }
    let clean_exit = broker.terminate();

    let mut violations = std::mem::take(&mut *shared.violations.lock().unwrap());
    let t = shared.tally.lock().unwrap();
    if !missing.is_empty() {
        violations.push(format!(
            "{} records neither acknowledged nor dead-lettered (lost), e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    // Sequences are contiguous per partition (nothing appended twice, no gaps), and
    // every dead letter and ACK is of a published record.
    let mut gaps = 0u64;
    let (mut acked_once, mut dead_unique, mut dead_twice, mut both) = (0u64, 0u64, 0u64, 0u64);
    let (mut rejected, mut not_dead, mut unknown) = (0u64, 0u64, 0u64);
    let mut ids = std::collections::HashSet::new();
    let mut appended_twice = 0u64;
    for (_, _, slot) in t.all() {
        if slot.id == (0, 0) {
            gaps += 1;
            unknown += u64::from(slot.acked != 0 || slot.dead != 0);
            continue;
        }
        if !ids.insert(slot.id) {
            appended_twice += 1;
        }
        acked_once += u64::from(slot.acked != 0);
        dead_unique += u64::from(slot.dead > 0);
        dead_twice += u64::from(slot.dead > 1);
        both += u64::from(slot.acked != 0 && slot.dead > 0);
        rejected += u64::from(slot.rejected);
        not_dead += u64::from(slot.rejected && slot.dead == 0);
    }
    drop(ids);
    if gaps > 0 {
        violations.push(format!(
            "{gaps} sequences never answered to a producer (gaps)"
        ));
    }
    if unknown > 0 {
        violations.push(format!(
            "{unknown} ACKs or dead letters of unpublished records"
        ));
    }
    if appended_twice > 0 {
        violations.push(format!("{appended_twice} producer_seqs appended twice"));
    }
    if dead_twice > 0 {
        violations.push(format!("{dead_twice} records dead-lettered twice"));
    }
    if not_dead > 0 {
        violations.push(format!("{not_dead} records REJECTed but not in the twin"));
    }
    if both > 0 && !restarted {
        violations.push(format!(
            "{both} records both acknowledged and dead-lettered"
        ));
    }
    if !clean_exit && !crashed {
        violations.push("mortard did not exit 0 on the final SIGTERM".into());
    }

    // Memory: after the warm-up (10% of the run, at least 2 s).
    let warm = (produce_secs * 0.1).max(2.0);
    let series = |i: usize| -> Vec<(f64, u64)> { samples.iter().map(|s| (s.0, s.1[i])).collect() };
    // The verdict is on RssAnon, the broker's own memory. VmRSS also counts the pages of
    // mapped segment files (RssFile): page cache that grows with the log the broker has
    // read, which the kernel reclaims; it is reported, not judged.
    let anon = memory_verdict("RssAnon", &series(1), warm);
    let vm = memory_verdict("VmRSS", &series(0), warm);
    let file = memory_verdict("RssFile", &series(2), warm);
    let flat = anon.as_ref().is_none_or(|a| a.0);
    let memory = [anon, vm, file]
        .into_iter()
        .map(|v| v.map_or_else(|| "RSS: too few samples for a verdict".into(), |v| v.1))
        .collect::<Vec<String>>()
        .join("\nsoak: ");
    if !flat {
        violations.push(format!("memory not flat: {memory}"));
    }
    println!(
        "soak: published {} (PUB retries {}, dedup answers {}), acknowledged {} unique \
         ({} ACK answers, {} duplicates across the restart), dead-lettered {} unique \
         (REJECTed {}), lost {}, deliveries {} (attempt > 1: {}), NACK RETRY {}; \
         members left {} times, dropped connections {} times; restarts {}; crashes {}; \
         produced for {:.1}s, settled in {:.1}s",
        t.published,
        t.pub_retries,
        t.dedup_answers,
        acked_once,
        t.ack_answers,
        t.duplicates_across_restart,
        dead_unique,
        rejected,
        missing.len(),
        t.deliveries,
        t.redeliveries,
        t.retried,
        t.leaves,
        t.drops,
        u8::from(restarted),
        u8::from(crashed),
        produce_secs,
        settle_secs
    );
    println!("soak: {memory}");
    if acked_once + dead_unique - both != t.published {
        violations.push(format!(
            "published {} != acknowledged {acked_once} + dead-lettered {dead_unique} \
             - both {both}",
            t.published
        ));
    }
    violations.sort();
    violations.dedup();
    for v in &violations {
        println!("soak: VIOLATION {v}");
    }
    if violations.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        println!("soak: OK");
    } else {
        println!("soak: FAILED; data and log kept in {}", dir.display());
    }
    Ok(violations.is_empty())
}

fn main() -> ExitCode {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mortar-soak: {e}");
            return ExitCode::from(2);
        }
    };
    match run(opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("mortar-soak: {e}");
            ExitCode::from(1)
        }
    }
}
