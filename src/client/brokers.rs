//! Which broker of a cluster a [`Producer`](super::Producer) or
//! [`Consumer`](super::Consumer) talks to: the addresses it was given, the leader a
//! NOT_LEADER named, and where to go next when a node cannot serve
//! (`man/mortarmq.7`, REPLICATION; `docs/REPLICATION.md` §7.1).
//!
//! A sans-IO state machine: the client asks it for the order to dial in, and tells it
//! what a broker answered. A single broker is the one-address case, where it changes
//! nothing.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::wire::ErrorCode;

use super::error::{Error, Result};

/// The spec's backoff for LEADER_UNKNOWN and ELECTION_TIMEOUT (and the other codes of
/// a cluster without a leader able to serve): 50 ms, doubling, capped at 2 s.
pub(crate) const CLUSTER_BACKOFF_FIRST: Duration = Duration::from_millis(50);
pub(crate) const CLUSTER_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// NOT_LEADER redirects followed in a row without an answer served, beyond the number
/// of known addresses, after which each further one backs off: two nodes that each
/// name the other while an election settles must not be bounced between at full speed.
const FREE_HOPS_EXTRA: usize = 1;

/// What to do about the broker after one of its ERRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// Stay: the connection can serve (or the error is not about the cluster).
    Stay,
    /// NOT_LEADER named the leader: connect there next, at once.
    Follow(SocketAddr),
    /// This node cannot serve now (no leader, or it lost its role): back off, then try
    /// the next known address.
    MoveOn,
}

/// The route an ERR calls for. NOT_LEADER whose text is not `leader <id> <host:port>`
/// (or names an address that does not resolve) moves on like LEADER_UNKNOWN.
pub(crate) fn route(err: &Error) -> Route {
    let Error::Broker { code, message, .. } = err else {
        return Route::Stay;
    };
    match code {
        ErrorCode::NotLeader => leader_address(message).map_or(Route::MoveOn, Route::Follow),
        ErrorCode::LeaderUnknown
        | ErrorCode::ElectionTimeout
        | ErrorCode::NotEnoughReplicas
        | ErrorCode::NotEnoughReplicasAfterAppend
        | ErrorCode::ReplicationTimeout
        | ErrorCode::LogTruncated
        | ErrorCode::SnapshotInProgress
        | ErrorCode::ReplicaNotInSync
        | ErrorCode::PeerUnreachable => Route::MoveOn,
        _ => Route::Stay,
    }
}

/// The leader's client address in NOT_LEADER's text, exactly `leader <id> <host:port>`.
pub(crate) fn leader_address(text: &str) -> Option<SocketAddr> {
    let mut words = text.split(' ');
    if words.next()? != "leader" {
        return None;
    }
    words.next()?.parse::<u8>().ok()?;
    let addr = words.next()?;
    if words.next().is_some() {
        return None;
    }
    addr.to_socket_addrs().ok()?.next()
}

/// The `n`-th (0-based) wait of the cluster backoff.
pub(crate) fn cluster_backoff(n: u32) -> Duration {
    CLUSTER_BACKOFF_FIRST
        .saturating_mul(1 << n.min(16))
        .min(CLUSTER_BACKOFF_MAX)
}

/// Parses a comma-separated list of broker addresses (`host:port,host:port`), each
/// resolved now: the bootstrap list of a cluster, for
/// [`Producer::builder`](super::Producer::builder) and
/// [`Consumer::builder`](super::Consumer::builder) as a slice.
///
/// ```
/// use mortarmq::client::resolve_brokers;
///
/// let brokers = resolve_brokers("127.0.0.1:7411, 127.0.0.1:7412,127.0.0.1:7413")?;
/// assert_eq!(brokers.len(), 3);
/// // mortarmq::client::Producer::builder(&brokers[..]).connect()?;
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub fn resolve_brokers(list: &str) -> Result<Vec<SocketAddr>> {
    let mut all = Vec::new();
    for part in list.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(Error::InvalidInput(format!(
                "broker list {list:?}: an empty address"
            )));
        }
        let found = part
            .to_socket_addrs()
            .map_err(|e| Error::InvalidInput(format!("broker address {part}: {e}")))?;
        for a in found {
            if !all.contains(&a) {
                all.push(a);
            }
        }
    }
    Ok(all)
}

/// The addresses a client knows and the order to dial them in.
#[derive(Debug, Clone)]
pub(crate) struct Brokers {
    /// Given at build time, then every leader a NOT_LEADER named.
    known: Vec<SocketAddr>,
    /// The leader last named: dialled first.
    leader: Option<SocketAddr>,
    /// Where in `known` the next dial starts when no leader is named.
    next: usize,
    /// The address of the current (or last) connection.
    current: Option<SocketAddr>,
    /// Redirects followed since a broker last served a request.
    hops: usize,
}

impl Brokers {
    pub fn new(known: Vec<SocketAddr>) -> Brokers {
        Brokers {
            known,
            leader: None,
            next: 0,
            current: None,
            hops: 0,
        }
    }

    /// Every known address, the named leader first, then from `next` on, round.
    pub fn order(&self) -> Vec<SocketAddr> {
        let n = self.known.len();
        let mut order: Vec<SocketAddr> = self.leader.into_iter().collect();
        for i in 0..n {
            let a = self.known[(self.next + i) % n];
            if !order.contains(&a) {
                order.push(a);
            }
        }
        order
    }

    /// A connection to `addr` is open.
    pub fn connected(&mut self, addr: Option<SocketAddr>) {
        self.current = addr;
        if let Some(i) = addr.and_then(|a| self.known.iter().position(|k| *k == a)) {
            self.next = i;
        }
    }

    /// A broker served a request: redirects start counting afresh.
    pub fn served(&mut self) {
        self.hops = 0;
    }

    /// Applies `route`; returns how many cluster backoffs the client should wait before
    /// its next try (`None`: none).
    pub fn take(&mut self, route: &Route) -> Option<u32> {
        match route {
            Route::Stay => None,
            Route::Follow(leader) => {
                if !self.known.contains(leader) {
                    self.known.push(*leader);
                }
                self.leader = Some(*leader);
                self.hops += 1;
                let free = self.known.len() + FREE_HOPS_EXTRA;
                (self.hops > free).then(|| (self.hops - free - 1) as u32)
            }
            Route::MoveOn => {
                self.move_on();
                None
            }
        }
    }

    /// The current broker is gone or cannot serve: forget the leader named and start
    /// the next dial after it.
    pub fn move_on(&mut self) {
        self.leader = None;
        let n = self.known.len().max(1);
        let at = self
            .current
            .and_then(|c| self.known.iter().position(|k| *k == c))
            .unwrap_or(self.next);
        self.next = (at + 1) % n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn not_leader(text: &str) -> Error {
        Error::from_err(0x6001, 3, text.as_bytes())
    }

    #[test]
    fn not_leader_names_the_address_to_follow() {
        assert_eq!(
            route(&not_leader("leader 2 127.0.0.1:7412")),
            Route::Follow(addr(7412))
        );
        for bad in [
            "",
            "leader",
            "leader x 127.0.0.1:1",
            "leader 2",
            "leader 2 a:b c",
        ] {
            assert_eq!(route(&not_leader(bad)), Route::MoveOn, "{bad:?}");
        }
        assert_eq!(route(&Error::from_err(0x6002, 3, b"")), Route::MoveOn);
        assert_eq!(route(&Error::from_err(0x600C, 3, b"")), Route::MoveOn);
        assert_eq!(route(&Error::from_err(0x6006, 3, b"")), Route::MoveOn);
        assert_eq!(route(&Error::from_err(0x4001, 3, b"")), Route::Stay);
        assert_eq!(route(&Error::Timeout("x".into())), Route::Stay);
    }

    #[test]
    fn the_named_leader_is_dialled_first_and_learnt() {
        let mut b = Brokers::new(vec![addr(1), addr(2)]);
        b.connected(Some(addr(1)));
        assert_eq!(b.take(&Route::Follow(addr(3))), None);
        assert_eq!(b.order(), vec![addr(3), addr(1), addr(2)]);
        b.connected(Some(addr(3)));
        // The leader died: the next known address after it, the leader forgotten.
        b.move_on();
        assert_eq!(b.order(), vec![addr(1), addr(2), addr(3)]);
    }

    #[test]
    fn moving_on_tries_the_next_address_round() {
        let mut b = Brokers::new(vec![addr(1), addr(2), addr(3)]);
        b.connected(Some(addr(2)));
        b.move_on();
        assert_eq!(b.order(), vec![addr(3), addr(1), addr(2)]);
        b.connected(Some(addr(3)));
        b.move_on();
        assert_eq!(b.order()[0], addr(1));
        let mut single = Brokers::new(vec![addr(1)]);
        single.move_on();
        assert_eq!(single.order(), vec![addr(1)]);
    }

    #[test]
    fn redirects_in_a_row_back_off_until_one_is_served() {
        let mut b = Brokers::new(vec![addr(1), addr(2), addr(3)]);
        let free = 3 + FREE_HOPS_EXTRA;
        for _ in 0..free {
            assert_eq!(b.take(&Route::Follow(addr(2))), None);
        }
        assert_eq!(b.take(&Route::Follow(addr(1))), Some(0));
        assert_eq!(b.take(&Route::Follow(addr(2))), Some(1));
        b.served();
        assert_eq!(b.take(&Route::Follow(addr(2))), None);
    }

    #[test]
    fn cluster_backoff_is_the_specs() {
        let waits: Vec<u64> = (0..7)
            .map(|n| cluster_backoff(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 2000]);
    }

    #[test]
    fn a_broker_list_is_split_on_commas() {
        let list = resolve_brokers("127.0.0.1:1, 127.0.0.1:2,127.0.0.1:1").unwrap();
        assert_eq!(list, vec![addr(1), addr(2)]);
        assert!(resolve_brokers("127.0.0.1:1,").is_err());
        assert!(resolve_brokers("nonsense").is_err());
    }
}
