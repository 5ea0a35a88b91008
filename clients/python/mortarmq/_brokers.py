"""Which broker of a cluster a Producer or Consumer talks to: the addresses it was given,
the leader a NOT_LEADER named, and where to go next when a node cannot serve
(man/mortarmq.7, REPLICATION). The same rules as the Rust client's
src/client/brokers.rs.

No I/O here: the client asks Brokers for the order to dial in and tells it what a broker
answered. A single address is the one-address case, where it changes nothing.
"""

from ._conn import leader_address, parse_address

# The spec's backoff while a cluster has no leader able to serve (LEADER_UNKNOWN,
# ELECTION_TIMEOUT and the other 0x6xxx codes below): 50 ms doubling to 2 s.
CLUSTER_BACKOFF_FIRST_SECONDS = 0.05
CLUSTER_BACKOFF_MAX_SECONDS = 2.0
# NOT_LEADER redirects followed in a row without a served answer, beyond the number of
# known addresses, after which each further one backs off: two nodes naming each other
# while an election settles are not bounced between at full speed.
FREE_HOPS_EXTRA = 1

# What to do about a broker after one of its ERRs.
STAY = "stay"  # the connection can serve, or the error is not about the cluster
MOVE_ON = "move_on"  # no leader here able to serve: back off, try the next address

# The codes of a node that cannot serve now; NOT_LEADER without a usable leader joins
# them. Each is retryable in the registry (man/mortarmq.7, ERRORS).
_MOVE_ON = frozenset((
    "LEADER_UNKNOWN", "ELECTION_TIMEOUT", "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "REPLICATION_TIMEOUT", "LOG_TRUNCATED",
    "SNAPSHOT_IN_PROGRESS", "REPLICA_NOT_IN_SYNC", "PEER_UNREACHABLE",
))


def route(err):
    """STAY, MOVE_ON, or ("follow", (host, port)) for a NOT_LEADER naming the leader."""
    name = getattr(err, "name", None)
    if name == "NOT_LEADER":
        leader = leader_address(err)
        if leader is None:
            return MOVE_ON
        try:
            return ("follow", parse_address(leader))
        except ValueError:
            return MOVE_ON
    return MOVE_ON if name in _MOVE_ON else STAY


def cluster_backoff(n):
    """The ``n``-th (0-based) wait of the cluster backoff, in seconds."""
    return min(CLUSTER_BACKOFF_MAX_SECONDS, CLUSTER_BACKOFF_FIRST_SECONDS * 2 ** min(n, 16))


def parse_brokers(address):
    """The bootstrap list: one "host:port", a comma-separated string of them, or a list
    (or tuple) of addresses; each as (host, port), duplicates dropped, order kept."""
    if isinstance(address, str):
        parts = [p.strip() for p in address.split(",")]
    elif isinstance(address, tuple) and len(address) == 2 and isinstance(address[1], int):
        parts = [address]  # one (host, port), as parse_address takes it
    else:
        parts = list(address)
    known = []
    for part in parts:
        if part == "" or part is None:
            raise ValueError("broker list %r: an empty address" % (address,))
        a = parse_address(part)
        if a not in known:
            known.append(a)
    if not known:
        raise ValueError("no broker address")
    return known


class Brokers:
    """The addresses a client knows and the order to dial them in."""

    def __init__(self, known):
        self.known = list(known)  # given at build time, then every leader named
        self.leader = None  # the leader last named: dialled first
        self.next = 0  # where in ``known`` the next dial starts with no leader named
        self.current = None  # the address of the current (or last) connection
        self.hops = 0  # redirects followed since a broker last served a request

    def order(self):
        """Every known address, the named leader first, then from ``next`` on, round."""
        order = [self.leader] if self.leader is not None else []
        n = len(self.known)
        for i in range(n):
            a = self.known[(self.next + i) % n]
            if a not in order:
                order.append(a)
        return order

    def connected(self, addr):
        self.current = addr
        if addr in self.known:
            self.next = self.known.index(addr)

    def served(self):
        """A broker served a request: redirects start counting afresh."""
        self.hops = 0

    def take(self, how):
        """Applies a route; returns how many cluster backoffs to wait before the next
        try (None: none)."""
        if how == STAY:
            return None
        if how == MOVE_ON:
            self.move_on()
            return None
        leader = how[1]
        if leader not in self.known:
            self.known.append(leader)
        self.leader = leader
        self.hops += 1
        free = len(self.known) + FREE_HOPS_EXTRA
        return self.hops - free - 1 if self.hops > free else None

    def move_on(self):
        """The current broker is gone or cannot serve: forget the leader named and start
        the next dial after it."""
        self.leader = None
        n = max(len(self.known), 1)
        at = self.known.index(self.current) if self.current in self.known else self.next
        self.next = (at + 1) % n

    def rotate(self):
        """No address answered: forget the leader named, and start the next round one
        address further on (so a node that accepts but never answers is not always the
        first one waited on)."""
        self.current = None
        self.move_on()
