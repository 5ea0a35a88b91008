"""Parser for the hand-written vectors in golden/*.hex (format: golden/README.md).

It knows nothing of the codec, so the codec can never agree with itself through it:
test_golden.py compares what this returns with mortarmq.wire. A file that does not
follow the format raises GoldenFormatError naming golden/<file>:<line>.
"""

import os
import re

REPEAT_MAX = 64 << 20  # a typo in a repeat count cannot allocate gigabytes


class GoldenFormatError(Exception):
    pass


class Golden:
    def __init__(self, name):
        self.name = name
        self.kind = "frame"  # the default when no @kind is given
        self.bytes = bytearray()
        self.fields = []  # (name, value) in file order; value: int, bytes or list
        self.spans = []  # parallel to fields: (start, end) in self.bytes
        self.expect = None
        self.result_op = None
        self.tail = 0
        self.preauth = False
        self.steps = []  # transcripts: (verb, argument)
        self.flags = []

    def field(self, name):
        for n, v in self.fields:
            if n == name:
                return v
        return None


def golden_dir(repo_root):
    return os.path.join(repo_root, "golden")


def load_all(repo_root):
    """Every golden/*.hex, sorted by name, as {case name: Golden}."""
    directory = golden_dir(repo_root)
    out = {}
    for fname in sorted(os.listdir(directory)):
        if fname.endswith(".hex"):
            with open(os.path.join(directory, fname), encoding="utf-8") as f:
                out[fname[:-4]] = parse(fname, f.read())
    if not out:
        raise GoldenFormatError("no *.hex file in %s" % directory)
    return out


def parse(fname, text):
    g = Golden(fname[:-4] if fname.endswith(".hex") else fname)
    tail_line = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()

        def fail(msg, number=number):
            raise GoldenFormatError("golden/%s:%d: %s" % (fname, number, msg))

        # Comment-only lines, field notes such as `# key = "" (empty field: no bytes)`
        # included, carry no bytes.
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            _directive(g, line[1:], fail)
            continue
        if tail_line is not None:
            fail("byte line after the unknown_tail line %d" % tail_line)
        data, _, comment = line.partition("#")
        start = len(g.bytes)
        data = data.strip()
        m = re.fullmatch(r"repeat\s+0x([0-9a-fA-F]{2})\s+(\d+)", data)
        if m:
            count = int(m.group(2))
            if count > REPEAT_MAX:
                fail("repeat count %d over %d" % (count, REPEAT_MAX))
            g.bytes += bytes([int(m.group(1), 16)]) * count
        else:
            try:
                g.bytes += _hex_pairs(data)
            except ValueError as e:
                fail(str(e))
        span = (start, len(g.bytes))
        comment = comment.strip()
        if not comment:
            # A field spanning several lines names itself on the first one only.
            if not g.spans:
                fail("byte line without a field comment before any named field")
            g.spans[-1] = (g.spans[-1][0], span[1])
            continue
        name, eq, value = comment.partition("=")
        name = name.strip()
        if not eq or not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            fail("the comment of a byte line must be `name = value`, got %r" % comment)
        value = _value(value.strip(), fail)
        if name == "unknown_tail":
            tail_line = number
            continue
        g.fields.append((name, value))
        g.spans.append(span)
    g.bytes = bytes(g.bytes)
    if g.kind == "transcript" and g.bytes:
        raise GoldenFormatError("golden/%s: a transcript has no byte lines" % fname)
    return g


def _directive(g, d, fail):
    name, _, arg = d.partition(" ")
    arg = arg.strip()
    if name == "kind":
        if arg not in ("frame", "reject", "partial", "transcript"):
            fail("@kind must be frame, reject, partial or transcript, got %r" % arg)
        g.kind = arg
    elif name == "expect":
        g.expect = arg
    elif name == "direction":
        if arg not in ("C->S", "S->C"):
            fail("@direction must be C->S or S->C")
    elif name == "result":
        if arg not in ("DECLARE", "PUB", "SUB", "CREDIT"):
            fail("@result must be DECLARE, PUB, SUB or CREDIT, got %r" % arg)
        g.result_op = arg
    elif name == "tail":
        if not arg.isdigit() or int(arg) == 0:
            fail("@tail needs a byte count > 0")
        g.tail = int(arg)
    elif name == "preauth":
        g.preauth = True
    elif name in ("send", "recv"):
        if not arg.endswith(".hex") or "/" in arg or " " in arg:
            fail("@%s needs one file of this directory ending in .hex" % name)
        g.steps.append((name, arg))
    elif name == "send-hex":
        try:
            g.steps.append((name, _hex_pairs(arg)))
        except ValueError as e:
            fail("@send-hex: %s" % e)
    elif name == "expect-close":
        g.steps.append((name, None))
    elif name in ("expect-no-close-before", "expect-close-within"):
        seconds = parse_duration(arg)
        if seconds is None:
            fail("@%s needs a duration <n>ms or <n>s" % name)
        g.steps.append((name, seconds))
    elif name == "flags":
        g.flags.extend(arg.split())
    else:
        fail("unknown directive @%s" % name)


def parse_duration(text):
    m = re.fullmatch(r"(\d+)(ms|s)", text)
    if not m:
        return None
    return int(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


def _hex_pairs(text):
    out = bytearray()
    for word in text.split():
        if len(word) % 2:
            raise ValueError("odd number of hex digits in %r" % word)
        out += bytes.fromhex(word)
    return bytes(out)


def _value(text, fail):
    """A field comment's value: 33, 0x0021, "ascii", hex:0a0b, [1, 2], repeat(0xAB, N)."""
    m = re.fullmatch(r'"([^"]*)"(\s.*)?', text)
    if m:
        return m.group(1).encode("ascii")
    m = re.fullmatch(r"hex:([0-9a-fA-F]*)(\s.*)?", text)
    if m:
        return bytes.fromhex(m.group(1))
    m = re.fullmatch(r"repeat\(0x([0-9a-fA-F]{2}),\s*(\d+)\)(\s.*)?", text)
    if m:
        return bytes([int(m.group(1), 16)]) * int(m.group(2))
    m = re.fullmatch(r"\[([0-9,\sxa-fA-F]*)\](\s.*)?", text)
    if m:
        return [int(x, 0) for x in m.group(1).replace(",", " ").split()]
    m = re.fullmatch(r"(0x[0-9a-fA-F]+|\d+)(\s.*)?", text)
    if m:
        return int(m.group(1), 0)
    fail("cannot read the value %r" % text)
