"""Consumer: a member of a consumer group (man/mortarmq.7, CONSUMER GROUPS).

The broker hands partitions out with NOTICE ASSIGN and takes them back with NOTICE
REVOKE; each is answered with a CONTROL_ACK echoing its id, kind and epochs, and MSGs
of a partition flow only after the ASSIGN is acknowledged. Every MSG carries the
ownership_epoch of its partition, echoed in its ACK or NACK so that a settle for a
partition that has moved is fenced. A member silent longer than the broker's session
timeout is expelled, so a background thread sends HEARTBEAT while the application is
busy. Credit is a window of unsettled deliveries: settling one lets the next flow.

The connection is read only in the thread that calls poll(); the heartbeat thread only
writes, and every write holds one lock together with the bookkeeping of the answer it
expects (answers come strictly in request order).
"""

import collections
import threading
import time

from . import wire
from ._brokers import MOVE_ON, STAY, Brokers, cluster_backoff, parse_brokers, route
from ._conn import check_answer, connect_first
from .errors import MortarError, ProtocolError

HEARTBEAT_INTERVAL = 3.0  # a tenth of the broker's default 30 s session timeout
# poll() looks at the heartbeat thread's findings at least this often while it waits.
READ_SLICE = 1.0
WRITE_BATCH = 128  # queued ACKs/NACKs that force a write

_OP_BYTE = {op: bytes([op]) for op in wire.Op}

DeadLetterOrigin = collections.namedtuple(
    "DeadLetterOrigin", "topic_id topic partition sequence attempts reason")
DeadLetterOrigin.__doc__ = """Where a dead letter came from: the source topic (its id,
and its name when known), partition and sequence, the deliveries it had (attempts) and
why it was dead-lettered (OriginReason REJECTED or MAX_ATTEMPTS)."""


class Message:
    """One delivery. Settle it with exactly one of ack(), nack_retry() or reject();
    progress() only extends the broker's ack-wait for it. Each returns False, sending
    nothing, when the connection it came on is gone: the broker delivers it again."""

    __slots__ = ("topic", "partition", "sequence", "attempt", "key", "value", "origin",
                 "producer_id", "producer_seq", "_consumer", "_ref", "_gen", "_settled")

    def __init__(self, consumer, topic, fields, gen):
        (subscription_id, topic_id, partition, sequence, delivery_id, attempt,
         ownership_epoch, producer_id, producer_seq, _flags, key, value, origin) = fields
        self.topic = topic
        self.partition = partition
        self.sequence = sequence
        self.attempt = attempt
        self.key = key
        self.value = value
        self.origin = origin
        self.producer_id = producer_id
        self.producer_seq = producer_seq
        self._consumer = consumer
        self._ref = (subscription_id, topic_id, partition, sequence, delivery_id,
                     ownership_epoch)
        self._gen = gen
        self._settled = False

    def ack(self):
        """Settles the delivery: the group's position may move past it."""
        return self._consumer._settle(self, "ack")

    def nack_retry(self):
        """Refuses it for now: delivered again (attempt + 1) after the broker's
        --nack-delay, and dead-lettered once it fails its last attempt."""
        return self._consumer._settle(self, "retry")

    def reject(self):
        """Dead-letters it now, to the topic's .dlq twin with an origin trailer."""
        return self._consumer._settle(self, "reject")

    def progress(self):
        """Still working on it: restarts its ack-wait without settling it."""
        return self._consumer._settle(self, "progress")

    def __repr__(self):
        return ("Message(topic=%r, partition=%d, sequence=%d, attempt=%d, key=%r, value=%r%s)"
                % (self.topic, self.partition, self.sequence, self.attempt, self.key,
                   self.value[:64], ", origin=%r" % (self.origin,) if self.origin else ""))


class Consumer:
    """Joins ``group`` on ``topic`` at ``address`` and yields its Messages.

    ``address`` is one broker ("host:port") or a cluster's nodes (a list, or one string
    "host:port,host:port,..."): the member joins on the leader, following NOT_LEADER,
    and after a failover joins again on the new one, trying the other nodes with the
    cluster backoff (50 ms doubling to 2 s) while none leads (man/mortarmq.7,
    REPLICATION). Delivery resumes at the group's committed position.

    ``start`` ("earliest" or "latest") is where the group begins on a partition it has
    no committed position for. ``credit`` (records) and ``credit_bytes`` size the window
    of unsettled deliveries (0: the broker's default, 256 records and 2 MiB). With
    ``pull=True`` nothing is pushed: poll() asks with PULL. ``on_assign(partition)`` and
    ``on_revoke(partition)`` are called from poll() before the broker is told, so an
    application can finish or commit its work for a partition first; a connection loss
    revokes every partition. A topic named "<source>.dlq" reads the source's dead
    letters; their Messages carry ``origin``.

    After a connection loss poll() reconnects and joins again (the broker delivers the
    unsettled records again) for up to ``reconnect_timeout`` seconds (None: for ever).

    A Consumer is used from one thread (the one calling poll()); its own heartbeat
    thread only writes.
    """

    def __init__(self, address="127.0.0.1:7411", group="", topic="", start="earliest",
                 pull=False, credit=0, credit_bytes=0, token=b"", timeout=10.0,
                 heartbeat_interval=HEARTBEAT_INTERVAL, reconnect_timeout=30.0,
                 on_assign=None, on_revoke=None):
        if start not in ("earliest", "latest"):
            raise ValueError("start must be 'earliest' or 'latest', not %r" % (start,))
        if not topic or not group:
            raise ValueError("a group and a topic are needed")
        self.address = address
        self.group = group
        self.topic = topic
        self._group = group.encode("utf-8") if isinstance(group, str) else bytes(group)
        self._start = wire.StartPolicy.EARLIEST if start == "earliest" else wire.StartPolicy.LATEST
        self.pull = pull
        self._credit = credit
        self._credit_bytes = credit_bytes
        self._token = token.encode("utf-8") if isinstance(token, str) else bytes(token)
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        self.reconnect_timeout = reconnect_timeout
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.source_topic = None
        if topic.endswith(wire.DLQ_SUFFIX):
            self.source_topic = topic[:-len(wire.DLQ_SUFFIX)]

        self._lock = threading.RLock()
        self._conn = None
        self._gen = 0  # one per connection: Messages of an older one are stale
        self._broken = False  # set by the heartbeat thread when a write fails
        # (op, gen, waiter) of each answer still owed; a waiter (a list) receives the
        # OK or the MortarError of a request someone waits for.
        self._pending = collections.deque()
        self._wbuf = []  # requests queued, in the order of _pending
        self._ready = collections.deque()
        self._notices = collections.deque()
        self._errors = []
        self._sub = None  # SubResult of the current membership
        self._assignment_epoch = 0
        self._held = {}  # partition -> ownership_epoch
        self._pulling = False
        self._closed = False
        self.topic_id = None
        self.source_topic_id = None
        self.ignored_errors = 0  # OWNERSHIP_FENCED / UNKNOWN_DELIVERY answers dropped
        # The addresses known and the order to dial them in; and where an ERR said to
        # join next (a route, or None: the next address).
        self._brokers = Brokers(parse_brokers(address))
        self._reroute = None

        self._join(rejoining=False)
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                           name="mortarmq-heartbeat")
        self._heartbeat.start()

    # ---- public API ------------------------------------------------------------------

    @property
    def assignment(self):
        """The partitions this member holds now."""
        return sorted(self._held)

    def poll(self, timeout=None):
        """The next Message, or None when ``timeout`` seconds pass without one
        (None: wait for one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_errors()
            if self._notices and self._conn is not None and not self._broken:
                # Before handing out more: a REVOKE takes back the partition's waiting
                # deliveries, and the broker waits for its answer to move it.
                self._answer_notice(self._notices.popleft())
                continue
            if self._ready:
                return self._ready.popleft()
            if self._closed:
                return None
            if self._conn is None or self._broken:
                self._rejoin()
                continue
            now = time.monotonic()
            expired = deadline is not None and now >= deadline
            if self.pull and not self._pulling and self._held:
                wait = READ_SLICE if deadline is None else min(READ_SLICE, deadline - now)
                self._send_pull(int(max(0.0, wait) * 1000))
            limit = now + READ_SLICE
            got = self._read(limit if deadline is None else min(deadline, limit))
            if expired and not got:
                return None

    def __iter__(self):
        while not self._closed:
            m = self.poll()
            if m is not None:
                yield m

    def flush(self, timeout=None):
        """Waits until the broker has answered every ACK, NACK and CONTROL_ACK sent so
        far, and returns True; False when the connection was lost first (what was not
        settled is delivered again). Errors among the answers are raised (fenced and
        unknown deliveries are dropped, as the registry advises). Messages that arrive
        meanwhile are kept for poll()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_errors()
            self._flush_writes()
            with self._lock:
                owed = [p for p in self._pending if p[1] == self._gen and p[0] != wire.Op.PULL]
            if self._conn is None or self._broken:
                return False
            if not owed:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("answers still owed after %s s" % timeout)
            limit = time.monotonic() + READ_SLICE
            self._read(limit if deadline is None else min(deadline, limit))

    def set_credit(self, count=0, credit_bytes=0):
        """Resizes the window of unsettled deliveries (CREDIT SET; 0 keeps a dimension
        as it is) and returns the broker's CreditResult (granted and outstanding
        counts and bytes). Raises MortarError, e.g. CREDIT_LIMIT above the broker's cap."""
        self._flush_writes()
        while True:
            if self._conn is None or self._broken:
                self._rejoin()
            sub = self._sub
            credit = wire.Credit(subscription_id=sub.subscription_id,
                                 membership_epoch=sub.membership_epoch,
                                 ownership_epoch=0, mode=wire.CreditMode.SET,
                                 credit_count=count, credit_bytes=credit_bytes)
            waiter = []
            if self._request(credit.encode(), wire.Op.CREDIT, waiter=waiter):
                deadline = time.monotonic() + self.timeout
                while not waiter and not self._broken and time.monotonic() < deadline:
                    self._read(deadline)
                if waiter:
                    if isinstance(waiter[0], MortarError):
                        raise waiter[0]
                    self._credit, self._credit_bytes = count or self._credit, \
                        credit_bytes or self._credit_bytes
                    return wire.CreditResult.decode(waiter[0].result)
                if not self._broken:
                    raise TimeoutError("no answer to CREDIT within %s s" % self.timeout)

    def close(self):
        """Leaves the group (HEARTBEAT LEAVE, so it rebalances at once) and closes the
        connection. Unsettled deliveries go to the other members."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            if self._conn is not None and not self._broken:
                try:
                    self.flush(self.timeout)
                except (MortarError, OSError, ProtocolError):
                    pass
                self._send_heartbeat(wire.HeartbeatState.LEAVE)
                deadline = time.monotonic() + self.timeout
                while self._pending and not self._broken and time.monotonic() < deadline:
                    self._read(deadline)
        except (OSError, ProtocolError, MortarError):
            pass
        finally:
            self._drop_connection()
            self._heartbeat.join(self.heartbeat_interval + 1)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    # ---- joining ---------------------------------------------------------------------

    def _join_once(self):
        conn, addr = connect_first(self._brokers.order(), self._token, self.timeout)
        self._brokers.connected(addr)
        try:
            pushes = []
            on_push = lambda op, payload: pushes.append((op, payload))  # noqa: E731
            self.topic_id = self._resolve(conn)
            sub = wire.Sub(group=self._group, topic_id=self.topic_id,
                           partition=wire.SUB_PARTITION_ANY, start_policy=self._start,
                           credit_count=self._credit, credit_bytes=self._credit_bytes,
                           flags=wire.SubFlags.PULL_MODE if self.pull else 0)
            ok = conn.request(sub.encode(), wire.Op.SUB, on_push=on_push)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._conn = conn
            self._gen += 1
            self._broken = False
            self._pending.clear()
            del self._wbuf[:]
            self._ready.clear()
            self._notices.clear()
            self._sub = wire.SubResult.decode(ok.result)
            self._assignment_epoch = self._sub.assignment_epoch
            self._held = {}
            self._pulling = False
        for op, payload in pushes:
            self._dispatch(op, payload)

    def _resolve(self, conn):
        """The topic id to SUB to. A dead-letter twin cannot be DECLAREd (the broker
        answers MUTATION_NOT_PACKABLE): it is its source's id + 1."""
        name = self.source_topic or self.topic
        declare = wire.Declare(topic=name.encode("utf-8"), partition_count=0,
                               flags=wire.DeclareFlags.PASSIVE)
        ok = conn.request(declare.encode(), wire.Op.DECLARE)
        topic_id = wire.DeclareResult.decode(ok.result).topic_id
        self.source_topic_id = topic_id
        return topic_id + 1 if self.source_topic else topic_id

    def _rejoin(self):
        """The connection is gone (or the member was expelled): every partition is
        lost; connect and SUB again, backing off, until reconnect_timeout."""
        self._drop_connection()
        self._lose_partitions()
        how, self._reroute = self._reroute, None
        if how is not None:
            self._brokers.take(how)
        else:
            self._brokers.move_on()  # the broker may be gone (a failover): try another
        self._join(rejoining=True)

    def _join(self, rejoining):
        """Joins, following NOT_LEADER and backing off while no leader can serve, until
        reconnect_timeout. A first join fails at once on anything but the cluster's
        redirects and backoffs; a rejoin tries again on any retryable failure."""
        started = time.monotonic()
        backoffs = cluster_backoffs = 0
        while True:
            try:
                self._join_once()
                self._brokers.served()
                return
            except MortarError as e:
                # AUTH_FAILED, UNKNOWN_TOPIC and the like will not go away by retrying.
                how = route(e)
                if not e.retryable or (not rejoining and how == STAY):
                    raise
                last = e
            except (OSError, ProtocolError) as e:
                if not rejoining:
                    raise
                how, last = None, e
            if (self.reconnect_timeout is not None
                    and time.monotonic() - started >= self.reconnect_timeout):
                if not rejoining:
                    raise last
                raise ConnectionError("cannot rejoin %r on %s within %s s: %s"
                                      % (self.group, self.address, self.reconnect_timeout, last))
            if how == MOVE_ON:
                self._brokers.take(how)
                wait = cluster_backoff(cluster_backoffs)
                cluster_backoffs += 1
            elif how not in (None, STAY):
                n = self._brokers.take(how)  # straight to the leader it names
                wait = None if n is None else cluster_backoff(n)
            else:
                if how is None:
                    self._brokers.rotate()  # every address failed: the leader too
                wait = min(1.0, 0.05 * 2 ** backoffs)
                backoffs += 1
            if wait:
                time.sleep(wait)

    def _lose_partitions(self):
        held, self._held = self._held, {}
        for partition in sorted(held):
            if self.on_revoke is not None:
                self.on_revoke(partition)

    def _drop_connection(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._pending.clear()
            del self._wbuf[:]
            self._ready.clear()
            self._notices.clear()
            self._pulling = False

    # ---- reading ---------------------------------------------------------------------

    def _read(self, deadline):
        """Reads and handles one frame; False when none came by ``deadline``."""
        if self._wbuf and not self._conn.has_frame():
            self._flush_writes()
        try:
            frame = self._conn.read_frame(deadline)
        except (OSError, ProtocolError):
            self._broken = True
            return False
        if frame is None:
            return False
        try:
            self._dispatch(*frame)
            # The rest of what one recv brought (answers among MSGs), without a trip
            # through poll() per frame.
            conn = self._conn
            while conn is not None and not self._broken and conn.has_frame():
                self._dispatch(*conn.read_frame())
        except (OSError, wire.WireError, ProtocolError):
            self._broken = True
        return True

    def _dispatch(self, op, payload):
        if op == wire.Op.MSG:
            fields = wire.decode_msg_fields(payload)
            sub = self._sub
            # A MSG for an earlier subscription of this connection is moot.
            if sub is not None and fields[0] == sub.subscription_id:
                self._ready.append(Message(self, self.topic, self._with_origin(fields),
                                           self._gen))
        elif op == wire.Op.NOTICE:
            self._notices.append(wire.Notice.decode(payload))
        elif op in (wire.Op.OK, wire.Op.ERR):
            with self._lock:
                if not self._pending:
                    raise ProtocolError("an answer to no request")
                expected, gen, waiter = self._pending.popleft()
            if waiter is not None:
                try:
                    waiter.append(check_answer(expected, op, payload))
                except MortarError as e:
                    waiter.append(e)
                return
            if op == wire.Op.OK and payload[:1] == _OP_BYTE[expected]:
                # The common case, an empty OK: its result is not needed.
                if expected == wire.Op.PULL:
                    self._pulling = False
                return
            try:
                check_answer(expected, op, payload)
                if expected == wire.Op.PULL:
                    self._pulling = False
            except MortarError as e:
                self._answer_error(expected, e)
        else:
            raise ProtocolError("op 0x%02X from the broker" % op)

    def _with_origin(self, fields):
        origin = fields[12]
        if origin is None:
            return fields
        name = self.source_topic if origin.origin_topic_id == self.source_topic_id else None
        reason = origin.reason
        if reason in wire.OriginReason._value2member_map_:
            reason = wire.OriginReason(reason)
        return fields[:12] + (DeadLetterOrigin(origin.origin_topic_id, name,
                                               origin.origin_partition, origin.origin_sequence,
                                               origin.attempts, reason),)

    def _answer_error(self, op, err):
        if op == wire.Op.PULL:
            self._pulling = False
        if err.name in ("OWNERSHIP_FENCED", "UNKNOWN_DELIVERY") and op in (wire.Op.ACK,
                                                                          wire.Op.NACK):
            # The partition moved, or the delivery expired: the broker delivers the
            # record again (here or elsewhere). Nothing to do.
            self.ignored_errors += 1
            if err.name == "UNKNOWN_DELIVERY":
                # It is also all an expelled member hears: a HEARTBEAT tells
                # (UNKNOWN_MEMBER) without waiting for the heartbeat thread.
                self._send_heartbeat(wire.HeartbeatState.ACTIVE)
        elif err.name == "UNKNOWN_NOTICE" or (err.name == "STALE_EPOCH" and op == wire.Op.PULL):
            # A notice already superseded; a PULL raced a rebalance (the NOTICE follows).
            self.ignored_errors += 1
        elif route(err) != STAY:
            # This node does not lead (any more): join again where the error says.
            self._reroute = route(err)
            self._broken = True
        elif err.name in ("UNKNOWN_SUBSCRIPTION", "UNKNOWN_MEMBER") or err.closes_connection:
            # Expelled (silent past the session timeout) or about to be closed: join again.
            self._broken = True
        else:
            self._errors.append(err)

    def _raise_errors(self):
        if self._errors:
            err = self._errors.pop(0)
            raise err

    # ---- rebalancing -----------------------------------------------------------------

    def _answer_notice(self, notice):
        sub = self._sub
        current = sub is not None and notice.member_id == sub.member_id
        if current:
            self._assignment_epoch = max(self._assignment_epoch, notice.assignment_epoch)
            if notice.kind == wire.NoticeKind.ASSIGN:
                self._held[notice.partition] = notice.ownership_epoch
                if self.on_assign is not None:
                    self.on_assign(notice.partition)
            elif notice.kind == wire.NoticeKind.REVOKE:
                # Deliveries of the partition not yet handed out go to the next owner.
                self._ready = collections.deque(
                    m for m in self._ready if m.partition != notice.partition)
                if notice.partition in self._held:
                    del self._held[notice.partition]
                    if self.on_revoke is not None:
                        self.on_revoke(notice.partition)
        known = notice.kind in (wire.NoticeKind.ASSIGN, wire.NoticeKind.REVOKE)
        result = wire.ControlResult.OK if current and known else wire.ControlResult.STALE
        answer = wire.ControlAck(notice_id=notice.notice_id, notice_kind=notice.kind,
                                 group_id=notice.group_id,
                                 membership_epoch=notice.membership_epoch,
                                 assignment_epoch=notice.assignment_epoch,
                                 ownership_epoch=notice.ownership_epoch, result=result)
        self._request(answer.encode(), wire.Op.CONTROL_ACK)

    # ---- writing ---------------------------------------------------------------------

    def _request(self, data, op, gen=None, batch=False, waiter=None):
        """Queues one request, noting the answer it is owed, and writes the queue unless
        ``batch``: ACKs and NACKs wait for the next read, the next unbatched request or
        the heartbeat thread's next tick, so a burst of them costs one write. False
        when the connection (of ``gen``, if given) is gone."""
        with self._lock:
            conn = self._conn
            if conn is None or self._broken or (gen is not None and gen != self._gen):
                return False
            self._wbuf.append(data)
            self._pending.append((op, self._gen, waiter))
            if not batch or len(self._wbuf) >= WRITE_BATCH:
                self._flush_writes()
            return True

    def _flush_writes(self):
        with self._lock:
            if not self._wbuf or self._conn is None:
                return
            data = b"".join(self._wbuf)
            del self._wbuf[:]
            try:
                self._conn.send(data)
            except OSError:
                self._broken = True

    def _settle(self, m, how):
        if m._settled:
            return False
        if how != "progress":
            m._settled = True
        sid, tid, partition, seq, delivery_id, epoch = m._ref
        if how == "ack":
            return self._request(wire.encode_ack(sid, tid, partition, seq, delivery_id, epoch),
                                 wire.Op.ACK, m._gen, batch=True)
        if how == "progress":
            return self._request(wire.encode_ack(sid, tid, partition, seq, delivery_id, epoch,
                                                 wire.AckFlags.PROGRESS), wire.Op.ACK, m._gen)
        reason = wire.NackReason.RETRY if how == "retry" else wire.NackReason.REJECT
        return self._request(wire.encode_nack(sid, tid, partition, seq, delivery_id, epoch,
                                              reason), wire.Op.NACK, m._gen, batch=True)

    def _send_pull(self, wait_ms):
        sub = self._sub
        pull = wire.Pull(subscription_id=sub.subscription_id, member_id=sub.member_id,
                         membership_epoch=sub.membership_epoch,
                         assignment_epoch=self._assignment_epoch, ownership_epochs=[],
                         max_msgs=self._credit or 256, max_bytes=0,
                         wait_ms=max(0, min(wait_ms, 0xFFFF)), min_bytes=0)
        self._pulling = self._request(pull.encode(), wire.Op.PULL)

    def _send_heartbeat(self, state):
        with self._lock:
            sub = self._sub
            if sub is None:
                return False
            hb = wire.Heartbeat(subscription_id=sub.subscription_id, member_id=sub.member_id,
                                membership_epoch=sub.membership_epoch,
                                assignment_epoch=self._assignment_epoch, state=state)
            return self._request(hb.encode(), wire.Op.HEARTBEAT)

    def _heartbeat_loop(self):
        # Runs for the consumer's life. Any request on the subscription keeps the
        # member alive, and every request keeps the connection from the idle timeout,
        # so a HEARTBEAT goes only after a quiet interval.
        while not self._stop.wait(self.heartbeat_interval / 3.0):
            with self._lock:
                conn = self._conn
                if conn is None or self._broken or self._closed:
                    continue
                if time.monotonic() - conn.last_send >= self.heartbeat_interval:
                    self._send_heartbeat(wire.HeartbeatState.ACTIVE)
                else:
                    # ACKs of an application that stopped polling still go out.
                    self._flush_writes()
