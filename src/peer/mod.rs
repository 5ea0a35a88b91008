//! The peer room: `--listen-peer` links between the nodes of a cluster
//! (`docs/REPLICATION.md` §5.6), carrying raft's messages.
//!
//! Each node dials every other node and sends only on its own outbound connection; what
//! it accepts it only reads, so a pair of nodes has two TCP connections and nobody breaks
//! ties. An outbound link starts with a HELLO ([`frame`]: cluster id, ids, the sender's
//! client and admin addresses); an accepted one must start with a valid HELLO or it is
//! refused and logged. After it, frames carry raft messages in the crate's protobuf
//! encoding. A peer is *up* ([`Peers::link_up`]) while both directions are open.
//!
//! Sans-broker and sans-thread: the sockets are non-blocking mio sources registered on
//! the caller's `Registry` in the token range `[token_base, token_base + TOKENS)`, so
//! they share the reactor's `Poll`; the caller hands events over ([`Peers::on_event`]),
//! fires [`Peers::on_timer`] at [`Peers::next_deadline_ms`] (dial backoff, dial and
//! HELLO timeouts, reads left over for fairness) and calls [`Peers::flush`] at the end of
//! its pass. Time is the caller's `now_ms`; nothing here sleeps or loops without bound.
//!
//! Raft tolerates lost messages, so a message to a peer whose link is down or whose
//! output passed [`OUTPUT_BYTES_MAX`] is dropped and the caller told ([`Dropped`]), which
//! then calls `report_unreachable`.
//!
//! May depend on: `std`, `mio`, `log`, `crc32fast`, and `raft`'s message type
//! (`eraftpb::Message`) with the `protobuf` trait that encodes it; nothing else of the
//! crate, so the broker's replica can change without touching links.

pub mod frame;
#[cfg(test)]
mod tests;

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
/// raft's message, re-exported so the reactor can hand it on without naming `raft`.
pub use raft::eraftpb::Message;

pub use frame::{cluster_id, FrameError, Hello, FRAME_BYTES_MAX};
use frame::{FrameKind, LENGTH_BYTES};

/// Nodes a cluster may have (`--peers` allows 3 or 5); fixes the outbound token range.
pub const NODES_MAX: usize = 8;
/// Accepted connections held at once: one per other node, plus room for a peer's
/// redial before its old connection's EOF is read, and for strays awaiting refusal.
pub const INBOUND_LINKS_MAX: usize = 2 * NODES_MAX;
/// Tokens used from `token_base`: the listener, one per node's outbound link, and one
/// per accepted connection.
pub const TOKENS: usize = 1 + NODES_MAX + INBOUND_LINKS_MAX;
/// Output queued for one peer before messages to it are dropped (raft resends).
pub const OUTPUT_BYTES_MAX: usize = 8 * 1024 * 1024;
/// First wait before redialling a peer after a failed dial or a lost link...
pub const BACKOFF_MIN_MS: u64 = 50;
/// ...doubling up to this. A link that stayed up this long starts again from the minimum.
pub const BACKOFF_MAX_MS: u64 = 1000;
/// A dial not connected by then is given up (a dead host may never answer a SYN).
pub const DIAL_TIMEOUT_MS: u64 = 1000;
/// An accepted connection without a HELLO by then is closed (it holds one of the
/// [`INBOUND_LINKS_MAX`] slots).
pub const HELLO_TIMEOUT_MS: u64 = 5000;
/// Bytes per `read` call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Reads of one connection per event before the others get a turn; the rest waits for
/// [`Peers::on_timer`], which [`Peers::next_deadline_ms`] then asks for at once.
const READS_PER_EVENT_MAX: usize = 16;
/// Accepts per listener event, for the same reason.
const ACCEPTS_PER_EVENT_MAX: usize = 16;
/// An emptied output or input buffer keeps at most this much capacity.
const IDLE_CAPACITY_MAX_BYTES: usize = 64 * 1024;
/// An emptied output (or input) buffer keeps what it grew to until it has held no more
/// than [`IDLE_CAPACITY_MAX_BYTES`] for this long: appends refill it every pass, and
/// growing it again each time cost the leader a tenth of its time in page faults
/// (`docs/BENCHMARKS.md`).
const BUFFER_SHRINK_AFTER_MS: u64 = 1_000;
/// Written output is cut from the front of the buffer once it is this large.
const COMPACT_BYTES_MIN: usize = 1024 * 1024;
/// A refusal is logged at most once per reason in this long; the others are counted
/// (`mortar_peer_refused_total{reason}`) and the next line says how many it left out: a
/// stranger sending bad frames must not fill the disk with warnings.
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 1_000;

/// Why the links refused a connection or a frame: the `reason` labels of
/// `mortar_peer_refused_total` that this room counts (the replica adds its own, for
/// raft messages it drops, through [`Peers::refused`]).
pub mod reason {
    /// Not a MortarMQ peer: bad magic or HELLO version, or no HELLO first.
    pub const NOT_A_PEER: &str = "not_a_peer";
    /// A HELLO of another cluster.
    pub const CLUSTER: &str = "cluster";
    /// A HELLO naming a node that is not the one dialled, or not another node.
    pub const NODE: &str = "node";
    /// A malformed frame or raft message, or one not from the link's node.
    pub const FRAME: &str = "frame";
    /// No HELLO within `HELLO_TIMEOUT_MS`.
    pub const HELLO_TIMEOUT: &str = "hello_timeout";
    /// Every accepted-connection slot taken.
    pub const SLOTS_FULL: &str = "slots_full";
    pub const ALL: [&str; 6] = [NOT_A_PEER, CLUSTER, NODE, FRAME, HELLO_TIMEOUT, SLOTS_FULL];
}

/// Refusals counted by reason, and when each reason was last logged.
#[derive(Debug, Default)]
struct Refusals {
    /// reason → (count, last logged at, left out since).
    by_reason: Vec<(&'static str, u64, Option<u64>, u64)>,
}

impl Refusals {
    fn seed(&mut self, reasons: &[&'static str]) {
        for &r in reasons {
            if !self.by_reason.iter().any(|e| e.0 == r) {
                self.by_reason.push((r, 0, None, 0));
            }
        }
    }

    fn note(&mut self, reason: &'static str, why: &str, now_ms: u64) {
        self.seed(&[reason]);
        let entry = (self.by_reason.iter_mut())
            .find(|e| e.0 == reason)
            .expect("seeded");
        entry.1 += 1;
        let due = entry
            .2
            .is_none_or(|at| now_ms >= at + REFUSAL_LOG_INTERVAL_MS);
        if !due {
            entry.3 += 1;
            return;
        }
        match std::mem::take(&mut entry.3) {
            0 => log::warn!("peer refused ({reason}): {why}"),
            n => log::warn!("peer refused ({reason}): {why} ({n} more left out since)"),
        }
        entry.2 = Some(now_ms);
    }
}

/// Who this node is and whom it links with (filled from `--node-id`, `--peers`,
/// `--listen-peer`, `--advertise`, `--admin-listen`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeersConfig {
    pub node_id: u8,
    /// Every node's peer address, this node's too (sorted or not).
    pub nodes: Vec<(u8, SocketAddr)>,
    /// Where peer links are accepted.
    pub listen: SocketAddr,
    /// The client address this node advertises in its HELLO.
    pub client_addr: SocketAddr,
    /// This node's admin address, if it has one.
    pub admin_addr: Option<SocketAddr>,
    /// The cluster's own id (`--cluster-id`, kept in the data directory): a peer's HELLO
    /// must carry the same, or none when this is `None`.
    pub cluster_uid: Option<u64>,
}

/// What the links report to the caller.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerEvent {
    /// A raft message from a peer, addressed to this node (`from` checked against the
    /// link's HELLO).
    Message(Message),
    /// An INSTALL frame's body from peer `from` (a snapshot's chunks).
    Install { from: u8, body: Vec<u8> },
    /// Both links with `id` are open and its HELLO was accepted.
    Up { id: u8 },
    /// One of them closed.
    Down { id: u8 },
}

/// Why [`Peers::send`] did not queue a message; the caller reports the peer unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// `to` is not another node of the cluster.
    UnknownPeer,
    /// No outbound connection (waiting for the backoff to redial).
    LinkDown,
    /// [`OUTPUT_BYTES_MAX`] already queued.
    OutputFull,
    /// The encoded message is past [`FRAME_BYTES_MAX`].
    TooLarge,
}

/// Figures for `/stats`, per peer (or summed by [`Peers::totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCounters {
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub frames_in: u64,
    /// RAFT frames queued (HELLOs are not counted).
    pub frames_out: u64,
    /// Dials started, the first included.
    pub dials: u64,
    /// Dials that connected.
    pub connects: u64,
    /// Messages [`Peers::send`] dropped.
    pub drops: u64,
    /// Accepted connections closed for a refused HELLO or a bad frame (for a peer
    /// only once its HELLO named it; the others count in the totals).
    pub refused: u64,
}

impl PeerCounters {
    fn add(&mut self, o: &PeerCounters) {
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.frames_in += o.frames_in;
        self.frames_out += o.frames_out;
        self.dials += o.dials;
        self.connects += o.connects;
        self.drops += o.drops;
        self.refused += o.refused;
    }
}

/// A refusal's reason label and what to log.
type Refused = (&'static str, String);

fn refused(reason: &'static str, why: String) -> Result<(), Refused> {
    Err((reason, why))
}

enum Outbound {
    /// Not connected; dial again at `Remote::retry_at_ms`.
    Idle,
    Connecting(TcpStream),
    Connected(TcpStream),
}

/// Another node: our outbound link to it and what its inbound link told us.
struct Remote {
    id: u8,
    addr: SocketAddr,
    out: Outbound,
    /// The next wait after a failure.
    backoff_ms: u64,
    retry_at_ms: u64,
    dial_started_ms: u64,
    connected_since_ms: Option<u64>,
    /// Queued frames; `buf[sent..]` is not written yet.
    buf: Vec<u8>,
    sent: usize,
    /// `buf` keeps its capacity until then ([`BUFFER_SHRINK_AFTER_MS`]).
    busy_until_ms: u64,
    /// The accepted connection whose HELLO named this peer.
    inbound: Option<usize>,
    hello: Option<Hello>,
    last_heard_ms: Option<u64>,
    /// What the last `Up`/`Down` said.
    up: bool,
    counters: PeerCounters,
}

/// An accepted connection.
struct Inbound {
    stream: TcpStream,
    input: Vec<u8>,
    /// `input` keeps its capacity until then ([`BUFFER_SHRINK_AFTER_MS`]: a follower's
    /// appends arrive every pass).
    busy_until_ms: u64,
    /// Index into `Peers::remotes` once its HELLO was accepted.
    remote: Option<usize>,
    accepted_ms: u64,
    bytes_in: u64,
    /// On `Peers::read_again`: its last turn ended before the socket would block.
    read_again: bool,
}

/// The peer links of one node. See the module doc.
pub struct Peers {
    me: u8,
    cluster_id: u64,
    cluster_uid: Option<u64>,
    client_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    last_index: u64,
    last_term: u64,
    listener: TcpListener,
    token_base: usize,
    remotes: Vec<Remote>,
    inbound: Vec<Option<Inbound>>,
    read_again: Vec<usize>,
    accept_again: bool,
    accept_retry_at_ms: Option<u64>,
    /// Remotes with queued output, for [`Peers::flush`].
    dirty: Vec<usize>,
    scratch: Vec<u8>,
    /// Connections refused before their HELLO named a peer.
    refused_unnamed: u64,
    refusals: Refusals,
}

impl Peers {
    /// Binds `cfg.listen` and registers the listener.
    pub fn new(cfg: &PeersConfig, registry: &Registry, token_base: usize) -> io::Result<Peers> {
        let listener = std::net::TcpListener::bind(cfg.listen)?;
        Peers::with_listener(cfg, listener, registry, token_base)
    }

    /// As [`Peers::new`], on a listener the caller bound (ephemeral ports in tests).
    pub fn with_listener(
        cfg: &PeersConfig,
        listener: std::net::TcpListener,
        registry: &Registry,
        token_base: usize,
    ) -> io::Result<Peers> {
        check_config(cfg)?;
        listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(listener);
        registry.register(&mut listener, Token(token_base), Interest::READABLE)?;
        let remotes = cfg
            .nodes
            .iter()
            .filter(|n| n.0 != cfg.node_id)
            .map(|&(id, addr)| Remote::new(id, addr))
            .collect();
        Ok(Peers {
            me: cfg.node_id,
            cluster_id: cluster_id(&cfg.nodes),
            cluster_uid: cfg.cluster_uid,
            client_addr: cfg.client_addr,
            admin_addr: cfg.admin_addr,
            last_index: 0,
            last_term: 0,
            listener,
            token_base,
            remotes,
            inbound: (0..INBOUND_LINKS_MAX).map(|_| None).collect(),
            read_again: Vec::new(),
            accept_again: false,
            accept_retry_at_ms: None,
            dirty: Vec::new(),
            scratch: vec![0; READ_CHUNK_BYTES],
            refused_unnamed: 0,
            refusals: {
                let mut r = Refusals::default();
                r.seed(&reason::ALL);
                r
            },
        })
    }

    /// Where peer links are accepted.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// This node's cluster id (sent in HELLO).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The last index and term sent in HELLOs of links dialled from now on.
    pub fn set_log_position(&mut self, last_index: u64, last_term: u64) {
        self.last_index = last_index;
        self.last_term = last_term;
    }

    /// The event's token is one of this room's.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKENS).contains(&token.0)
    }

    /// Handles one event of an owned token.
    pub fn on_event(
        &mut self,
        registry: &Registry,
        event: &Event,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) {
        let Some(offset) = event.token().0.checked_sub(self.token_base) else {
            return;
        };
        if offset == 0 {
            self.accept(registry, now_ms);
        } else if offset <= NODES_MAX {
            self.on_outbound_event(registry, offset - 1, event, now_ms, out);
        } else if offset < TOKENS {
            self.read_inbound(registry, offset - 1 - NODES_MAX, now_ms, out);
        }
    }

    /// Queues `msg` for `msg.to`; written by [`Peers::flush`] (or a writable event).
    pub fn send(&mut self, msg: &Message) -> Result<(), Dropped> {
        let to = u8::try_from(msg.to).ok();
        let bytes = frame::raft_frame_bytes(msg);
        self.queue(to, bytes, |buf| {
            frame::put_raft(buf, msg).map_err(|e| {
                log::warn!("peer {}: raft message not encoded: {e}", msg.to);
                Dropped::TooLarge
            })
        })
    }

    /// Queues an INSTALL frame carrying `body` for peer `to`.
    pub fn send_install(&mut self, to: u64, body: &[u8]) -> Result<(), Dropped> {
        let to = u8::try_from(to).ok();
        let bytes = LENGTH_BYTES + 1 + body.len();
        self.queue(to, bytes, |buf| {
            frame::put_install(buf, body);
            Ok(())
        })
    }

    /// Queues a frame of `bytes` (length prefix included) that `put` appends.
    fn queue(
        &mut self,
        to: Option<u8>,
        bytes: usize,
        put: impl FnOnce(&mut Vec<u8>) -> Result<(), Dropped>,
    ) -> Result<(), Dropped> {
        let Some(r) = to.and_then(|id| self.remote_index(id)) else {
            return Err(Dropped::UnknownPeer);
        };
        let remote = &mut self.remotes[r];
        let result = if matches!(remote.out, Outbound::Idle) {
            Err(Dropped::LinkDown)
        } else if bytes - LENGTH_BYTES > FRAME_BYTES_MAX {
            log::warn!(
                "peer {}: a {bytes}-byte frame is past the {FRAME_BYTES_MAX}-byte cap; dropped",
                remote.id
            );
            Err(Dropped::TooLarge)
        } else if remote.buf.len() - remote.sent + bytes > OUTPUT_BYTES_MAX {
            Err(Dropped::OutputFull)
        } else {
            put(&mut remote.buf)
        };
        match result {
            Ok(()) => {
                remote.counters.frames_out += 1;
                if !self.dirty.contains(&r) {
                    self.dirty.push(r);
                }
            }
            Err(_) => remote.counters.drops += 1,
        }
        result
    }

    /// Writes queued output of every peer that has some. Call at the end of a pass.
    pub fn flush(&mut self, registry: &Registry, now_ms: u64, out: &mut Vec<PeerEvent>) {
        let dirty = std::mem::take(&mut self.dirty);
        for &r in &dirty {
            self.write_out(registry, r, now_ms, out);
        }
        let mut dirty = dirty;
        dirty.clear();
        self.dirty = dirty;
    }

    /// When [`Peers::on_timer`] has work: a redial, a dial or HELLO timeout, or reads and
    /// accepts left over from an event (then 0: at once).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        if !self.read_again.is_empty() || self.accept_again {
            return Some(0);
        }
        let mut next = self.accept_retry_at_ms;
        let mut at = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        for remote in &self.remotes {
            match remote.out {
                Outbound::Idle => at(remote.retry_at_ms),
                Outbound::Connecting(_) => at(remote.dial_started_ms + DIAL_TIMEOUT_MS),
                Outbound::Connected(_) => {}
            }
        }
        for link in self.inbound.iter().flatten() {
            if link.remote.is_none() {
                at(link.accepted_ms + HELLO_TIMEOUT_MS);
            }
        }
        next
    }

    /// Dials peers whose backoff ended, gives up slow dials and silent accepted
    /// connections, and continues reads and accepts an event left unfinished.
    pub fn on_timer(&mut self, registry: &Registry, now_ms: u64, out: &mut Vec<PeerEvent>) {
        for r in 0..self.remotes.len() {
            let remote = &self.remotes[r];
            match remote.out {
                Outbound::Idle if remote.retry_at_ms <= now_ms => self.dial(registry, r, now_ms),
                Outbound::Connecting(_) if remote.dial_started_ms + DIAL_TIMEOUT_MS <= now_ms => {
                    let why = format!("not connected after {DIAL_TIMEOUT_MS} ms");
                    self.outbound_failed(registry, r, now_ms, &why, out);
                }
                _ => {}
            }
        }
        for s in 0..INBOUND_LINKS_MAX {
            let silent = self.inbound[s]
                .as_ref()
                .is_some_and(|l| l.remote.is_none() && l.accepted_ms + HELLO_TIMEOUT_MS <= now_ms);
            if silent {
                self.refused_unnamed += 1;
                let why = format!("no HELLO within {HELLO_TIMEOUT_MS} ms");
                let from = self.inbound_addr(s);
                self.refusals
                    .note(reason::HELLO_TIMEOUT, &format!("{from}: {why}"), now_ms);
                self.close_inbound(registry, s, &why, out);
            }
        }
        for s in std::mem::take(&mut self.read_again) {
            if let Some(link) = self.inbound[s].as_mut() {
                link.read_again = false;
                self.read_inbound(registry, s, now_ms, out);
            }
        }
        let retry_due = self.accept_retry_at_ms.is_some_and(|t| t <= now_ms);
        if self.accept_again || retry_due {
            self.accept(registry, now_ms);
        }
    }

    /// Both links with `id` are open and its HELLO was accepted.
    pub fn link_up(&self, id: u8) -> bool {
        self.remote(id).is_some_and(|r| r.up)
    }

    /// When a frame last arrived from `id` (caller's clock), if ever.
    pub fn last_heard_ms(&self, id: u8) -> Option<u64> {
        self.remote(id)?.last_heard_ms
    }

    /// The last HELLO accepted from `id` (kept after its link closes).
    pub fn hello(&self, id: u8) -> Option<&Hello> {
        self.remote(id)?.hello.as_ref()
    }

    /// Bytes queued for `id` and not written yet.
    pub fn output_bytes(&self, id: u8) -> Option<usize> {
        self.remote(id).map(|r| r.buf.len() - r.sent)
    }

    /// The capacity held by peer `id`'s output buffer and by the input buffer of its
    /// accepted connection: what an idle link keeps in memory.
    #[cfg(test)]
    pub(crate) fn buffer_capacities(&self, id: u8) -> (usize, usize) {
        let r = self.remote_index(id).expect("a peer");
        let inbound = (self.inbound.iter().flatten()).find(|l| l.remote == Some(r));
        (
            self.remotes[r].buf.capacity(),
            inbound.map_or(0, |l| l.input.capacity()),
        )
    }

    /// The other nodes' ids, in `--peers` order.
    pub fn peer_ids(&self) -> impl Iterator<Item = u8> + '_ {
        self.remotes.iter().map(|r| r.id)
    }

    /// Counters of the links with `id`.
    pub fn counters(&self, id: u8) -> Option<PeerCounters> {
        self.remote(id).map(|r| r.counters)
    }

    /// Every peer's counters summed, plus connections refused before naming a peer.
    pub fn totals(&self) -> PeerCounters {
        let mut sum = PeerCounters::default();
        for r in &self.remotes {
            sum.add(&r.counters);
        }
        sum.refused += self.refused_unnamed;
        sum
    }

    /// Counts a refusal of `reason` and logs `why`, at most once per reason in
    /// [`REFUSAL_LOG_INTERVAL_MS`]. `reasons` of the caller's own are seeded with
    /// [`Peers::count_reasons`] so that their counters exist from the start.
    pub fn refused(&mut self, reason: &'static str, why: &str, now_ms: u64) {
        self.refusals.note(reason, why, now_ms);
    }

    /// Makes `reasons` appear in [`Peers::refusals`] before anything was refused for them.
    pub fn count_reasons(&mut self, reasons: &[&'static str]) {
        self.refusals.seed(reasons);
    }

    /// Every refusal reason seen or seeded, with its count.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        let counts = self.refusals.by_reason.iter().map(|e| (e.0, e.1));
        counts.collect()
    }

    fn remote_index(&self, id: u8) -> Option<usize> {
        self.remotes.iter().position(|r| r.id == id)
    }

    fn remote(&self, id: u8) -> Option<&Remote> {
        self.remotes.iter().find(|r| r.id == id)
    }

    /// Sends `Up`/`Down` when whether `r` is up changed.
    fn note_up(&mut self, r: usize, out: &mut Vec<PeerEvent>) {
        let remote = &mut self.remotes[r];
        let up = matches!(remote.out, Outbound::Connected(_)) && remote.inbound.is_some();
        if up != remote.up {
            remote.up = up;
            let id = remote.id;
            log::info!("peer {id}: link {}", if up { "up" } else { "down" });
            out.push(if up {
                PeerEvent::Up { id }
            } else {
                PeerEvent::Down { id }
            });
        }
    }
}

fn check_config(cfg: &PeersConfig) -> io::Result<()> {
    let invalid = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    if cfg.nodes.len() > NODES_MAX {
        return invalid(format!("{} nodes, at most {NODES_MAX}", cfg.nodes.len()));
    }
    for (i, a) in cfg.nodes.iter().enumerate() {
        if cfg.nodes[i + 1..].iter().any(|b| b.0 == a.0) {
            return invalid(format!("node id {} given twice", a.0));
        }
    }
    if !cfg.nodes.iter().any(|n| n.0 == cfg.node_id) {
        return invalid(format!("node id {} is not among the nodes", cfg.node_id));
    }
    Ok(())
}

impl Remote {
    fn new(id: u8, addr: SocketAddr) -> Remote {
        Remote {
            id,
            addr,
            out: Outbound::Idle,
            backoff_ms: BACKOFF_MIN_MS,
            retry_at_ms: 0,
            dial_started_ms: 0,
            connected_since_ms: None,
            buf: Vec::new(),
            sent: 0,
            busy_until_ms: 0,
            inbound: None,
            hello: None,
            last_heard_ms: None,
            up: false,
            counters: PeerCounters::default(),
        }
    }
}

// ---- outbound links ---------------------------------------------------------------------

impl Peers {
    fn outbound_token(&self, r: usize) -> Token {
        Token(self.token_base + 1 + r)
    }

    fn dial(&mut self, registry: &Registry, r: usize, now_ms: u64) {
        let hello = Hello {
            cluster_id: self.cluster_id,
            from: self.me,
            to: self.remotes[r].id,
            last_index: self.last_index,
            last_term: self.last_term,
            client_addr: self.client_addr,
            admin_addr: self.admin_addr,
            cluster_uid: self.cluster_uid,
        };
        let token = self.outbound_token(r);
        let remote = &mut self.remotes[r];
        remote.counters.dials += 1;
        remote.dial_started_ms = now_ms;
        let dialled = TcpStream::connect(remote.addr).and_then(|mut stream| {
            registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
            Ok(stream)
        });
        match dialled {
            Ok(stream) => {
                remote.out = Outbound::Connecting(stream);
                remote.buf.clear();
                remote.sent = 0;
                frame::put_hello(&mut remote.buf, &hello);
            }
            Err(e) => {
                log::debug!("peer {}: dial {} failed: {e}", remote.id, remote.addr);
                remote.schedule_retry(now_ms);
            }
        }
    }

    fn on_outbound_event(
        &mut self,
        registry: &Registry,
        r: usize,
        event: &Event,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) {
        let Some(remote) = self.remotes.get_mut(r) else {
            return;
        };
        match &mut remote.out {
            Outbound::Idle => {}
            Outbound::Connecting(stream) => match connect_state(stream) {
                Ok(false) => {}
                Ok(true) => self.on_connected(registry, r, now_ms, out),
                Err(e) => {
                    let why = format!("dial failed: {e}");
                    self.outbound_failed(registry, r, now_ms, &why, out);
                }
            },
            Outbound::Connected(stream) => {
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    // Peers never write on a link they accepted: anything readable is
                    // its end (EOF or an error), or a confused peer.
                    let mut byte = [0u8; 1];
                    let why = match stream.read(&mut byte) {
                        Ok(0) => Some("closed by the peer".to_string()),
                        Ok(_) => Some("the peer wrote on our outbound link".to_string()),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
                        Err(e) => Some(e.to_string()),
                    };
                    if let Some(why) = why {
                        self.outbound_failed(registry, r, now_ms, &why, out);
                        return;
                    }
                }
                if event.is_writable() {
                    self.write_out(registry, r, now_ms, out);
                }
            }
        }
    }

    fn on_connected(
        &mut self,
        registry: &Registry,
        r: usize,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) {
        let remote = &mut self.remotes[r];
        let Outbound::Connecting(stream) = std::mem::replace(&mut remote.out, Outbound::Idle)
        else {
            return;
        };
        // Raft's heartbeats and appends are small and latency-bound.
        if let Err(e) = stream.set_nodelay(true) {
            log::debug!("peer {}: TCP_NODELAY not set: {e}", remote.id);
        }
        remote.out = Outbound::Connected(stream);
        remote.counters.connects += 1;
        remote.connected_since_ms = Some(now_ms);
        log::debug!("peer {}: connected to {}", remote.id, remote.addr);
        self.write_out(registry, r, now_ms, out);
        self.note_up(r, out);
    }

    /// Closes the outbound link to `r` (its queued output is lost) and schedules a redial.
    fn outbound_failed(
        &mut self,
        registry: &Registry,
        r: usize,
        now_ms: u64,
        why: &str,
        out: &mut Vec<PeerEvent>,
    ) {
        let remote = &mut self.remotes[r];
        match std::mem::replace(&mut remote.out, Outbound::Idle) {
            Outbound::Idle => return,
            Outbound::Connecting(mut s) => {
                log::debug!("peer {}: dial {}: {why}", remote.id, remote.addr);
                let _ = registry.deregister(&mut s);
            }
            Outbound::Connected(mut s) => {
                log::info!(
                    "peer {}: outbound link to {} lost: {why}",
                    remote.id,
                    remote.addr
                );
                let _ = registry.deregister(&mut s);
            }
        }
        remote.buf = Vec::new();
        remote.sent = 0;
        remote.schedule_retry(now_ms);
        self.note_up(r, out);
    }

    /// Writes `r`'s queued output until it is empty or the socket would block.
    fn write_out(&mut self, registry: &Registry, r: usize, now_ms: u64, out: &mut Vec<PeerEvent>) {
        let remote = &mut self.remotes[r];
        let Outbound::Connected(stream) = &mut remote.out else {
            return;
        };
        let mut failure = None;
        if remote.buf.len() - remote.sent > IDLE_CAPACITY_MAX_BYTES {
            remote.busy_until_ms = now_ms + BUFFER_SHRINK_AFTER_MS;
        }
        while remote.sent < remote.buf.len() {
            match stream.write(&remote.buf[remote.sent..]) {
                Ok(0) => {
                    failure = Some("write returned 0".to_string());
                    break;
                }
                Ok(n) => {
                    remote.sent += n;
                    remote.counters.bytes_out += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(why) = failure {
            self.outbound_failed(registry, r, now_ms, &why, out);
            return;
        }
        if remote.sent == remote.buf.len() {
            remote.buf.clear();
            if now_ms >= remote.busy_until_ms {
                remote.buf.shrink_to(IDLE_CAPACITY_MAX_BYTES);
            }
            remote.sent = 0;
        } else if remote.sent >= COMPACT_BYTES_MIN {
            remote.buf.drain(..remote.sent);
            remote.sent = 0;
        }
    }
}

impl Remote {
    fn schedule_retry(&mut self, now_ms: u64) {
        let stayed_up = self
            .connected_since_ms
            .take()
            .is_some_and(|since| since + BACKOFF_MAX_MS <= now_ms);
        if stayed_up {
            self.backoff_ms = BACKOFF_MIN_MS;
        }
        self.retry_at_ms = now_ms + self.backoff_ms;
        self.backoff_ms = (self.backoff_ms * 2).min(BACKOFF_MAX_MS);
    }
}

/// Whether a non-blocking connect finished: `Ok(true)` connected, `Ok(false)` not yet.
fn connect_state(stream: &TcpStream) -> io::Result<bool> {
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

// ---- inbound links ----------------------------------------------------------------------

impl Peers {
    fn inbound_token(&self, s: usize) -> Token {
        Token(self.token_base + 1 + NODES_MAX + s)
    }

    fn accept(&mut self, registry: &Registry, now_ms: u64) {
        self.accept_again = false;
        self.accept_retry_at_ms = None;
        for _ in 0..ACCEPTS_PER_EVENT_MAX {
            let (mut stream, from) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: the backlog keeps the connection; try later.
                    log::warn!("peer listener: accept failed: {e}");
                    self.accept_retry_at_ms = Some(now_ms + BACKOFF_MAX_MS);
                    return;
                }
            };
            let Some(s) = self.inbound.iter().position(Option::is_none) else {
                self.refused_unnamed += 1;
                let why = format!("{from}: {INBOUND_LINKS_MAX} connections already");
                self.refusals.note(reason::SLOTS_FULL, &why, now_ms);
                continue;
            };
            let token = self.inbound_token(s);
            if let Err(e) = registry.register(&mut stream, token, Interest::READABLE) {
                log::warn!("peer listener: {from} not registered: {e}");
                continue;
            }
            self.inbound[s] = Some(Inbound {
                stream,
                input: Vec::new(),
                busy_until_ms: 0,
                remote: None,
                accepted_ms: now_ms,
                bytes_in: 0,
                read_again: false,
            });
        }
        self.accept_again = true;
    }

    /// Reads accepted connection `s` for one turn and handles its complete frames.
    fn read_inbound(
        &mut self,
        registry: &Registry,
        s: usize,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) {
        for _ in 0..READS_PER_EVENT_MAX {
            let Some(link) = self.inbound[s].as_mut() else {
                return;
            };
            match link.stream.read(&mut self.scratch) {
                Ok(0) => {
                    let why = if link.input.is_empty() {
                        "closed by the peer"
                    } else {
                        "closed by the peer mid-frame"
                    };
                    self.close_inbound(registry, s, why, out);
                    return;
                }
                Ok(n) => {
                    link.input.extend_from_slice(&self.scratch[..n]);
                    link.bytes_in += n as u64;
                    if let Some(r) = link.remote {
                        self.remotes[r].counters.bytes_in += n as u64;
                    }
                    if let Err((reason, why)) = self.handle_input(registry, s, now_ms, out) {
                        self.refuse(registry, s, reason, &why, now_ms, out);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.close_inbound(registry, s, &e.to_string(), out);
                    return;
                }
            }
        }
        if let Some(link) = self.inbound[s].as_mut() {
            if !link.read_again {
                link.read_again = true;
                self.read_again.push(s);
            }
        }
    }

    /// Handles every complete frame of `s`'s input.
    fn handle_input(
        &mut self,
        registry: &Registry,
        s: usize,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) -> Result<(), Refused> {
        let Some(link) = self.inbound[s].as_mut() else {
            return Ok(());
        };
        if link.input.len() > IDLE_CAPACITY_MAX_BYTES {
            link.busy_until_ms = now_ms + BUFFER_SHRINK_AFTER_MS;
        }
        let input = std::mem::take(&mut link.input);
        let mut at = 0;
        let mut result = Ok(());
        let bad_frame = |e: FrameError| (reason::FRAME, e.to_string());
        while let Some(split) = frame::split(&input[at..]).map_err(bad_frame)? {
            let (kind, body, used) = split;
            at += used;
            result = self.handle_frame(registry, s, kind, body, now_ms, out);
            if result.is_err() {
                break;
            }
        }
        if let Some(link) = self.inbound[s].as_mut() {
            link.input = input;
            link.input.drain(..at);
            if link.input.is_empty() && now_ms >= link.busy_until_ms {
                link.input.shrink_to(IDLE_CAPACITY_MAX_BYTES);
            }
        }
        result
    }

    fn handle_frame(
        &mut self,
        registry: &Registry,
        s: usize,
        kind: FrameKind,
        body: &[u8],
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) -> Result<(), Refused> {
        let Some(link) = self.inbound[s].as_ref() else {
            return Ok(());
        };
        match (kind, link.remote) {
            (FrameKind::Hello, None) => {
                let hello =
                    frame::parse_hello(body).map_err(|e| (reason::NOT_A_PEER, e.to_string()))?;
                self.accept_hello(registry, s, hello, now_ms, out)
            }
            (FrameKind::Hello, Some(_)) => Err((reason::FRAME, "a second HELLO".to_string())),
            (FrameKind::Raft | FrameKind::Install, None) => {
                Err((reason::NOT_A_PEER, format!("a {kind:?} frame before HELLO")))
            }
            (FrameKind::Install, Some(r)) => {
                let remote = &mut self.remotes[r];
                remote.last_heard_ms = Some(now_ms);
                remote.counters.frames_in += 1;
                let (from, body) = (remote.id, body.to_vec());
                out.push(PeerEvent::Install { from, body });
                Ok(())
            }
            (FrameKind::Raft, Some(r)) => {
                let msg = frame::parse_raft(body).map_err(|e| (reason::FRAME, e.to_string()))?;
                let remote = &mut self.remotes[r];
                if msg.from != u64::from(remote.id) || msg.to != u64::from(self.me) {
                    let why = format!("a message from {} to {}", msg.from, msg.to);
                    return Err((reason::FRAME, why));
                }
                remote.last_heard_ms = Some(now_ms);
                remote.counters.frames_in += 1;
                out.push(PeerEvent::Message(msg));
                Ok(())
            }
        }
    }

    /// A HELLO of this cluster: the same `--peers` and the same cluster id.
    fn check_cluster(&self, hello: &Hello) -> Result<(), Refused> {
        if hello.cluster_id != self.cluster_id {
            let why = format!(
                "HELLO from node {} of cluster {:016x}, this is cluster {:016x} (do both \
                 nodes have the same --peers?)",
                hello.from, hello.cluster_id, self.cluster_id
            );
            return refused(reason::CLUSTER, why);
        }
        if hello.cluster_uid != self.cluster_uid {
            let name = |uid: Option<u64>| uid.map_or("(none)".into(), |u| format!("{u:016x}"));
            let why = format!(
                "HELLO from node {} of cluster id {}, this node's cluster id is {} (is it \
                 another cluster's data directory, or a node without --cluster-id?)",
                hello.from,
                name(hello.cluster_uid),
                name(self.cluster_uid)
            );
            return refused(reason::CLUSTER, why);
        }
        Ok(())
    }

    fn accept_hello(
        &mut self,
        registry: &Registry,
        s: usize,
        hello: Hello,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) -> Result<(), Refused> {
        self.check_cluster(&hello)?;
        if hello.to != self.me {
            return refused(
                reason::NODE,
                format!("HELLO for node {}, this is node {}", hello.to, self.me),
            );
        }
        let Some(r) = self
            .remote_index(hello.from)
            .filter(|_| hello.from != self.me)
        else {
            let why = format!("HELLO from node {}, not another node", hello.from);
            return refused(reason::NODE, why);
        };
        let remote = &mut self.remotes[r];
        if matches!(remote.out, Outbound::Idle) {
            // It is back (it restarted, or the network healed): dial it now rather than
            // at the end of a backoff grown while it was gone.
            remote.retry_at_ms = now_ms;
            remote.backoff_ms = BACKOFF_MIN_MS;
        }
        // A redial replaces the old link, whose end we may not have read yet.
        if let Some(old) = self.remotes[r].inbound.filter(|&old| old != s) {
            self.close_inbound(registry, old, "replaced by a new link from the peer", out);
        }
        if let Some(link) = self.inbound[s].as_mut() {
            link.remote = Some(r);
            let remote = &mut self.remotes[r];
            // Counted from here on by `read_inbound`; what came before, now.
            remote.counters.bytes_in += link.bytes_in;
            remote.counters.frames_in += 1;
            remote.inbound = Some(s);
            remote.last_heard_ms = Some(now_ms);
            log::debug!(
                "peer {}: HELLO accepted (client {}, last index {} term {})",
                hello.from,
                hello.client_addr,
                hello.last_index,
                hello.last_term
            );
            remote.hello = Some(hello);
        }
        self.note_up(r, out);
        Ok(())
    }

    /// Closes `s` for a protocol violation, counted and logged (rate-limited).
    fn refuse(
        &mut self,
        registry: &Registry,
        s: usize,
        reason: &'static str,
        why: &str,
        now_ms: u64,
        out: &mut Vec<PeerEvent>,
    ) {
        match self.inbound[s].as_ref().and_then(|l| l.remote) {
            Some(r) => self.remotes[r].counters.refused += 1,
            None => self.refused_unnamed += 1,
        }
        let from = self.inbound_addr(s);
        let line = format!("link from {from}: {why}");
        self.refusals.note(reason, &line, now_ms);
        self.close_inbound(registry, s, why, out);
    }

    /// The address of accepted connection `s`, for a log line.
    fn inbound_addr(&self, s: usize) -> String {
        let addr = self.inbound[s]
            .as_ref()
            .and_then(|l| l.stream.peer_addr().ok());
        addr.map_or_else(|| "?".to_string(), |a| a.to_string())
    }

    fn close_inbound(
        &mut self,
        registry: &Registry,
        s: usize,
        why: &str,
        out: &mut Vec<PeerEvent>,
    ) {
        let Some(mut link) = self.inbound[s].take() else {
            return;
        };
        let _ = registry.deregister(&mut link.stream);
        self.read_again.retain(|&x| x != s);
        if let Some(r) = link.remote {
            log::debug!("peer {}: inbound link closed: {why}", self.remotes[r].id);
            if self.remotes[r].inbound == Some(s) {
                self.remotes[r].inbound = None;
                self.note_up(r, out);
            }
        }
    }
}
