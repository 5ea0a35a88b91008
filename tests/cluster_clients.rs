//! Clients against a real 3-node cluster over real TCP: the Rust `Producer` and
//! `Consumer` and `mortarctl pub`/`sub` follow NOT_LEADER to the leader, and a producer
//! given every node keeps publishing across a kill -9 of the leader with no record lost
//! or doubled (`man/mortarmq.7`, REPLICATION; docs/DECISIONS.md "Clients in a cluster").

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::mortarctl::{command, run_to_end};
use mortarmq::client::{Consumer, Durability, ErrorCode, Producer, StartPolicy};

const ELECTION_LIMIT: Duration = Duration::from_secs(20);
/// How long the surviving nodes may take to apply every acknowledged record.
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);
/// Bounds every client's retries here: a client that does not follow the leader fails
/// within it instead of hanging the test.
const CLIENT_RETRY: Duration = Duration::from_secs(15);
/// How long one `mortarctl` run may take before it is killed and the test fails.
const CTL_LIMIT: Duration = Duration::from_secs(30);

/// A node that does not lead: the one after the leader.
fn follower_of(cluster: &Cluster, leader: usize) -> usize {
    (leader + 1) % cluster.nodes.len()
}

fn producer(addrs: &[SocketAddr]) -> Producer {
    Producer::builder(addrs)
        .declare(1)
        .durability(Durability::Replicated)
        .retry_timeout(CLIENT_RETRY)
        .timeout(Duration::from_secs(5))
        .connect()
        .expect("connect")
}

/// Waits until node `i` holds `want` values (in any order), and returns what it holds.
fn wait_values(cluster: &Cluster, i: usize, topic: &str, want: usize) -> Vec<String> {
    let deadline = Instant::now() + CONVERGE_LIMIT;
    loop {
        let got: Vec<String> = cluster
            .records(i, topic, 0)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        if got.len() >= want || Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_producer_given_a_follower_publishes_through_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let follower = follower_of(&cluster, leader);
    let mut p = producer(&[cluster.nodes[follower].addr]);
    for i in 1..=10u64 {
        let r = p
            .publish("orders", "", format!("v{i}"), None)
            .expect("publish through a follower");
        assert_eq!(r.durability, Durability::Replicated);
        assert_eq!(r.sequence, i);
        assert!(r.commit_seq >= r.sequence && r.leader_epoch > 0, "{r:?}");
    }
    let values = wait_values(&cluster, leader, "orders", 10);
    let want: Vec<String> = (1..=10).map(|i| format!("v{i}")).collect();
    assert_eq!(values, want, "the leader holds each record once, in order");
}

#[test]
fn a_producer_given_every_node_keeps_publishing_across_kill_9_of_the_leader() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.addr).collect();
    let mut p = producer(&addrs);
    const RECORDS: usize = 600;
    let mut handles = Vec::new();
    for i in 0..RECORDS {
        handles.push(p.send("orders", b"", format!("r{i}"), None).expect("send"));
        if i == RECORDS / 2 {
            // Records in flight on the leader's connection when it dies: their outcome
            // is unknown, and they are resent to the new leader with the same seq.
            p.send_queued();
            cluster.kill9(leader);
        }
    }
    p.flush().expect("every record answered after the failover");
    let mut epochs = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        let r = h.result().expect("answered").expect("published");
        assert_eq!(r.durability, Durability::Replicated, "record {i}");
        epochs.push(r.leader_epoch);
    }
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "no answer under an older epoch"
    );
    assert!(
        epochs[RECORDS - 1] > epochs[0],
        "the last answers came from a new leader"
    );
    assert!(p.stats().reconnects >= 1, "{:?}", p.stats());
    let survivor = follower_of(&cluster, leader);
    let values = wait_values(&cluster, survivor, "orders", RECORDS);
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &values {
        *count.entry(v.as_str()).or_default() += 1;
    }
    let doubled: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "records doubled: {doubled:?}");
    let lost: Vec<usize> = (0..RECORDS)
        .filter(|i| !count.contains_key(format!("r{i}").as_str()))
        .collect();
    assert!(lost.is_empty(), "records lost: {lost:?}");
    assert_eq!(values.len(), RECORDS);
}

#[test]
fn a_consumer_given_a_follower_subscribes_on_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let mut p = producer(&[cluster.nodes[leader].addr]);
    for i in 0..5 {
        p.publish("orders", "", format!("m{i}"), None)
            .expect("publish");
    }
    let follower = follower_of(&cluster, leader);
    let mut c = Consumer::builder(cluster.nodes[follower].addr)
        .timeout(Duration::from_secs(5))
        .reconnect_timeout(Some(CLIENT_RETRY))
        .connect()
        .expect("connect");
    c.subscribe("billing", "orders", StartPolicy::Earliest)
        .expect("SUB through a follower");
    let mut got = Vec::new();
    while got.len() < 5 {
        let m = c
            .poll(Some(Duration::from_secs(10)))
            .expect("poll")
            .expect("a message within 10 s");
        got.push(String::from_utf8_lossy(&m.value).into_owned());
        m.ack();
    }
    assert_eq!(got, ["m0", "m1", "m2", "m3", "m4"]);
}

#[test]
fn mortarctl_pub_to_a_follower_is_published_by_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let follower = follower_of(&cluster, leader);
    let broker = cluster.nodes[follower].addr.to_string();
    let deadline = Instant::now() + ELECTION_LIMIT;
    while !matches!(cluster.probe(follower), Err((ErrorCode::NotLeader, _))) {
        assert!(
            Instant::now() < deadline,
            "the follower never named the leader"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A one-shot admin write does not follow: it names the leader and says what to do.
    let mut cmd = command();
    cmd.args([
        "--broker",
        &broker,
        "topics",
        "create",
        "orders",
        "--partitions",
        "1",
    ]);
    let out = run_to_end(cmd, b"", CTL_LIMIT).expect("mortarctl topics create ended");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let named = format!("leader {} {}", leader + 1, cluster.nodes[leader].addr);
    assert!(stderr.contains(&named), "{stderr}");
    assert!(
        stderr.contains("give --broker the leader's address"),
        "{stderr}"
    );
    producer(&[cluster.nodes[leader].addr])
        .topic("orders")
        .expect("declared");
    let mut cmd = command();
    cmd.args(["--broker", &broker, "--timeout", "5s", "pub", "orders"]);
    let out = run_to_end(cmd, b"one\ntwo\n", CTL_LIMIT).expect("mortarctl pub ended");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(wait_values(&cluster, leader, "orders", 2), ["one", "two"]);
}

#[test]
fn mortarctl_sub_given_a_list_starting_with_a_follower_consumes_from_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let follower = follower_of(&cluster, leader);
    let mut p = producer(&[cluster.nodes[leader].addr]);
    for v in ["a", "b", "c"] {
        p.publish("orders", "", v, None).expect("publish");
    }
    let list = format!(
        "{},{}",
        cluster.nodes[follower].addr, cluster.nodes[leader].addr
    );
    let mut cmd = command();
    cmd.env("MORTAR_BROKER", &list);
    cmd.args(["--timeout", "5s", "sub", "orders", "--group", "g"]);
    cmd.args(["--from", "earliest", "--count", "3"]);
    let out = run_to_end(cmd, b"", CTL_LIMIT).expect("mortarctl sub ended");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nb\nc\n");
}

#[test]
fn a_consumer_given_every_node_goes_on_consuming_after_kill_9_of_the_leader() {
    let mut cluster = Cluster::start(3, &["--commit-interval", "100ms"]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.addr).collect();
    let mut p = producer(&addrs);
    p.topic("orders").expect("declared");
    let mut c = Consumer::builder(&addrs[..])
        .timeout(Duration::from_secs(5))
        .reconnect_timeout(Some(CLIENT_RETRY))
        .connect()
        .expect("connect");
    c.subscribe("billing", "orders", StartPolicy::Earliest)
        .expect("subscribe");
    let mut seen = std::collections::BTreeSet::new();
    let mut take = |c: &mut Consumer, want: &str| {
        let deadline = Instant::now() + CLIENT_RETRY;
        while !seen.contains(want) {
            assert!(Instant::now() < deadline, "{want} not delivered");
            if let Some(m) = c.poll(Some(Duration::from_secs(1))).expect("poll") {
                seen.insert(String::from_utf8_lossy(&m.value).into_owned());
                m.ack();
            }
        }
    };
    p.publish("orders", "", "before", None).expect("publish");
    take(&mut c, "before");
    cluster.kill9(leader);
    p.publish("orders", "", "after", None)
        .expect("publish on the new leader");
    take(&mut c, "after");
    assert!(c.stats().rejoins >= 1, "{:?}", c.stats());
}
