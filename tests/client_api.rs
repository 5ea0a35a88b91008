//! The Rust client library (`mortarmq::client`, issue 16) against real `mortard`
//! processes: round trips, a broker restart in the middle of a stream (SIGTERM and
//! kill -9), dead letters, rebalances with two members, PULL, credit, heartbeats,
//! expulsion, idle connections, errors. Broker timers are shortened with flags; waits
//! are for conditions (a message, a figure in `/stats`), not fixed sleeps.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use common::wait;
use mortarmq::client::{
    Consumer, DeadLetterOrigin, Durability, Error, ErrorCode, Message, OriginReason, Producer,
    Rebalance, Record, Retry, SendHandle, StartPolicy,
};

/// Short consume-plane timers; an ack-wait long enough that a loaded machine never
/// expires a delivery a test holds on purpose.
const FAST: &[&str] = &[
    "--nack-delay",
    "100ms",
    "--commit-interval",
    "100ms",
    "--revoke-timeout",
    "1s",
    "--ack-wait",
    "20s",
];
/// How long a test waits for a condition before it fails.
const WAIT_MAX: Duration = Duration::from_secs(30);
/// `drain` stops after this long without a message.
const IDLE: Duration = Duration::from_millis(1500);

/// A broker with the FAST timers (a flag in `extra` replaces FAST's) on a fixed port.
fn broker(extra: &[&str]) -> Mortard {
    let mut args: Vec<&str> = FAST
        .chunks(2)
        .filter(|pair| !extra.contains(&pair[0]))
        .flatten()
        .copied()
        .collect();
    args.extend_from_slice(extra);
    Mortard::start_on_fixed_port(&args)
}

fn addr(b: &Mortard) -> String {
    b.addr.to_string()
}

fn wait_until(what: &str, ready: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT_MAX, ready);
}

/// The partition `mortarctl pub` and the Python client pick for a key (man/mortarctl.1):
/// CRC-32 of the key modulo the partition count.
fn mortarctl_partition(key: &[u8], partitions: u16) -> u16 {
    (crc32fast::hash(key) % u32::from(partitions)) as u16
}

/// (partition, sequence, attempt, key, value) of a message.
type Seen = (u16, u64, u16, Vec<u8>, Vec<u8>);

/// Messages until none arrives for `idle`, each acknowledged, then the answers awaited.
fn drain(c: &mut Consumer, idle: Duration) -> Vec<Seen> {
    let mut got = Vec::new();
    while let Some(m) = c.poll(Some(idle)).expect("poll") {
        got.push(seen(&m));
        assert!(m.ack(), "acknowledged on a live connection");
    }
    assert!(c.flush(WAIT_MAX).expect("flush"), "answers came");
    got
}

fn seen(m: &Message) -> Seen {
    (
        m.partition,
        m.sequence,
        m.attempt,
        m.key.to_vec(),
        m.value.to_vec(),
    )
}

fn subscribed(b: &Mortard, group: &str, topic: &str) -> Consumer {
    let mut c = Consumer::connect(addr(b)).expect("connect");
    c.subscribe(group, topic, StartPolicy::Earliest)
        .expect("subscribe");
    c
}

fn stats(b: &Mortard) -> serde_json::Value {
    let (status, body) = b.http("GET", "/stats");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("stats JSON")
}

/// The group's partitions in `/stats`: (partition, state, owner).
fn group_partitions(admin: std::net::SocketAddr, group: &str) -> Vec<(u64, String, u64)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin).expect("admin");
    write!(
        s,
        "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(body).expect("stats JSON");
    let g = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == group)
        .cloned()
        .unwrap_or_default();
    g["partitions"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let state = p["state"].as_str().unwrap_or("").to_string();
                    (
                        p["partition"].as_u64().unwrap(),
                        state,
                        p["owner"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn publish_and_consume_every_record_once_in_partition_order() {
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(4).connect().unwrap();
    for i in 0..40u32 {
        let key = format!("key-{}", i % 7);
        let r = p.publish("rt", &key, format!("value-{i}"), None).unwrap();
        assert_eq!(r.partition, mortarctl_partition(key.as_bytes(), 4));
        assert_eq!(r.durability, Durability::Fsynced, "the broker's default");
        assert!(!r.deduplicated);
    }
    let handles: Vec<SendHandle> = (40..100u32)
        .map(|i| {
            let key = format!("key-{}", i % 7);
            p.send("rt", &key, format!("value-{i}"), Durability::Written)
                .unwrap()
        })
        .collect();
    p.flush().unwrap();
    for h in &handles {
        let r = h.result().expect("answered after flush").unwrap();
        assert_eq!(r.durability, Durability::Written);
    }
    p.close().unwrap();

    let mut c = subscribed(&b, "g", "rt");
    let got = drain(&mut c, IDLE);
    assert_eq!(c.assignment(), vec![0, 1, 2, 3]);
    c.close().unwrap();
    let values: BTreeSet<Vec<u8>> = got.iter().map(|m| m.4.clone()).collect();
    let want: BTreeSet<Vec<u8>> = (0..100)
        .map(|i| format!("value-{i}").into_bytes())
        .collect();
    assert_eq!(values, want);
    assert_eq!(got.len(), 100, "each once");
    let mut by_partition: BTreeMap<u16, Vec<u64>> = BTreeMap::new();
    for (partition, sequence, attempt, key, _) in &got {
        assert_eq!(*attempt, 1);
        assert_eq!(*partition, mortarctl_partition(key, 4));
        by_partition.entry(*partition).or_default().push(*sequence);
    }
    for seqs in by_partition.values() {
        assert_eq!(*seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    }
    // Everything was acknowledged: the group gets nothing more, another group all.
    let mut again = subscribed(&b, "g", "rt");
    assert!(again
        .poll(Some(Duration::from_millis(500)))
        .unwrap()
        .is_none());
    again.close().unwrap();
    let mut other = subscribed(&b, "other", "rt");
    assert_eq!(drain(&mut other, IDLE).len(), 100);
}

#[test]
fn a_refused_record_leaves_no_gap_and_no_copy_in_a_pipeline() {
    // DURABILITY_UNAVAILABLE refuses the 4th record for good: its producer_seq is a
    // hole, so the records behind it are refused too, and must be renumbered and
    // resent in order.
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    let handles: Vec<SendHandle> = (0..8)
        .map(|i| {
            let d = (i == 3).then_some(Durability::Replicated);
            p.send("holes", "", format!("{i}"), d).unwrap()
        })
        .collect();
    let flushed = p.flush().unwrap_err();
    assert_eq!(flushed.code(), Some(ErrorCode::DurabilityUnavailable));
    let refused = handles[3].result().unwrap().unwrap_err();
    assert_eq!(refused.name(), "DURABILITY_UNAVAILABLE");
    let seqs: Vec<u64> = (0..8)
        .filter(|i| *i != 3)
        .map(|i| handles[i].result().unwrap().unwrap().sequence)
        .collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    assert_eq!(p.publish("holes", "", "8", None).unwrap().sequence, 8);
    p.close().unwrap();
    let mut c = subscribed(&b, "g", "holes");
    let values: Vec<Vec<u8>> = drain(&mut c, IDLE).into_iter().map(|m| m.4).collect();
    let want: Vec<Vec<u8>> = ["0", "1", "2", "4", "5", "6", "7", "8"]
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect();
    assert_eq!(values, want);
}

/// A producer thread streams records while the broker is stopped (SIGTERM, or kill -9)
/// and started again; afterwards every record is stored exactly once.
fn restart_in_a_stream(kill: bool) {
    let mut b = broker(&[]);
    let address = addr(&b);
    let handles: Arc<Mutex<Vec<SendHandle>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (handles, stop) = (handles.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut p = Producer::builder(address.as_str())
                .declare(3)
                .durability(Durability::Written)
                .connect()?;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let h = p.send("once", format!("{}", i % 11), format!("{i}"), None)?;
                handles.lock().unwrap().push(h);
                i += 1;
            }
            p.flush()?;
            let stats = p.stats();
            p.close()?;
            Ok::<_, Error>(stats)
        })
    };
    let answered = || {
        handles
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.is_done())
            .count()
    };
    wait_until("500 answered records", || answered() >= 500);
    if kill {
        b.restart_after_kill9();
    } else {
        b.restart();
    }
    // The stream goes on through the restart, so the stop hit it mid-flight.
    let sent_by_then = handles.lock().unwrap().len();
    wait_until("500 more answered after the restart", || {
        answered() >= sent_by_then + 500
    });
    stop.store(true, Ordering::Relaxed);
    let stats = producer.join().unwrap().expect("the producer carried on");
    assert!(stats.reconnects >= 1, "{stats:?}");
    let handles = handles.lock().unwrap();
    let total = handles.len();
    let mut stored = BTreeSet::new();
    for h in handles.iter() {
        let r = h.result().expect("answered").expect("stored");
        assert!(
            stored.insert((r.partition, r.sequence)),
            "{r:?} named twice"
        );
    }
    let mut c = Consumer::builder(addr(&b))
        .credit(1000, 0)
        .connect()
        .unwrap();
    c.subscribe("g", "once", StartPolicy::Earliest).unwrap();
    let mut values: Vec<u64> = drain(&mut c, IDLE)
        .iter()
        .map(|m| String::from_utf8_lossy(&m.4).parse().unwrap())
        .collect();
    assert_eq!(values.len(), total, "no record lost or doubled");
    values.sort_unstable();
    assert_eq!(values, (0..total as u64).collect::<Vec<_>>());
}

#[test]
fn sigterm_in_the_middle_of_a_stream_leaves_exactly_one_copy() {
    // A stopping broker answers what it read and refuses the rest with SHUTTING_DOWN
    // (which closes): those are resent to the next broker.
    restart_in_a_stream(false);
}

#[test]
fn kill9_in_the_middle_of_a_stream_leaves_exactly_one_copy() {
    // Answers in flight are lost: those records are resent with the same producer_seq
    // and the restarted broker recognises the ones it had appended.
    restart_in_a_stream(true);
}

/// A consumer reads part of a topic, the broker restarts, and the same consumer goes on
/// with the rest.
fn consumer_resumes(kill: bool) {
    let mut b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(2).connect().unwrap();
    for i in 0..10u16 {
        p.send_record(Record::new("resume", format!("{i}").as_bytes()).partition(i % 2))
            .unwrap();
    }
    p.close().unwrap();
    let events: Arc<Mutex<Vec<Rebalance>>> = Arc::default();
    let mut c = {
        let events = events.clone();
        Consumer::builder(addr(&b))
            .heartbeat_interval(Duration::from_millis(500))
            .on_rebalance(move |r| events.lock().unwrap().push(r))
            .connect()
            .unwrap()
    };
    c.subscribe("g", "resume", StartPolicy::Earliest).unwrap();
    let mut first = Vec::new();
    while first.len() < 4 {
        let m = c.poll(Some(WAIT_MAX)).unwrap().expect("a message");
        first.push(String::from_utf8(m.value.to_vec()).unwrap());
        m.ack();
    }
    assert!(c.flush(WAIT_MAX).unwrap());
    if kill {
        b.restart_after_kill9();
    } else {
        b.restart();
    }
    let rest: Vec<String> = drain(&mut c, Duration::from_secs(3))
        .into_iter()
        .map(|m| String::from_utf8(m.4).unwrap())
        .collect();
    assert!(c.stats().rejoins >= 1, "{:?}", c.stats());
    c.close().unwrap();
    let lost: BTreeSet<Rebalance> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches!(r, Rebalance::Lost(_)))
        .copied()
        .collect();
    assert_eq!(
        lost,
        BTreeSet::from([Rebalance::Lost(0), Rebalance::Lost(1)]),
        "a lost connection loses every partition"
    );
    let before: BTreeSet<String> = first.into_iter().collect();
    let after: BTreeSet<String> = rest.into_iter().collect();
    let all: BTreeSet<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(&before | &after, all, "nothing lost");
    if !kill {
        // SIGTERM saves the positions: nothing acknowledged comes again.
        assert_eq!(&before & &after, BTreeSet::new());
    }
}

#[test]
fn consumer_resumes_after_a_sigterm_restart() {
    consumer_resumes(false);
}

#[test]
fn consumer_resumes_after_a_kill9_restart() {
    consumer_resumes(true);
}

#[test]
fn a_rejected_message_is_read_from_the_twin_with_its_origin() {
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(2).connect().unwrap();
    let fine = Record::new("orders", b"fine").key(b"k0").partition(1);
    p.publish_record(fine).unwrap();
    let poison = Record::new("orders", b"poison-value")
        .key(b"poison-key")
        .partition(1);
    let poison = p.publish_record(poison).unwrap();
    let source = p.topic("orders").unwrap();
    assert_eq!(p.topic("orders.dlq").unwrap().id, source.id + 1);
    p.close().unwrap();

    let mut c = subscribed(&b, "billing", "orders");
    let first = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    let bad = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    assert_eq!(
        (&first.value[..], &bad.value[..]),
        (&b"fine"[..], &b"poison-value"[..])
    );
    assert!(first.ack());
    assert!(bad.reject());
    assert!(c.flush(WAIT_MAX).unwrap());
    assert!(
        c.poll(Some(Duration::from_millis(500))).unwrap().is_none(),
        "settled by the dead letter"
    );
    c.close().unwrap();

    let mut d = subscribed(&b, "dlq-reader", "orders.dlq");
    let m = d.poll(Some(WAIT_MAX)).unwrap().expect("the dead letter");
    assert!(d.poll(Some(Duration::from_millis(300))).unwrap().is_none());
    assert_eq!(
        (&*m.topic, m.partition, &m.key[..], &m.value[..]),
        ("orders.dlq", 1, &b"poison-key"[..], &b"poison-value"[..])
    );
    let origin = m.origin.clone().expect("an origin");
    assert_eq!(
        origin,
        DeadLetterOrigin {
            topic_id: source.id,
            topic: Some("orders".into()),
            partition: 1,
            sequence: poison.sequence,
            attempts: 1,
            reason: Some(OriginReason::Rejected),
        }
    );
    assert!(m.ack());
    d.close().unwrap();
}

#[test]
fn a_record_failing_its_last_attempt_is_dead_lettered_with_the_count() {
    let b = broker(&["--max-attempts", "2"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.publish("flaky", "key", "never-acked", None).unwrap();
    let mut c = subscribed(&b, "g", "flaky");
    for attempt in [1, 2] {
        let m = c.poll(Some(WAIT_MAX)).unwrap().expect("a delivery");
        assert_eq!(m.attempt, attempt);
        assert!(m.nack_retry());
    }
    assert!(c.flush(WAIT_MAX).unwrap());
    assert!(c.poll(Some(Duration::from_millis(500))).unwrap().is_none());
    let mut d = subscribed(&b, "g", "flaky.dlq");
    let m = d.poll(Some(WAIT_MAX)).unwrap().expect("the dead letter");
    let origin = m.origin.clone().unwrap();
    assert_eq!(m.value, b"never-acked");
    assert_eq!(
        (origin.topic.as_deref(), origin.attempts, origin.reason),
        (Some("flaky"), 2, Some(OriginReason::MaxAttempts))
    );
    // A producer may publish to the twin by hand, through its source's id.
    assert_eq!(
        p.publish("flaky.dlq", "", "by hand", None)
            .unwrap()
            .sequence,
        2
    );
}

#[test]
fn rebalances_reach_the_callback_before_the_broker_is_told() {
    // The default revoke timeout: the broker must still be waiting for the
    // CONTROL_ACK while the callback runs.
    let b = Mortard::start_on_fixed_port(&["--commit-interval", "100ms"]);
    let admin = b.admin.unwrap();
    let mut p = Producer::builder(addr(&b)).declare(4).connect().unwrap();
    for i in 0..40u16 {
        p.send_record(Record::new("shared", format!("{i}").as_bytes()).partition(i % 4))
            .unwrap();
    }
    p.close().unwrap();
    // (event, the partition's state at the broker while the callback ran)
    let seen: Arc<Mutex<Vec<(Rebalance, String)>>> = Arc::default();
    let member = |name: &'static str| {
        let seen = seen.clone();
        let mut c = Consumer::builder(addr(&b))
            .credit(1, 0)
            .on_rebalance(move |r| {
                let (Rebalance::Assigned(p) | Rebalance::Revoked(p) | Rebalance::Lost(p)) = r;
                let state = group_partitions(admin, "g")
                    .into_iter()
                    .find(|(q, _, _)| *q == u64::from(p))
                    .map(|(_, s, _)| s)
                    .unwrap_or_default();
                seen.lock().unwrap().push((r, format!("{name}:{state}")));
            })
            .connect()
            .unwrap();
        c.subscribe("g", "shared", StartPolicy::Earliest).unwrap();
        c
    };
    let mut a = member("a");
    let mut got = BTreeSet::new();
    let mut take = |c: &mut Consumer, wait: Duration| {
        let m = c.poll(Some(wait)).unwrap();
        if let Some(m) = m {
            got.insert(String::from_utf8(m.value.to_vec()).unwrap());
            m.ack();
        }
    };
    while a.assignment().len() < 4 {
        take(&mut a, Duration::from_millis(50));
    }
    let mut bm = member("b");
    let deadline = Instant::now() + WAIT_MAX;
    while a.assignment().len() + bm.assignment().len() < 4 || bm.assignment().is_empty() {
        assert!(Instant::now() < deadline, "no rebalance to two members");
        take(&mut a, Duration::from_millis(50));
        take(&mut bm, Duration::from_millis(50));
    }
    let mut held: Vec<u16> = a.assignment();
    held.extend(bm.assignment());
    held.sort_unstable();
    assert_eq!(held, vec![0, 1, 2, 3]);
    let seen_now = seen.lock().unwrap().clone();
    let revoked: Vec<u16> = seen_now
        .iter()
        .filter_map(|(r, _)| match r {
            Rebalance::Revoked(p) => Some(*p),
            _ => None,
        })
        .collect();
    assert!(
        !revoked.is_empty(),
        "a gave partitions up for b: {seen_now:?}"
    );
    for (r, state) in &seen_now {
        let want = match r {
            Rebalance::Assigned(_) => "assigning",
            Rebalance::Revoked(_) => "revoking",
            Rebalance::Lost(_) => panic!("nothing was lost: {seen_now:?}"),
        };
        assert!(
            state.ends_with(want),
            "{r:?} while the broker showed {state}"
        );
    }
    // b leaves: a takes everything back and the rest of the records.
    bm.close().unwrap();
    while let Some(m) = a.poll(Some(IDLE)).unwrap() {
        got.insert(String::from_utf8(m.value.to_vec()).unwrap());
        m.ack();
    }
    assert_eq!(a.assignment(), vec![0, 1, 2, 3]);
    a.close().unwrap();
    assert_eq!(got, (0..40).map(|i| i.to_string()).collect());
}

#[test]
fn pull_mode_reads_everything() {
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(2).connect().unwrap();
    for i in 0..10u16 {
        p.send_record(Record::new("pulled", format!("{i}").as_bytes()).partition(i % 2))
            .unwrap();
    }
    p.close().unwrap();
    let mut c = Consumer::builder(addr(&b))
        .pull(true)
        .credit(3, 0)
        .connect()
        .unwrap();
    c.subscribe("g", "pulled", StartPolicy::Earliest).unwrap();
    let mut values: Vec<u32> = drain(&mut c, IDLE)
        .iter()
        .map(|m| String::from_utf8_lossy(&m.4).parse().unwrap())
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..10).collect::<Vec<_>>());
    let members = &stats(&b)["groups"][0]["members"];
    assert_eq!(members[0]["pull_mode"], true, "{members}");
}

#[test]
fn credit_bounds_the_window_of_unsettled_deliveries() {
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    for v in ["0", "1", "2"] {
        p.send("credited", "", v, None).unwrap();
    }
    p.flush().unwrap();
    let mut c = subscribed(&b, "g", "credited");
    let granted = c.set_credit(1, 0).unwrap();
    assert_eq!(granted.granted_count, 1);
    let first = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    // The window is full until the first is settled.
    assert!(c.poll(Some(Duration::from_millis(500))).unwrap().is_none());
    assert_eq!(first.value, b"0");
    assert!(first.ack());
    let second = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    assert_eq!(second.value, b"1");
    assert!(second.ack());
    assert_eq!(c.poll(Some(WAIT_MAX)).unwrap().unwrap().value, b"2");
    let too_much = c.set_credit(u16::MAX, u32::MAX).unwrap_err();
    assert_eq!(too_much.code(), Some(ErrorCode::CreditLimit));
}

#[test]
fn nack_retry_delivers_again_with_the_next_attempt() {
    let b = broker(&[]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.publish("retried", "", "again", None).unwrap();
    let mut c = subscribed(&b, "g", "retried");
    let first = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    let sequence = first.sequence;
    assert!(first.nack_retry());
    let second = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    assert_eq!((second.sequence, second.attempt), (sequence, 2));
    assert!(second.ack());
    assert!(c.flush(WAIT_MAX).unwrap());
    assert!(c.poll(Some(Duration::from_millis(500))).unwrap().is_none());
}

#[test]
fn progress_keeps_a_slow_delivery() {
    let b = broker(&["--ack-wait", "1500ms"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.publish("slow", "", "work", None).unwrap();
    let mut c = subscribed(&b, "g", "slow");
    let m = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    // 2.5 s of "work", past the ack-wait, with PROGRESS every 500 ms: no redelivery.
    for _ in 0..5 {
        assert!(c.poll(Some(Duration::from_millis(500))).unwrap().is_none());
        assert!(m.progress());
    }
    assert!(m.ack());
    assert!(c.flush(WAIT_MAX).unwrap());
    assert!(c.poll(Some(Duration::from_secs(2))).unwrap().is_none());
}

#[test]
fn heartbeats_keep_a_member_that_does_not_poll() {
    let b = broker(&["--session-timeout", "1500ms"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.topic("busy").unwrap();
    let mut c = Consumer::builder(addr(&b))
        .heartbeat_interval(Duration::from_millis(200))
        .connect()
        .unwrap();
    c.subscribe("g", "busy", StartPolicy::Earliest).unwrap();
    assert!(c.poll(Some(Duration::from_millis(300))).unwrap().is_none());
    let member = stats(&b)["groups"][0]["members"][0]["member_id"].clone();
    // The application is busy for twice the session timeout; only the heartbeat
    // thread speaks for the member, which stays the same.
    let busy_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < busy_until {
        let members = stats(&b)["groups"][0]["members"].clone();
        assert_eq!(members[0]["member_id"], member, "{members}");
        std::thread::sleep(Duration::from_millis(100));
    }
    p.publish("busy", "", "still here", None).unwrap();
    assert_eq!(
        c.poll(Some(WAIT_MAX)).unwrap().unwrap().value,
        b"still here"
    );
    assert_eq!(c.stats().rejoins, 0);
}

#[test]
fn an_expelled_member_joins_again() {
    let b = broker(&["--session-timeout", "500ms"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.publish("expel", "", "first", None).unwrap();
    let mut c = Consumer::builder(addr(&b))
        .heartbeat_interval(Duration::from_secs(60))
        .connect()
        .unwrap();
    c.subscribe("g", "expel", StartPolicy::Earliest).unwrap();
    let first = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    wait_until("the silent member's expulsion", || {
        stats(&b)["groups"][0]["members"]
            .as_array()
            .is_some_and(|m| m.is_empty())
    });
    first.ack(); // answered UNKNOWN_DELIVERY: the member finds out and joins again
    let again = c.poll(Some(WAIT_MAX)).unwrap().unwrap();
    assert_eq!(again.value, b"first", "delivered again after the rejoin");
    assert!(again.ack());
    assert!(c.flush(WAIT_MAX).unwrap());
    assert_eq!(c.stats().rejoins, 1);
}

#[test]
fn connections_the_broker_closed_as_idle_are_replaced() {
    let b = broker(&["--idle-timeout", "1s"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    p.publish("idle", "", "1", None).unwrap();
    wait_until("the idle connection's close", || {
        stats(&b)["connections"]["open"] == 0
    });
    assert_eq!(p.publish("idle", "", "2", None).unwrap().sequence, 2);
    assert_eq!(p.stats().reconnects, 1);
    let mut c = Consumer::builder(addr(&b))
        .heartbeat_interval(Duration::from_millis(200))
        .connect()
        .unwrap();
    c.subscribe("g", "idle", StartPolicy::Earliest).unwrap();
    let values: Vec<Vec<u8>> = drain(&mut c, Duration::from_millis(800))
        .into_iter()
        .map(|m| m.4)
        .collect();
    assert_eq!(values, vec![b"1".to_vec(), b"2".to_vec()]);
    // Heartbeats keep the consumer's connection open past the idle timeout.
    assert!(c.poll(Some(Duration::from_millis(1500))).unwrap().is_none());
    assert_eq!(c.stats().rejoins, 0);
}

/// Records sent, their answers not yet read, when the broker closes the quiet
/// connection; then records written one by one into the closed connection until a
/// write fails (the kernel has the broker's reset by then), some of them never
/// written: the producer connects again and each record is stored once. It used to
/// panic taking back a record a failed write never sent.
#[test]
fn records_in_flight_when_the_broker_closes_an_idle_connection_are_stored_once() {
    let b = broker(&["--idle-timeout", "1s"]);
    let mut p = Producer::builder(addr(&b)).declare(1).connect().unwrap();
    let mut sent: Vec<SendHandle> = Vec::new();
    for i in 0..3 {
        sent.push(p.send("q", "", format!("a{i}"), None).unwrap());
    }
    p.send_queued();
    wait_until("the idle connection's close", || {
        stats(&b)["connections"]["closed"]["idle_timeout"] == 1
    });
    let deadline = Instant::now() + WAIT_MAX;
    while p.stats().reconnects == 0 {
        assert!(Instant::now() < deadline, "no reconnect");
        sent.push(p.send("q", "", format!("b{}", sent.len()), None).unwrap());
        p.send_queued();
    }
    p.flush().unwrap();
    let sequences: Vec<u64> = sent
        .iter()
        .map(|h| h.result().unwrap().unwrap().sequence)
        .collect();
    let want: Vec<u64> = (1..=sent.len() as u64).collect();
    assert_eq!(sequences, want);
    let stored = &stats(&b)["topics"][0]["partitions"][0]["last_sequence"];
    assert_eq!(stored.as_u64(), Some(sent.len() as u64));
}

/// `keep_alive`, called while the producer waits for input, PINGs within its keepalive
/// period: the broker's shorter idle timeout never closes the connection.
#[test]
fn keep_alive_holds_a_quiet_producers_connection() {
    let b = broker(&["--idle-timeout", "1s"]);
    let keepalive = Duration::from_millis(200);
    let mut p = Producer::builder(addr(&b))
        .declare(1)
        .keepalive(keepalive)
        .connect()
        .unwrap();
    p.send("kept", "", "1", None).unwrap();
    // 10 PINGs 200 ms apart: a quiet spell of about two idle timeouts.
    let pings = |b: &Mortard| {
        let (_, metrics) = b.http("GET", "/metrics");
        let line = metrics
            .lines()
            .find(|l| l.starts_with("mortar_frames_in_total{op=\"PING\"}"));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap()
    };
    let deadline = Instant::now() + WAIT_MAX;
    while pings(&b) < 10 {
        assert!(Instant::now() < deadline, "no PINGs");
        let wait = p.keep_alive().unwrap();
        assert!(wait <= keepalive, "{wait:?}");
        std::thread::sleep(wait);
    }
    assert_eq!(stats(&b)["connections"]["closed"]["idle_timeout"], 0);
    assert_eq!(p.publish("kept", "", "2", None).unwrap().sequence, 2);
    assert_eq!(p.stats().reconnects, 0);
}

#[test]
fn a_producer_gives_up_after_its_retry_timeout_and_recovers() {
    let mut b = broker(&[]);
    let mut p = Producer::builder(addr(&b))
        .declare(1)
        .retry_timeout(Duration::from_secs(1))
        .connect()
        .unwrap();
    p.publish("gone", "", "x", None).unwrap();
    let id = p.producer_id();
    b.kill9();
    let started = Instant::now();
    let e = p.publish("gone", "", "y", None).unwrap_err();
    assert!(matches!(e, Error::Io(_)), "{e:?}");
    assert!(e.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(10));
    b.restart();
    // After an unknown outcome the producer numbers from a new producer_id: nothing is
    // refused as out of order.
    assert!(p.publish("gone", "", "z", None).unwrap().sequence >= 2);
    assert_ne!(p.producer_id(), id);
}

#[test]
fn errors_carry_the_registry_entry() {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "s3cret\n").unwrap();
    let path = token_file.path().to_str().unwrap();
    let b = broker(&["--token-file", path]);
    let refused = Producer::builder(addr(&b))
        .token("guess")
        .connect()
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::AuthFailed));
    assert_eq!(refused.client_should(), "fix the credentials; do not loop");
    let mut p = Producer::builder(addr(&b))
        .token("s3cret")
        .connect()
        .unwrap();
    let unknown = p.publish("nope", "", "x", None).unwrap_err();
    assert_eq!(
        (unknown.code(), unknown.name(), unknown.retry()),
        (Some(ErrorCode::UnknownTopic), "UNKNOWN_TOPIC", Retry::No)
    );
    assert!(
        unknown
            .to_string()
            .contains("client should: DECLARE the topic"),
        "{unknown}"
    );
    let long_key = vec![b'k'; 256];
    let e = p.publish("nope", &long_key, "x", None).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
    let mut created = Producer::builder(addr(&b))
        .token("s3cret")
        .declare(2)
        .connect()
        .unwrap();
    let e = created
        .publish_record(Record::new("two", b"x").partition(2))
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownPartition));
    let next = created.publish_record(Record::new("two", b"y").partition(1));
    assert_eq!(next.unwrap().sequence, 1, "the refused record left no hole");
    let mut c = Consumer::builder(addr(&b))
        .token("s3cret")
        .connect()
        .unwrap();
    let e = c.subscribe("g", "nope", StartPolicy::Earliest).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownTopic));
}

/// The ```rust blocks of README.md's "Rust client" section.
fn readme_rust_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = readme
        .find("\n## Rust client\n")
        .expect("a Rust client section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    section
        .split("```rust\n")
        .skip(1)
        .map(|b| b[..b.find("```").expect("a closed block")].to_string())
        .collect()
}

/// The newest modification time under `dir`.
fn newest(dir: &std::path::Path) -> std::time::SystemTime {
    let mut t = std::time::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        t = t.max(if m.is_dir() {
            newest(&e.path())
        } else {
            m.modified().unwrap()
        });
    }
    t
}

/// The files cargo built `exe` from, as its dep-info file (`exe.d`) lists them: the
/// example and the library's sources, not the library's test-only modules, whose changes
/// rebuild no example.
fn built_from(exe: &std::path::Path) -> Option<Vec<std::path::PathBuf>> {
    let text = std::fs::read_to_string(exe.with_extension("d")).ok()?;
    let (_, deps) = text.lines().next()?.split_once(": ")?;
    let escaped = deps.replace("\\ ", "\0");
    let paths = escaped
        .split_whitespace()
        .map(|p| p.replace('\0', " ").into());
    Some(paths.collect())
}

/// A built example program, newer than its source and the library's: tools/test.sh
/// runs `cargo build --examples` first (`cargo test` builds them only as test
/// harnesses, whose `main` does not run).
fn example_binary(name: &str) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let test_exe = std::env::current_exe().unwrap();
    let exe = test_exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    let written = match built_from(&exe) {
        Some(sources) => (sources.iter())
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()))
            .map(|t| t.unwrap_or_else(|_| std::time::SystemTime::now()))
            .max()
            .unwrap_or(std::time::UNIX_EPOCH),
        None => {
            let source = std::fs::metadata(root.join(format!("examples/{name}.rs")));
            newest(&root.join("src")).max(source.unwrap().modified().unwrap())
        }
    };
    match std::fs::metadata(&exe).and_then(|m| m.modified()) {
        Ok(built) if built >= written => exe,
        _ => panic!(
            "{} is missing or older than its sources: `cargo build --examples`",
            exe.display()
        ),
    }
}

#[test]
fn the_readme_rust_section_is_the_examples_and_they_run() {
    let names = ["produce", "consume", "dead_letters", "errors"];
    let blocks = readme_rust_blocks();
    let sources: Vec<String> = names
        .iter()
        .map(|n| {
            std::fs::read_to_string(format!("{}/examples/{n}.rs", env!("CARGO_MANIFEST_DIR")))
                .unwrap()
        })
        .collect();
    assert_eq!(
        blocks, sources,
        "README.md shows examples/ whole, in this order"
    );
    let b = broker(&[]);
    let run = |name: &str| {
        let out = std::process::Command::new(example_binary(name))
            .arg(addr(&b))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{name}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let customer = mortarctl_partition(b"customer-42", 4);
    assert_eq!(
        run("produce"),
        format!("partition {customer} sequence 1\nline 999: partition 0 sequence 1000\n")
    );
    assert_eq!(run("consume"), "acknowledged 1001, rejected 1\n");
    assert_eq!(
        run("dead_letters"),
        "[255, 254] from orders partition 0 sequence 1001 after 1 attempt(s): Some(Rejected)\n"
    );
    assert_eq!(
        run("errors"),
        "UNKNOWN_TOPIC No - DECLARE the topic, or refresh the id\n"
    );
}

/// A loopback proxy in front of a broker that can lose an answer on purpose: once
/// armed, the next bytes the broker sends are dropped and that connection is cut, as if
/// it broke after the broker acted on a request.
struct Proxy {
    addr: std::net::SocketAddr,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

impl Proxy {
    fn new(target: std::net::SocketAddr) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let (a, d) = (armed.clone(), dropped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let upstream = std::net::TcpStream::connect(target).unwrap();
                let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                std::thread::spawn(move || Proxy::pump(c2, u2, None));
                let (a, d) = (a.clone(), d.clone());
                std::thread::spawn(move || Proxy::pump(upstream, client, Some((a, d))));
            }
        });
        Proxy {
            addr,
            armed,
            dropped,
        }
    }

    /// Copies `src` to `dst`; from the broker (`lose` given), drops what comes once armed.
    fn pump(
        mut src: std::net::TcpStream,
        mut dst: std::net::TcpStream,
        lose: Option<(Arc<AtomicBool>, Arc<AtomicBool>)>,
    ) {
        use std::io::{Read, Write};
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = src.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Some((armed, dropped)) = &lose {
                if armed.swap(false, Ordering::SeqCst) {
                    dropped.store(true, Ordering::SeqCst);
                    break;
                }
            }
            if dst.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = src.shutdown(std::net::Shutdown::Both);
        let _ = dst.shutdown(std::net::Shutdown::Both);
    }
}

#[test]
fn a_lost_answer_is_resent_and_deduplicated() {
    let b = broker(&[]);
    let proxy = Proxy::new(b.addr);
    let mut p = Producer::builder(proxy.addr).declare(1).connect().unwrap();
    let first = p.publish("dedup", "", "one", None).unwrap();
    // The broker appends "two"; its answer is lost with the connection: the producer
    // reconnects and resends the same (producer_id, producer_seq).
    proxy.armed.store(true, Ordering::SeqCst);
    let again = p.publish("dedup", "", "two", None).unwrap();
    assert!(proxy.dropped.load(Ordering::SeqCst), "an answer was lost");
    assert!(again.deduplicated, "{again:?}");
    assert_eq!(again.sequence, first.sequence + 1);
    assert_eq!(p.stats().reconnects, 1);
    assert_eq!(
        p.publish("dedup", "", "three", None).unwrap().sequence,
        first.sequence + 2
    );
    let mut c = subscribed(&b, "g", "dedup");
    let values: Vec<Vec<u8>> = drain(&mut c, IDLE).into_iter().map(|m| m.4).collect();
    assert_eq!(values, [&b"one"[..], b"two", b"three"]);
}
