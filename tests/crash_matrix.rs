//! Crash matrix (issue 8): `kill -9` at random points while the broker is
//! (a) publishing with FSYNC, (b) rolling segments, (c) creating and deleting topics,
//! (d) persisting group positions, (e) dead-lettering — then restart on the same data
//! directory and check the invariants. Ten kill points per scenario, fifty in all.
//! `MORTAR_CRASH_SEED=<n>` replays a run; `MORTAR_CRASH_KILLS=<n>` runs longer.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use common::rng::Rng;
use mortarmq::broker::dlq::{dlq_producer_id, split_origin};
use mortarmq::client::{Client, ClientError, Push};
use mortarmq::log::{FsStorage, LogConfig, PartitionLog};
use mortarmq::wire::ops::*;
use mortarmq::wire::{
    AckFlags, ControlResult, DeclareFlags, Durability, ErrorCode, NackReason, PubFlags, SubFlags,
};

const KILLS_PER_SCENARIO: usize = 10;

fn kills() -> usize {
    std::env::var("MORTAR_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(KILLS_PER_SCENARIO)
}

/// Runs `workload` against the broker, SIGKILLs the broker after a random delay,
/// waits for the workload to notice, restarts. `kills` times.
fn kill_loop(
    broker: &mut Mortard,
    rng: &mut Rng,
    n: usize,
    workload: impl Fn(SocketAddr, Arc<AtomicBool>) + Send + Sync + Clone + 'static,
) {
    for _ in 0..n {
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s, addr) = (workload.clone(), Arc::clone(&stop), broker.addr);
        let worker = std::thread::spawn(move || w(addr, s));
        std::thread::sleep(Duration::from_millis(rng.range(30, 300)));
        broker.kill9();
        stop.store(true, Ordering::SeqCst);
        worker.join().expect("workload thread panicked");
        broker.restart_after_kill9();
    }
}

fn connect(addr: SocketAddr) -> Option<Client> {
    let c = Client::connect(addr, b"").ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(c)
}

fn partition_dir(
    broker: &Mortard,
    topic_id: u16,
    name: &str,
    partition: u16,
) -> std::path::PathBuf {
    broker
        .data_dir()
        .join("topics")
        .join(format!(
            "{topic_id}-{:08x}",
            crc32fast::hash(name.as_bytes())
        ))
        .join(partition.to_string())
}

/// Every record of a partition, read offline: (sequence, producer_id, producer_seq, flags, value).
fn read_partition(
    broker: &Mortard,
    topic_id: u16,
    name: &str,
    partition: u16,
) -> Vec<(u64, u64, u64, u16, Vec<u8>)> {
    let config = LogConfig {
        segment_size_bytes: 4096,
        retention_size_bytes: 0,
        retention_age_ms: 0,
    };
    let (mut log, _) = PartitionLog::open(
        &FsStorage::shared(),
        &partition_dir(broker, topic_id, name, partition),
        config,
    )
    .unwrap();
    let mut out = Vec::new();
    let mut from = log.first_sequence();
    loop {
        let r = log
            .read(from, 1024, usize::MAX, |r| {
                out.push((
                    r.sequence,
                    r.producer_id,
                    r.producer_seq,
                    r.flags,
                    r.value.to_vec(),
                ))
            })
            .unwrap();
        if r.records == 0 {
            return out;
        }
        from = r.next_sequence;
    }
}

/// (a) and (b): an idempotent producer pipelines FSYNC PUBs and resends what was not
/// answered after each restart. Every acknowledged record must be on disk with its bytes,
/// sequences contiguous, every producer_seq stored exactly once.
fn publish_scenario(segment_size: &str, value_bytes: usize) {
    let mut rng = Rng::from_env();
    let mut broker = Mortard::start(&["--segment-size", segment_size]);
    let topic = broker
        .client()
        .declare("crash", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    // producer_seq -> acknowledged sequence; next_seq: the next seq never sent.
    let state = Arc::new(Mutex::new((BTreeMap::<u64, u64>::new(), 1u64)));
    let value = move |seq: u64| -> Vec<u8> {
        let mut v = format!("seq-{seq}-").into_bytes();
        v.resize(value_bytes, b'a' + (seq % 26) as u8);
        v
    };
    let st = Arc::clone(&state);
    let workload = move |addr: SocketAddr, stop: Arc<AtomicBool>| {
        let Some(mut c) = connect(addr) else { return };
        // Resend everything not acknowledged, from the oldest unacknowledged seq.
        let mut next = {
            let s = st.lock().unwrap();
            (1..s.1).find(|q| !s.0.contains_key(q)).unwrap_or(s.1)
        };
        let mut in_flight = std::collections::VecDeque::new();
        while !stop.load(Ordering::SeqCst) {
            while in_flight.len() < 16 {
                let v = value(next);
                c.queue(&Frame::Pub(Pub {
                    topic_id: topic,
                    producer_id: 77,
                    producer_seq: next,
                    flags: PubFlags::requesting(Some(Durability::Fsynced)),
                    value: &v,
                    ..Pub::default()
                }));
                in_flight.push_back(next);
                next += 1;
            }
            let mut s = st.lock().unwrap();
            s.1 = s.1.max(next);
            drop(s);
            if c.flush().is_err() {
                return;
            }
            let Ok(reply) = c.recv_reply() else { return };
            let r: PubResult = reply.typed().unwrap();
            let seq = in_flight.pop_front().unwrap();
            st.lock().unwrap().0.insert(seq, r.sequence);
        }
    };
    kill_loop(&mut broker, &mut rng, kills(), workload.clone());
    // Drain: one last clean run that resends the rest and waits for every answer.
    {
        let mut c = broker.client();
        let (acked, sent) = state.lock().unwrap().clone();
        for seq in (1..sent).filter(|q| !acked.contains_key(q)) {
            let v = value(seq);
            let r = c
                .publish(&Pub {
                    topic_id: topic,
                    producer_id: 77,
                    producer_seq: seq,
                    flags: PubFlags::requesting(Some(Durability::Fsynced)),
                    value: &v,
                    ..Pub::default()
                })
                .unwrap();
            state.lock().unwrap().0.insert(seq, r.sequence);
        }
    }
    broker.terminate();
    let records = read_partition(&broker, topic, "crash", 0);
    let (acked, _) = state.lock().unwrap().clone();
    let mut stored = BTreeMap::new();
    for (i, (sequence, producer_id, producer_seq, _, v)) in records.iter().enumerate() {
        assert_eq!(*sequence, i as u64 + 1, "sequences contiguous from 1");
        assert_eq!(*producer_id, 77);
        assert_eq!(v, &value(*producer_seq), "bytes of seq {producer_seq}");
        assert!(
            stored.insert(*producer_seq, *sequence).is_none(),
            "producer_seq {producer_seq} stored twice"
        );
    }
    for (pseq, sequence) in &acked {
        assert_eq!(
            stored.get(pseq),
            Some(sequence),
            "acknowledged producer_seq {pseq} missing or moved"
        );
    }
    let segments = std::fs::read_dir(partition_dir(&broker, topic, "crash", 0))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    println!(
        "publish scenario ({segment_size}): {} acknowledged, {} stored, {segments} segments",
        acked.len(),
        records.len()
    );
}

#[test]
fn a_publishing_with_fsync() {
    publish_scenario("16MiB", 200);
}

#[test]
fn b_rolling_segments() {
    publish_scenario("4KiB", 1500);
}

/// (c) topics created and deleted: after each restart, every acknowledged create that
/// was not deleted exists whole (every partition takes a PUB), every acknowledged
/// delete is gone, and no directory is left without its topic.
#[test]
fn c_creating_and_deleting_topics() {
    let mut rng = Rng::from_env();
    let mut broker = Mortard::start(&[]);
    // name -> Some(partitions) when its create was acknowledged, None when its delete was.
    let outcome = Arc::new(Mutex::new((BTreeMap::<String, Option<u16>>::new(), 0u64)));
    let out = Arc::clone(&outcome);
    let workload = move |addr: SocketAddr, stop: Arc<AtomicBool>| {
        let Some(mut c) = connect(addr) else { return };
        while !stop.load(Ordering::SeqCst) {
            let n = {
                let mut o = out.lock().unwrap();
                o.1 += 1;
                o.1
            };
            let name = format!("t{n}");
            let partitions = (n % 3) as u16 + 1;
            out.lock().unwrap().0.remove(&name);
            let Ok(r) = c.declare(&name, partitions, DeclareFlags::empty()) else {
                return;
            };
            out.lock().unwrap().0.insert(name.clone(), Some(partitions));
            if c.publish_value(r.topic_id, 0, b"x", Some(Durability::Fsynced))
                .is_err()
            {
                return;
            }
            if n % 2 == 0 {
                let victim = format!("t{}", n - 1);
                // Unknown until answered: forget what we knew of it.
                let before = out.lock().unwrap().0.remove(&victim);
                match c.declare(&victim, 0, DeclareFlags::DELETE) {
                    Ok(_) => {
                        out.lock().unwrap().0.insert(victim, None);
                    }
                    // Its create was lost or never answered: it does not exist either way.
                    Err(ClientError::Broker { code, .. })
                        if code == ErrorCode::UnknownTopic.code() =>
                    {
                        let _ = before;
                        out.lock().unwrap().0.insert(victim, None);
                    }
                    Err(_) => return,
                }
            }
        }
    };
    let check = |broker: &Mortard, outcome: &BTreeMap<String, Option<u16>>| {
        let mut c = broker.client();
        for (name, expect) in outcome {
            match (expect, c.declare(name, 0, DeclareFlags::PASSIVE)) {
                (Some(partitions), Ok(r)) => {
                    assert_eq!(r.partition_count, *partitions, "{name}");
                    for p in 0..*partitions {
                        c.publish_value(r.topic_id, p, b"check", Some(Durability::Written))
                            .unwrap_or_else(|e| panic!("{name} half-created: partition {p}: {e}"));
                    }
                }
                (None, Err(e)) => assert_eq!(e.code(), Some(ErrorCode::UnknownTopic), "{name}"),
                (Some(_), Err(e)) => panic!("acknowledged topic {name} lost: {e}"),
                (None, Ok(_)) => panic!("acknowledged delete of {name} undone"),
            }
        }
        let (_, body) = broker.http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        let dirs = std::fs::read_dir(broker.data_dir().join("topics"))
            .unwrap()
            .count();
        assert_eq!(
            dirs,
            stats["topics"].as_array().unwrap().len(),
            "a directory per topic, no orphans"
        );
    };
    for _ in 0..kills() {
        kill_loop(&mut broker, &mut rng, 1, workload.clone());
        check(&broker, &outcome.lock().unwrap().0);
    }
    println!("topics scenario: {} operations", outcome.lock().unwrap().1);
}

fn sub(c: &mut Client, group: &str, topic_id: u16) -> Option<SubResult> {
    c.request(&Frame::Sub(Sub {
        group: group.as_bytes(),
        topic_id,
        partition: 0xFFFF,
        start_policy: 0,
        credit_count: 64,
        credit_bytes: 0,
        flags: SubFlags::empty(),
    }))
    .ok()?
    .typed()
    .ok()
}

/// Accepts ASSIGNs and returns the next MSG (None when the connection dies). The
/// answers to the pipelined ACK/NACK/CONTROL_ACKs are read and dropped on the way.
fn next_msg(c: &mut Client) -> Option<mortarmq::client::Delivery> {
    if let Some(Push::Msg(m)) = c.kept_pushes().pop_front() {
        return Some(m);
    }
    loop {
        let frame = c.read_frame().ok()?;
        match frame.decode().ok()? {
            Frame::Msg(m) => return Some((&m).into()),
            Frame::Notice(n) => {
                c.send(&Frame::ControlAck(ControlAck::answering(
                    &n,
                    ControlResult::Ok,
                )))
                .ok()?;
            }
            Frame::Ok(_) | Frame::Err(_) => {}
            _ => return None,
        }
    }
}

fn committed(broker: &Mortard, group: &str) -> u64 {
    let (_, body) = broker.http("GET", "/stats");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    stats["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == group)
        .map_or(0, |g| g["partitions"][0]["committed"].as_u64().unwrap())
}

/// (d) group positions: a consumer ACKs records while the broker dies; after the
/// restart the committed position never passes what was ACKed, and the group resumes
/// right after it: nothing skipped, redeliveries only inside the at-least-once window.
#[test]
fn d_persisting_group_positions() {
    const RECORDS: u64 = 20_000;
    let mut rng = Rng::from_env();
    let mut broker = Mortard::start(&["--commit-interval", "20ms"]);
    let topic = {
        let mut c = broker.client();
        let topic = c.declare("pos", 1, DeclareFlags::empty()).unwrap().topic_id;
        for chunk in 0..RECORDS / 100 {
            for i in 0..100 {
                let v = (chunk * 100 + i + 1).to_be_bytes();
                c.queue(&Frame::Pub(Pub {
                    topic_id: topic,
                    flags: PubFlags::requesting(Some(Durability::Written)),
                    value: &v,
                    ..Pub::default()
                }));
            }
            c.flush().unwrap();
            for _ in 0..100 {
                c.recv_reply().unwrap();
            }
        }
        topic
    };
    let acks_sent = Arc::new(Mutex::new(BTreeSet::<u64>::new()));
    let sent = Arc::clone(&acks_sent);
    let workload = move |addr: SocketAddr, stop: Arc<AtomicBool>| {
        let Some(mut c) = connect(addr) else { return };
        if sub(&mut c, "g", topic).is_none() {
            return;
        }
        while !stop.load(Ordering::SeqCst) {
            let Some(m) = next_msg(&mut c) else { return };
            sent.lock().unwrap().insert(m.sequence);
            let ack = m.ack(AckFlags::empty());
            if c.send(&Frame::Ack(ack)).is_err() {
                return;
            }
        }
    };
    let mut redelivered_window = 0;
    for _ in 0..kills() {
        kill_loop(&mut broker, &mut rng, 1, workload.clone());
        // The group (and its restored position) exists again once a member joins.
        let mut c = broker.client();
        sub(&mut c, "g", topic).unwrap();
        let c_pos = committed(&broker, "g");
        let sent = acks_sent.lock().unwrap().clone();
        let contiguous = (1..).take_while(|s| sent.contains(s)).last().unwrap_or(0);
        assert!(
            c_pos <= contiguous,
            "committed {c_pos} passes the ACKed prefix {contiguous}"
        );
        redelivered_window += contiguous - c_pos;
        // The group resumes right after its committed position.
        if c_pos < RECORDS {
            let first = next_msg(&mut c).unwrap();
            assert_eq!(
                first.sequence,
                c_pos + 1,
                "resumes after the committed position"
            );
        }
    }
    println!(
        "positions scenario: {} ACKs sent, {redelivered_window} records in at-least-once windows",
        acks_sent.lock().unwrap().len()
    );
}

/// (e) dead-lettering: every record is NACK REJECTed while the broker dies; at the end
/// every record is in the twin exactly once for the group.
#[test]
fn e_dead_lettering() {
    const RECORDS: u64 = 400;
    let mut rng = Rng::from_env();
    let mut broker = Mortard::start(&["--commit-interval", "20ms"]);
    let topic = {
        let mut c = broker.client();
        let topic = c.declare("dl", 1, DeclareFlags::empty()).unwrap().topic_id;
        for i in 1..=RECORDS {
            c.queue(&Frame::Pub(Pub {
                topic_id: topic,
                flags: PubFlags::requesting(Some(Durability::Written)),
                value: &i.to_be_bytes(),
                ..Pub::default()
            }));
        }
        c.flush().unwrap();
        for _ in 0..RECORDS {
            c.recv_reply().unwrap();
        }
        topic
    };
    let workload = move |addr: SocketAddr, stop: Arc<AtomicBool>| {
        let Some(mut c) = connect(addr) else { return };
        if sub(&mut c, "g", topic).is_none() {
            return;
        }
        while !stop.load(Ordering::SeqCst) {
            let Some(m) = next_msg(&mut c) else { return };
            let nack = m.nack(NackReason::Reject);
            if c.send(&Frame::Nack(nack)).is_err() {
                return;
            }
        }
    };
    kill_loop(&mut broker, &mut rng, kills(), workload);
    // Finish cleanly: reject the rest until the group has settled every record.
    let stop = Arc::new(AtomicBool::new(false));
    let (s, addr) = (Arc::clone(&stop), broker.addr);
    let finisher = std::thread::spawn(move || workload(addr, s));
    let deadline = Instant::now() + Duration::from_secs(30);
    while committed(&broker, "g") < RECORDS {
        assert!(
            Instant::now() < deadline,
            "group never settled every record"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    broker.terminate();
    let _ = finisher.join();
    let mut count: HashMap<u64, u32> = HashMap::new();
    for (_, producer_id, _, flags, value) in read_partition(&broker, topic + 1, "dl.dlq", 0) {
        let (original, origin) = split_origin(flags, &value);
        let origin = origin.expect("a dead letter carries its origin");
        assert_eq!(producer_id, dlq_producer_id(b"g"));
        assert_eq!(
            original,
            origin.origin_sequence.to_be_bytes(),
            "original value kept"
        );
        *count.entry(origin.origin_sequence).or_default() += 1;
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "dead-lettered twice for one group: {twice:?}"
    );
    assert_eq!(
        count.len() as u64,
        RECORDS,
        "every record dead-lettered once"
    );
    println!("dead-letter scenario: {RECORDS} records, each dead-lettered once");
}
