"""One TCP connection to the broker: CONNECT, writes, and frames read with a deadline.
Shared by Producer and Consumer; it keeps no protocol state beyond the read buffer."""

import select
import socket
import struct
import time

from . import wire
from .errors import MortarError, ProtocolError

READ_CHUNK = 256 * 1024
_LENGTH = struct.Struct(">I")
# Compacting the read buffer costs a copy of what is left; doing it only once this much
# has been consumed keeps that copy rare.
COMPACT_AFTER = 1 << 20


def parse_address(address):
    """"host:port", "[v6]:port" or "host" (port 7411) -> (host, port)."""
    if isinstance(address, tuple):
        return address
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:
        host, port = address, ""
    return host or "127.0.0.1", int(port) if port else wire.DEFAULT_PORT


def leader_address(err):
    """The leader's "host:port" that a NOT_LEADER names (its text is exactly
    "leader <id> <host:port>", man/mortarmq.7 REPLICATION); None for any other error."""
    if not isinstance(err, MortarError) or err.name != "NOT_LEADER":
        return None
    words = err.message.split(" ")
    if len(words) != 3 or words[0] != "leader" or not words[1].isdigit():
        return None
    return words[2]


def encode_connect(token):
    return wire.Connect(protocol_version=wire.WIRE_VERSION, client_flags=0, token=token,
                        reserved=0).encode()


def connect_first(addrs, token, timeout):
    """A Connection to the first of ``addrs`` ((host, port), in order) that connects
    and answers CONNECT, and its address. One that is down, or accepts but does not
    answer within ``timeout`` (a paused node), is passed over; an ERR to CONNECT
    (AUTH_FAILED) is raised. With one address its error is raised as it is."""
    last = None
    for addr in addrs:
        try:
            return Connection(addr, token, timeout), addr
        except OSError as e:
            if len(addrs) == 1:
                raise
            last = e
    raise ConnectionError("no broker of %s answers (the last: %s)"
                          % (", ".join("%s:%d" % a for a in addrs), last))


class Connection:
    def __init__(self, address, token=b"", timeout=10.0):
        self.timeout = timeout
        self.sock = socket.create_connection(parse_address(address), timeout=timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self._buf = bytearray()
            self._pos = 0
            self.last_send = time.monotonic()
            self.request(encode_connect(token), wire.Op.CONNECT)
        except BaseException:
            self.sock.close()
            raise

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        self.sock.sendall(data)
        self.last_send = time.monotonic()

    def has_frame(self):
        """Whether read_frame would return without waiting: a whole frame (or bytes it
        refuses) is buffered. Only the header is looked at: this runs once per read."""
        avail = len(self._buf) - self._pos
        if avail < wire.FRAME_HEADER_BYTES:
            return False
        (length,) = _LENGTH.unpack_from(self._buf, self._pos)
        return avail >= wire.FRAME_HEADER_BYTES + length

    def read_frame(self, deadline=None):
        """The next frame as (op, payload), or None once ``deadline`` (monotonic
        seconds; None: wait for ever) has passed and no more bytes are readable. EOF is
        a ConnectionError; bytes the codec refuses are a ProtocolError."""
        buf = self._buf
        while True:
            try:
                split = wire.split_frame(buf, wire.MAX_FRAME_LEN, self._pos)
            except wire.WireError as e:
                raise ProtocolError("from the broker: %s" % e) from None
            if split is not None:
                op, start, end = split
                if end - start > 4096:
                    with memoryview(buf) as view:
                        payload = bytes(view[start:end])
                else:
                    payload = bytes(buf[start:end])
                self._pos = end
                return op, payload
            if self._pos:
                if self._pos == len(buf):
                    del buf[:]
                    self._pos = 0
                elif self._pos > COMPACT_AFTER:
                    del buf[:self._pos]
                    self._pos = 0
            # Past the deadline, what is already readable is still taken.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # select, not the socket timeout: that one also bounds sendall, which must
            # not be cut short by a reader's deadline.
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                return None
            data = self.sock.recv(READ_CHUNK)
            if not data:
                raise ConnectionError("the broker closed the connection")
            buf += data

    def request(self, data, op, deadline=None, on_push=None):
        """Sends one request on an otherwise idle connection and returns its OK frame,
        handing any MSG or NOTICE that arrives first to ``on_push(op, payload)``. An ERR
        answer raises MortarError; no answer by ``deadline`` (default: now + timeout)
        raises TimeoutError."""
        self.send(data)
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        while True:
            frame = self.read_frame(deadline)
            if frame is None:
                raise TimeoutError("no answer to %s within %.1f s" % (op_name(op), self.timeout))
            got, payload = frame
            if got in (wire.Op.MSG, wire.Op.NOTICE) and on_push is not None:
                on_push(got, payload)
                continue
            return check_answer(op, got, payload)


def check_answer(op, got, payload):
    """The OK answering ``op``, or the MortarError its ERR carries."""
    try:
        if got == wire.Op.ERR:
            raise MortarError.from_frame(wire.Err.decode(payload))
        if got != wire.Op.OK:
            raise ProtocolError("%s while waiting for the answer to %s"
                                % (op_name(got), op_name(op)))
        ok = wire.Ok.decode(payload)
    except wire.WireError as e:
        raise ProtocolError("from the broker: %s" % e) from None
    if ok.request_op != op:
        raise ProtocolError("OK for op 0x%02X while waiting for the answer to %s"
                            % (ok.request_op, op_name(op)))
    return ok


def op_name(op):
    try:
        return wire.Op(op).name
    except ValueError:
        return "op 0x%02X" % op
