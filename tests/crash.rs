//! Crash test for durable publish (issue 4): idempotent producers pipeline FSYNC PUBs
//! while the broker is SIGKILLed at random moments and restarted on the same data
//! directory; producers reconnect and resend every unacknowledged PUB with the same
//! producer_id/producer_seq. Afterwards the partitions are read from disk: every
//! acknowledged record is there with its exact bytes, sequences are contiguous, and
//! every PUB is stored exactly once.
//!
//! The kill points come from a seeded xorshift generator; the seed is printed, and
//! `MORTAR_CRASH_SEED=<n>` replays a run's choices.

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use common::rng::Rng;
use mortarmq::client::{Client, ClientError};
use mortarmq::log::{FsStorage, LogConfig, PartitionLog};
use mortarmq::wire::ops::{Frame, Pub, PubResult};
use mortarmq::wire::{DeclareFlags, Durability, PubFlags};

const PRODUCERS: u64 = 4;
const PIPELINE: usize = 16;
const PARTITIONS: u16 = 2;
const KILL_POINTS: usize = 10;
const VALUE_BYTES: usize = 300;
const SEGMENT_BYTES: u64 = 256 * 1024;
/// Acknowledgements to wait for after each (re)start before the next kill is armed, so
/// every kill lands while PUBs flow.
const PROGRESS_ACKS: u64 = 100;
/// Hard limit on the whole run; a stuck producer fails the test instead of hanging it.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

fn producer_id(p: u64) -> u64 {
    0x1000 + p
}

/// The unique bytes of producer `p`'s PUB `seq` on `partition`.
fn value_of(p: u64, partition: u16, seq: u64) -> Vec<u8> {
    let mut v = format!("p{p}-{partition}-{seq}|").into_bytes();
    let mut x = (p << 48) ^ ((partition as u64) << 40) ^ seq;
    while v.len() < VALUE_BYTES {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.push(b'!' + (x >> 58) as u8);
    }
    v
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    partition: u16,
    producer_seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct Ack {
    producer: u64,
    partition: u16,
    producer_seq: u64,
    sequence: u64,
    deduplicated: bool,
    leader_epoch: u64,
}

struct Shared {
    addr: Mutex<SocketAddr>,
    stop: AtomicBool,
    acks: AtomicU64,
    started: Instant,
}

#[derive(Default)]
struct Report {
    acks: Vec<Ack>,
    /// PUBs sent again on a new connection after the old one died with them unanswered.
    retried: u64,
    reconnects: u64,
}

fn queue_pub(c: &mut Client, topic: u16, p: u64, s: Sent) {
    let value = value_of(p, s.partition, s.producer_seq);
    c.queue(&Frame::Pub(Pub {
        topic_id: topic,
        partition: s.partition,
        producer_id: producer_id(p),
        producer_seq: s.producer_seq,
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        key: b"",
        value: &value,
    }));
}

fn run_producer(p: u64, topic: u16, shared: &Shared, seed: u64) -> Report {
    let mut rng = Rng::new(seed ^ (p + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut report = Report::default();
    let mut next_seq = [1u64; PARTITIONS as usize];
    let mut in_flight: VecDeque<Sent> = VecDeque::new();
    let mut conn: Option<Client> = None;
    loop {
        assert!(
            shared.started.elapsed() < RUN_DEADLINE,
            "producer {p} stuck with {} PUBs in flight",
            in_flight.len()
        );
        let stopping = shared.stop.load(Ordering::SeqCst);
        if stopping && in_flight.is_empty() {
            return report;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                let addr = *shared.addr.lock().unwrap();
                let Ok(mut c) = Client::connect(addr, b"") else {
                    // The broker is down or restarting (on a new port): try again.
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                report.reconnects += 1;
                // Resend everything unanswered, in order, with the same producer seqs.
                report.retried += in_flight.len() as u64;
                for &s in &in_flight {
                    queue_pub(&mut c, topic, p, s);
                }
                conn.insert(c)
            }
        };
        while !stopping && in_flight.len() < PIPELINE {
            let partition = (rng.next() % PARTITIONS as u64) as u16;
            let s = Sent {
                partition,
                producer_seq: next_seq[partition as usize],
            };
            next_seq[partition as usize] += 1;
            in_flight.push_back(s);
            queue_pub(c, topic, p, s);
        }
        if c.flush().is_err() {
            conn = None;
            continue;
        }
        match c.recv_reply() {
            Ok(reply) => {
                let r: PubResult = reply.typed().expect("PUB result");
                let s = in_flight.pop_front().expect("an answer without a request");
                assert_eq!(r.durability, 2, "FSYNC PUB answered at {r:?}");
                assert!(r.commit_seq >= r.sequence, "{r:?}");
                report.acks.push(Ack {
                    producer: p,
                    partition: s.partition,
                    producer_seq: s.producer_seq,
                    sequence: r.sequence,
                    deduplicated: r.result_flags.bits() & 1 != 0,
                    leader_epoch: r.leader_epoch,
                });
                shared.acks.fetch_add(1, Ordering::SeqCst);
            }
            Err(ClientError::Io(_)) => conn = None,
            Err(e) => panic!("producer {p}: {e} (in flight: {in_flight:?})"),
        }
    }
}

fn wait_for_acks(shared: &Shared, at_least: u64, broker: &Mortard) {
    while shared.acks.load(Ordering::SeqCst) < at_least {
        assert!(
            shared.started.elapsed() < RUN_DEADLINE,
            "no progress: {} acks, waiting for {at_least}; log:\n{}",
            shared.acks.load(Ordering::SeqCst),
            broker.log_text()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// (sequence, producer_id, producer_seq, value) of every record of a partition.
fn read_partition(dir: &std::path::Path) -> Vec<(u64, u64, u64, Vec<u8>)> {
    let config = LogConfig {
        segment_size_bytes: SEGMENT_BYTES,
        ..LogConfig::default()
    };
    let (mut log, report) =
        PartitionLog::open(&FsStorage::shared(), dir, config).expect("open partition");
    assert!(report.is_clean(), "recovery after a clean stop: {report:?}");
    let mut out = Vec::new();
    let mut next = 1;
    loop {
        let got = log
            .read(next, 4096, usize::MAX, |r| {
                out.push((r.sequence, r.producer_id, r.producer_seq, r.value.to_vec()))
            })
            .expect("read");
        if got.records == 0 {
            return out;
        }
        next = got.next_sequence;
    }
}

#[test]
fn acknowledged_pubs_survive_sigkill_and_retries_are_deduplicated() {
    let seed = Rng::seed_from_env();
    let mut rng = Rng::new(seed);
    let mut broker = Mortard::start(&["--segment-size", "256KiB"]);
    let topic = {
        let mut c = broker.client();
        c.declare("crash", PARTITIONS, DeclareFlags::empty())
            .unwrap()
            .topic_id
    };
    let shared = Arc::new(Shared {
        addr: Mutex::new(broker.addr),
        stop: AtomicBool::new(false),
        acks: AtomicU64::new(0),
        started: Instant::now(),
    });
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || run_producer(p, topic, &shared, seed))
        })
        .collect();

    let mut kill_delays = Vec::new();
    for _ in 0..KILL_POINTS {
        let base = shared.acks.load(Ordering::SeqCst);
        wait_for_acks(&shared, base + PROGRESS_ACKS, &broker);
        let delay = rng.range(50, 400);
        kill_delays.push(delay);
        std::thread::sleep(Duration::from_millis(delay));
        broker.restart_after_kill9();
        *shared.addr.lock().unwrap() = broker.addr;
    }
    // After the last restart: some more traffic, then drain every PUB in flight.
    let base = shared.acks.load(Ordering::SeqCst);
    wait_for_acks(&shared, base + PROGRESS_ACKS, &broker);
    shared.stop.store(true, Ordering::SeqCst);
    let reports: Vec<Report> = producers
        .into_iter()
        .map(|h| h.join().expect("producer thread"))
        .collect();
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");

    let acks: Vec<Ack> = reports
        .iter()
        .flat_map(|r| r.acks.iter().copied())
        .collect();
    let retried: u64 = reports.iter().map(|r| r.retried).sum();
    let reconnects: u64 = reports.iter().map(|r| r.reconnects).sum();
    let deduplicated = acks.iter().filter(|a| a.deduplicated).count() as u64;
    let max_epoch = acks.iter().map(|a| a.leader_epoch).max().unwrap();

    // On disk: (partition, producer, producer_seq) -> sequence, each exactly once.
    let mut stored: HashMap<(u16, u64, u64), u64> = HashMap::new();
    let mut records_on_disk = 0u64;
    let dir = broker
        .data_dir()
        .join("topics")
        .join(format!("{topic}-{:08x}", crc32fast::hash(b"crash")));
    let mut by_sequence: HashMap<(u16, u64), (u64, u64, Vec<u8>)> = HashMap::new();
    for partition in 0..PARTITIONS {
        let records = read_partition(&dir.join(partition.to_string()));
        let mut last_seq_of = HashMap::new();
        for (i, (sequence, pid, pseq, value)) in records.into_iter().enumerate() {
            assert_eq!(
                sequence,
                i as u64 + 1,
                "partition {partition}: sequences not contiguous"
            );
            let p = pid.checked_sub(producer_id(0)).expect("a test producer");
            assert!(p < PRODUCERS, "unknown producer_id {pid}");
            assert_eq!(
                value,
                value_of(p, partition, pseq),
                "partition {partition} seq {sequence}"
            );
            // Within a partition a producer's seqs are stored in order, without gaps.
            let last = last_seq_of.insert(p, pseq).unwrap_or(0);
            assert_eq!(
                pseq,
                last + 1,
                "producer {p} partition {partition} at {sequence}"
            );
            if let Some(first) = stored.insert((partition, p, pseq), sequence) {
                panic!("producer {p} seq {pseq} stored twice: sequences {first} and {sequence}");
            }
            by_sequence.insert((partition, sequence), (p, pseq, value));
            records_on_disk += 1;
        }
    }
    for a in &acks {
        let (p, pseq, value) = by_sequence
            .get(&(a.partition, a.sequence))
            .unwrap_or_else(|| panic!("acknowledged {a:?} is not on disk"));
        assert_eq!((*p, *pseq), (a.producer, a.producer_seq), "{a:?}");
        assert_eq!(value, &value_of(a.producer, a.partition, a.producer_seq));
    }
    // Every PUB was eventually acknowledged once (producers drained), so the disk holds
    // exactly the acknowledged set.
    assert_eq!(records_on_disk, acks.len() as u64, "stored vs acknowledged");
    for r in &reports {
        for pair in r.acks.windows(2) {
            assert!(pair[0].leader_epoch <= pair[1].leader_epoch, "{pair:?}");
        }
    }

    println!(
        "crash test: seed {seed}, {} kill points (delays {kill_delays:?} ms), \
         {} acknowledged, {retried} retried, {deduplicated} deduplicated, \
         {reconnects} connections made, {records_on_disk} records on disk, final epoch {max_epoch}, \
         {:.1} s",
        KILL_POINTS,
        acks.len(),
        shared.started.elapsed().as_secs_f64()
    );
    assert_eq!(max_epoch, KILL_POINTS as u64 + 1, "one epoch per start");
    assert!(retried > 0, "no kill caught a PUB in flight");
    assert!(deduplicated <= retried);
    assert!(
        shared.started.elapsed() < Duration::from_secs(60),
        "too slow"
    );
}
