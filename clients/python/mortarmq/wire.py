"""The MortarMQ wire protocol v0 (WIRE_VERSION 1) as described in man/mortarmq.7:
frames, the 15 ops, the typed OK results, every enum and flag value, the limits and
the 51-code error registry.

Standard library only. Every integer is big-endian. A frame is ``length:u32 op:u8
payload`` where ``length`` counts the op byte and the payload. Byte fields are preceded
by their length (u16, or u32 for ``value`` and ``result``); ``ownership_epochs`` is
preceded by its entry count. Bytes after the last known field are an unknown tail from
a later compatible version and are ignored when decoding; the encoder never writes one.
"""

import enum
import struct
from collections import namedtuple

# ---- limits (man/mortarmq.7, FRAME FORMAT) -------------------------------------------

WIRE_VERSION = 1
FRAME_HEADER_BYTES = 4
MAX_FRAME_LEN = 16 * 1024 * 1024
PREAUTH_FRAME_LEN_MAX = 64 * 1024
MAX_VALUE_LEN = MAX_FRAME_LEN - 1024
MAX_KEY_LEN = 255
MAX_TOPIC_LEN = 255
MAX_GROUP_LEN = 255
MAX_ERR_MESSAGE = 512
MAX_OK_RESULT_LEN = MAX_FRAME_LEN - 6
KEEPALIVE_SECONDS = 30.0
IDLE_TIMEOUT_SECONDS = 45.0
DEDUP_WINDOW_SEQS = 1024
SUB_PARTITION_ANY = 0xFFFF
DEFAULT_PORT = 7411
DLQ_SUFFIX = ".dlq"


# ---- ops -----------------------------------------------------------------------------


class Op(enum.IntEnum):
    CONNECT = 0x01
    DECLARE = 0x02
    PUB = 0x03
    SUB = 0x04
    ACK = 0x05
    NACK = 0x06
    PING = 0x07
    ERR = 0x08
    OK = 0x09
    MSG = 0x0A
    PULL = 0x0B
    HEARTBEAT = 0x0C
    NOTICE = 0x0D
    CONTROL_ACK = 0x0E
    CREDIT = 0x0F


# Only the broker sends these; a client sending one gets UNEXPECTED_OP.
SERVER_ONLY_OPS = frozenset((Op.OK, Op.MSG, Op.NOTICE))


class OpClass(enum.Enum):
    KNOWN = "known"
    RESERVED = "reserved"  # 0x10-0xFE: ERR UNKNOWN_OP, the connection stays
    ILLEGAL = "illegal"  # 0x00 and 0xFF: ERR ILLEGAL_OP, the connection closes


def classify_op(op):
    if op in (0x00, 0xFF):
        return OpClass.ILLEGAL
    if 0x01 <= op <= 0x0F:
        return OpClass.KNOWN
    return OpClass.RESERVED


# ---- vocabulary (man/mortarmq.7, OPERATIONS and DURABILITY) ---------------------------


class Durability(enum.IntEnum):
    """What a PUB asks for (flags bits 0-1; 0 asks for the broker's default) and what
    its OK reports as reached."""

    WRITTEN = 1
    FSYNCED = 2
    REPLICATED = 3


# The spelling of `mortarctl pub --durability` and of Producer(durability=...).
DURABILITY_NAMES = {
    "written": Durability.WRITTEN,
    "fsync": Durability.FSYNCED,
    "replicated": Durability.REPLICATED,
}


class DeclareCreated(enum.IntEnum):
    CREATED = 0
    IDEMPOTENT_OK = 1
    DELETED = 2


class StartPolicy(enum.IntEnum):
    EARLIEST = 0
    LATEST = 1


class NackReason(enum.IntEnum):
    RETRY = 0
    REJECT = 1


class NoticeKind(enum.IntEnum):
    ASSIGN = 0
    REVOKE = 1


class ControlResult(enum.IntEnum):
    OK = 0
    STALE = 1
    ERROR = 2


class HeartbeatState(enum.IntEnum):
    ACTIVE = 0
    LEAVE = 1


class CreditMode(enum.IntEnum):
    SET = 0
    ADD = 1


class OriginReason(enum.IntEnum):
    """Why a record was dead-lettered (the origin trailer's ``reason``)."""

    REJECTED = 0
    MAX_ATTEMPTS = 1


class DeclareFlags(enum.IntFlag):
    DELETE = 0x0001
    IF_UNUSED = 0x0002
    PASSIVE = 0x0004


class PubFlags(enum.IntFlag):
    DURABILITY = 0x0003  # a mask: the requested Durability, 0 = the broker's default


class PubResultFlags(enum.IntFlag):
    DEDUPLICATED = 0x01


class SubFlags(enum.IntFlag):
    PULL_MODE = 0x0001


class AckFlags(enum.IntFlag):
    PROGRESS = 0x0001


class MsgFlags(enum.IntFlag):
    ORIGIN = 0x0001


# ---- the error registry (man/mortarmq.7, ERRORS) -------------------------------------

ErrorCode = namedtuple("ErrorCode", "code name after retry client_should")

# (code, name, after, retry, client should). After: "close" or "keep"; retry: "no",
# "backoff" or "idempotent". Codes are never changed nor reused.
_REGISTRY = (
    # 0x0xxx: protocol / session (26)
    (0x0001, "INVALID_FRAME_LENGTH", "close", "no", "fix the encoder; never resynchronise"),
    (0x0002, "ILLEGAL_OP", "close", "no", "fix the encoder"),
    (0x0003, "UNKNOWN_OP", "keep", "no",
     "the broker is older than the client: do not use that op"),
    (0x0004, "UNSUPPORTED_VERSION", "close", "no", "reconnect with version 1"),
    (0x0005, "NOT_CONNECTED", "close", "no", "send CONNECT first"),
    (0x0006, "AUTH_FAILED", "close", "no", "fix the credentials; do not loop"),
    (0x0007, "ALREADY_CONNECTED", "keep", "no", "ignore; the first CONNECT stands"),
    (0x0008, "UNKNOWN_TOPIC", "keep", "no", "DECLARE the topic, or refresh the id"),
    (0x0009, "UNKNOWN_PARTITION", "keep", "no",
     "refresh partition_count with DECLARE(PASSIVE)"),
    (0x000C, "MALFORMED_PAYLOAD", "keep", "no", "fix the encoder"),
    (0x000D, "UNEXPECTED_OP", "close", "no", "fix the client"),
    (0x000E, "INTERNAL_ERROR", "keep", "idempotent", "report; retry PUB idempotently"),
    (0x000F, "SHUTTING_DOWN", "close", "backoff", "reconnect later (or to another broker)"),
    (0x0010, "VALUE_TOO_LARGE", "keep", "no", "split the value"),
    (0x0011, "KEY_TOO_LARGE", "keep", "no", "shorten the key"),
    (0x0012, "SEQUENCE_OUT_OF_ORDER", "keep", "no",
     "resend from the expected seq, or start a new producer_id"),
    (0x0013, "INVALID_PRODUCER", "keep", "no", "fix the producer fields"),
    (0x0014, "INVALID_ARGUMENT", "keep", "no", "fix the request"),
    (0x0020, "UNKNOWN_SUBSCRIPTION", "keep", "no", "SUB again"),
    (0x0021, "STALE_EPOCH", "keep", "backoff",
     "process pending NOTICEs, then retry with the new epochs"),
    (0x0022, "OWNERSHIP_FENCED", "keep", "no", "drop the message: the new owner gets it"),
    (0x0023, "UNKNOWN_DELIVERY", "keep", "no", "drop it; it was or will be redelivered"),
    (0x0024, "INVALID_SUBSCRIPTION", "keep", "no", "fix the request"),
    (0x0025, "TOO_MANY_SUBSCRIPTIONS", "keep", "no", "use another connection"),
    (0x0026, "UNKNOWN_MEMBER", "keep", "no", "SUB again to rejoin"),
    (0x0027, "UNKNOWN_NOTICE", "keep", "no", "ignore"),
    # 0x2xxx: metadata (7)
    (0x2001, "INVALID_TOPIC_NAME", "keep", "no", "fix the name"),
    (0x2002, "INVALID_GROUP_NAME", "keep", "no", "fix the name"),
    (0x2003, "TOPIC_CONFIG_CONFLICT", "keep", "no", "DECLARE(PASSIVE) to read it"),
    (0x2004, "TOPIC_REGISTRY_FULL", "keep", "no", "delete topics"),
    (0x2005, "GROUP_LIMIT_REACHED", "keep", "backoff", "alert the operator"),
    (0x2006, "TOPIC_IN_USE", "keep", "backoff",
     "stop consumers first, or delete without IF_UNUSED"),
    (0x2007, "MUTATION_NOT_PACKABLE", "keep", "no", "address the source topic"),
    # 0x4xxx: backpressure / quota (6)
    (0x4001, "BACKPRESSURE", "keep", "backoff", "back off (e.g. 10 ms doubling to 1 s), resend"),
    (0x4002, "QUOTA_EXCEEDED", "keep", "backoff", "back off for the period in the message"),
    (0x4003, "STORAGE_FULL", "keep", "backoff", "alert the operator; back off"),
    (0x4004, "MEMORY_LIMIT", "keep", "backoff", "back off"),
    (0x4005, "CREDIT_LIMIT", "keep", "no", "ask for less"),
    (0x4006, "CONNECTION_LIMIT", "close", "backoff", "back off and reconnect"),
    # 0x6xxx: replication (12)
    (0x6001, "NOT_LEADER", "keep", "backoff", "reconnect to the leader"),
    (0x6002, "LEADER_UNKNOWN", "keep", "backoff", "back off, retry"),
    (0x6003, "STALE_LEADER_EPOCH", "keep", "backoff", "refresh metadata, retry"),
    (0x6004, "NOT_ENOUGH_REPLICAS", "keep", "backoff", "back off, retry"),
    (0x6005, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "keep", "idempotent",
     "resend with the same producer_seq"),
    (0x6006, "REPLICATION_TIMEOUT", "keep", "idempotent", "resend with the same producer_seq"),
    (0x6007, "REPLICA_NOT_IN_SYNC", "keep", "backoff", "use the leader"),
    (0x6008, "LOG_TRUNCATED", "keep", "idempotent", "resend unacknowledged PUBs idempotently"),
    (0x6009, "SNAPSHOT_IN_PROGRESS", "keep", "backoff", "back off"),
    (0x600A, "PEER_UNREACHABLE", "keep", "backoff", "back off"),
    (0x600B, "DURABILITY_UNAVAILABLE", "keep", "no", "ask for a level the broker offers"),
    (0x600C, "ELECTION_TIMEOUT", "keep", "backoff", "back off"),
)

ERRORS = {row[0]: ErrorCode(*row) for row in _REGISTRY}
ERRORS_BY_NAME = {e.name: e for e in ERRORS.values()}


def error_code(code):
    """The registry entry of ``code``; an unregistered code (from a newer broker) gets
    a placeholder that neither closes nor invites a retry."""
    entry = ERRORS.get(code)
    if entry is None:
        entry = ErrorCode(code, "UNREGISTERED_0x%04X" % code, "keep", "no",
                          "upgrade the client")
    return entry


# ---- codec errors --------------------------------------------------------------------


class WireError(Exception):
    """Bytes the codec refuses, named by the registry code a broker would answer:
    INVALID_FRAME_LENGTH, ILLEGAL_OP, UNKNOWN_OP or MALFORMED_PAYLOAD."""

    def __init__(self, name, detail):
        super().__init__("%s: %s" % (name, detail))
        self.name = name
        self.code = ERRORS_BY_NAME[name].code
        self.detail = detail


def _short(op, offset, need):
    return WireError(
        "MALFORMED_PAYLOAD",
        "op 0x%02X: %d bytes needed at payload offset %d" % (op, need, offset),
    )


# ---- field plans ---------------------------------------------------------------------
#
# A message is a list of (name, kind) in byte order. Runs of fixed-width fields are
# compiled into one struct.Struct each, so decoding a MSG or encoding a PUB is a few
# C calls rather than one per field.

_FIXED = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
_LEN_PREFIX = {"bytes16": struct.Struct(">H"), "bytes32": struct.Struct(">I"),
               "list16": struct.Struct(">H")}
_U64 = struct.Struct(">Q")
_HEADER = struct.Struct(">IB")


def _compile(fields):
    plan, run = [], []

    def close_run():
        if run:
            fmt = ">" + "".join(_FIXED[k] for _, k in run)
            plan.append(("fixed", struct.Struct(fmt), tuple(n for n, _ in run)))
            del run[:]

    for name, kind in fields:
        if kind in _FIXED:
            run.append((name, kind))
        else:
            close_run()
            plan.append((kind, _LEN_PREFIX[kind], name))
    close_run()
    return tuple(plan)


def _decode_plan(op, plan, buf, pos, out):
    """Reads the plan's fields from ``buf`` at ``pos`` into ``out``; returns the new
    position. A payload shorter than its fields is MALFORMED_PAYLOAD."""
    end = len(buf)
    for kind, st, names in plan:
        if kind == "fixed":
            if end - pos < st.size:
                raise _short(op, pos, st.size)
            for name, value in zip(names, st.unpack_from(buf, pos)):
                out[name] = value
            pos += st.size
            continue
        if end - pos < st.size:
            raise _short(op, pos, st.size)
        (n,) = st.unpack_from(buf, pos)
        pos += st.size
        width = n * 8 if kind == "list16" else n
        # Checked before slicing or allocating: a hostile count cannot outrun the frame.
        if end - pos < width:
            raise _short(op, pos, width)
        if kind == "list16":
            out[names] = list(struct.unpack_from(">%dQ" % n, buf, pos))
        else:
            out[names] = bytes(buf[pos:pos + width])
        pos += width
    return pos


def _encode_plan(plan, values, parts):
    try:
        for kind, st, names in plan:
            if kind == "fixed":
                parts.append(st.pack(*[values[n] for n in names]))
            elif kind == "list16":
                items = values[names]
                parts.append(st.pack(len(items)))
                parts.append(struct.pack(">%dQ" % len(items), *items))
            else:
                data = values[names]
                parts.append(st.pack(len(data)))
                parts.append(bytes(data))
    except struct.error as e:
        raise ValueError("field out of range: %s" % e) from None


def _frame(op, payload):
    return _HEADER.pack(len(payload) + 1, op) + payload


# ---- messages ------------------------------------------------------------------------


class Message:
    """A decoded or to-be-encoded message: one attribute per field, named as the spec
    names it. Subclasses set OP and FIELDS."""

    OP = None
    FIELDS = ()
    __slots__ = ()

    def __init__(self, **values):
        for name, kind in self.FIELDS:
            default = b"" if kind.startswith("bytes") else [] if kind == "list16" else 0
            setattr(self, name, values.pop(name, default))
        if values:
            raise TypeError("%s has no field %s" % (type(self).__name__, ", ".join(values)))

    def _values(self):
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def decode(cls, payload):
        out = {}
        _decode_plan(cls.OP, cls._PLAN, payload, 0, out)
        return cls(**out)

    def encode_payload(self):
        parts = []
        _encode_plan(self._PLAN, self._values(), parts)
        return b"".join(parts)

    def encode(self):
        """The whole frame: length, op, payload."""
        return _frame(self.OP, self.encode_payload())

    def fields(self):
        """(name, value) in byte order, ``*_len`` before each byte field or list."""
        out = []
        for name, kind in self.FIELDS:
            value = getattr(self, name)
            if kind not in _FIXED:
                out.append((name + "_len", len(value)))
            out.append((name, value))
        return out

    def __eq__(self, other):
        return type(self) is type(other) and self._values() == other._values()

    def __repr__(self):
        inner = ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__)
        return "%s(%s)" % (type(self).__name__, inner)


def _message(name, op, fields, base=Message, doc=None, extra_slots=()):
    fields = tuple(tuple(f.split(":")) for f in fields.split())
    cls = type(name, (base,), {
        "OP": op,
        "FIELDS": fields,
        "__slots__": tuple(n for n, _ in fields) + extra_slots,
        "_PLAN": _compile(fields),
        "__doc__": doc,
    })
    return cls


Connect = _message("Connect", Op.CONNECT,
                   "protocol_version:u8 client_flags:u16 token:bytes16 reserved:u32",
                   doc="CONNECT 0x01, C->S: opens the session.")
Declare = _message("Declare", Op.DECLARE, "topic:bytes16 partition_count:u16 flags:u16",
                   doc="DECLARE 0x02, C->S: create, look up (PASSIVE) or delete a pair.")
Pub = _message("Pub", Op.PUB,
               "topic_id:u16 partition:u16 producer_id:u64 producer_seq:u64 flags:u16 "
               "key:bytes16 value:bytes32",
               doc="PUB 0x03, C->S: append one record.")
Sub = _message("Sub", Op.SUB,
               "group:bytes16 topic_id:u16 partition:u16 start_policy:u8 credit_count:u16 "
               "credit_bytes:u32 flags:u16",
               doc="SUB 0x04, C->S: join a consumer group (partition must be 0xFFFF).")
Ack = _message("Ack", Op.ACK,
               "subscription_id:u16 topic_id:u16 partition:u16 seq:u64 delivery_id:u64 "
               "ownership_epoch:u64 flags:u16",
               doc="ACK 0x05, C->S: settle a delivery (PROGRESS: extend its deadline).")
Nack = _message("Nack", Op.NACK,
                "subscription_id:u16 topic_id:u16 partition:u16 seq:u64 delivery_id:u64 "
                "ownership_epoch:u64 reason:u8 flags:u16",
                doc="NACK 0x06, C->S: RETRY later or REJECT (dead-letter now).")
Ping = _message("Ping", Op.PING, "", doc="PING 0x07, C->S: answered OK even before CONNECT.")
Err = _message("Err", Op.ERR, "code:u16 request_op:u8 message:bytes16",
               doc="ERR 0x08, both ways: a failed request's answer.")
Ok = _message("Ok", Op.OK, "request_op:u8 result:bytes32",
              doc="OK 0x09, S->C: a successful request's answer; see decode_result.")
Pull = _message("Pull", Op.PULL,
                "subscription_id:u16 member_id:u64 membership_epoch:u32 assignment_epoch:u32 "
                "ownership_epochs:list16 max_msgs:u16 max_bytes:u32 wait_ms:u16 min_bytes:u32",
                doc="PULL 0x0B, C->S: answered MSG x N, then OK.")
Heartbeat = _message("Heartbeat", Op.HEARTBEAT,
                     "subscription_id:u16 member_id:u64 membership_epoch:u32 "
                     "assignment_epoch:u32 state:u8",
                     doc="HEARTBEAT 0x0C, C->S: keep a member alive, or LEAVE.")
Notice = _message("Notice", Op.NOTICE,
                  "notice_id:u64 kind:u8 group_id:u16 membership_epoch:u32 "
                  "assignment_epoch:u32 ownership_epoch:u64 topic_id:u16 partition:u16 "
                  "member_id:u64",
                  doc="NOTICE 0x0D, S->C push: ASSIGN or REVOKE of one partition.")
ControlAck = _message("ControlAck", Op.CONTROL_ACK,
                      "notice_id:u64 notice_kind:u8 group_id:u16 membership_epoch:u32 "
                      "assignment_epoch:u32 ownership_epoch:u64 result:u8",
                      doc="CONTROL_ACK 0x0E, C->S: echoes a NOTICE.")
Credit = _message("Credit", Op.CREDIT,
                  "subscription_id:u16 membership_epoch:u32 ownership_epoch:u64 mode:u8 "
                  "credit_count:u16 credit_bytes:u32 reserved:u32",
                  doc="CREDIT 0x0F, C->S: SET or ADD to the credit window.")

_ORIGIN_NAMES = ("origin_topic_id", "origin_partition", "origin_sequence", "attempts", "reason")
_ORIGIN = struct.Struct(">HHQHB")
# Plain ints: `~` on an IntFlag drops the reserved bits a receiver must keep.
_ORIGIN_BIT = int(MsgFlags.ORIGIN)


class _MsgBase(Message):
    __slots__ = ()

    def __init__(self, origin=None, **values):
        Message.__init__(self, **values)
        self.origin = origin

    @classmethod
    def decode(cls, payload):
        out = {}
        pos = _decode_plan(Op.MSG, cls._PLAN, payload, 0, out)
        msg = cls(**out)
        # Flags bit0 promises the origin trailer after the value: a dead letter.
        if msg.flags & _ORIGIN_BIT:
            if len(payload) - pos < _ORIGIN.size:
                raise _short(Op.MSG, pos, _ORIGIN.size)
            msg.origin = Origin(*_ORIGIN.unpack_from(payload, pos))
        return msg

    def encode_payload(self):
        values = self._values()
        # The flag follows `origin`, so an encoded MSG never promises a trailer it lacks.
        flags = values["flags"] & ~_ORIGIN_BIT
        values["flags"] = flags | (_ORIGIN_BIT if self.origin is not None else 0)
        parts = []
        _encode_plan(self._PLAN, values, parts)
        if self.origin is not None:
            parts.append(_ORIGIN.pack(*self.origin))
        return b"".join(parts)

    def fields(self):
        out = Message.fields(self)
        if self.origin is not None:
            out.extend(zip(_ORIGIN_NAMES, self.origin))
        return out

    def _values(self):
        return {name: getattr(self, name) for name in self.__slots__ if name != "origin"}

    def __eq__(self, other):
        return Message.__eq__(self, other) and self.origin == other.origin


Origin = namedtuple("Origin", _ORIGIN_NAMES)
Origin.__doc__ = "The origin trailer of a dead letter (MSG flags bit0)."

Msg = _message("Msg", Op.MSG,
               "subscription_id:u16 topic_id:u16 partition:u16 sequence:u64 delivery_id:u64 "
               "attempt:u16 ownership_epoch:u64 producer_id:u64 producer_seq:u64 flags:u16 "
               "key:bytes16 value:bytes32",
               base=_MsgBase, extra_slots=("origin",),
               doc="MSG 0x0A, S->C push: one delivery; `origin` is set on dead letters.")

MESSAGES = {cls.OP: cls for cls in (
    Connect, Declare, Pub, Sub, Ack, Nack, Ping, Err, Ok, Msg, Pull, Heartbeat, Notice,
    ControlAck, Credit)}


# ---- typed OK results ----------------------------------------------------------------


class Result(Message):
    """A typed OK result. Extra bytes from a later version are ignored."""

    __slots__ = ()
    SIZE = 0

    @classmethod
    def decode(cls, result):
        out = {}
        _decode_plan(Op.OK, cls._PLAN, result, 0, out)
        return cls(**out)


def _result(name, op, fields, doc):
    cls = _message(name, op, fields, base=Result, doc=doc)
    cls.SIZE = sum(st.size for _, st, _ in cls._PLAN)
    return cls


DeclareResult = _result("DeclareResult", Op.DECLARE,
                        "topic_id:u16 partition_count:u16 created:u8",
                        "OK result of DECLARE (5 bytes).")
PubResult = _result("PubResult", Op.PUB,
                    "sequence:u64 durability:u8 leader_epoch:u64 commit_seq:u64 "
                    "result_flags:u8",
                    "OK result of PUB (26 bytes).")
SubResult = _result("SubResult", Op.SUB,
                    "subscription_id:u16 member_id:u64 membership_epoch:u32 "
                    "assignment_epoch:u32",
                    "OK result of SUB (18 bytes).")
CreditResult = _result("CreditResult", Op.CREDIT,
                       "granted_count:u16 granted_bytes:u32 outstanding_count:u16 "
                       "outstanding_bytes:u32 credit_epoch:u64",
                       "OK result of CREDIT (20 bytes).")

RESULTS = {cls.OP: cls for cls in (DeclareResult, PubResult, SubResult, CreditResult)}


def decode_result(request_op, result):
    """The typed result of an OK answering ``request_op``; None for ops whose result is
    empty in v0."""
    cls = RESULTS.get(request_op)
    return None if cls is None else cls.decode(result)


# ---- frames --------------------------------------------------------------------------


def split_frame(buf, max_frame_len=MAX_FRAME_LEN, start=0):
    """The first frame of ``buf[start:]`` as ``(op, payload_start, frame_end)``, or None
    while it is incomplete (never an error). The length is checked against
    ``max_frame_len`` (MAX_FRAME_LEN, or PREAUTH_FRAME_LEN_MAX before CONNECT) from the
    header alone, before any of the body is needed."""
    if len(buf) - start < FRAME_HEADER_BYTES:
        return None
    (length,) = struct.unpack_from(">I", buf, start)
    if length == 0 or length > max_frame_len:
        raise WireError("INVALID_FRAME_LENGTH", "frame length %d" % length)
    if len(buf) - start < FRAME_HEADER_BYTES + 1:
        return None
    op = buf[start + FRAME_HEADER_BYTES]
    if classify_op(op) is OpClass.ILLEGAL:
        raise WireError("ILLEGAL_OP", "op 0x%02X" % op)
    end = start + FRAME_HEADER_BYTES + length
    if len(buf) < end:
        return None
    return op, start + FRAME_HEADER_BYTES + 1, end


def decode(op, payload):
    """The message of a known op's payload. A reserved op is UNKNOWN_OP, a short
    payload MALFORMED_PAYLOAD (both WireError)."""
    kind = classify_op(op)
    if kind is OpClass.ILLEGAL:
        raise WireError("ILLEGAL_OP", "op 0x%02X" % op)
    if kind is OpClass.RESERVED:
        raise WireError("UNKNOWN_OP", "op 0x%02X is reserved" % op)
    return MESSAGES[op].decode(payload)


def decode_frame(frame, max_frame_len=MAX_FRAME_LEN):
    """Decodes one whole frame (``bytes``); bytes past the frame are an error."""
    split = split_frame(frame, max_frame_len)
    if split is None:
        raise WireError("MALFORMED_PAYLOAD", "incomplete frame (%d bytes)" % len(frame))
    op, start, end = split
    if end != len(frame):
        raise ValueError("%d bytes after the frame" % (len(frame) - end))
    return decode(op, frame[start:end])


# ---- hot paths -----------------------------------------------------------------------
#
# The clients build PUB, ACK and NACK frames and read MSG and OK frames for every
# record, so these skip the generic message objects. The golden tests check the
# generic codec; tests/test_wire.py checks these agree with it.

_PUB_HEAD = struct.Struct(">IBHHQQHH")
_U32 = struct.Struct(">I")
_ACK = struct.Struct(">IBHHHQQQH")
_NACK = struct.Struct(">IBHHHQQQBH")
_PUB_FIXED = _PUB_HEAD.size - FRAME_HEADER_BYTES + _U32.size  # op + fields + value_len


def encode_pub(topic_id, partition, producer_id, producer_seq, flags, key, value):
    length = _PUB_FIXED + len(key) + len(value)
    return b"".join((
        _PUB_HEAD.pack(length, Op.PUB, topic_id, partition, producer_id, producer_seq,
                       flags, len(key)),
        key, _U32.pack(len(value)), value))


def encode_ack(subscription_id, topic_id, partition, seq, delivery_id, ownership_epoch,
               flags=0):
    return _ACK.pack(_ACK.size - FRAME_HEADER_BYTES, Op.ACK, subscription_id, topic_id,
                     partition, seq, delivery_id, ownership_epoch, flags)


def encode_nack(subscription_id, topic_id, partition, seq, delivery_id, ownership_epoch,
                reason):
    return _NACK.pack(_NACK.size - FRAME_HEADER_BYTES, Op.NACK, subscription_id, topic_id,
                      partition, seq, delivery_id, ownership_epoch, reason, 0)


_MSG_HEAD = struct.Struct(">HHHQQHQQQHH")


def decode_msg_fields(payload):
    """MSG as a tuple: (subscription_id, topic_id, partition, sequence, delivery_id,
    attempt, ownership_epoch, producer_id, producer_seq, flags, key, value, origin)."""
    end = len(payload)
    if end < _MSG_HEAD.size:
        raise _short(Op.MSG, 0, _MSG_HEAD.size)
    head = _MSG_HEAD.unpack_from(payload, 0)
    pos = _MSG_HEAD.size
    key_len = head[10]
    if end - pos < key_len:
        raise _short(Op.MSG, pos, key_len)
    key = bytes(payload[pos:pos + key_len])
    pos += key_len
    if end - pos < 4:
        raise _short(Op.MSG, pos, 4)
    (value_len,) = _U32.unpack_from(payload, pos)
    pos += 4
    if end - pos < value_len:
        raise _short(Op.MSG, pos, value_len)
    value = bytes(payload[pos:pos + value_len])
    pos += value_len
    origin = None
    if head[9] & _ORIGIN_BIT:
        if end - pos < _ORIGIN.size:
            raise _short(Op.MSG, pos, _ORIGIN.size)
        origin = Origin(*_ORIGIN.unpack_from(payload, pos))
    return head[:10] + (key, value, origin)
