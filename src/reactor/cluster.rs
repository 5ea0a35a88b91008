//! The reactor's side of a cluster (`docs/REPLICATION.md` §5.1, §5.2): the `peer` room's
//! links on this reactor's `Poll` and raft's tick timer, in one place.
//!
//! `Cluster` is `None` without `--peers`, so a single node runs exactly as before. With
//! it, each pass hands the replica what arrived (peer messages, links going up and down)
//! and the ticks that are due, in [`ClusterInput`]s; the replica's outgoing messages
//! come back through [`Cluster::send`] and leave in [`Cluster::flush`] at the end of the
//! pass. The replica itself lives in the broker: `Reactor::replica_input` hands ticks,
//! peer messages and link changes to it, and `cluster_flush` sends what it released
//! (a message the links cannot queue is reported to raft as unreachable).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use mio::event::Event;
use mio::{Registry, Token};

use super::{Reactor, PEER_TOKEN_BASE};
use crate::admin::{ClusterFigures, PeerFigures, NO_LEADER};
use crate::broker::Now;
use crate::peer::{Dropped, Message, PeerEvent, Peers, PeersConfig};

/// What one pass hands to the replica, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterInput {
    /// One raft tick (`--raft-tick`) is due.
    Tick,
    /// A peer link reported something.
    Peer(PeerEvent),
}

/// Counters for `/stats` beside the links' own ([`Peers::totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounters {
    pub ticks: u64,
    /// Ticks skipped because a pass came late (see [`Cluster::step`]).
    pub ticks_skipped: u64,
}

pub struct Cluster {
    pub peers: Peers,
    events: Vec<PeerEvent>,
    raft_tick_ms: u64,
    next_tick_ms: u64,
    pub counters: ClusterCounters,
}

impl Cluster {
    /// Binds `--listen-peer` and registers the links from `token_base`; the first tick is
    /// one `raft_tick_ms` after `now_ms`.
    pub fn new(
        cfg: &PeersConfig,
        raft_tick_ms: u64,
        registry: &Registry,
        token_base: usize,
        now_ms: u64,
    ) -> io::Result<Cluster> {
        Ok(Cluster::with_peers(
            Peers::new(cfg, registry, token_base)?,
            raft_tick_ms,
            now_ms,
        ))
    }

    fn with_peers(peers: Peers, raft_tick_ms: u64, now_ms: u64) -> Cluster {
        let raft_tick_ms = raft_tick_ms.max(1);
        Cluster {
            peers,
            events: Vec::new(),
            raft_tick_ms,
            next_tick_ms: now_ms + raft_tick_ms,
            counters: ClusterCounters::default(),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.peers.local_addr()
    }

    pub fn owns(&self, token: Token) -> bool {
        self.peers.owns(token)
    }

    /// Handles a link event; what it reports waits for the pass's [`Cluster::step`].
    pub fn on_event(&mut self, registry: &Registry, event: &Event, now_ms: u64) {
        self.peers
            .on_event(registry, event, now_ms, &mut self.events);
    }

    /// The earliest of the links' deadline and the next tick.
    pub fn next_deadline_ms(&self) -> u64 {
        self.peers
            .next_deadline_ms()
            .map_or(self.next_tick_ms, |at| at.min(self.next_tick_ms))
    }

    /// Runs the links' timers and appends what the replica gets this pass: what the
    /// links reported, then at most one tick. A pass that comes late (a slow disk, a
    /// SIGSTOP) gives one tick, never a burst: raft's timeouts stretch, and a node
    /// resumed after a pause does not start an election on its first pass.
    pub fn step(&mut self, registry: &Registry, now_ms: u64, out: &mut Vec<ClusterInput>) {
        if self.peers.next_deadline_ms().is_some_and(|at| at <= now_ms) {
            self.peers.on_timer(registry, now_ms, &mut self.events);
        }
        out.extend(self.events.drain(..).map(ClusterInput::Peer));
        if now_ms >= self.next_tick_ms {
            out.push(ClusterInput::Tick);
            self.counters.ticks += 1;
            self.next_tick_ms += self.raft_tick_ms;
            if self.next_tick_ms <= now_ms {
                let behind = (now_ms - self.next_tick_ms) / self.raft_tick_ms + 1;
                self.counters.ticks_skipped += behind;
                self.next_tick_ms += behind * self.raft_tick_ms;
            }
        }
    }

    /// Queues a raft message for its `to`; `Err` = dropped (report the peer unreachable).
    pub fn send(&mut self, msg: &Message) -> Result<(), Dropped> {
        self.peers.send(msg)
    }

    /// Queues an INSTALL frame for peer `to`; `Err` = dropped (the follower asks again).
    pub fn send_install(&mut self, to: u64, body: &[u8]) -> Result<(), Dropped> {
        self.peers.send_install(to, body)
    }

    /// Writes queued messages; what that reports (a link lost) waits for the next step.
    pub fn flush(&mut self, registry: &Registry, now_ms: u64) {
        self.peers.flush(registry, now_ms, &mut self.events);
    }
}

// ---- the reactor's glue ------------------------------------------------------------------

impl Reactor {
    /// Joins the cluster: binds `--listen-peer`, registers the peer links on this
    /// reactor's `Poll` (tokens from [`PEER_TOKEN_BASE`]) and starts raft's tick timer.
    /// Not called without `--peers`, so a single node is unchanged. Returns where peer
    /// links are accepted.
    pub fn attach_peers(
        &mut self,
        cfg: &PeersConfig,
        raft_tick_ms: u64,
    ) -> Result<SocketAddr, String> {
        let now = self.now();
        let cluster = Cluster::new(
            cfg,
            raft_tick_ms,
            self.poll.registry(),
            PEER_TOKEN_BASE,
            now.mono_ms,
        )
        .map_err(|e| format!("cannot listen for peers on {}: {e}", cfg.listen))?;
        let mut cluster = cluster;
        cluster
            .peers
            .count_reasons(&crate::broker::PEER_MESSAGE_REFUSALS);
        if let Some((index, term)) = self.broker.raft_log_end() {
            // Before the first dial: its HELLO says where this node's log ends.
            cluster.peers.set_log_position(index, term);
        }
        let addr = cluster.local_addr().map_err(|e| e.to_string())?;
        log::info!(
            "peer links on {addr}, node {} of {}",
            cfg.node_id,
            cfg.nodes.len()
        );
        self.cluster = Some(cluster);
        Ok(addr)
    }

    /// The peer links, in a cluster: liveness (`link_up`, `last_heard_ms`), HELLOs and
    /// counters for the replica's gate and for `/stats`.
    pub fn peers(&self) -> Option<&Peers> {
        self.cluster.as_ref().map(|c| &c.peers)
    }

    /// Hands an event of a peer token to the links.
    pub(super) fn on_peer_event(&mut self, event: &Event, now: Now) {
        if let Some(cluster) = self.cluster.as_mut().filter(|c| c.owns(event.token())) {
            cluster.on_event(self.poll.registry(), event, now.mono_ms);
        }
    }

    /// After the pass's reads: the links' timers, then what arrived and the due tick go
    /// to the replica (`docs/REPLICATION.md` §5.2: peer input and ticks before the
    /// broker's end of pass).
    pub(super) fn cluster_pass(&mut self, now: Now) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        if let Some((index, term)) = self.broker.raft_log_end() {
            cluster.peers.set_log_position(index, term);
        }
        let mut inputs = std::mem::take(&mut self.cluster_inputs);
        cluster.step(self.poll.registry(), now.mono_ms, &mut inputs);
        for input in inputs.drain(..) {
            self.replica_input(input, now);
        }
        self.cluster_inputs = inputs;
    }

    /// Sends what the broker's replica released this pass, then writes the links (after
    /// the clients' output).
    pub(super) fn cluster_flush(&mut self, now: Now) {
        let Some(cluster) = self.cluster.as_mut() else {
            return;
        };
        let mut out = std::mem::take(&mut self.peer_out);
        self.broker.drain_peer_messages(&mut out);
        for msg in out.drain(..) {
            if let Err(why) = cluster.send(&msg) {
                log::trace!("peer message to {} dropped: {why:?}", msg.to);
                self.counters.peer_messages_dropped += 1;
                self.broker.peer_unreachable(&msg);
            }
        }
        self.peer_out = out;
        let mut frames = std::mem::take(&mut self.install_out);
        self.broker.drain_install_frames(&mut frames);
        for (to, body) in frames.drain(..) {
            if let Err(why) = cluster.send_install(to, &body) {
                log::debug!("INSTALL frame to {to} dropped: {why:?}");
            }
        }
        self.install_out = frames;
        cluster.flush(self.poll.registry(), now.mono_ms);
    }

    fn replica_input(&mut self, input: ClusterInput, now: Now) {
        match input {
            ClusterInput::Tick => self.broker.raft_tick(),
            ClusterInput::Peer(PeerEvent::Message(m)) => {
                self.counters.peer_messages_in += 1;
                let from = m.from;
                if let Err((reason, why)) = self.broker.peer_message(m) {
                    if let Some(c) = self.cluster.as_mut() {
                        let why = format!("a raft message from node {from}: {why}");
                        c.peers.refused(reason, &why, now.mono_ms);
                    }
                }
            }
            ClusterInput::Peer(PeerEvent::Install { from, body }) => {
                self.broker.peer_install(u64::from(from), &body, now);
            }
            ClusterInput::Peer(PeerEvent::Up { id }) => {
                let hello = self.cluster.as_ref().and_then(|c| c.peers.hello(id));
                let addr = hello.map(|h| h.client_addr.to_string());
                let last_index = hello.map(|h| h.last_index);
                self.broker.peer_up(u64::from(id), addr, last_index);
            }
            ClusterInput::Peer(PeerEvent::Down { id }) => self.broker.peer_down(u64::from(id)),
        }
    }

    /// What `/healthz` reads: the reachable leader, or none (nothing on a single node).
    pub(super) fn publish_leader(&self) {
        let Some(status) = self.broker.cluster_status() else {
            return;
        };
        let leader = status.leader_id.unwrap_or(NO_LEADER);
        self.liveness.leader.store(leader, Ordering::Relaxed);
    }

    /// This node's raft figures and links for `/stats` (`None` on a single node).
    pub(super) fn cluster_figures(&self, now: Now) -> Option<ClusterFigures> {
        let status = self.broker.cluster_status()?;
        let links = self.peers()?;
        let matched: BTreeMap<u64, u64> = status.match_indexes.iter().copied().collect();
        let peers = links.peer_ids().map(|id| {
            let hello = links.hello(id);
            let c = links.counters(id).unwrap_or_default();
            let match_index = matched.get(&u64::from(id)).copied();
            PeerFigures {
                id: u64::from(id),
                link_up: links.link_up(id),
                last_contact_ms: links
                    .last_heard_ms(id)
                    .map(|t| now.mono_ms.saturating_sub(t)),
                match_index,
                lag: match_index.map(|m| status.last_index.saturating_sub(m)),
                client_addr: hello.map(|h| h.client_addr.to_string()).unwrap_or_default(),
                admin_addr: (hello.and_then(|h| h.admin_addr))
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                bytes_in: c.bytes_in,
                bytes_out: c.bytes_out,
                frames_in: c.frames_in,
                frames_out: c.frames_out,
            }
        });
        Some(ClusterFigures {
            node_id: status.node_id,
            role: status.role,
            term: status.term,
            leader_id: status.leader_id.unwrap_or(0),
            commit_index: status.commit_index,
            applied_index: status.applied_index,
            last_index: status.last_index,
            checkpoint_index: status.checkpoint_index,
            first_index: status.first_index,
            journal_bytes: status.journal_bytes,
            log_clock_ms: status.log_clock_ms,
            clock_skewed_batches: status.clock_skewed_batches,
            snapshot_bytes_sent: status.snapshot_bytes_sent,
            install_bytes_done: status.install_bytes.0,
            install_bytes_total: status.install_bytes.1,
            refused: links.refusals(),
            peers: peers.collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::Poll;

    fn lone(poll: &Poll, tick_ms: u64, now_ms: u64) -> Cluster {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = listener.local_addr().unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cfg = PeersConfig {
            node_id: 1,
            nodes: vec![(1, me), (2, other.local_addr().unwrap())],
            listen: me,
            client_addr: me,
            admin_addr: None,
            cluster_uid: None,
        };
        let peers = Peers::with_listener(&cfg, listener, poll.registry(), 0).unwrap();
        Cluster::with_peers(peers, tick_ms, now_ms)
    }

    fn ticks(inputs: &[ClusterInput]) -> usize {
        inputs.iter().filter(|i| **i == ClusterInput::Tick).count()
    }

    #[test]
    fn ticks_come_every_raft_tick_and_a_late_pass_gets_one_not_a_burst() {
        let poll = Poll::new().unwrap();
        let mut cluster = lone(&poll, 50, 1000);
        let mut inputs = Vec::new();
        cluster.step(poll.registry(), 1049, &mut inputs);
        assert_eq!(ticks(&inputs), 0, "not before the first tick is due");
        assert!(cluster.next_deadline_ms() <= 1050);
        for now in [1050, 1100, 1150] {
            inputs.clear();
            cluster.step(poll.registry(), now, &mut inputs);
            assert_eq!(ticks(&inputs), 1, "at {now}");
        }
        inputs.clear();
        cluster.step(poll.registry(), 1150, &mut inputs);
        assert_eq!(ticks(&inputs), 0, "one tick per period");
        inputs.clear();
        cluster.step(poll.registry(), 1600, &mut inputs);
        assert_eq!(ticks(&inputs), 1, "a late pass gets one tick");
        assert_eq!(cluster.counters.ticks_skipped, 8);
        inputs.clear();
        cluster.step(poll.registry(), 1649, &mut inputs);
        assert_eq!(ticks(&inputs), 0, "the period restarts after a late pass");
        cluster.step(poll.registry(), 1650, &mut inputs);
        assert_eq!((ticks(&inputs), cluster.counters.ticks), (1, 5));
    }

    /// A node of the test's own: its links on its own `Poll`, driven by the test.
    struct Other {
        poll: Poll,
        events: mio::Events,
        peers: Peers,
        seen: Vec<PeerEvent>,
    }

    impl Other {
        fn turn(&mut self, now_ms: u64) {
            self.poll
                .poll(&mut self.events, Some(std::time::Duration::ZERO))
                .unwrap();
            let registry = self.poll.registry();
            for event in self.events.iter() {
                self.peers.on_event(registry, event, now_ms, &mut self.seen);
            }
            self.peers.on_timer(registry, now_ms, &mut self.seen);
            self.peers.flush(registry, now_ms, &mut self.seen);
        }
    }

    fn reactor_in(dir: &std::path::Path) -> Reactor {
        let broker_config = crate::broker::BrokerConfig {
            data_dir: dir.to_path_buf(),
            ..Default::default()
        };
        let reactor_config = super::super::ReactorConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Default::default()
        };
        Reactor::bind(reactor_config, 1, |sink| {
            let storage = crate::log::FsStorage::shared();
            crate::broker::Broker::open(broker_config, storage, Box::new(sink), Now::default())
                .map(|(broker, _)| broker)
        })
        .unwrap()
    }

    #[test]
    fn a_reactor_with_peers_ticks_hands_their_messages_on_and_sends_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut reactor = reactor_in(dir.path());
        // Bound and released for the reactor's own bind: its address must be in both
        // nodes' --peers before either starts.
        let addr1 = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let l2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nodes = vec![(1, addr1), (2, l2.local_addr().unwrap())];
        let cfg = |id: u8, listen| PeersConfig {
            node_id: id,
            nodes: nodes.clone(),
            listen,
            client_addr: "127.0.0.1:7401".parse().unwrap(),
            admin_addr: None,
            cluster_uid: None,
        };
        assert_eq!(reactor.attach_peers(&cfg(1, addr1), 10).unwrap(), addr1);
        let poll = Poll::new().unwrap();
        let peers = Peers::with_listener(&cfg(2, nodes[1].1), l2, poll.registry(), 0).unwrap();
        let mut other = Other {
            poll,
            events: mio::Events::with_capacity(16),
            peers,
            seen: Vec::new(),
        };
        let mut events = mio::Events::with_capacity(64);
        let started = std::time::Instant::now();
        let mut turn_until =
            |reactor: &mut Reactor, other: &mut Other, done: &dyn Fn(&Reactor, &Other) -> bool| {
                while !done(reactor, other) {
                    assert!(started.elapsed().as_secs() < 10, "gave up");
                    let timeout = Some(std::time::Duration::from_millis(2));
                    reactor.turn(&mut events, timeout).unwrap();
                    other.turn(started.elapsed().as_millis() as u64);
                }
            };
        turn_until(&mut reactor, &mut other, &|r, o| {
            o.peers.link_up(1) && r.peers().is_some_and(|p| p.link_up(2))
        });
        let mut to1 = Message::default();
        (to1.from, to1.to, to1.term) = (2, 1, 3);
        other.peers.send(&to1).unwrap();
        turn_until(&mut reactor, &mut other, &|r, _| {
            r.counters.peer_messages_in == 1
        });
        let mut to2 = Message::default();
        (to2.from, to2.to, to2.term) = (1, 2, 4);
        let cluster = reactor.cluster.as_mut().unwrap();
        assert!(cluster.send(&to2).is_ok());
        turn_until(&mut reactor, &mut other, &|_, o| {
            o.seen
                .iter()
                .any(|e| matches!(e, PeerEvent::Message(m) if m.term == 4))
        });
        turn_until(&mut reactor, &mut other, &|r, _| {
            r.cluster.as_ref().is_some_and(|c| c.counters.ticks >= 3)
        });
    }

    #[test]
    fn the_links_timers_run_in_step_and_their_deadline_counts() {
        let poll = Poll::new().unwrap();
        let mut cluster = lone(&poll, 10_000, 0);
        assert_eq!(cluster.next_deadline_ms(), 0, "node 2 is dialled at once");
        let mut inputs = Vec::new();
        cluster.step(poll.registry(), 0, &mut inputs);
        assert_eq!(cluster.peers.counters(2).unwrap().dials, 1);
        assert!(cluster.next_deadline_ms() > 0);
    }
}
