"""The Python codec against the hand-written vectors of golden/ (golden/README.md), the
same files tests/golden.rs checks the Rust codec against, so the two cannot drift.

Every `@kind frame` file is split, decoded to the fields its comments name and
re-encoded byte for byte (minus an `@tail`); every `@kind reject` file is refused with
its `@expect` code; every `@kind partial` file makes the splitter ask for more. The
transcripts, which hold no bytes of their own, are replayed against a real broker in
test_transcripts.py.
"""

import os
import re
import unittest

import support
import golden_format
from mortarmq import wire

CONTRACT = ("golden vectors are the contract: the Python codec (clients/python/mortarmq/"
            "wire.py), src/wire and man/mortarmq.7 change together with golden/")

ALL = golden_format.load_all(support.REPO_ROOT)


def of_kind(kind):
    return [(n, g) for n, g in ALL.items() if g.kind == kind]


def cap(g):
    return wire.PREAUTH_FRAME_LEN_MAX if g.preauth else wire.MAX_FRAME_LEN


def describe(value):
    if isinstance(value, (bytes, bytearray)):
        if len(value) > 32:
            return "%d bytes starting %s" % (len(value), value[:16].hex())
        return "hex:" + value.hex()
    return repr(value)


def is_empty(value):
    return isinstance(value, (bytes, bytearray, list)) and len(value) == 0


def compare_fields(fname, prefix, expected, actual, errs):
    """Names in order, then values. An empty byte field has no byte line in a vector
    (README), so a codec field that is empty and absent from the file is accepted."""
    i = j = 0
    while i < len(expected) or j < len(actual):
        e = expected[i] if i < len(expected) else None
        a = actual[j] if j < len(actual) else None
        if e and a and e[0] == a[0]:
            if e[1] != a[1]:
                errs.append("%s: field `%s%s`: expected %s (file), actual %s (codec)"
                            % (fname, prefix, e[0], describe(e[1]), describe(a[1])))
            i, j = i + 1, j + 1
        elif a and is_empty(a[1]) and all(n != a[0] for n, _ in expected[i:]):
            j += 1
        elif e and not a:
            errs.append("%s: field `%s%s`: the codec decodes no such field" % (fname, prefix, e[0]))
            i += 1
        elif a and not e:
            errs.append("%s: field `%s%s`: not in the file, codec has %s"
                        % (fname, prefix, a[0], describe(a[1])))
            j += 1
        else:
            errs.append("%s: field names and order differ: file %s, codec %s"
                        % (fname, [n for n, _ in expected], [n for n, _ in actual]))
            return


def check_frame(name, g):
    fname = "golden/%s.hex" % name
    errs = []
    try:
        split = wire.split_frame(g.bytes, cap(g))
    except wire.WireError as e:
        return ["%s: expected a complete frame, the splitter refused it: %s" % (fname, e)]
    if split is None:
        return ["%s: expected a complete frame, the splitter asks for more" % fname]
    op, start, end = split
    if end != len(g.bytes):
        errs.append("%s: the frame occupies %d bytes, the file holds %d"
                    % (fname, end, len(g.bytes)))
    for field, actual in (("length", end - 4), ("op", op)):
        if g.field(field) != actual:
            errs.append("%s: field `%s`: expected %r (file), actual %r"
                        % (fname, field, g.field(field), actual))
    try:
        msg = wire.decode(op, g.bytes[start:end])
    except wire.WireError as e:
        return errs + ["%s: decode refused it: %s" % (fname, e)]
    expected = [(n, v) for n, v in g.fields
                if n not in ("length", "op") and not n.startswith("result.")]
    actual = msg.fields()
    if g.result_op:
        actual = [(n, v) for n, v in actual if n != "result"]
    compare_fields(fname, "", expected, actual, errs)
    if g.result_op:
        check_result(fname, g, msg, errs)
    want = g.bytes
    if g.tail:
        # The encoder never writes a tail it does not know: the file minus its tail,
        # with `length` reduced by the tail (README, @tail).
        want = bytearray(g.bytes[:-g.tail])
        want[:4] = (len(want) - 4).to_bytes(4, "big")
        want = bytes(want)
    encoded = msg.encode()
    if encoded != want:
        at = next((k for k, (w, e) in enumerate(zip(want, encoded)) if w != e),
                  min(len(want), len(encoded)))
        errs.append("%s: re-encoding differs at byte %d: file %s, codec %s (%d vs %d bytes)"
                    % (fname, at, want[at:at + 8].hex(), encoded[at:at + 8].hex(),
                       len(want), len(encoded)))
    return errs


def check_result(fname, g, msg, errs):
    cls = wire.RESULTS[wire.Op[g.result_op]]
    if msg.OP != wire.Op.OK or msg.request_op != cls.OP:
        errs.append("%s: @result %s needs an OK answering 0x%02x" % (fname, g.result_op, cls.OP))
        return
    try:
        typed = wire.decode_result(msg.request_op, msg.result)
    except wire.WireError as e:
        errs.append("%s: the %s result does not decode: %s" % (fname, g.result_op, e))
        return
    expected = [(n[len("result."):], v) for n, v in g.fields if n.startswith("result.")]
    if not expected:
        errs.append("%s: @result but no result.* field" % fname)
    compare_fields(fname, "result.", expected, typed.fields(), errs)
    if typed.encode_payload() != msg.result:
        errs.append("%s: the typed %s result re-encodes differently" % (fname, g.result_op))
    if len(msg.result) != cls.SIZE:
        errs.append("%s: %s result is %d bytes, v0 says %d"
                    % (fname, g.result_op, len(msg.result), cls.SIZE))


def refusal(data, limit):
    """The registry name the splitter, op classification or decoder refuses ``data``
    with, or None when it is accepted (or incomplete)."""
    try:
        split = wire.split_frame(data, limit)
        if split is None:
            return None
        op, start, end = split
        wire.decode(op, data[start:end])
    except wire.WireError as e:
        return e.name
    return None


class GoldenVectors(unittest.TestCase):
    def run_all(self, kind, check):
        cases = of_kind(kind)
        self.assertTrue(cases, "no @kind %s vector in golden/" % kind)
        errs = []
        for name, g in cases:
            errs.extend(check(name, g))
        if errs:
            self.fail("%d failures over %d %s vectors:\n  - %s\n%s"
                      % (len(errs), len(cases), kind, "\n  - ".join(errs), CONTRACT))

    def test_frame_vectors_decode_and_reencode_byte_for_byte(self):
        self.run_all("frame", check_frame)

    def test_reject_vectors_are_refused_with_their_code(self):
        def check(name, g):
            fname = "golden/%s.hex" % name
            errs = []
            if g.expect not in wire.ERRORS_BY_NAME:
                errs.append("%s: @expect %s is not a registry name" % (fname, g.expect))
            got = refusal(g.bytes, cap(g))
            if got != g.expect:
                errs.append("%s: expected %s, actual %s" % (fname, g.expect, got or "accepted"))
            if g.expect == "INVALID_FRAME_LENGTH":
                # Refused from the 4 header bytes alone, before any body is buffered.
                if refusal(g.bytes[:4], cap(g)) != g.expect:
                    errs.append("%s: not refused from the header alone" % fname)
            elif int.from_bytes(g.bytes[:4], "big") + 4 != len(g.bytes):
                errs.append("%s: the frame boundary is not intact" % fname)
            return errs

        self.run_all("reject", check)

    def test_partial_vectors_make_the_splitter_ask_for_more(self):
        def check(name, g):
            fname = "golden/%s.hex" % name
            for cut in range(len(g.bytes) + 1):
                try:
                    got = wire.split_frame(g.bytes[:cut], cap(g))
                except wire.WireError as e:
                    return ["%s: first %d bytes refused: %s" % (fname, cut, e)]
                if got is not None:
                    return ["%s: first %d bytes gave a frame" % (fname, cut)]
            total = int.from_bytes(g.bytes[:4], "big") + 4
            if total <= len(g.bytes):
                return ["%s: length does not promise more bytes" % fname]
            whole = g.bytes + bytes(total - len(g.bytes))
            got = wire.split_frame(whole, cap(g))
            if got is None or got[2] != total:
                return ["%s: completed to %d bytes, no whole frame: %r" % (fname, total, got)]
            return []

        self.run_all("partial", check)

    def test_transcripts_name_existing_byte_vectors(self):
        def check(name, g):
            errs = []
            for verb, arg in g.steps:
                if verb in ("send", "recv"):
                    target = ALL.get(arg[:-4])
                    if target is None or target.kind == "transcript" or not target.bytes:
                        errs.append("golden/%s.hex: @%s %s: no byte vector of that name"
                                    % (name, verb, arg))
            return errs

        self.run_all("transcript", check)

    def test_every_op_has_a_frame_vector(self):
        covered = {g.bytes[4] for _, g in of_kind("frame")}
        missing = [op.name for op in wire.Op if op not in covered]
        self.assertEqual(missing, [], CONTRACT)

    def test_field_comments_match_their_own_bytes(self):
        # Independent of the codec: catches a slip in reject and partial files, which
        # are not decoded field by field.
        errs = []
        for name, g in ALL.items():
            for (field, value), (start, end) in zip(g.fields, g.spans):
                raw = g.bytes[start:end]
                if isinstance(value, int):
                    ok = 1 <= len(raw) <= 8 and int.from_bytes(raw, "big") == value
                elif isinstance(value, list):
                    ok = raw == b"".join(v.to_bytes(8, "big") for v in value)
                else:
                    ok = raw == value
                if not ok:
                    errs.append("golden/%s.hex: `%s` = %s, its bytes are %s"
                                % (name, field, describe(value), describe(raw)))
        self.assertEqual(errs, [])

    def test_hot_paths_agree_with_the_generic_codec(self):
        pub = ALL["pub_idempotent"].bytes
        m = wire.decode_frame(pub)
        self.assertEqual(wire.encode_pub(m.topic_id, m.partition, m.producer_id,
                                         m.producer_seq, m.flags, m.key, m.value), pub)
        for name in ("ack", "ack_progress"):
            a = wire.decode_frame(ALL[name].bytes)
            self.assertEqual(wire.encode_ack(a.subscription_id, a.topic_id, a.partition, a.seq,
                                             a.delivery_id, a.ownership_epoch, a.flags),
                             ALL[name].bytes)
        for name in ("nack_retry", "nack_reject"):
            n = wire.decode_frame(ALL[name].bytes)
            self.assertEqual(wire.encode_nack(n.subscription_id, n.topic_id, n.partition, n.seq,
                                              n.delivery_id, n.ownership_epoch, n.reason),
                             ALL[name].bytes)
        for name in ("msg", "msg_origin"):
            raw = ALL[name].bytes
            m = wire.decode_frame(raw)
            self.assertEqual(wire.decode_msg_fields(raw[5:]),
                             (m.subscription_id, m.topic_id, m.partition, m.sequence,
                              m.delivery_id, m.attempt, m.ownership_epoch, m.producer_id,
                              m.producer_seq, m.flags, m.key, m.value, m.origin))


def rust_source(path):
    with open(os.path.join(support.REPO_ROOT, path), encoding="utf-8") as f:
        return f.read()


class Vocabulary(unittest.TestCase):
    """The enums, flags, ops and limits of mortarmq.wire against src/wire, whose values
    the golden vectors only partly cover."""

    def test_enums_and_flags_match_src_wire_vocab(self):
        text = rust_source("src/wire/vocab.rs")
        enums = {}
        for name, body in re.findall(r"pub enum (\w+) \{(.*?)\n    \}", text, re.S):
            enums[name] = {spec: int(code) for code, spec in
                           re.findall(r"\w+ = (\d+), \"(\w+)\";", body)}
        for name, body in re.findall(r"pub struct (\w+): u\d+ \{(.*?)\n    \}", text, re.S):
            enums[name] = {flag: int(v, 16) for flag, v in
                           re.findall(r"const (\w+) = (0x[0-9A-Fa-f]+);", body)}
        self.assertEqual(len(enums), 15, sorted(enums))
        for name, values in enums.items():
            # __members__, not iteration: a multi-bit mask such as PubFlags.DURABILITY is
            # not iterated over.
            ours = {n: int(m) for n, m in getattr(wire, name).__members__.items()}
            self.assertEqual(ours, values, name)

    def test_ops_match_src_wire_ops(self):
        text = rust_source("src/wire/ops.rs")
        codes = dict(re.findall(r"^    (\w+) = (0x[0-9A-F]{2}),$", text, re.M))
        names = dict(re.findall(r"Op::(\w+) => \"(\w+)\",", text))
        rust = {names[v]: int(c, 16) for v, c in codes.items()}
        self.assertEqual({op.name: int(op) for op in wire.Op}, rust)

    def test_limits_match_src_wire_limits(self):
        text = rust_source("src/wire/limits.rs")
        for rust, ours in [("MAX_FRAME_LEN_BYTES", wire.MAX_FRAME_LEN),
                           ("MAX_KEY_LEN_BYTES", wire.MAX_KEY_LEN),
                           ("MAX_TOPIC_LEN_BYTES", wire.MAX_TOPIC_LEN),
                           ("MAX_ERR_MESSAGE_BYTES", wire.MAX_ERR_MESSAGE),
                           ("PREAUTH_FRAME_LEN_MAX_BYTES", wire.PREAUTH_FRAME_LEN_MAX),
                           ("WIRE_VERSION", wire.WIRE_VERSION),
                           ("DEDUP_WINDOW_SEQS", wire.DEDUP_WINDOW_SEQS),
                           ("SUB_PARTITION_ANY", wire.SUB_PARTITION_ANY)]:
            expr = re.search(r"const %s: \w+ = ([^;]+);" % rust, text).group(1)
            # Integer expressions such as `16 * 1024 * 1024` (Rust `_` separators removed).
            value = eval(expr.replace("_", ""), {"__builtins__": {}})
            self.assertEqual(value, ours, rust)
        self.assertEqual(wire.MAX_VALUE_LEN, wire.MAX_FRAME_LEN - 1024)


if __name__ == "__main__":
    unittest.main()
