"""Replays every `@kind transcript` of golden/ against a real broker, reading its
answers with the Python frame splitter and codec (golden/README.md, Transcript
semantics). The Rust broker tests replay the same files."""

import select
import socket
import time
import unittest

import support
import golden_format
from mortarmq import wire

ALL = golden_format.load_all(support.REPO_ROOT)
CLOSE_WAIT = 5.0  # @expect-close: how long the broker may take to close


class Replay:
    def __init__(self, test, address):
        host, port = address.split(":")
        self.test = test
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = b""
        self.sent_at = time.monotonic()

    def send(self, data):
        self.sock.sendall(data)
        self.sent_at = time.monotonic()

    def read_frame(self, deadline):
        while True:
            split = wire.split_frame(self.buf)
            if split is not None:
                op, start, end = split
                raw, self.buf = self.buf[:end], self.buf[end:]
                return raw
            chunk = self._recv(deadline)
            if not chunk:
                self.test.fail("closed while a frame was expected")
            self.buf += chunk

    def _recv(self, deadline):
        """Bytes, b"" at EOF (or reset), None when nothing came by ``deadline``."""
        left = max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([self.sock], [], [], left)
        if not readable:
            return None
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def expect_close(self, within):
        self.test.assertEqual(self.buf, b"", "bytes before the close")
        got = self._recv(self.sent_at + within)
        self.test.assertIsNotNone(got, "still open after %.1f s" % within)
        self.test.assertEqual(got, b"", "bytes arrived instead of the close")

    def expect_open(self, until):
        self.test.assertEqual(self.buf, b"")
        got = self._recv(self.sent_at + until)
        self.test.assertIsNone(got, "closed or answered before %.3f s" % until)


@support.needs_broker
class Transcripts(unittest.TestCase):
    def test_every_transcript_replays_against_the_broker(self):
        transcripts = {n: g for n, g in ALL.items() if g.kind == "transcript"}
        self.assertTrue(transcripts)
        plain = support.Mortard()
        self.addCleanup(plain.stop)
        for name, g in sorted(transcripts.items()):
            with self.subTest(name):
                if g.flags:
                    broker = support.Mortard(*g.flags)
                    self.addCleanup(broker.stop)
                else:
                    broker = plain
                self.replay(g, broker.address)

    def replay(self, g, address):
        r = Replay(self, address)
        try:
            for verb, arg in g.steps:
                if verb == "send":
                    r.send(ALL[arg[:-4]].bytes)
                elif verb == "send-hex":
                    r.send(arg)
                elif verb == "recv":
                    self.expect_frame(r, ALL[arg[:-4]], arg)
                elif verb == "expect-close":
                    r.expect_close(CLOSE_WAIT)
                elif verb == "expect-close-within":
                    r.expect_close(arg)
                elif verb == "expect-no-close-before":
                    r.expect_open(arg)
                else:
                    self.fail("unknown step @%s" % verb)
        finally:
            r.sock.close()

    def expect_frame(self, r, want, fname):
        raw = r.read_frame(time.monotonic() + 10)
        if want.bytes[4] != wire.Op.ERR:
            self.assertEqual(raw.hex(), want.bytes.hex(), fname)
            return
        # An ERR's message text is not known in advance: code and request_op are.
        got = wire.decode_frame(raw)
        expected = wire.decode_frame(want.bytes)
        self.assertIsInstance(got, wire.Err, fname)
        self.assertEqual((got.code, got.request_op), (expected.code, expected.request_op), fname)
        self.assertLessEqual(len(got.message), wire.MAX_ERR_MESSAGE)


if __name__ == "__main__":
    unittest.main()
