//! Replication over real TCP (issue 15, `docs/REPLICATION.md` §9.2): three `mortard`
//! processes on loopback joined by `--peers`, each with its own data directory. What a
//! client sees: REPLICATED answers from the leader, the role gate's codes elsewhere, and
//! no acknowledged record lost or doubled across kill -9 of the leader.

mod common;

use std::time::Duration;

use common::cluster::Cluster;
use common::consume::receive;
use common::wait::wait_until;
use mortarmq::client::{Client, ClientError};
use mortarmq::wire::ops::{Frame, Pub, PubResult, Sub};
use mortarmq::wire::{
    AckFlags, DeclareFlags, Durability, ErrorCode, NackReason, PubFlags, PubResultFlags,
};

/// Longest an election may take here: 0.5–1.0 s by default, more on a loaded 2-core host.
const ELECTION_LIMIT: Duration = Duration::from_secs(20);
/// Longest a committed record may take to reach every node's segments.
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);
/// How soon a follower sees its link to a killed leader drop: a TCP reset on loopback,
/// well within the 5 s minimum election timeout of the test that uses it.
const LINK_DOWN_LIMIT: Duration = Duration::from_secs(4);
const PRODUCER_ID: u64 = 7;

fn client_of(cluster: &Cluster, i: usize) -> Client {
    let c = Client::connect(cluster.nodes[i].addr, b"").expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

fn publish(c: &mut Client, topic_id: u16, seq: u64, durability: Option<Durability>) -> PubResult {
    let value = format!("v{seq}");
    c.publish(&Pub {
        topic_id,
        flags: PubFlags::requesting(durability),
        producer_id: PRODUCER_ID,
        producer_seq: seq,
        value: value.as_bytes(),
        ..Pub::default()
    })
    .unwrap_or_else(|e| panic!("PUB producer_seq {seq}: {e}"))
}

/// Joins group `g` on every partition of `topic_id`.
fn subscribe(c: &mut Client, topic_id: u16) {
    c.request(&Frame::Sub(Sub {
        group: b"g",
        topic_id,
        partition: 0xFFFF,
        ..Sub::default()
    }))
    .expect("SUB");
}

/// A 3-node cluster started with `args`, its leader, a client on it and the id of the
/// one-partition topic `orders` it declared.
fn cluster_with_topic(args: &[&str]) -> (Cluster, usize, Client, u16) {
    topic_on(Cluster::start(3, args), "orders")
}

/// `cluster`'s leader, a client on it and the id of the one-partition topic `name` it
/// declared.
fn topic_on(cluster: Cluster, name: &str) -> (Cluster, usize, Client, u16) {
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let mut c = client_of(&cluster, leader);
    let topic_id = c.declare(name, 1, DeclareFlags::empty()).unwrap().topic_id;
    (cluster, leader, c, topic_id)
}

/// A 3-node cluster whose leader (returned, with a client on it) holds topic `orders`
/// (one partition, returned id) and `records` REPLICATED records `v1`…, each acknowledged:
/// their (sequence, value) in order.
fn cluster_with_orders(records: u64) -> (Cluster, usize, Client, u16, Vec<(u64, String)>) {
    let (cluster, leader, mut c, topic_id) = cluster_with_topic(&[]);
    let acked = (1..=records)
        .map(|seq| {
            (
                publish(&mut c, topic_id, seq, None).sequence,
                format!("v{seq}"),
            )
        })
        .collect();
    (cluster, leader, c, topic_id, acked)
}

/// Waits until every running node holds exactly `want` in `orders` partition 0.
fn wait_converged(cluster: &Cluster, want: &[(u64, String)]) {
    for i in (0..cluster.nodes.len()).filter(|&i| cluster.is_up(i)) {
        wait_until(
            &format!("node {} to hold the acknowledged records", cluster.id(i)),
            CONVERGE_LIMIT,
            || cluster.records(i, "orders", 0) == want,
        );
    }
}

#[test]
fn a_replicated_pub_is_answered_by_the_leader_held_by_every_node_and_followers_name_it() {
    let (cluster, leader, mut c, topic_id, mut acked) = cluster_with_orders(0);
    for seq in 1..=20 {
        // The default durability of a cluster is REPLICATED; ask for it outright too.
        let durability = (seq % 2 == 0).then_some(Durability::Replicated);
        let r = publish(&mut c, topic_id, seq, durability);
        assert_eq!(r.durability, Durability::Replicated.as_code(), "{r:?}");
        assert!(r.leader_epoch >= 1, "the raft term: {r:?}");
        assert!(r.commit_seq >= r.sequence, "{r:?}");
        acked.push((r.sequence, format!("v{seq}")));
    }
    let sequences: Vec<u64> = acked.iter().map(|(s, _)| *s).collect();
    let first = sequences[0];
    assert_eq!(sequences, (first..first + 20).collect::<Vec<_>>());

    let want = format!(
        "leader {} {}",
        cluster.id(leader),
        cluster.nodes[leader].addr
    );
    for i in (0..3).filter(|&i| i != leader) {
        assert_eq!(cluster.probe(i), Err((ErrorCode::NotLeader, want.clone())));
        let mut f = client_of(&cluster, i);
        match f.declare("other", 1, DeclareFlags::empty()) {
            Err(e @ ClientError::Broker { .. }) => {
                assert_eq!(e.code(), Some(ErrorCode::NotLeader), "{e:?}");
                assert!(matches!(e, ClientError::Broker { message, .. } if message == want));
            }
            other => panic!("a follower took a DECLARE: {other:?}"),
        }
    }
    // Admin writes go to the leader: a follower names it, and changes nothing.
    for i in (0..3).filter(|&i| i != leader) {
        for (method, path) in [
            ("POST", "/topics/orders/purge"),
            ("DELETE", "/groups/g?topic=orders"),
            ("POST", "/groups/g/reset?topic=orders&to=earliest"),
        ] {
            let (status, body) = cluster.nodes[i].http(method, path);
            assert_eq!(status, 421, "{method} {path} on node {i}: {body}");
            assert!(
                body.contains("NOT_LEADER") && body.contains(&want),
                "{body}"
            );
        }
    }
    wait_converged(&cluster, &acked);
}

/// `mortarctl topics purge orders` against node `i`'s listeners.
fn mortarctl_purge(cluster: &Cluster, i: usize) -> std::process::Output {
    let mut cmd = common::mortarctl::against(&cluster.nodes[i]);
    cmd.args(["topics", "purge", "orders"]);
    common::mortarctl::run_to_end(cmd, b"", Duration::from_secs(30)).expect("mortarctl ended")
}

#[test]
fn a_purge_through_mortarctl_on_the_leader_empties_the_topic_on_every_node() {
    let (cluster, leader, mut c, topic_id, acked) = cluster_with_orders(5);
    wait_converged(&cluster, &acked);
    let out = mortarctl_purge(&cluster, leader);
    assert!(out.status.success(), "{out:?}");
    wait_converged(&cluster, &[]);
    // Sequences go on after the purge, on every node.
    let after = publish(&mut c, topic_id, 6, None);
    assert_eq!(after.sequence, acked[4].0 + 1);
    wait_converged(&cluster, &[(after.sequence, "v6".to_string())]);
    // On a follower mortarctl says where the leader is.
    let f = (0..3).find(|&i| i != leader).unwrap();
    let out = mortarctl_purge(&cluster, f);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "leader {} {}",
        cluster.id(leader),
        cluster.nodes[leader].addr
    );
    assert!(err.contains("NOT_LEADER") && err.contains(&want), "{err}");
    assert!(err.contains("hint:"), "{err}");
    wait_converged(&cluster, &[(after.sequence, "v6".to_string())]);
}

#[test]
fn a_leader_killed_with_kill_9_loses_no_acknowledged_record_and_a_resend_is_not_doubled() {
    let (mut cluster, old, mut c, topic_id, mut acked) = cluster_with_orders(10);
    let old_epoch = publish(&mut c, topic_id, 10, None).leader_epoch;
    cluster.kill9(old);

    let new = cluster.wait_leader(ELECTION_LIMIT);
    assert_ne!(new, old);
    let mut c = client_of(&cluster, new);
    // The producer did not see its last answer: it resends, and gets the original.
    let resent = publish(&mut c, topic_id, 10, None);
    assert!(
        resent.result_flags.contains(PubResultFlags::DEDUPLICATED),
        "{resent:?}"
    );
    assert_eq!(resent.sequence, acked[9].0);
    for seq in 11..=20 {
        let r = publish(&mut c, topic_id, seq, None);
        assert!(
            r.leader_epoch > old_epoch,
            "a new term: {r:?} after {old_epoch}"
        );
        acked.push((r.sequence, format!("v{seq}")));
    }
    wait_converged(&cluster, &acked);

    // The old leader comes back as a follower and catches up.
    cluster.restart(old);
    wait_converged(&cluster, &acked);
    let want = format!("leader {} {}", cluster.id(new), cluster.nodes[new].addr);
    wait_until("the old leader to name the new one", CONVERGE_LIMIT, || {
        cluster.probe(old) == Err((ErrorCode::NotLeader, want.clone()))
    });
}

#[test]
fn a_leader_that_lost_its_followers_never_answers_ok() {
    let (mut cluster, leader, mut c, topic_id, _) = cluster_with_orders(1);
    for i in (0..3).filter(|&i| i != leader) {
        cluster.kill9(i);
    }
    let r = c.publish(&Pub {
        topic_id,
        flags: PubFlags::requesting(Some(Durability::Replicated)),
        producer_id: PRODUCER_ID,
        producer_seq: 2,
        value: b"alone",
        ..Pub::default()
    });
    let allowed = common::cluster::LONE_LEADER_CODES;
    match r {
        Err(e) if e.code().is_some_and(|code| allowed.contains(&code)) => {}
        other => panic!("a leader without a majority answered {other:?}"),
    }
}

#[test]
fn a_node_cut_off_from_the_leader_answers_leader_unknown_then_election_timeout() {
    let mut cluster = Cluster::start(3, &["--replication-timeout", "3s"]);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let survivor = (leader + 1) % 3;
    cluster.kill9(leader);
    cluster.kill9((leader + 2) % 3);
    wait_until("LEADER_UNKNOWN", ELECTION_LIMIT, || {
        matches!(cluster.probe(survivor), Err((ErrorCode::LeaderUnknown, _)))
    });
    wait_until("ELECTION_TIMEOUT", ELECTION_LIMIT, || {
        matches!(
            cluster.probe(survivor),
            Err((ErrorCode::ElectionTimeout, _))
        )
    });
    // A node comes back: a leader is elected and the gate opens again.
    cluster.restart(leader);
    let again = cluster.wait_leader(ELECTION_LIMIT);
    assert!(again == leader || again == survivor);
}

#[test]
fn a_follower_that_lost_its_link_to_the_leader_stops_naming_it_before_raft_notices() {
    // Elections after 5–10 s: raft keeps naming the dead leader that long.
    let mut cluster = Cluster::start(3, &["--election-ticks", "100"]);
    let leader = cluster.wait_leader(ELECTION_LIMIT * 2);
    let follower = (leader + 1) % 3;
    let named = format!(
        "leader {} {}",
        cluster.id(leader),
        cluster.nodes[leader].addr
    );
    wait_until("the follower to name the leader", ELECTION_LIMIT, || {
        cluster.probe(follower) == Err((ErrorCode::NotLeader, named.clone()))
    });
    cluster.kill9(leader);
    // Sending clients to a dead address would cost each a connect timeout.
    wait_until(
        "LEADER_UNKNOWN once the link dropped",
        LINK_DOWN_LIMIT,
        || matches!(cluster.probe(follower), Err((ErrorCode::LeaderUnknown, _))),
    );
}

/// A dead letter is replicated like any record: every node's twin holds it, the group
/// counts it settled on every node, and a new leader neither loses nor writes it again.
#[test]
fn a_dead_letter_reaches_every_node_and_is_not_written_again_after_a_failover() {
    let (mut cluster, old, mut producer, topic_id, _) = cluster_with_orders(3);
    let mut member = client_of(&cluster, old);
    subscribe(&mut member, topic_id);
    let got = receive(&mut member, 3, CONVERGE_LIMIT);
    for m in [&got[0], &got[2]] {
        member
            .request(&Frame::Ack(m.ack(AckFlags::empty())))
            .unwrap();
    }
    let reject = got[1].nack(NackReason::Reject);
    member.request(&Frame::Nack(reject)).unwrap();
    let dead_letter = vec![(1, "v2".to_string())];
    wait_until("every node to hold the dead letter", CONVERGE_LIMIT, || {
        (0..3).all(|i| cluster.records(i, "orders.dlq", 0) == dead_letter)
    });
    // Settled by the dead letter, the group's position moves past it on every node.
    let settled = got[2].sequence;
    wait_until(
        "every node to hold the group past it",
        CONVERGE_LIMIT,
        || {
            (0..3).all(|i| {
                let (_, body) = cluster.nodes[i].http("GET", "/stats");
                body.contains(&format!("\"committed\":{settled}"))
            })
        },
    );
    drop(producer);
    cluster.kill9(old);
    let new = cluster.wait_leader(ELECTION_LIMIT);
    producer = client_of(&cluster, new);
    let fourth = publish(&mut producer, topic_id, 4, None).sequence;
    let mut member = client_of(&cluster, new);
    subscribe(&mut member, topic_id);
    let next = receive(&mut member, 1, CONVERGE_LIMIT);
    assert_eq!(next[0].sequence, fourth, "the rejected record came back");
    assert_eq!(cluster.records(new, "orders.dlq", 0), dead_letter);
}

#[test]
fn after_a_failover_a_group_resumes_at_its_committed_position() {
    let (mut cluster, old, _, topic_id, acked) = cluster_with_orders(20);
    let mut member = client_of(&cluster, old);
    subscribe(&mut member, topic_id);
    let first = receive(&mut member, 10, CONVERGE_LIMIT);
    for m in &first {
        member
            .request(&Frame::Ack(m.ack(AckFlags::empty())))
            .unwrap();
    }
    let settled = first.last().unwrap().sequence;
    assert_eq!(settled, acked[9].0);
    // The positions ride the leader's next BATCH; a survivor holds them once applied.
    wait_until(
        "the survivors to hold the group's position",
        CONVERGE_LIMIT,
        || {
            (0..3).filter(|&i| i != old).all(|i| {
                let (_, body) = cluster.nodes[i].http("GET", "/stats");
                body.contains(&format!("\"committed\":{settled}"))
            })
        },
    );
    cluster.kill9(old);
    let new = cluster.wait_leader(ELECTION_LIMIT);
    let mut member = client_of(&cluster, new);
    subscribe(&mut member, topic_id);
    let next = receive(&mut member, 1, CONVERGE_LIMIT);
    assert_eq!(
        next[0].sequence,
        settled + 1,
        "not redelivered from the start"
    );
    // Its ASSIGNs carry ownership epochs above anything the old leader (term 1) gave.
    let (_, stats) = cluster.nodes[new].http("GET", "/stats");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let epoch = stats["groups"][0]["partitions"][0]["ownership_epoch"].as_u64();
    assert!(epoch.is_some_and(|e| e > 2 << 32), "{epoch:?}");
}

/// A group the leader removed after `--group-ttl` is removed on every node
/// (`docs/DECISIONS.md`, "Group expiry in a cluster"): no survivor shows it, and after a
/// failover a SUB of its name starts a new group from its start policy instead of at the
/// old position.
#[test]
fn a_group_the_leader_expired_is_gone_from_every_node_and_stays_gone_after_a_failover() {
    let (mut cluster, old, mut c, topic_id) = cluster_with_topic(&["--group-ttl", "2s"]);
    for seq in 1..=5 {
        publish(&mut c, topic_id, seq, None);
    }
    let mut member = client_of(&cluster, old);
    subscribe(&mut member, topic_id);
    for m in receive(&mut member, 3, CONVERGE_LIMIT) {
        let ack = Frame::Ack(m.ack(AckFlags::empty()));
        member.request(&ack).unwrap();
    }
    let groups = |i: usize| {
        let (_, body) = cluster.nodes[i].http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let names = stats["groups"].as_array().expect("groups").iter();
        names
            .map(|g| g["group"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    wait_until("every node to show group g", CONVERGE_LIMIT, || {
        (0..3).all(|i| groups(i) == ["g"])
    });
    drop(member);
    wait_until("every node to let group g go", CONVERGE_LIMIT, || {
        (0..3).all(|i| groups(i).is_empty())
    });
    cluster.kill9(old);
    let new = cluster.wait_leader(ELECTION_LIMIT);
    let mut member = client_of(&cluster, new);
    subscribe(&mut member, topic_id);
    let first = receive(&mut member, 1, CONVERGE_LIMIT);
    assert_eq!(first[0].sequence, 1, "a new group, from EARLIEST");
}

/// Node `i`'s `/stats` `cluster` figure `name`.
fn cluster_figure(cluster: &Cluster, i: usize, name: &str) -> u64 {
    let (_, body) = cluster.nodes[i].http("GET", "/stats");
    let stats: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    stats["cluster"][name].as_u64().expect(name)
}

/// This machine's wall clock, Unix milliseconds.
fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.expect("after 1970").as_millis() as u64
}

/// Node `i`'s raft journal files.
fn journal_files(cluster: &Cluster, i: usize) -> usize {
    let dir = cluster.nodes[i].data_dir().join("raft-journal");
    std::fs::read_dir(dir)
        .expect("raft-journal")
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".jnl")
        })
        .count()
}

/// A cluster with 64 KiB journal files whose topic `orders` (its id returned, with a
/// client on the leader) holds 150 records of 4 KiB (the value returned): about ten
/// journal files, which every node compacts.
fn compacting_cluster() -> (Cluster, usize, (Client, u16), String) {
    let (cluster, leader, mut c, topic_id) = cluster_with_topic(&["--journal-file-size", "64KiB"]);
    let value = "x".repeat(4096);
    for seq in 1..=150 {
        c.publish(&Pub {
            topic_id,
            producer_id: PRODUCER_ID,
            producer_seq: seq,
            value: value.as_bytes(),
            ..Pub::default()
        })
        .unwrap();
    }
    (cluster, leader, (c, topic_id), value)
}

#[test]
fn every_node_compacts_its_journal_and_a_node_killed_after_starts_from_its_checkpoint() {
    let started_ms = unix_ms();
    let (mut cluster, leader, _, value) = compacting_cluster();
    wait_until("every node to compact its journal", CONVERGE_LIMIT, || {
        (0..3).all(|i| {
            cluster_figure(&cluster, i, "first_index") > 1 && journal_files(&cluster, i) <= 3
        })
    });
    for i in 0..3 {
        let held = cluster_figure(&cluster, i, "journal_bytes");
        assert!(held <= 4 * 64 * 1024, "node {i} holds {held} journal bytes");
    }
    let f = (0..3).find(|&i| i != leader).unwrap();
    cluster.kill9(f);
    cluster.restart(f);
    let checkpoint = cluster_figure(&cluster, f, "checkpoint_index");
    assert!(checkpoint > 1, "started from checkpoint {checkpoint}");
    let leader_applied = cluster_figure(&cluster, leader, "applied_index");
    wait_until(
        "the restarted node to apply the rest",
        CONVERGE_LIMIT,
        || cluster_figure(&cluster, f, "applied_index") >= leader_applied,
    );
    let held = cluster.records(f, "orders", 0);
    assert_eq!(held.len(), 150);
    assert!(held.iter().all(|(_, v)| *v == value));
    // Every node, the restarted one too, keeps time by the leader's stamps.
    for i in 0..3 {
        let clock = cluster_figure(&cluster, i, "log_clock_ms");
        assert!(
            (started_ms..=unix_ms()).contains(&clock),
            "node {i}'s log clock {clock}"
        );
    }
    // Its HELLO told the leader where its log ends: appends, not a snapshot.
    let (log, leader_log) = (
        cluster.nodes[f].log_text(),
        cluster.nodes[leader].log_text(),
    );
    assert!(!log.contains("installing"), "{log}");
    assert!(!leader_log.contains("lost entries"), "{leader_log}");
}

#[test]
fn a_node_whose_data_directory_was_lost_after_compaction_installs_a_snapshot_and_serves() {
    let (mut cluster, leader, (mut c, topic_id), value) = compacting_cluster();
    wait_until("every node to compact its journal", CONVERGE_LIMIT, || {
        (0..3).all(|i| cluster_figure(&cluster, i, "first_index") > 1)
    });
    let f = (0..3).find(|&i| i != leader).unwrap();
    cluster.kill9(f);
    let data_dir = cluster.nodes[f].data_dir();
    std::fs::remove_dir_all(&data_dir).unwrap();
    let probed = probe_until_stopped(cluster.nodes[f].addr);
    cluster.restart(f);
    let leader_applied = cluster_figure(&cluster, leader, "applied_index");
    let applied = |cluster: &Cluster| -> Option<u64> {
        let (_, body) = cluster.nodes[f].try_http("GET", "/stats")?;
        let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
        stats["cluster"]["applied_index"].as_u64()
    };
    wait_until(
        "the wiped node to install and apply the rest",
        CONVERGE_LIMIT,
        || applied(&cluster).is_some_and(|a| a >= leader_applied),
    );
    let codes = probed.stop();
    assert!(
        codes.contains(&ErrorCode::SnapshotInProgress),
        "never answered SNAPSHOT_IN_PROGRESS while installing: {codes:?}"
    );
    let checkpoint = cluster_figure(&cluster, f, "checkpoint_index");
    assert!(
        checkpoint > 1,
        "its log starts after the snapshot, at {checkpoint}"
    );
    assert!(
        !data_dir.join("install").exists(),
        "the install marker is gone"
    );
    let held = cluster.records(f, "orders", 0);
    assert_eq!(held.len(), 150);
    assert!(held.iter().all(|(_, v)| *v == value));
    // It counts towards a majority: with the third node down, REPLICATED still commits.
    let third = (0..3).find(|&i| i != leader && i != f).unwrap();
    cluster.kill9(third);
    let r = c
        .publish(&Pub {
            topic_id,
            producer_id: PRODUCER_ID,
            producer_seq: 151,
            value: b"after",
            ..Pub::default()
        })
        .unwrap();
    assert_eq!(r.sequence, 151);
    let log = cluster.nodes[f].log_text();
    assert!(log.contains("installing node"), "{log}");
}

/// Asks the node at `addr` through the role gate (a PUB to a topic nobody declared)
/// every few milliseconds, on a thread, until stopped; connection failures (the process
/// restarting) are skipped.
struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<ErrorCode>>,
}

impl Prober {
    /// The distinct codes answered, in the order first seen.
    fn stop(self) -> Vec<ErrorCode> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn probe_until_stopped(addr: std::net::SocketAddr) -> Prober {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut codes = Vec::new();
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            let Ok(mut c) = Client::connect(addr, b"") else {
                continue;
            };
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            if let Err(e) = c.publish_value(u16::MAX, 0, b"probe", None) {
                if let Some(code) = e.code().filter(|code| !codes.contains(code)) {
                    codes.push(code);
                }
            }
        }
        codes
    });
    Prober { stop, thread }
}

/// Open descriptors of node `i`'s process.
fn fd_count(cluster: &Cluster, i: usize) -> usize {
    let pid = cluster.nodes[i].pid();
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A closed segment keeps its two descriptors until a sync takes it, and a cluster node
/// synced them only at its checkpoints, FLOORs apart. Before a node synced them as soon
/// as a partition held 64 such files (and applied nothing more until it had), 4 KiB
/// segments ran every node out of descriptors at once: EMFILE in apply, and each node
/// stopped serving (about 500 records at 1,024 descriptors).
#[test]
fn small_segments_do_not_run_the_nodes_out_of_descriptors() {
    const NOFILE: u64 = 1024;
    const RECORDS: u64 = 1_500;
    let cluster = Cluster::start_with_nofile(3, &["--segment-size", "4KiB"], NOFILE);
    let (cluster, leader, mut c, topic_id) = topic_on(cluster, "small");
    let value = vec![b's'; 3_900]; // one record fills a segment
    let mut most_fds = 0;
    for seq in 1..=RECORDS {
        let r = c.publish(&Pub {
            topic_id,
            producer_id: PRODUCER_ID,
            producer_seq: seq,
            value: &value,
            ..Pub::default()
        });
        assert!(r.is_ok(), "record {seq}: {r:?}");
        if seq % 100 == 0 {
            let fds = (0..3).map(|i| fd_count(&cluster, i)).max().unwrap();
            most_fds = most_fds.max(fds);
        }
    }
    println!("{RECORDS} records, one per 4 KiB segment: at most {most_fds} descriptors on a node");
    assert!(most_fds < 600, "{most_fds} descriptors open on a node");
    let leader_applied = cluster_figure(&cluster, leader, "applied_index");
    wait_until("every node to apply every record", CONVERGE_LIMIT, || {
        (0..3).all(|i| cluster_figure(&cluster, i, "applied_index") >= leader_applied)
    });
}
