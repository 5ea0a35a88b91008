//! The load: idempotent REPLICATED producers, group members, and an observer that reads
//! every running node's group positions and raft figures. Each is a thread writing to
//! the history; all of them know every node's client address and follow NOT_LEADER.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mortarmq::client::{Consumer, Durability, Producer, Record, SendHandle, StartPolicy};
use serde_json::json;

use crate::cluster::{get_json, Observable};
use crate::history::History;

pub const TOPIC: &str = "chaos";
pub const GROUP: &str = "chaos-group";
/// Records a producer has unanswered at once.
const WINDOW_RECORDS: usize = 16;
/// How long the client keeps resending one record (across failovers) before failing it.
const RETRY_TIMEOUT_MS: u64 = 60_000;
/// A member's wait for one message.
const POLL_MS: u64 = 200;
/// After a client call fails for good, the pause before a new client is made.
const REDIAL_PAUSE_MS: u64 = 200;
/// Between two looks at every node's positions.
const OBSERVE_EVERY_MS: u64 = 250;

/// What the threads share.
pub struct Load {
    pub history: Arc<History>,
    pub addrs: Vec<SocketAddr>,
    pub partitions: u16,
    /// Records per second per producer.
    pub rate: u64,
    /// Producers stop sending new records.
    pub stop_producing: AtomicBool,
    /// Members and the observer stop.
    pub stop_consuming: AtomicBool,
    /// Values acknowledged and not delivered yet, so the end can wait for them, and
    /// values delivered before their ack was seen (one lock: an ack and a delivery of
    /// the same value may race).
    pending: Mutex<(HashSet<String>, HashSet<String>)>,
    /// The nodes the observer may ask (running ones).
    pub observable: Mutex<Vec<Observable>>,
}

impl Load {
    pub fn new(history: Arc<History>, addrs: Vec<SocketAddr>, partitions: u16, rate: u64) -> Load {
        Load {
            history,
            addrs,
            partitions,
            rate,
            stop_producing: AtomicBool::new(false),
            stop_consuming: AtomicBool::new(false),
            pending: Mutex::new((HashSet::new(), HashSet::new())),
            observable: Mutex::new(Vec::new()),
        }
    }

    fn producer(&self) -> Result<Producer, String> {
        Producer::builder(&self.addrs[..])
            .durability(Durability::Replicated)
            .declare(self.partitions)
            .retry_timeout(Duration::from_millis(RETRY_TIMEOUT_MS))
            .max_in_flight(WINDOW_RECORDS)
            .connect()
            .map_err(|e| e.to_string())
    }

    fn acked(&self, value: &str) {
        let (undelivered, early) = &mut *lock(&self.pending);
        if !early.remove(value) {
            undelivered.insert(value.to_string());
        }
    }

    fn delivered(&self, value: &str) {
        let (undelivered, early) = &mut *lock(&self.pending);
        if !undelivered.remove(value) {
            early.insert(value.to_string());
        }
    }

    pub fn undelivered_count(&self) -> usize {
        lock(&self.pending).0.len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One record in flight.
struct Sent {
    value: String,
    partition: u16,
    handle: SendHandle,
}

/// Producer `id`: sends `rate` records a second round-robin over the partitions until
/// told to stop, then waits for the answers in flight.
pub fn run_producer(load: &Load, id: u64) {
    let h = &load.history;
    let (mut generation, mut n, mut scan) = (0u64, 0u64, 0u64);
    let pace = Duration::from_micros(1_000_000 / load.rate.max(1));
    while !load.stop_producing.load(Ordering::Relaxed) {
        let mut producer = match load.producer() {
            Ok(p) => p,
            Err(e) => {
                h.add(
                    "note",
                    json!({"text": format!("producer {id}: connect: {e}")}),
                );
                std::thread::sleep(Duration::from_millis(REDIAL_PAUSE_MS));
                continue;
            }
        };
        generation += 1;
        let mut inflight = VecDeque::new();
        let mut next_at = Instant::now();
        while !load.stop_producing.load(Ordering::Relaxed) {
            let value = format!("p{id}-g{generation}-n{n}");
            let partition = (n % u64::from(load.partitions)) as u16;
            n += 1;
            let record = Record::new(TOPIC, value.as_bytes()).partition(partition);
            h.add(
                "send",
                json!({"producer": id, "value": value, "partition": partition}),
            );
            match producer.send_record(record) {
                Ok(handle) => inflight.push_back(Sent {
                    value,
                    partition,
                    handle,
                }),
                Err(e) => {
                    h.add(
                        "fail",
                        json!({"producer": id, "value": value, "error": e.to_string()}),
                    );
                    break;
                }
            }
            producer.send_queued();
            if inflight.len() >= WINDOW_RECORDS {
                let _ = producer.wait(&inflight[0].handle);
            }
            scan += 1;
            settle(load, id, scan, &mut inflight, false);
            next_at += pace;
            if let Some(wait) = next_at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            } else {
                next_at = Instant::now();
            }
        }
        let _ = producer.flush();
        scan += 1;
        settle(load, id, scan, &mut inflight, true);
    }
}

/// Writes the answers found in one look at the sends in flight (all of them, at the end).
fn settle(load: &Load, id: u64, scan: u64, inflight: &mut VecDeque<Sent>, all: bool) {
    let h = &load.history;
    let mut keep = VecDeque::new();
    for s in inflight.drain(..) {
        match s.handle.result() {
            None if !all => keep.push_back(s),
            None => h.add(
                "fail",
                json!({"producer": id, "value": s.value, "error": "unanswered"}),
            ),
            Some(Ok(r)) => {
                h.add(
                    "ack",
                    json!({"producer": id, "value": s.value, "partition": r.partition,
                        "sequence": r.sequence, "leader_epoch": r.leader_epoch,
                        "commit_seq": r.commit_seq, "durability": r.durability.name(),
                        "dedup": r.deduplicated, "scan": scan, "asked": s.partition}),
                );
                load.acked(&s.value);
            }
            Some(Err(e)) => h.add(
                "fail",
                json!({"producer": id, "value": s.value, "error": e.to_string()}),
            ),
        }
    }
    *inflight = keep;
}

/// Member `id` of the group: acknowledges every message, joins again after any failure.
pub fn run_member(load: &Load, id: u64) {
    let h = &load.history;
    while !load.stop_consuming.load(Ordering::Relaxed) {
        let mut consumer = match Consumer::connect(&load.addrs[..]).map_err(|e| e.to_string()) {
            Ok(c) => c,
            Err(e) => {
                h.add(
                    "note",
                    json!({"text": format!("member {id}: connect: {e}")}),
                );
                std::thread::sleep(Duration::from_millis(REDIAL_PAUSE_MS));
                continue;
            }
        };
        if let Err(e) = consumer.subscribe(GROUP, TOPIC, StartPolicy::Earliest) {
            h.add(
                "note",
                json!({"text": format!("member {id}: subscribe: {e}")}),
            );
            std::thread::sleep(Duration::from_millis(REDIAL_PAUSE_MS));
            continue;
        }
        while !load.stop_consuming.load(Ordering::Relaxed) {
            match consumer.poll(Some(Duration::from_millis(POLL_MS))) {
                Ok(None) => {}
                Ok(Some(m)) => {
                    let value = String::from_utf8_lossy(&m.value).into_owned();
                    h.add(
                        "deliver",
                        json!({"member": id, "value": value, "partition": m.partition,
                            "sequence": m.sequence, "attempt": m.attempt}),
                    );
                    load.delivered(&value);
                    m.ack();
                }
                Err(e) => {
                    h.add("note", json!({"text": format!("member {id}: poll: {e}")}));
                    break;
                }
            }
        }
    }
}

/// Reads every observable node's role, term and the group's committed positions.
pub fn run_observer(load: &Load) {
    while !load.stop_consuming.load(Ordering::Relaxed) {
        let nodes = lock(&load.observable).clone();
        for node in &nodes {
            observe_as(&load.history, "position", node);
        }
        std::thread::sleep(Duration::from_millis(OBSERVE_EVERY_MS));
    }
}

/// Writes one `ev` event per partition of the group that node `o` shows, unless a
/// process of it ended meanwhile (the answers may then be a later life's).
pub fn observe_as(h: &History, ev: &str, o: &Observable) {
    let (node, life) = (o.node, o.life);
    let Ok(stats) = get_json(o.admin, "/stats") else {
        return;
    };
    let Ok(topic) = get_json(o.admin, &format!("/topics/{TOPIC}")) else {
        return;
    };
    if !o.same_process() {
        return;
    }
    let cluster = &stats["cluster"];
    let groups = topic["groups"].as_array().into_iter().flatten();
    for g in groups.filter(|g| g["name"] == GROUP) {
        for p in g["partitions"].as_array().into_iter().flatten() {
            h.add(
                ev,
                json!({"node": node, "life": life, "role": cluster["role"],
                    "term": cluster["term"], "partition": p["partition"],
                    "committed": p["committed"], "uptime_ms": stats["broker"]["uptime_ms"]}),
            );
        }
    }
}
