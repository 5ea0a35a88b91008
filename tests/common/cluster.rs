//! Starts a cluster of real `mortard` processes on loopback (`--node-id`, `--peers`), each
//! with its own temporary data directory and client and admin ports that stay the same
//! across restarts, so that NOT_LEADER's `leader <id> <host:port>` stays true.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mortarmq::client::{Client, ClientError};
use mortarmq::wire::ErrorCode;

use super::mortard::{free_port, Mortard};

/// A topic id no test declares: the leader answers a PUB to it UNKNOWN_TOPIC, after the
/// role gate; any other node answers with the gate's code.
const PROBE_TOPIC_ID: u16 = u16::MAX;

/// What a leader that lost both followers may answer a REPLICATED PUB: never OK.
pub const LONE_LEADER_CODES: [ErrorCode; 5] = [
    ErrorCode::NotEnoughReplicas,
    ErrorCode::NotEnoughReplicasAfterAppend,
    ErrorCode::ReplicationTimeout,
    ErrorCode::LeaderUnknown,
    ErrorCode::ElectionTimeout,
];

pub struct Cluster {
    pub nodes: Vec<Mortard>,
    /// Every node's `--peers` entry: its id and peer address.
    pub peers: Vec<(u8, std::net::SocketAddr)>,
    down: Vec<bool>,
}

/// What a node said to a probe: `Ok` = it leads; `Err` = the gate's (code, text).
pub type Probe = Result<(), (ErrorCode, String)>;

/// A free loopback port this test process has not handed out before: clusters started
/// by tests running in parallel would otherwise race for ports just released.
fn fresh_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = free_port();
        if given.insert(port) {
            return port;
        }
    }
}

impl Cluster {
    /// Starts `n` nodes with `args` added to each; returns once every one listens.
    pub fn start(n: usize, args: &[&str]) -> Cluster {
        Cluster::start_under(n, args, None)
    }

    /// [`Cluster::start`], each node under a RLIMIT_NOFILE of `nofile`.
    pub fn start_with_nofile(n: usize, args: &[&str], nofile: u64) -> Cluster {
        Cluster::start_under(n, args, Some(nofile))
    }

    fn start_under(n: usize, args: &[&str], nofile: Option<u64>) -> Cluster {
        let peer_addrs: Vec<(u8, std::net::SocketAddr)> = (1..=n as u8)
            .map(|id| (id, format!("127.0.0.1:{}", fresh_port()).parse().unwrap()))
            .collect();
        let peers: Vec<String> = (peer_addrs.iter())
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect();
        let peers = peers.join(",");
        let nodes = (1..=n)
            .map(|id| {
                let listen = format!("127.0.0.1:{}", fresh_port());
                // Fixed too: a node that re-executes itself (INSTALL) keeps it.
                let admin = format!("127.0.0.1:{}", fresh_port());
                let id = id.to_string();
                let mut all = vec!["--listen", &listen, "--node-id", &id, "--peers", &peers];
                if !args.iter().any(|a| a.starts_with("--admin-listen")) {
                    all.extend_from_slice(&["--admin-listen", &admin]);
                }
                all.extend_from_slice(args);
                let name = format!("node{id}");
                match nofile {
                    Some(n) => Mortard::start_in_with_nofile(&name, &all, n),
                    None => Mortard::start_in(&name, &all),
                }
            })
            .collect();
        Cluster {
            nodes,
            peers: peer_addrs,
            down: vec![false; n],
        }
    }

    /// The node's `--node-id` (1-based).
    pub fn id(&self, i: usize) -> u64 {
        i as u64 + 1
    }

    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
        self.down[i] = true;
    }

    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart_after_kill9();
        self.down[i] = false;
    }

    pub fn is_up(&self, i: usize) -> bool {
        !self.down[i]
    }

    /// Asks node `i` through the role gate with a PUB to a topic nobody declared.
    pub fn probe(&self, i: usize) -> Probe {
        let mut c = Client::connect(self.nodes[i].addr, b"").expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match c.publish_value(PROBE_TOPIC_ID, 0, b"probe", None) {
            Err(e @ ClientError::Broker { .. }) => match (e.code(), e) {
                (Some(ErrorCode::UnknownTopic), _) => Ok(()),
                (Some(code), ClientError::Broker { message, .. }) => Err((code, message)),
                (None, e) => panic!("node {} answered an unregistered code: {e:?}", self.id(i)),
                (Some(_), _) => unreachable!("matched as a broker error"),
            },
            other => panic!("node {} answered a probe with {other:?}", self.id(i)),
        }
    }

    /// Waits up to `limit` for one running node to lead (and be applied up to its log);
    /// returns its index.
    pub fn wait_leader(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let up = (0..self.nodes.len()).filter(|&i| self.is_up(i));
            if let Some(i) = up.into_iter().find(|&i| self.probe(i).is_ok()) {
                return i;
            }
            assert!(Instant::now() < deadline, "no leader within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The (sequence, value) pairs node `i` holds in `topic`'s partition `partition`,
    /// from its admin records endpoint (committed and applied records only).
    pub fn records(&self, i: usize, topic: &str, partition: u16) -> Vec<(u64, String)> {
        let path = format!("/topics/{topic}/partitions/{partition}/records?from=0&max=1000");
        let (status, body) = self.nodes[i].http("GET", &path);
        if status == 404 {
            return Vec::new();
        }
        assert_eq!(status, 200, "node {}: {body}", self.id(i));
        let json: serde_json::Value = serde_json::from_str(&body).expect("records JSON");
        json["records"]
            .as_array()
            .expect("records")
            .iter()
            .map(|r| {
                let sequence = r["sequence"].as_u64().expect("sequence");
                (
                    sequence,
                    r["value"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}
