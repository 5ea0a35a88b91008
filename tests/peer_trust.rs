//! Peer links you can trust (issue 42): the forgeries of the table, sent to real
//! `mortard` cluster nodes over their peer port as an attacker would (a HELLO naming a
//! node, then raft's protobuf), and a data directory of another cluster at start.
//! Each row was seen to wipe, crash or fool a node before `replica::vet` and the
//! cluster id; here each must leave the cluster serving and its records whole.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::wait::wait_until;
use mortarmq::client::Client;
use mortarmq::peer::{cluster_id, frame, Hello, Message};
use mortarmq::wire::ops::Pub;
use mortarmq::wire::{DeclareFlags, Durability, ErrorCode, PubFlags};
use raft::eraftpb::{Entry, MessageType};

const ELECTION_LIMIT: Duration = Duration::from_secs(20);
/// How long a forgery is given to do its harm before the test looks.
const HARM_WINDOW: Duration = Duration::from_secs(2);

/// A connection to node `to`'s peer port that said it is node `from`.
struct Forger {
    stream: TcpStream,
    from: u8,
    to: u8,
}

impl Forger {
    fn new(cluster: &Cluster, from: u8, to: u8) -> Forger {
        let addr = cluster.peers[usize::from(to - 1)].1;
        let mut stream = TcpStream::connect(addr).expect("connect to the peer port");
        let hello = Hello {
            cluster_id: cluster_id(&cluster.peers),
            from,
            to,
            last_index: 0,
            last_term: 0,
            client_addr: "127.0.0.1:1".parse().unwrap(),
            admin_addr: None,
            cluster_uid: None,
        };
        let mut bytes = Vec::new();
        frame::put_hello(&mut bytes, &hello);
        stream.write_all(&bytes).expect("HELLO");
        Forger { stream, from, to }
    }

    fn message(&self, kind: MessageType, term: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(kind);
        (m.from, m.to, m.term) = (u64::from(self.from), u64::from(self.to), term);
        m
    }

    /// Sends `m`; false once the node closed the link.
    fn send(&mut self, m: &Message) -> bool {
        let mut bytes = Vec::new();
        frame::put_raft(&mut bytes, m).expect("encode");
        self.stream.write_all(&bytes).is_ok()
    }
}

fn stats(cluster: &Cluster, i: usize) -> serde_json::Value {
    let (_, body) = cluster.nodes[i].http("GET", "/stats");
    serde_json::from_str(&body).expect("JSON")
}

/// `mortar_peer_refused_total{reason="REASON"}` on node `i`.
fn refused(cluster: &Cluster, i: usize, reason: &str) -> u64 {
    stats(cluster, i)["cluster"]["refused"][reason]
        .as_u64()
        .unwrap_or(0)
}

fn publish(c: &mut Client, topic_id: u16, seq: u64) -> Result<u64, ErrorCode> {
    let value = format!("v{seq}");
    let r = c.publish(&Pub {
        topic_id,
        flags: PubFlags::requesting(Some(Durability::Replicated)),
        producer_id: 7,
        producer_seq: seq,
        value: value.as_bytes(),
        ..Pub::default()
    });
    r.map(|r| r.sequence)
        .map_err(|e| e.code().unwrap_or_else(|| panic!("PUB {seq}: {e}")))
}

/// A 3-node cluster, its leader, a client on it, topic `orders` and `n` records in it.
fn cluster_with_records(n: u64, args: &[&str]) -> (Cluster, usize, Client, u16) {
    let cluster = Cluster::start(3, args);
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let mut c = Client::connect(cluster.nodes[leader].addr, b"").expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let topic = c
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for seq in 1..=n {
        publish(&mut c, topic, seq).expect("acknowledged");
    }
    (cluster, leader, c, topic)
}

fn values(cluster: &Cluster, i: usize) -> Vec<String> {
    let records = cluster.records(i, "orders", 0);
    records.into_iter().map(|(_, v)| v).collect()
}

fn wait_values(cluster: &Cluster, i: usize, want: &[&str]) {
    wait_until(
        &format!("node {} to hold {want:?}", i + 1),
        ELECTION_LIMIT,
        || values(cluster, i) == want,
    );
}

/// Row 1: a 40-byte MsgSnapshot (term 1000, index 1,000,000, no manifest) made a
/// follower delete its topics and restart into an install. Now it is refused, the
/// follower keeps its records, and the cluster goes on committing.
#[test]
fn a_forged_snapshot_neither_wipes_a_follower_nor_stops_the_cluster() {
    let (cluster, leader, mut c, topic) = cluster_with_records(2, &[]);
    let f = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    wait_values(&cluster, f, &["v1", "v2"]);
    let mut forger = Forger::new(&cluster, other as u8 + 1, f as u8 + 1);
    let mut snap = forger.message(MessageType::MsgSnapshot, 1000);
    let meta = snap.mut_snapshot().mut_metadata();
    (meta.index, meta.term) = (1_000_000, 1000);
    meta.mut_conf_state().voters = vec![1, 2, 3];
    assert!(forger.send(&snap));
    let until = Instant::now() + HARM_WINDOW;
    while Instant::now() < until {
        let role = stats(&cluster, f)["cluster"]["role"].clone();
        assert_ne!(role, "installing", "the forged snapshot started an install");
        assert_eq!(
            values(&cluster, f),
            ["v1", "v2"],
            "the follower lost its records"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(refused(&cluster, f, "raft_snapshot"), 1);
    publish(&mut c, topic, 3).expect("the cluster still commits");
    for i in 0..3 {
        wait_values(&cluster, i, &["v1", "v2", "v3"]);
    }
}

/// Row 2: an append whose entry conflicts with committed entries made raft abort the
/// follower (`entry 1 conflict with committed entry 17`). Now the follower drops it
/// and stays up.
#[test]
fn an_append_that_conflicts_with_committed_entries_does_not_end_the_follower() {
    let (cluster, leader, _c, _) = cluster_with_records(3, &[]);
    let f = (leader + 1) % 3;
    wait_values(&cluster, f, &["v1", "v2", "v3"]);
    let st = stats(&cluster, f);
    let (term, commit) = (
        st["cluster"]["term"].as_u64().unwrap(),
        st["cluster"]["commit_index"].as_u64().unwrap(),
    );
    let mut forger = Forger::new(&cluster, leader as u8 + 1, f as u8 + 1);
    let mut append = forger.message(MessageType::MsgAppend, term);
    (append.index, append.log_term) = (commit, term);
    let mut entry = Entry::default();
    (entry.index, entry.term) = (1, term);
    append.entries.push(entry);
    assert!(forger.send(&append));
    std::thread::sleep(HARM_WINDOW);
    assert!(
        cluster.nodes[f].try_http("GET", "/healthz").is_some(),
        "the follower died; log:\n{}",
        cluster.nodes[f].log_text()
    );
    assert_eq!(refused(&cluster, f, "raft_entries"), 1);
    assert_eq!(values(&cluster, f), ["v1", "v2", "v3"]);
}

/// Row 3: with both followers killed, heartbeat responses stamped `u64::MAX` and append
/// responses acknowledging index 2^40, "from" a follower every 30 ms, made the leader
/// answer REPLICATED PUBs alone. Now they are refused, and so is the PUB.
#[test]
fn forged_acknowledgements_do_not_make_a_lone_leader_answer_replicated() {
    let (mut cluster, leader, mut c, topic) = cluster_with_records(1, &[]);
    let term = stats(&cluster, leader)["cluster"]["term"].as_u64().unwrap();
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &f in &followers {
        cluster.kill9(f);
    }
    let mut forger = Forger::new(&cluster, followers[0] as u8 + 1, leader as u8 + 1);
    let lying = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(8);
        let mut context = b"MMQL".to_vec();
        context.extend_from_slice(&term.to_be_bytes());
        context.extend_from_slice(&u64::MAX.to_be_bytes());
        while Instant::now() < until {
            let mut beat = forger.message(MessageType::MsgHeartbeatResponse, term);
            beat.context = context.clone().into();
            let mut ack = forger.message(MessageType::MsgAppendResponse, term);
            ack.index = 1 << 40;
            if !forger.send(&beat) || !forger.send(&ack) {
                return;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    let alone = publish(&mut c, topic, 2);
    let allowed = common::cluster::LONE_LEADER_CODES;
    assert!(
        alone.as_ref().is_err_and(|code| allowed.contains(code)),
        "a leader without its followers answered {alone:?}"
    );
    lying.join().unwrap();
    let lies = refused(&cluster, leader, "raft_lease") + refused(&cluster, leader, "raft_ack");
    assert!(lies >= 2, "{lies} lies counted");
}

/// Runs `mortard ARGS` to its exit (it must fail within the limit): its status and log.
fn run_to_failure(args: &[String]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mortard"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mortard");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("mortard started on another cluster's data directory");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Item 3: a data directory remembers its cluster's id; started with another, it is
/// refused, naming both; started without one it keeps its own.
#[test]
fn a_data_directory_of_another_cluster_is_refused_at_start() {
    let ours = "00000000c1a55e01";
    let (mut cluster, leader, _c, _) = cluster_with_records(1, &["--cluster-id", ours]);
    let n = (leader + 1) % 3;
    cluster.kill9(n);
    let peers: Vec<String> = (cluster.peers.iter())
        .map(|(id, a)| format!("{id}={a}"))
        .collect();
    let data_dir = cluster.nodes[n].data_dir();
    let args = |extra: &[&str]| {
        let mut args = vec![
            "--data-dir".to_string(),
            data_dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "off".into(),
            "--node-id".into(),
            (n + 1).to_string(),
            "--peers".into(),
            peers.join(","),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let theirs = "00000000c1a55e02";
    let (status, log) = run_to_failure(&args(&["--cluster-id", theirs]));
    assert_ne!(status, Some(0), "{log}");
    assert!(log.contains(ours) && log.contains(theirs), "{log}");
    cluster.restart(n);
    wait_values(&cluster, n, &["v1"]);
    let log = cluster.nodes[n].log_text();
    assert!(!log.contains("refused (cluster)"), "{log}");
}
