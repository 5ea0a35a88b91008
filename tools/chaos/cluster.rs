//! The `mortard` processes (3 or 5): ports, data directories, start, kill -9, SIGSTOP and
//! SIGCONT, SIGTERM, their wall clocks (stepped through libfaketime), and their admin
//! HTTP (`/stats`, `/topics/…`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::proxy::{self, Links};

/// How long a started node may take to print its listening line.
const START_TIMEOUT_MS: u64 = 20_000;
/// One admin request, connect to last byte: a paused node must not stall the tool.
const ADMIN_TIMEOUT_MS: u64 = 2_000;

/// A loopback port nobody listens on now (bind port 0, close). Used for the ports a node
/// binds itself; the proxies keep their listeners.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local address").port()
}

/// How a node is doing, as the fault schedule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Paused,
    Killed,
}

pub struct Node {
    pub id: u8,
    pub client: SocketAddr,
    pub admin: SocketAddr,
    peer_real: SocketAddr,
    data: PathBuf,
    log: PathBuf,
    /// The offset of its wall clock, in libfaketime's form (`+0`, `-600`): read by the
    /// process's libfaketime at most a second late. Beside the data directory, which a
    /// wipe deletes.
    clock: PathBuf,
    child: Option<Child>,
    pub state: State,
    /// False from a wipe (`--wipe-faults`) until the node was seen caught up: the
    /// schedule wipes only when every node is intact.
    pub intact: bool,
    /// Starts so far: positions are compared within one life of a node.
    pub life: u32,
    /// Bumped before the tool stops a process of the node and when it finds one exited:
    /// see [`Observable`].
    ends: Arc<AtomicU32>,
}

/// A node as the observer may ask it, naming the life whose process answers. The
/// observer's list can be a restart old (a disk fault restarts a node it was asking),
/// so an answer counts only if [`Observable::same_process`] still holds after it came:
/// no process of the node ended since the list was made, so the one that answered is
/// the one `life` names, not a newer one on the same port.
#[derive(Clone)]
pub struct Observable {
    pub node: u8,
    pub life: u32,
    pub admin: SocketAddr,
    ends: Arc<AtomicU32>,
    ends_then: u32,
}

impl Observable {
    pub fn same_process(&self) -> bool {
        self.ends.load(Ordering::SeqCst) == self.ends_then
    }
}

impl Node {
    pub fn observable(&self) -> Observable {
        Observable {
            node: self.id,
            life: self.life,
            admin: self.admin,
            ends: Arc::clone(&self.ends),
            ends_then: self.ends.load(Ordering::SeqCst),
        }
    }

    /// Before a process of the node is stopped, or once it is found exited.
    fn ending(&self) {
        self.ends.fetch_add(1, Ordering::SeqCst);
    }

    pub fn data(&self) -> &Path {
        &self.data
    }

    /// Where its stderr (its log) goes, across restarts.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    peers_arg: String,
    mortard: PathBuf,
    /// `--mortard-arg`s, given to every node after the cluster's own flags.
    mortard_args: Vec<String>,
    pub links: Arc<Links>,
    /// libfaketime, preloaded into every node whose wall clock may be stepped
    /// (`--clock-faults`); `None`: real clocks.
    libfaketime: Option<PathBuf>,
}

impl Cluster {
    /// Binds one proxy listener per node (its `--peers` address), picks the other ports,
    /// starts the proxies; the nodes are started by [`Cluster::start_all`].
    pub fn new(n: u8, dir: &Path, mortard: (&Path, &[String]), seed: u64) -> Cluster {
        let (mortard, mortard_args) = mortard;
        let links = Arc::new(Links::new(usize::from(n)));
        let mut peers = Vec::new();
        let mut nodes = Vec::new();
        for id in 1..=n {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
            let addr = listener.local_addr().expect("proxy address");
            peers.push(format!("{id}={addr}"));
            let peer_real: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            proxy::spawn(id, listener, peer_real, Arc::clone(&links), seed);
            nodes.push(Node {
                id,
                client: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                admin: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                peer_real,
                data: dir.join(format!("node{id}")),
                log: dir.join(format!("node{id}.log")),
                clock: dir.join(format!("node{id}.clock")),
                child: None,
                state: State::Killed,
                intact: true,
                life: 0,
                ends: Arc::new(AtomicU32::new(0)),
            });
        }
        Cluster {
            nodes,
            peers_arg: peers.join(","),
            mortard: mortard.to_path_buf(),
            mortard_args: mortard_args.to_vec(),
            links,
            libfaketime: None,
        }
    }

    /// From now on nodes start with libfaketime preloaded and their wall clocks at the
    /// real time, until [`Cluster::step_clock`].
    pub fn fake_clocks(&mut self, libfaketime: &Path) -> Result<(), String> {
        self.libfaketime = Some(libfaketime.to_path_buf());
        (0..self.nodes.len()).try_for_each(|i| self.step_clock(i, 0))
    }

    /// Node `i`'s wall clock set `offset_s` seconds from the real time (its monotonic
    /// clock untouched).
    pub fn step_clock(&self, i: usize, offset_s: i64) -> Result<(), String> {
        let clock = &self.nodes[i].clock;
        std::fs::write(clock, format!("{offset_s:+}\n"))
            .map_err(|e| format!("{}: {e}", clock.display()))
    }

    /// What a node's process needs in its environment for [`Cluster::step_clock`]: the
    /// cache of one second keeps libfaketime from reading the file on every call.
    fn clock_env(&self, node: &Node) -> Vec<(&'static str, String)> {
        let Some(lib) = &self.libfaketime else {
            return Vec::new();
        };
        vec![
            ("LD_PRELOAD", lib.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE", node.clock.display().to_string()),
            ("FAKETIME_CACHE_DURATION", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
    }

    pub fn start_all(&mut self) -> Result<(), String> {
        (0..self.nodes.len()).try_for_each(|i| self.start(i))
    }

    /// Starts node `i` (again) on its ports and data directory.
    pub fn start(&mut self, i: usize) -> Result<(), String> {
        let clock_env = self.clock_env(&self.nodes[i]);
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| format!("{}: {e}", node.log.display()))?;
        let mut child = Command::new(&self.mortard)
            .args(["--data-dir", &node.data.display().to_string()])
            .args(["--listen", &node.client.to_string()])
            .args(["--admin-listen", &node.admin.to_string()])
            .args(["--node-id", &node.id.to_string()])
            .args(["--peers", &self.peers_arg])
            .args(["--listen-peer", &node.peer_real.to_string()])
            .args(&self.mortard_args)
            .envs(clock_env)
            .env(
                "RUST_LOG",
                std::env::var("MORTARD_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("{}: {e}", self.mortard.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("listening ") => break,
                Ok(_) => continue,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "node {} did not start; see {}",
                        node.id,
                        node.log.display()
                    ));
                }
            }
        }
        std::thread::spawn(move || while rx.recv().is_ok() {});
        node.child = Some(child);
        node.state = State::Running;
        node.life += 1;
        Ok(())
    }

    /// Nodes that exited without being told to, with their status; they are marked
    /// killed, so that healing starts them again.
    pub fn reap(&mut self) -> Vec<(u8, String)> {
        let mut exited = Vec::new();
        for node in &mut self.nodes {
            let Some(child) = node.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                node.ending();
                exited.push((node.id, status.to_string()));
                node.child = None;
                node.state = State::Killed;
            }
        }
        exited
    }

    pub fn kill9(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        node.ending();
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.state = State::Killed;
    }

    /// SIGTERM and wait: a clean stop.
    pub fn terminate(&mut self, i: usize) {
        self.resume(i);
        self.nodes[i].ending();
        self.signal(i, "TERM");
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.wait();
        }
        self.nodes[i].state = State::Killed;
    }

    pub fn pause(&mut self, i: usize) {
        if self.nodes[i].state == State::Running {
            self.signal(i, "STOP");
            self.nodes[i].state = State::Paused;
        }
    }

    pub fn resume(&mut self, i: usize) {
        if self.nodes[i].state == State::Paused {
            self.signal(i, "CONT");
            self.nodes[i].state = State::Running;
        }
    }

    fn signal(&self, i: usize, name: &str) {
        if let Some(child) = &self.nodes[i].child {
            let _ = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(child.id().to_string())
                .status();
        }
    }

    /// SIGTERM to every running node; `Err` names those that did not exit 0.
    pub fn stop_all(&mut self) -> Result<(), String> {
        let mut bad = Vec::new();
        for i in 0..self.nodes.len() {
            self.resume(i);
            self.nodes[i].ending();
            self.signal(i, "TERM");
            if let Some(mut child) = self.nodes[i].child.take() {
                match child.wait() {
                    Ok(s) if s.success() => {}
                    other => bad.push(format!("node {}: {other:?}", self.nodes[i].id)),
                }
            }
            self.nodes[i].state = State::Killed;
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("did not exit 0 on SIGTERM: {}", bad.join(", ")))
        }
    }

    /// Every node back up and every link passing.
    pub fn heal(&mut self) -> Result<(), String> {
        self.links.heal();
        for i in 0..self.nodes.len() {
            match self.nodes[i].state {
                State::Paused => self.resume(i),
                State::Killed => self.start(i)?,
                State::Running => {}
            }
        }
        Ok(())
    }

    /// Node `i`'s process id, while it has one.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.client).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.resume(i);
            self.kill9(i);
        }
    }
}

/// `GET path` on an admin listener: (status, body).
pub fn http_get(admin: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let timeout = Duration::from_millis(ADMIN_TIMEOUT_MS);
    let mut s = TcpStream::connect_timeout(&admin, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no HTTP status")?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

/// `GET path` as JSON, for a 200 answer.
pub fn get_json(admin: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    let (status, body) = http_get(admin, path)?;
    if status != 200 {
        return Err(format!("{path}: HTTP {status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{path}: {e}"))
}
