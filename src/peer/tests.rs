//! Peer links over real loopback TCP, driven by a test-owned mio `Poll` that several
//! `Peers` share (each in its own token range), as the reactor's would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::time::{Duration, Instant};

use mio::{Events, Poll};
use raft::eraftpb::{Entry, Message, MessageType};

use super::frame::{self, Hello};
use super::*;

/// Token ranges of the nodes on the shared poll.
const TOKEN_STRIDE: usize = 100;
/// What a test waits for a condition before failing (loopback: milliseconds normally).
const WAIT_LIMIT: Duration = Duration::from_secs(10);

struct Net {
    poll: Poll,
    events: Events,
    nodes: Vec<Option<Peers>>,
    /// Events each node reported.
    seen: Vec<Vec<PeerEvent>>,
    start: Instant,
    /// `Some` = a fake clock the test moves; `None` = real milliseconds since `start`.
    fake_now_ms: Option<u64>,
}

fn loopback() -> StdListener {
    StdListener::bind("127.0.0.1:0").unwrap()
}

fn config(me: u8, nodes: &[(u8, SocketAddr)]) -> PeersConfig {
    let addr = nodes.iter().find(|n| n.0 == me).unwrap().1;
    PeersConfig {
        node_id: me,
        nodes: nodes.to_vec(),
        listen: addr,
        client_addr: format!("127.0.0.1:{}", 7400 + u16::from(me))
            .parse()
            .unwrap(),
        admin_addr: Some(
            format!("127.0.0.1:{}", 8400 + u16::from(me))
                .parse()
                .unwrap(),
        ),
        cluster_uid: None,
    }
}

impl Net {
    fn new(size: usize) -> Net {
        Net {
            poll: Poll::new().unwrap(),
            events: Events::with_capacity(64),
            nodes: (0..size).map(|_| None).collect(),
            seen: vec![Vec::new(); size],
            start: Instant::now(),
            fake_now_ms: None,
        }
    }

    /// Starts node `id` (1-based) on `listener`.
    fn start(&mut self, id: u8, listener: StdListener, nodes: &[(u8, SocketAddr)]) {
        let i = usize::from(id - 1);
        let cfg = config(id, nodes);
        let base = i * TOKEN_STRIDE;
        let peers = Peers::with_listener(&cfg, listener, self.poll.registry(), base).unwrap();
        self.nodes[i] = Some(peers);
    }

    fn node(&mut self, id: u8) -> &mut Peers {
        self.nodes[usize::from(id - 1)].as_mut().unwrap()
    }

    fn now_ms(&self) -> u64 {
        self.fake_now_ms
            .unwrap_or_else(|| self.start.elapsed().as_millis() as u64)
    }

    /// One pass: poll, hand each event to its node, timers that are due, flush.
    fn turn(&mut self) {
        self.poll
            .poll(&mut self.events, Some(Duration::from_millis(5)))
            .unwrap();
        let now = self.now_ms();
        let registry = self.poll.registry();
        for event in self.events.iter() {
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if let Some(peers) = node.as_mut().filter(|p| p.owns(event.token())) {
                    peers.on_event(registry, event, now, &mut self.seen[i]);
                }
            }
        }
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let Some(peers) = node.as_mut() else { continue };
            if peers.next_deadline_ms().is_some_and(|at| at <= now) {
                peers.on_timer(registry, now, &mut self.seen[i]);
            }
            peers.flush(registry, now, &mut self.seen[i]);
        }
    }

    fn run_until(&mut self, what: &str, done: impl Fn(&mut Net) -> bool) {
        let limit = Instant::now() + WAIT_LIMIT;
        while !done(self) {
            assert!(Instant::now() < limit, "gave up waiting for: {what}");
            self.turn();
        }
    }

    fn messages(&self, id: u8) -> Vec<Message> {
        let seen = &self.seen[usize::from(id - 1)];
        seen.iter()
            .filter_map(|e| match e {
                PeerEvent::Message(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }
}

fn message(from: u8, to: u8, data: &[u8]) -> Message {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgAppend);
    m.from = u64::from(from);
    m.to = u64::from(to);
    m.term = 7;
    m.index = 41;
    m.mut_entries().push(Entry {
        index: 42,
        term: 7,
        data: data.to_vec().into(),
        ..Default::default()
    });
    m
}

fn all_up(net: &mut Net, ids: &[u8]) -> bool {
    ids.iter().all(|&a| {
        let node = net.node(a);
        ids.iter().filter(|&&b| b != a).all(|&b| node.link_up(b))
    })
}

#[test]
fn three_nodes_exchange_raft_messages_both_ways() {
    let listeners: Vec<StdListener> = (0..3).map(|_| loopback()).collect();
    let nodes: Vec<(u8, SocketAddr)> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as u8 + 1, l.local_addr().unwrap()))
        .collect();
    let mut net = Net::new(3);
    for (i, l) in listeners.into_iter().enumerate() {
        net.start(i as u8 + 1, l, &nodes);
    }
    net.run_until("all links up", |n| all_up(n, &[1, 2, 3]));
    for a in 1..=3u8 {
        for b in (1..=3u8).filter(|&b| b != a) {
            net.node(a)
                .send(&message(a, b, format!("{a}->{b}").as_bytes()))
                .unwrap();
        }
    }
    net.run_until("two messages at each node", |n| {
        (1..=3).all(|id| n.messages(id).len() == 2)
    });
    for b in 1..=3u8 {
        let mut got: Vec<(u64, Vec<u8>)> = net
            .messages(b)
            .iter()
            .map(|m| {
                assert_eq!(m.to, u64::from(b));
                assert_eq!((m.term, m.index, m.entries.len()), (7, 41, 1));
                (m.from, m.entries[0].data.to_vec())
            })
            .collect();
        got.sort();
        let want: Vec<(u64, Vec<u8>)> = (1..=3u8)
            .filter(|&a| a != b)
            .map(|a| (u64::from(a), format!("{a}->{b}").into_bytes()))
            .collect();
        assert_eq!(got, want);
        let ups = net.seen[usize::from(b - 1)]
            .iter()
            .filter(|e| matches!(e, PeerEvent::Up { .. }))
            .count();
        assert_eq!(ups, 2, "node {b}: one Up per peer");
    }
    let hello = net.node(1).hello(3).unwrap().clone();
    assert_eq!(hello.client_addr, "127.0.0.1:7403".parse().unwrap());
    assert_eq!(hello.admin_addr, Some("127.0.0.1:8403".parse().unwrap()));
    assert!(net.node(2).last_heard_ms(1).is_some());
    let totals = net.node(2).totals();
    assert_eq!(
        (totals.frames_in, totals.frames_out, totals.drops),
        (4, 2, 0)
    );
    assert!(totals.bytes_in > 0 && totals.bytes_out > 0);
}

/// Node 1 of a three-node cluster whose other nodes never run, plus a raw connection.
fn lone_node_and_raw_peer() -> (Net, Vec<(u8, SocketAddr)>, StdStream) {
    let l1 = loopback();
    // Bound and dropped: nothing listens there, so node 1's dials to them fail.
    let nodes = vec![
        (1, l1.local_addr().unwrap()),
        (2, loopback().local_addr().unwrap()),
        (3, loopback().local_addr().unwrap()),
    ];
    let mut net = Net::new(1);
    net.start(1, l1, &nodes);
    let raw = StdStream::connect(nodes[0].1).unwrap();
    raw.set_nodelay(true).unwrap();
    raw.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
    (net, nodes, raw)
}

fn hello_from(nodes: &[(u8, SocketAddr)], from: u8, to: u8) -> Hello {
    Hello {
        cluster_id: cluster_id(nodes),
        from,
        to,
        last_index: 5,
        last_term: 2,
        client_addr: "127.0.0.1:7402".parse().unwrap(),
        admin_addr: None,
        cluster_uid: None,
    }
}

fn frame_bytes(put: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out);
    out
}

/// The raw connection was closed by node 1.
fn assert_closed(raw: &mut StdStream) {
    let mut buf = [0u8; 16];
    match raw.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the link closed, got {other:?}"),
    }
}

#[test]
fn a_hello_with_another_cluster_id_or_wrong_ids_is_refused() {
    let (mut net, nodes, mut raw) = lone_node_and_raw_peer();
    let mut other = nodes.clone();
    other[2].1 = "127.0.0.9:1".parse().unwrap();
    let mut hello = hello_from(&nodes, 2, 1);
    hello.cluster_id = cluster_id(&other);
    raw.write_all(&frame_bytes(|o| frame::put_hello(o, &hello)))
        .unwrap();
    net.run_until("HELLO refused", |n| n.node(1).totals().refused == 1);
    assert_closed(&mut raw);
    assert!(net.node(1).hello(2).is_none());

    for (from, to) in [(2, 3), (9, 1), (1, 1)] {
        let mut raw = StdStream::connect(nodes[0].1).unwrap();
        raw.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
        let hello = hello_from(&nodes, from, to);
        raw.write_all(&frame_bytes(|o| frame::put_hello(o, &hello)))
            .unwrap();
        let want = net.node(1).totals().refused + 1;
        net.run_until("HELLO refused", |n| n.node(1).totals().refused == want);
        assert_closed(&mut raw);
    }
    assert!(net.node(1).hello(2).is_none() && net.node(1).hello(3).is_none());
    assert!(net.messages(1).is_empty());
}

/// Issue 42: two clusters made on the same `--peers` differ in their own ids, and each
/// refusal is counted by reason.
#[test]
fn a_hello_of_another_cluster_id_is_refused_and_counted_by_reason() {
    let (mut net, nodes, mut raw) = lone_node_and_raw_peer();
    let mut hello = hello_from(&nodes, 2, 1);
    hello.cluster_uid = Some(0x1234);
    raw.write_all(&frame_bytes(|o| frame::put_hello(o, &hello)))
        .unwrap();
    net.run_until("HELLO refused", |n| n.node(1).totals().refused == 1);
    assert_closed(&mut raw);
    let count = |net: &mut Net, reason: &str| {
        let refusals = net.node(1).refusals();
        refusals.iter().find(|r| r.0 == reason).map_or(0, |r| r.1)
    };
    assert_eq!(count(&mut net, reason::CLUSTER), 1);
    // Refused again within the log interval: counted, not logged (not seen here).
    let mut raw = StdStream::connect(nodes[0].1).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    net.run_until("not a peer", |n| n.node(1).totals().refused == 2);
    let bad = count(&mut net, reason::FRAME) + count(&mut net, reason::NOT_A_PEER);
    assert_eq!(bad, 1);
    for r in reason::ALL {
        assert!(
            net.node(1).refusals().iter().any(|e| e.0 == r),
            "{r} counted from 0"
        );
    }
}

#[test]
fn a_hello_round_trips_with_and_without_the_cluster_uid() {
    let nodes = vec![(1, "127.0.0.1:1".parse().unwrap())];
    let mut hello = hello_from(&nodes, 2, 1);
    for uid in [None, Some(u64::MAX)] {
        hello.cluster_uid = uid;
        let bytes = frame_bytes(|o| frame::put_hello(o, &hello));
        let (kind, body, _) = frame::split(&bytes).unwrap().unwrap();
        assert_eq!(kind, FrameKind::Hello);
        assert_eq!(frame::parse_hello(body).unwrap(), hello);
        let version = u16::from_be_bytes([body[4], body[5]]);
        assert_eq!(version, if uid.is_some() { 2 } else { 1 });
    }
}

#[test]
fn an_oversized_frame_closes_the_link() {
    let (mut net, nodes, mut raw) = lone_node_and_raw_peer();
    let hello = hello_from(&nodes, 2, 1);
    raw.write_all(&frame_bytes(|o| frame::put_hello(o, &hello)))
        .unwrap();
    net.run_until("HELLO accepted", |n| n.node(1).hello(2).is_some());
    // Only the length and kind: the link must close without waiting for 2 MiB of body.
    let mut big = ((FRAME_BYTES_MAX + 1) as u32).to_be_bytes().to_vec();
    big.push(FrameKind::Raft as u8);
    raw.write_all(&big).unwrap();
    net.run_until("link closed", |n| {
        n.node(1).counters(2).unwrap().refused == 1
    });
    assert_closed(&mut raw);
    assert!(net.messages(1).is_empty());

    // The largest allowed length is waited for, not refused.
    let mut raw = StdStream::connect(nodes[0].1).unwrap();
    raw.write_all(&frame_bytes(|o| frame::put_hello(o, &hello)))
        .unwrap();
    let mut max = (FRAME_BYTES_MAX as u32).to_be_bytes().to_vec();
    max.push(FrameKind::Raft as u8);
    raw.write_all(&max).unwrap();
    net.run_until("second HELLO accepted", |n| {
        n.node(1).counters(2).unwrap().frames_in == 2
    });
    for _ in 0..20 {
        net.turn();
    }
    assert_eq!(net.node(1).counters(2).unwrap().refused, 1);
}

#[test]
fn frames_split_across_reads_are_put_back_together() {
    let (mut net, nodes, mut raw) = lone_node_and_raw_peer();
    let mut bytes = frame_bytes(|o| frame::put_hello(o, &hello_from(&nodes, 2, 1)));
    let first = bytes.len();
    frame::put_raft(&mut bytes, &message(2, 1, b"one")).unwrap();
    let second = bytes.len();
    frame::put_raft(&mut bytes, &message(2, 1, b"two")).unwrap();
    for (i, chunk) in bytes.chunks(3).enumerate() {
        raw.write_all(chunk).unwrap();
        let written = (i + 1) * 3;
        // Wait until node 1 read what was written, then check it handled no more.
        net.run_until("chunk read", |n| {
            let c = n.node(1).totals();
            c.bytes_in as usize >= written.min(bytes.len()) || (written < first && c.refused == 0)
        });
        for _ in 0..2 {
            net.turn();
        }
        let got = net.messages(1).len();
        let want = usize::from(written >= second) + usize::from(written >= bytes.len());
        assert_eq!(got, want, "after {written} of {} bytes", bytes.len());
        assert_eq!(net.node(1).hello(2).is_some(), written >= first);
    }
    let data: Vec<Vec<u8>> = net
        .messages(1)
        .iter()
        .map(|m| m.entries[0].data.to_vec())
        .collect();
    assert_eq!(data, vec![b"one".to_vec(), b"two".to_vec()]);
}

/// A socket bound to a loopback port but not listening: dials to it are refused until
/// `listen` turns it into the listener of a node that comes up.
fn bound_not_listening() -> (rustix::fd::OwnedFd, SocketAddr) {
    use rustix::net::{AddressFamily, SocketType};
    let socket = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    rustix::net::bind(&socket, &any).unwrap();
    let addr = rustix::net::getsockname(&socket).unwrap();
    (socket, SocketAddr::try_from(addr).unwrap())
}

/// Node 1 running on a clock that stands still at 0, and node 2's port, bound but not
/// listening yet (its dials are refused).
fn node_1_with_node_2_down() -> (Net, rustix::fd::OwnedFd, Vec<(u8, SocketAddr)>) {
    let l1 = loopback();
    let (socket2, addr2) = bound_not_listening();
    let nodes = vec![(1, l1.local_addr().unwrap()), (2, addr2)];
    let mut net = Net::new(2);
    net.fake_now_ms = Some(0);
    net.start(1, l1, &nodes);
    (net, socket2, nodes)
}

#[test]
fn a_peer_that_is_down_is_redialled_with_backoff_and_messages_flow_once_it_is_up() {
    let (mut net, socket2, nodes) = node_1_with_node_2_down();
    assert_eq!(net.node(1).next_deadline_ms(), Some(0), "dials at once");
    let mut now = 0;
    for (dial, gap) in [50, 100, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
        net.turn();
        assert_eq!(net.node(1).counters(2).unwrap().dials, dial as u64 + 1);
        // Refused: the HELLO queued at the dial is gone and the redial is `gap` away.
        net.run_until("dial refused", |n| {
            let p = n.node(1);
            p.output_bytes(2) == Some(0) && p.next_deadline_ms() == Some(now + gap)
        });
        now += gap;
        let peers = net.nodes[0].as_mut().unwrap();
        peers.on_timer(net.poll.registry(), now - 1, &mut net.seen[0]);
        assert_eq!(
            peers.counters(2).unwrap().dials,
            dial as u64 + 1,
            "not before"
        );
        net.fake_now_ms = Some(now);
    }
    assert_eq!(
        net.node(1).send(&message(1, 2, b"lost")),
        Err(Dropped::LinkDown)
    );
    assert_eq!(net.node(1).counters(2).unwrap().drops, 1);

    rustix::net::listen(&socket2, 16).unwrap();
    net.start(2, StdListener::from(socket2), &nodes);
    net.run_until("both up", |n| all_up(n, &[1, 2]));
    net.node(1).send(&message(1, 2, b"to 2")).unwrap();
    net.node(2).send(&message(2, 1, b"to 1")).unwrap();
    net.run_until("both delivered", |n| {
        n.messages(1).len() == 1 && n.messages(2).len() == 1
    });
    assert_eq!(
        net.messages(2)[0].entries[0].data.to_vec(),
        b"to 2".to_vec()
    );
    assert_eq!(
        net.messages(1)[0].entries[0].data.to_vec(),
        b"to 1".to_vec()
    );
}

#[test]
fn output_past_the_cap_is_dropped_and_reported() {
    let l1 = loopback();
    // Node 2 is a listener nobody accepts from: the kernel completes the handshake,
    // then its buffers fill and node 1's output stays queued.
    let stuck = loopback();
    let nodes = vec![
        (1, l1.local_addr().unwrap()),
        (2, stuck.local_addr().unwrap()),
    ];
    let mut net = Net::new(1);
    net.start(1, l1, &nodes);
    net.run_until("connected", |n| {
        n.node(1).counters(2).unwrap().connects == 1
    });
    let big = vec![7u8; 256 * 1024];
    let mut dropped = None;
    for sent in 0..400 {
        match net.node(1).send(&message(1, 2, &big)) {
            Ok(()) => net.turn(),
            Err(e) => {
                dropped = Some((sent, e));
                break;
            }
        }
    }
    let (sent, why) = dropped.expect("a send past the cap is dropped");
    assert_eq!(why, Dropped::OutputFull);
    assert!(
        sent >= OUTPUT_BYTES_MAX / big.len(),
        "only {sent} sends before the cap"
    );
    let queued = net.node(1).output_bytes(2).unwrap();
    assert!(queued <= OUTPUT_BYTES_MAX && queued + big.len() > OUTPUT_BYTES_MAX - 4096);
    assert_eq!(net.node(1).counters(2).unwrap().drops, 1);
    // A small message still fits, since the cap is on bytes.
    assert_eq!(net.node(1).send(&message(1, 2, b"")), Ok(()));
    drop(stuck);
}

#[test]
fn frames_round_trip_and_the_cluster_id_depends_on_the_peers_only() {
    let nodes: Vec<(u8, SocketAddr)> = vec![
        (2, "10.0.0.2:7413".parse().unwrap()),
        (1, "10.0.0.1:7413".parse().unwrap()),
    ];
    let mut sorted = nodes.clone();
    sorted.sort();
    assert_eq!(cluster_id(&nodes), cluster_id(&sorted));
    let mut moved = sorted.clone();
    moved[1].1 = "10.0.0.3:7413".parse().unwrap();
    assert_ne!(cluster_id(&sorted), cluster_id(&moved));

    let mut hello = hello_from(&nodes, 1, 2);
    hello.admin_addr = Some("[::1]:9000".parse().unwrap());
    let mut bytes = frame_bytes(|o| frame::put_hello(o, &hello));
    let msg = message(1, 2, b"payload");
    frame::put_raft(&mut bytes, &msg).unwrap();
    for cut in 0..bytes.len() {
        let partial = &bytes[..cut];
        if let Some((_, _, used)) = frame::split(partial).unwrap() {
            assert!(used <= cut);
        }
    }
    let (kind, body, used) = frame::split(&bytes).unwrap().unwrap();
    assert_eq!(
        (kind, frame::parse_hello(body).unwrap()),
        (FrameKind::Hello, hello)
    );
    let (kind, body, rest) = frame::split(&bytes[used..]).unwrap().unwrap();
    assert_eq!(
        (kind, frame::parse_raft(body).unwrap()),
        (FrameKind::Raft, msg.clone())
    );
    assert_eq!(used + rest, bytes.len());
    assert_eq!(frame::raft_frame_bytes(&msg), rest);
    assert!(frame::split(&[0, 0, 0, 0, 2]).is_err());
    assert!(frame::split(&[0, 0, 0, 1, 9]).is_err());
}

/// A field number no `eraftpb` message has: what a peer sends there is an unknown field.
const UNKNOWN_FIELD: u64 = 100;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `inner` as the length-delimited field `field`: how a nested message is encoded.
fn nested(field: u64, inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, field << 3 | 2);
    put_varint(&mut out, inner.len() as u64);
    out.extend_from_slice(inner);
    out
}

/// `depth` unknown groups, each inside the one before (start-group tags, then as many
/// end-group tags): 4 bytes a level, so one frame under the cap nests 400,000 deep.
fn nested_groups(depth: usize) -> Vec<u8> {
    let (mut start, mut end) = (Vec::new(), Vec::new());
    put_varint(&mut start, UNKNOWN_FIELD << 3 | 3);
    put_varint(&mut end, UNKNOWN_FIELD << 3 | 4);
    let mut out = start.repeat(depth);
    out.extend(end.repeat(depth));
    out
}

/// RUSTSEC-2024-0437 (docs/REPLICATION.md §11): protobuf 3.x before 3.7.2 skips an
/// unknown group by recursing into each group inside it, a stack frame a level, so
/// 400,000 levels overflow the stack and abort the process. protobuf 2.28 (raft 0.7 pins 2.x) skips
/// one level of group and refuses a group inside it: these frames keep that true, so an
/// upgrade that brings the recursion back crashes this test rather than a node.
#[test]
fn deeply_nested_unknown_groups_are_refused_without_recursing() {
    let deep = nested_groups(400_000);
    let mut valid = Vec::new();
    frame::put_raft(&mut valid, &message(2, 1, b"x")).unwrap();
    let valid = &valid[LENGTH_BYTES + 1..];
    // At the top of the message, in an entry, and in the deepest message the schema has
    // (Message.snapshot.metadata.conf_state): wherever unknown fields are skipped.
    let in_entry = [valid, &nested(7, &deep)].concat();
    let in_conf_state = [valid, &nested(9, &nested(2, &nested(1, &deep)))].concat();
    for (place, body) in [
        ("top", &deep),
        ("entry", &in_entry),
        ("conf_state", &in_conf_state),
    ] {
        assert!(
            body.len() < FRAME_BYTES_MAX,
            "{place}: {} bytes",
            body.len()
        );
        let err = frame::parse_raft(body).expect_err(place);
        assert_eq!(
            err.to_string(),
            "bad RAFT frame: unexpected wire type",
            "{place}"
        );
    }
    // One level of unknown group is legal protobuf and is skipped, not refused.
    let mut one = valid.to_vec();
    one.extend(nested_groups(1));
    assert_eq!(frame::parse_raft(&one).unwrap(), message(2, 1, b"x"));

    // Over a link: refused, closed, nothing handed to raft.
    let (mut net, nodes, mut raw) = lone_node_and_raw_peer();
    let mut bytes = frame_bytes(|o| frame::put_hello(o, &hello_from(&nodes, 2, 1)));
    bytes.extend(((deep.len() + 1) as u32).to_be_bytes());
    bytes.push(FrameKind::Raft as u8);
    bytes.extend(&deep);
    raw.write_all(&bytes).unwrap();
    net.run_until("frame refused", |n| {
        n.node(1).counters(2).is_some_and(|c| c.refused == 1)
    });
    assert_closed(&mut raw);
    assert!(net.messages(1).is_empty());
}

#[test]
fn busy_links_keep_their_buffers_and_idle_ones_give_them_back() {
    let listeners: Vec<StdListener> = (0..2).map(|_| loopback()).collect();
    let nodes: Vec<(u8, SocketAddr)> = (listeners.iter().enumerate())
        .map(|(i, l)| (i as u8 + 1, l.local_addr().unwrap()))
        .collect();
    let mut net = Net::new(2);
    net.fake_now_ms = Some(0);
    for (i, l) in listeners.into_iter().enumerate() {
        net.start(i as u8 + 1, l, &nodes);
    }
    net.run_until("both up", |n| all_up(n, &[1, 2]));
    let big = vec![7u8; 4 * IDLE_CAPACITY_MAX_BYTES];
    net.node(1).send(&message(1, 2, &big)).unwrap();
    net.run_until("the big one arrived", |n| n.messages(2).len() == 1);
    // Still busy: an append a pass later must not grow the buffers from nothing again.
    net.node(1).send(&message(1, 2, b"small")).unwrap();
    net.run_until("the small one arrived", |n| n.messages(2).len() == 2);
    let (out, _) = net.node(1).buffer_capacities(2);
    let (_, input) = net.node(2).buffer_capacities(1);
    assert!(
        out > IDLE_CAPACITY_MAX_BYTES,
        "output cut back while busy: {out}"
    );
    assert!(
        input > IDLE_CAPACITY_MAX_BYTES,
        "input cut back while busy: {input}"
    );
    // A second later, small traffic gives the room back.
    net.fake_now_ms = Some(BUFFER_SHRINK_AFTER_MS + 1);
    net.node(1).send(&message(1, 2, b"later")).unwrap();
    net.run_until("the later one arrived", |n| n.messages(2).len() == 3);
    let (out, _) = net.node(1).buffer_capacities(2);
    let (_, input) = net.node(2).buffer_capacities(1);
    assert!(out <= IDLE_CAPACITY_MAX_BYTES, "output kept idle: {out}");
    assert!(input <= IDLE_CAPACITY_MAX_BYTES, "input kept idle: {input}");
}

#[test]
fn a_peer_that_dials_in_is_dialled_back_at_once_not_after_the_backoff() {
    let (mut net, socket2, nodes) = node_1_with_node_2_down();
    net.turn();
    net.run_until("the first dial refused", |n| {
        n.node(1).next_deadline_ms() == Some(BACKOFF_MIN_MS)
    });
    // Node 2 comes up while node 1 waits out its backoff (the clock stands still).
    rustix::net::listen(&socket2, 16).unwrap();
    net.start(2, StdListener::from(socket2), &nodes);
    net.run_until("both up before the backoff ran out", |n| all_up(n, &[1, 2]));
    assert_eq!(net.node(1).counters(2).unwrap().dials, 2);
}
