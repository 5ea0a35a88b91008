"""Producer: publishes records, pipelined, idempotent by default, and survives
retryable errors and broker restarts without losing or doubling a record.

Idempotence (man/mortarmq.7, PUB): every record carries this producer's random
producer_id and a producer_seq that is last + 1 per partition. The broker answers a
resend of a (producer_id, producer_seq) it already appended with the original sequence
(flag deduplicated), so a record whose outcome is unknown (connection lost, INTERNAL_ERROR)
is simply resent with the same pair. A record the broker refused for good leaves a hole
in the partition's producer_seqs; every later record of that partition is then refused
SEQUENCE_OUT_OF_ORDER without being appended, so those are renumbered and resent.
"""

import collections
import random
import struct
import threading
import time
import zlib

from . import wire
from ._brokers import MOVE_ON, STAY, Brokers, cluster_backoff, parse_brokers, route
from ._conn import check_answer, connect_first
from .errors import MortarError, ProtocolError

Receipt = collections.namedtuple(
    "Receipt", "sequence durability leader_epoch commit_seq deduplicated partition")
Receipt.__doc__ = """What the broker answered a publish: the record's sequence in its
partition, the Durability reached, the broker's leader_epoch and commit_seq, whether it
was a resend the broker had already appended (deduplicated), and the partition."""

# OK answering PUB: request_op, result_len, then the 26-byte result.
_OK_PUB = struct.Struct(">BIQBQQB")
_DURABILITY = {int(d): d for d in wire.Durability}
_DEDUPLICATED = int(wire.PubResultFlags.DEDUPLICATED)

BACKOFF_FIRST = 0.01  # the registry's advice for BACKPRESSURE: 10 ms doubling to 1 s
BACKOFF_MAX = 1.0
WRITE_BATCH_BYTES = 256 * 1024


def new_producer_id():
    # Non-zero (0 means "not idempotent") and 63 bits, so it is also a valid signed i64
    # for tools that store it.
    return random.SystemRandom().randrange(1, 1 << 63)


def as_bytes(value, what):
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError("%s must be bytes or str, not %s" % (what, type(value).__name__))


def durability_flags(durability):
    if durability is None:
        return 0
    if isinstance(durability, str):
        try:
            return int(wire.DURABILITY_NAMES[durability])
        except KeyError:
            raise ValueError("durability must be None, %s, not %r"
                             % (", ".join(map(repr, wire.DURABILITY_NAMES)), durability)) from None
    return int(wire.Durability(durability))


def _backoff_wait(rec):
    """How long ``rec`` asks to wait before it is resent, in seconds."""
    if not rec.backoffs:
        return 0.0
    if rec.error is not None and route(rec.error) == MOVE_ON:
        return cluster_backoff(rec.backoffs - 1)
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (rec.backoffs - 1))


def partition_for(key, partition_count):
    """mortarctl pub's choice: crc32 of the key modulo the partition count; no key is
    partition 0."""
    if not key:
        return 0
    return zlib.crc32(key) % max(partition_count, 1)


class PublishHandle:
    """The future outcome of one ``Producer.send``."""

    __slots__ = ("_producer", "_receipt", "_error")

    def __init__(self, producer):
        self._producer = producer
        self._receipt = None
        self._error = None

    def done(self):
        return self._receipt is not None or self._error is not None

    def result(self, timeout=None):
        """The Receipt, once the broker answered; raises the MortarError (or
        ConnectionError) the record failed with, or TimeoutError after ``timeout``."""
        if not self.done():
            self._producer._wait(self.done, timeout)
        if self._error is not None:
            raise self._error
        return self._receipt

    def exception(self, timeout=None):
        if not self.done():
            self._producer._wait(self.done, timeout)
        return self._error


class _Record:
    __slots__ = ("topic_id", "partition", "flags", "key", "value", "handle", "pid", "seq",
                 "order", "renumber", "backoffs", "first_sent", "error")

    def __init__(self, topic_id, partition, flags, key, value, handle):
        self.topic_id = topic_id
        self.partition = partition
        self.flags = flags
        self.key = key
        self.value = value
        self.handle = handle
        self.pid = 0
        self.seq = 0
        self.order = None  # first-send order, kept across resends
        self.renumber = False  # definitely not appended, behind a hole: take a fresh seq
        self.backoffs = 0
        self.first_sent = None
        self.error = None


class Producer:
    """Publishes to a broker at ``address`` ("host:port"), or to a cluster given as a
    list of its nodes' addresses (a list, or one string "host:port,host:port,...").
    A node that does not lead answers NOT_LEADER naming the leader, where the producer
    goes; while no leader can serve it backs off (50 ms doubling to 2 s) and tries the
    next address, and a node that is down is passed over (man/mortarmq.7, REPLICATION).

    ``durability`` is the default for publishes (None: the broker's --durability;
    "written", "fsync" or "replicated"). With ``declare=True`` a topic that does not
    exist is created with ``partitions`` partitions on first use. ``max_in_flight``
    bounds unanswered publishes; ``retry_timeout`` bounds how long a record is retried
    (and the broker looked for after a connection loss) before its handle fails.
    ``idempotent=False`` sends producer_id 0: a resend could then be appended twice, so
    records whose outcome a connection loss made unknown fail with ConnectionError.

    One Producer may be shared by threads; calls are serialised.
    """

    def __init__(self, address="127.0.0.1:7411", token=b"", timeout=10.0, durability=None,
                 idempotent=True, declare=False, partitions=1, max_in_flight=256,
                 retry_timeout=30.0):
        if not 1 <= max_in_flight <= wire.DEDUP_WINDOW_SEQS:
            # Beyond the broker's dedup window a resend after a reconnect could be
            # too old to be recognised.
            raise ValueError("max_in_flight must be 1..%d" % wire.DEDUP_WINDOW_SEQS)
        self.address = address
        self._token = as_bytes(token, "token")
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self._durability = durability_flags(durability)
        self.idempotent = idempotent
        self._declare = declare
        self._partitions = partitions
        self._max_in_flight = max_in_flight
        self._lock = threading.RLock()
        self._topics = {}  # name -> (topic_id, partition_count)
        self._inflight = collections.deque()  # _Record, in the order sent
        self._retry = []  # _Record to send again, answered or lost
        self._must_drain = False  # a hole appeared: let in-flight records settle first
        self._wbuf = []
        self._wbuf_bytes = 0
        self._order = 0
        self._next_seq = {}  # (topic_id, partition) -> producer_seq of the next record
        self.producer_id = new_producer_id() if idempotent else 0
        self.reconnects = 0  # connections replaced after a loss
        self.resent = 0  # records sent again (after an ERR or a connection loss)
        self._closed = False
        # The addresses known and the order to dial them in; and where an ERR said to
        # go once the records in flight are answered (a route, or None).
        self._brokers = Brokers(parse_brokers(address))
        self._reroute = None
        self._conn = self._open()

    # ---- public API ------------------------------------------------------------------

    def publish(self, topic, value, key=b"", durability=None, partition=None):
        """Publishes one record and waits for the broker's answer: a Receipt, or the
        MortarError it failed with after the retries the registry allows."""
        return self.send(topic, value, key, durability, partition).result()

    def send(self, topic, value, key=b"", durability=None, partition=None):
        """Queues one record and returns its PublishHandle at once. Records are written
        in batches; ``flush()`` (or a handle's ``result()``) waits for the answers."""
        value = as_bytes(value, "value")
        key = as_bytes(key, "key")
        if len(key) > wire.MAX_KEY_LEN:
            raise ValueError("key is %d bytes, at most %d" % (len(key), wire.MAX_KEY_LEN))
        if len(value) > wire.MAX_VALUE_LEN:
            raise ValueError("value is %d bytes, at most %d" % (len(value), wire.MAX_VALUE_LEN))
        flags = self._durability if durability is None else durability_flags(durability)
        with self._lock:
            self._check_open()
            topic_id, count = self.topic(topic)
            if partition is None:
                partition = partition_for(key, count)
            elif not 0 <= partition < count:
                raise ValueError("partition %d: %r has %d partitions" % (partition, topic, count))
            handle = PublishHandle(self)
            rec = _Record(topic_id, partition, flags, key, value, handle)
            if len(self._inflight) >= self._max_in_flight:
                # Down to half the window, not one below it: the next half goes out
                # in one write rather than one write per record.
                self._pump(lambda: len(self._inflight) <= self._max_in_flight // 2)
            self._pump(self._ready_to_write)
            self._probe_if_idle()
            self._write(rec)
            if self._wbuf_bytes >= WRITE_BATCH_BYTES:
                self._flush_writes()
            return handle

    def flush(self, timeout=None):
        """Waits until every record sent so far is answered (its handle done)."""
        with self._lock:
            self._wait(lambda: not self._inflight and not self._retry, timeout)

    def topic(self, name):
        """(topic_id, partition_count) of a topic, looked up once with DECLARE PASSIVE
        (created first when the producer was made with declare=True). A ".dlq" name is
        its source's twin: the source's id + 1."""
        with self._lock:
            known = self._topics.get(name)
            if known is None:
                known = self._resolve(name)
                self._topics[name] = known
            return known

    def close(self, timeout=None):
        """Flushes, then closes the connection. Records still unanswered after
        ``timeout`` are left to their handles' errors."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._conn is not None or self._retry:
                    self.flush(timeout)
            finally:
                self._closed = True
                self._drop_connection()
                for rec in list(self._inflight) + self._retry:
                    self._fail(rec, ConnectionError("the producer was closed"))
                self._inflight.clear()
                self._retry = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # The exception on its way out says more than a failure to flush after it.
        try:
            self.close()
        except Exception:
            pass

    # ---- topics ----------------------------------------------------------------------

    def _resolve(self, name):
        if name.endswith(wire.DLQ_SUFFIX):
            # The broker refuses to DECLARE a twin (MUTATION_NOT_PACKABLE): it is
            # addressed through its source, whose id + 1 it always has.
            source_id, count = self.topic(name[:-len(wire.DLQ_SUFFIX)])
            return source_id + 1, count
        passive = wire.Declare(topic=name.encode(), partition_count=0,
                               flags=wire.DeclareFlags.PASSIVE)
        try:
            return self._declare_call(passive)
        except MortarError as e:
            if e.name != "UNKNOWN_TOPIC" or not self._declare:
                raise
        create = wire.Declare(topic=name.encode(), partition_count=self._partitions, flags=0)
        try:
            return self._declare_call(create)
        except MortarError as e:
            # Someone else created it meanwhile with another partition count: use theirs.
            if e.name != "TOPIC_CONFIG_CONFLICT":
                raise
            return self._declare_call(passive)

    def _declare_call(self, declare):
        ok = self._call(declare.encode(), wire.Op.DECLARE)
        result = wire.decode_result(wire.Op.DECLARE, ok.result)
        return result.topic_id, result.partition_count

    def _call(self, data, op):
        """One request on a quiet connection (nothing in flight), retried through
        reconnects and backoff errors until retry_timeout."""
        self._pump(lambda: self._conn is not None and not self._inflight and not self._retry)
        deadline = time.monotonic() + self.retry_timeout
        backoffs = 0
        while True:
            if self._conn is None:
                self._reconnect(deadline)
            try:
                ok = self._conn.request(data, op)
                self._brokers.served()
                return ok
            except MortarError as e:
                how = route(e)
                if e.closes_connection or how != STAY:
                    self._drop_connection()
                if e.retry == "no" or time.monotonic() >= deadline:
                    raise
                if how == MOVE_ON:
                    self._brokers.take(how)
                    time.sleep(cluster_backoff(backoffs))
                    backoffs += 1
                elif how != STAY:
                    # Straight to the leader it names (backing off only once redirects
                    # go round in circles).
                    n = self._brokers.take(how)
                    if n is not None:
                        time.sleep(cluster_backoff(n))
                else:
                    time.sleep(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** backoffs))
                    backoffs += 1
                continue
            except (OSError, ProtocolError):
                self._drop_connection()
                self._brokers.move_on()  # it may be gone: another is tried first
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** backoffs))
            backoffs += 1

    # ---- the pipeline ----------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ValueError("the producer is closed")

    def _ready_to_write(self):
        return (self._conn is not None and not self._retry and not self._must_drain
                and len(self._inflight) < self._max_in_flight)

    def _wait(self, done, timeout):
        with self._lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            self._pump(done, deadline)
            if not done():
                raise TimeoutError("not answered within %s s" % timeout)

    def _pump(self, done, deadline=None):
        """Works until ``done()``: writes, reads answers, reconnects, resends. Returns
        early only when ``deadline`` passes."""
        while not done():
            if self._conn is None:
                self._reconnect_or_fail()
            elif self._inflight:
                if not self._read_answer(deadline):
                    return
            elif self._retry:
                self._resend()
            elif self._must_drain:
                self._must_drain = False
            else:
                return

    def _probe_if_idle(self):
        # The broker closes a connection without a frame for 45 s. A PING after a quiet
        # spell finds that out before a record is written into a closed socket.
        conn = self._conn
        if (conn is not None and not self._inflight and not self._wbuf
                and time.monotonic() - conn.last_send > wire.KEEPALIVE_SECONDS):
            self._call(wire.Ping().encode(), wire.Op.PING)

    def _write(self, rec):
        if rec.order is None:
            rec.order = self._order
            self._order += 1
            rec.first_sent = time.monotonic()
        if self.idempotent and (rec.pid == 0 or rec.renumber):
            key = (rec.topic_id, rec.partition)
            rec.pid = self.producer_id
            rec.seq = self._next_seq.get(key, 1)
            self._next_seq[key] = rec.seq + 1
            rec.renumber = False
        frame = wire.encode_pub(rec.topic_id, rec.partition, rec.pid, rec.seq, rec.flags,
                                rec.key, rec.value)
        self._wbuf.append(frame)
        self._wbuf_bytes += len(frame)
        self._inflight.append(rec)

    def _flush_writes(self):
        if not self._wbuf:
            return
        data = b"".join(self._wbuf)
        self._wbuf = []
        self._wbuf_bytes = 0
        try:
            self._conn.send(data)
        except OSError:
            self._lost()

    def _read_answer(self, deadline):
        """Reads one answer and settles the oldest in-flight record with it. False when
        ``deadline`` passed first."""
        self._flush_writes()
        if self._conn is None:
            return True
        # A broker that answers nothing for `timeout` is treated as gone: the records
        # are resent (idempotently) on a new connection.
        broker_deadline = time.monotonic() + self.timeout
        wait = broker_deadline if deadline is None else min(deadline, broker_deadline)
        try:
            frame = self._conn.read_frame(wait)
            if frame is None:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                raise TimeoutError("no answer from the broker within %.1f s" % self.timeout)
            op, payload = frame
            rec = self._inflight[0]
            if op == wire.Op.OK and len(payload) >= _OK_PUB.size and payload[0] == wire.Op.PUB:
                # The common answer, decoded in one call; extra result bytes of a later
                # version are ignored.
                _, _, sequence, reached, leader_epoch, commit_seq, flags = \
                    _OK_PUB.unpack_from(payload)
            else:
                check_answer(wire.Op.PUB, op, payload)
                raise ProtocolError("an OK to PUB with a short result")
        except MortarError as e:
            self._inflight.popleft()
            self._refused(rec, e)
            return True
        except (OSError, ProtocolError):
            self._lost()
            return True
        self._inflight.popleft()
        self._brokers.served()
        self._succeed(rec, Receipt(sequence, _DURABILITY.get(reached, reached), leader_epoch,
                                   commit_seq, bool(flags & _DEDUPLICATED), rec.partition))
        return True

    def _refused(self, rec, err):
        """An ERR answering ``rec``: resend it, or fail it (and renumber what follows)."""
        rec.error = err
        how = route(err)
        if how not in (STAY, MOVE_ON):
            # Refused at the gate, not appended: resent as it is on the leader, once
            # the records in flight here are answered (they get NOT_LEADER too).
            self._reroute = how
            self._retry.append(rec)
            return
        if how == MOVE_ON and (err.retry == "backoff" or self.idempotent):
            # No leader here able to serve: the next node, after the cluster backoff.
            # An entry that may have been appended (REPLICATION_TIMEOUT and the like)
            # is resent with the same producer_seq there.
            self._reroute = how
            rec.backoffs += 1
            self._retry.append(rec)
            return
        if err.closes_connection:
            # The broker closes after this ERR and ran nothing after the frame: the
            # records behind it are lost with the connection and resent with it.
            if err.retry == "no":
                self._fail(rec, err)
                self._hole(rec)
            else:
                rec.backoffs += err.retry == "backoff"
                self._retry.append(rec)
            self._lost()
            return
        if err.name == "SEQUENCE_OUT_OF_ORDER" and (rec.renumber or self._behind_retry(rec)):
            # Refused only because an earlier record of the partition was: nothing was
            # appended, and it goes again in its place.
            self._retry.append(rec)
            return
        if err.retry == "backoff" or (err.retry == "idempotent" and self.idempotent):
            # INTERNAL_ERROR too waits before the resend: a broker whose disk failed
            # answers every resend the same way, and at full speed it is a storm.
            rec.backoffs += 1
            self._retry.append(rec)
            return
        if err.name in ("UNKNOWN_TOPIC", "UNKNOWN_PARTITION"):
            # The topic was deleted or recreated: look it up afresh next time.
            self._topics.clear()
        if err.name == "SEQUENCE_OUT_OF_ORDER":
            # The broker expects another seq than any this producer can explain (its
            # state was lost): start a new producer_id, as the registry advises.
            self.producer_id = new_producer_id()
            self._next_seq.clear()
        self._fail(rec, err)
        self._hole(rec)

    def _behind_retry(self, rec):
        return any(r.pid == rec.pid and r.topic_id == rec.topic_id and
                   r.partition == rec.partition and r.seq < rec.seq for r in self._retry)

    def _hole(self, failed):
        """``failed`` was not appended: its producer_seq is a hole the broker will never
        see filled, so every later record of the partition is refused until renumbered."""
        if not failed.pid or failed.renumber:
            return
        for rec in list(self._inflight) + self._retry:
            if (rec.pid == failed.pid and rec.topic_id == failed.topic_id and
                    rec.partition == failed.partition and rec.seq > failed.seq):
                rec.renumber = True
        key = (failed.topic_id, failed.partition)
        if failed.pid == self.producer_id and self._next_seq.get(key, 1) > failed.seq:
            self._next_seq[key] = failed.seq
        # New records wait until the doomed ones are answered, so they cannot overtake
        # them in the partition.
        self._must_drain = True

    def _resend(self):
        if self._reroute is not None:
            # Nothing is in flight here any more: go where the broker said. _pump
            # connects there, then resends.
            n = self._brokers.take(self._reroute)
            self._drop_connection()
            if n is not None:
                time.sleep(cluster_backoff(n))
            return
        recs = sorted(self._retry, key=lambda r: r.order)
        self._retry = []
        # Nothing is in flight: the resent records go out ahead of any new one.
        self._must_drain = False
        wait = max(_backoff_wait(r) for r in recs)
        if wait:
            time.sleep(wait)
        now = time.monotonic()
        for rec in recs:
            if rec.error is not None and now - rec.first_sent > self.retry_timeout:
                self._give_up(rec, rec.error)
                continue
            self.resent += 1
            self._write(rec)
        self._flush_writes()

    def _give_up(self, rec, err):
        self._fail(rec, err)
        if rec.renumber or (rec.error is not None and rec.error.retry == "backoff"):
            self._hole(rec)  # known not appended
        elif rec.pid and rec.pid == self.producer_id:
            # Maybe appended, maybe not: neither reusing nor skipping its seq is safe
            # under this producer_id, so later records take a new one.
            self.producer_id = new_producer_id()
            self._next_seq.clear()

    def _lost(self):
        """The connection is gone: what was in flight has an unknown outcome."""
        if self._reroute is not None:
            self._brokers.take(self._reroute)
        else:
            self._brokers.move_on()  # the broker may be gone: another is tried first
        self._drop_connection()
        pending = list(self._inflight)
        self._inflight.clear()
        for rec in pending:
            if self.idempotent:
                self._retry.append(rec)
            else:
                self._fail(rec, ConnectionError(
                    "connection lost before the broker answered (not idempotent: not resent)"))

    def _drop_connection(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._reroute = None
        self._wbuf = []
        self._wbuf_bytes = 0

    def _open(self):
        conn, addr = connect_first(self._brokers.order(), self._token, self.timeout)
        self._brokers.connected(addr)
        return conn

    def _reconnect(self, deadline):
        backoffs = 0
        while True:
            try:
                self._conn = self._open()
                self.reconnects += 1
                return
            except MortarError as e:
                if e.retry == "no" or time.monotonic() >= deadline:
                    raise
                last = e
            except OSError as e:
                last = e
                # Every address was tried: the leader named (if any) is gone too.
                self._brokers.rotate()
            if time.monotonic() >= deadline:
                raise ConnectionError("cannot reach the broker at %s within %.0f s: %s"
                                      % (self.address, self.retry_timeout, last))
            time.sleep(min(BACKOFF_MAX, 0.05 * 2 ** backoffs))
            backoffs += 1

    def _reconnect_or_fail(self):
        starts = [r.first_sent for r in self._retry if r.first_sent is not None]
        deadline = (min(starts) if starts else time.monotonic()) + self.retry_timeout
        try:
            self._reconnect(deadline)
        except (OSError, MortarError) as e:
            for rec in sorted(self._retry, key=lambda r: r.order):
                self._give_up(rec, e)
            self._retry = []
            raise

    def _succeed(self, rec, receipt):
        rec.handle._receipt = receipt
        rec.key = rec.value = None

    def _fail(self, rec, err):
        rec.handle._error = err
        rec.key = rec.value = None
