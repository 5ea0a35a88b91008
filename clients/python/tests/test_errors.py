"""ERR answers become MortarError with the registry's name, After, Retry and "client
should": the registry itself against man/mortarmq.7 and the golden ERR frames, then
every error path a real broker can be driven into from one host."""

import os
import re
import socket
import struct
import tempfile
import unittest

import support
import mortarmq
from mortarmq import wire
from mortarmq._conn import Connection, encode_connect
from golden_format import load_all


def man_registry():
    """The ERRORS tables of man/mortarmq.7 as {code: (name, after, client_should, retry)}."""
    with open(os.path.join(support.REPO_ROOT, "man", "mortarmq.7"), encoding="utf-8") as f:
        text = f.read()
    rows = {}
    for table in re.findall(r"^\.TS\n(.*?)^\.TE", text, re.S | re.M):
        # One row: code, name, after, then text blocks T{ ... T}; a long name is a text
        # block too, with a `\:` break point.
        row = r"^(0x[0-9A-F]{4})\t(T\{\n(.*?)\nT\}|\S+)\t(\w+)\tT\{\n(.*?)\nT\}\t(\w+)$"
        for m in re.finditer(row, table, re.S | re.M):
            name = (m.group(3) or m.group(2)).replace("\\:", "")
            rows[int(m.group(1), 16)] = (name, m.group(4), m.group(5), m.group(6))
    return rows


class Refusals(unittest.TestCase):
    def test_an_internal_error_is_resent_after_a_backoff_that_doubles(self):
        # A broker whose disk failed answers every resend INTERNAL_ERROR until a restart:
        # resent at once, that was thousands of PUBs a second until the retry timeout.
        from mortarmq.producer import _backoff_wait, _Record
        producer = object.__new__(mortarmq.Producer)
        producer.idempotent = True
        producer._retry = []
        rec = _Record(1, 0, 0, b"", b"v", None)
        waits = []
        for _ in range(3):
            err = mortarmq.MortarError(0x000E, "journal write failed", wire.Op.PUB)
            producer._refused(rec, err)
            waits.append(_backoff_wait(rec))
        self.assertEqual(len(producer._retry), 3)
        self.assertTrue(0 < waits[0] < waits[1] < waits[2], waits)


class Registry(unittest.TestCase):
    def test_the_registry_is_the_man_pages(self):
        man = man_registry()
        self.assertEqual(len(man), 51)
        ours = {e.code: (e.name, e.after, e.client_should, e.retry) for e in wire.ERRORS.values()}
        self.assertEqual(ours, man)

    def test_every_code_becomes_a_mortar_error_with_its_entry(self):
        for entry in wire.ERRORS.values():
            e = mortarmq.MortarError(entry.code, "text", wire.Op.PUB)
            self.assertEqual((e.code, e.name, e.after, e.retry, e.client_should, e.message),
                             (entry.code, entry.name, entry.after, entry.retry,
                              entry.client_should, "text"))
            self.assertIn(entry.name, str(e))
            self.assertIn(entry.client_should, str(e))
        self.assertEqual(mortarmq.MortarError(0x000A).name, "UNREGISTERED_0x000A")

    def test_golden_err_frames_carry_the_code_their_file_names(self):
        golden = load_all(support.REPO_ROOT)
        errs = {n: g for n, g in golden.items() if n.startswith("err_") and g.kind == "frame"}
        self.assertGreaterEqual(len(errs), 18)
        for name, g in errs.items():
            err = mortarmq.MortarError.from_frame(wire.decode_frame(g.bytes))
            if name != "err_from_client":
                self.assertEqual(err.name, name[len("err_"):].upper(), name)


@support.needs_broker
class BrokerErrors(unittest.TestCase):
    """Each case drives the broker into one ERR and checks the client's MortarError."""

    @classmethod
    def setUpClass(cls):
        cls.broker = support.Mortard("--max-subscriptions", "2", "--max-credit-count", "500")
        cls.addr = cls.broker.address
        with mortarmq.Producer(cls.addr, declare=True, partitions=2) as p:
            cls.topic_id = p.topic("errs")[0]

    @classmethod
    def tearDownClass(cls):
        cls.broker.stop()

    def assertErr(self, name, call, *args, **kw):
        with self.assertRaises(mortarmq.MortarError) as caught:
            call(*args, **kw)
        e = caught.exception
        self.assertEqual(e.name, name, str(e))
        entry = wire.ERRORS_BY_NAME[name]
        self.assertEqual((e.code, e.after, e.retry, e.client_should),
                         (entry.code, entry.after, entry.retry, entry.client_should))
        return e

    def conn(self):
        c = Connection(self.addr)
        self.addCleanup(c.close)
        return c

    def request(self, msg, conn=None):
        # NOTICEs pushed to a raw member are not what these cases look at.
        return (conn or self.conn()).request(msg.encode(), msg.OP, on_push=lambda *push: None)

    def test_producer_errors(self):
        with mortarmq.Producer(self.addr) as p:
            self.assertErr("UNKNOWN_TOPIC", p.publish, "missing", b"v")
            self.assertErr("DURABILITY_UNAVAILABLE", p.publish, "errs", b"v",
                           durability="replicated")
            # The producer goes on after both.
            self.assertEqual(p.publish("errs", b"v", partition=1).partition, 1)
        with mortarmq.Producer(self.addr, declare=True) as p:
            self.assertErr("INVALID_TOPIC_NAME", p.publish, "no spaces", b"v")
            self.assertErr("MUTATION_NOT_PACKABLE", p._declare_call,
                           wire.Declare(topic=b"errs.dlq", partition_count=2))

    def test_declare_errors(self):
        declare = lambda name, count, flags=0: self.request(  # noqa: E731
            wire.Declare(topic=name, partition_count=count, flags=flags))
        self.assertErr("TOPIC_CONFIG_CONFLICT", declare, b"errs", 5)
        self.assertErr("INVALID_ARGUMENT", declare, b"zero", 0)
        self.assertErr("UNKNOWN_TOPIC", declare, b"nothing", 0, wire.DeclareFlags.PASSIVE)
        with mortarmq.Producer(self.addr, declare=True) as p:
            p.topic("inuse")
        with mortarmq.Consumer(self.addr, group="in-use", topic="inuse"):
            self.assertErr("TOPIC_IN_USE", declare, b"inuse", 0,
                           wire.DeclareFlags.DELETE | wire.DeclareFlags.IF_UNUSED)

    def test_pub_errors(self):
        def pub(**fields):
            return self.request(wire.Pub(**dict(dict(topic_id=self.topic_id), **fields)))

        self.assertErr("UNKNOWN_PARTITION", pub, partition=7)
        self.assertErr("UNKNOWN_TOPIC", pub, topic_id=999)
        self.assertErr("KEY_TOO_LARGE", pub, key=b"k" * 256)
        self.assertErr("SEQUENCE_OUT_OF_ORDER", lambda: (
            pub(producer_id=77, producer_seq=1), pub(producer_id=77, producer_seq=3)))

    def test_consume_errors(self):
        c = self.conn()
        ack = wire.Ack(subscription_id=9, topic_id=self.topic_id)
        self.assertErr("UNKNOWN_SUBSCRIPTION", self.request, ack, c)
        self.assertErr("INVALID_GROUP_NAME", mortarmq.Consumer, self.addr, group="bad group!",
                       topic="errs")
        self.assertErr("CREDIT_LIMIT", mortarmq.Consumer, self.addr, group="g", topic="errs",
                       credit=501)
        with mortarmq.Consumer(self.addr, group="g", topic="errs") as member:
            self.assertErr("CREDIT_LIMIT", member.set_credit, count=501)
            self.assertEqual(member.set_credit(count=500).granted_count, 500)
        sub = wire.Sub(group=b"raw", topic_id=self.topic_id, partition=0)
        self.assertErr("INVALID_SUBSCRIPTION", self.request, sub, c)
        sub.partition = wire.SUB_PARTITION_ANY
        joined = wire.SubResult.decode(self.request(sub, c).result)
        hb = wire.Heartbeat(subscription_id=joined.subscription_id, member_id=joined.member_id + 1,
                            membership_epoch=joined.membership_epoch)
        self.assertErr("UNKNOWN_MEMBER", self.request, hb, c)
        self.assertErr("UNKNOWN_NOTICE", self.request, wire.ControlAck(notice_id=12345), c)
        credit = wire.Credit(subscription_id=joined.subscription_id,
                             membership_epoch=joined.membership_epoch + 1)
        self.assertErr("STALE_EPOCH", self.request, credit, c)
        nack = wire.Nack(subscription_id=joined.subscription_id, topic_id=self.topic_id, reason=9)
        self.assertErr("INVALID_ARGUMENT", self.request, nack, c)
        self.request(wire.Sub(group=b"raw2", topic_id=self.topic_id,
                              partition=wire.SUB_PARTITION_ANY), c)
        self.assertErr("TOO_MANY_SUBSCRIPTIONS", self.request,
                       wire.Sub(group=b"raw3", topic_id=self.topic_id,
                                partition=wire.SUB_PARTITION_ANY), c)

    def test_settling_twice_is_dropped_as_the_registry_advises(self):
        with mortarmq.Producer(self.addr) as p:
            p.publish("errs", b"twice", partition=0)
        with mortarmq.Consumer(self.addr, group="twice", topic="errs") as c:
            m = c.poll(5)
            m.reject()
            m._settled = False  # force a second settle: UNKNOWN_DELIVERY, dropped
            m.ack()
            c.flush()
            self.assertEqual(c.ignored_errors, 1)

    def test_session_and_framing_errors(self):
        cases = [
            # (bytes, expected name, the broker closes after it)
            (struct.pack(">IB", 1, 0x00), "ILLEGAL_OP", True),
            (wire.Pub(topic_id=1).encode(), "NOT_CONNECTED", True),
            (struct.pack(">I", 0), "INVALID_FRAME_LENGTH", True),
            (wire.Connect(protocol_version=9).encode(), "UNSUPPORTED_VERSION", True),
            (encode_connect(b"") + encode_connect(b""), "ALREADY_CONNECTED", False),
            (encode_connect(b"") + struct.pack(">IB", 1, 0x10), "UNKNOWN_OP", False),
            (encode_connect(b"") + struct.pack(">IBH", 3, wire.Op.DECLARE, 9),
             "MALFORMED_PAYLOAD", False),
            (encode_connect(b"") + wire.Ok().encode(), "UNEXPECTED_OP", True),
        ]
        for data, name, closes in cases:
            with self.subTest(name):
                frame, closed = self._first_err(data, closes)
                e = mortarmq.MortarError.from_frame(frame)
                self.assertEqual(e.name, name, str(e))
                self.assertEqual(e.closes_connection, closes)
                if closes:
                    self.assertTrue(closed, "the broker closes after %s" % name)

    def _first_err(self, data, closes):
        host, port = self.addr.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(data)
            buf = b""
            while True:
                split = wire.split_frame(buf)
                if split:
                    op, start, end = split
                    frame = wire.decode(op, buf[start:end])
                    buf = buf[end:]
                    if op == wire.Op.ERR:
                        break
                    continue
                chunk = s.recv(65536)
                self.assertTrue(chunk, "closed without an ERR")
                buf += chunk
            closed = False
            if closes:
                try:
                    closed = buf == b"" and s.recv(1) == b""
                except ConnectionResetError:
                    closed = True
            return frame, closed


@support.needs_broker
class LimitErrors(unittest.TestCase):
    def test_auth_failed_is_not_retried(self):
        with tempfile.TemporaryDirectory() as tmp:
            tokens = os.path.join(tmp, "tokens")
            with open(tokens, "w") as f:
                f.write("s3cret\n")
            with support.Mortard("--token-file", tokens) as broker:
                with self.assertRaises(mortarmq.MortarError) as caught:
                    mortarmq.Producer(broker.address, token=b"wrong")
                self.assertEqual((caught.exception.name, caught.exception.after),
                                 ("AUTH_FAILED", "close"))
                with mortarmq.Producer(broker.address, token="s3cret", declare=True) as p:
                    self.assertEqual(p.publish("t", b"v").sequence, 1)

    def test_connection_limit(self):
        with support.Mortard("--max-connections", "1") as broker:
            with mortarmq.Producer(broker.address):
                with self.assertRaises(mortarmq.MortarError) as caught:
                    mortarmq.Producer(broker.address)
                self.assertEqual((caught.exception.name, caught.exception.retry),
                                 ("CONNECTION_LIMIT", "backoff"))

    def test_group_limit(self):
        broker = support.Mortard("--max-groups", "2")
        self.addCleanup(broker.stop)
        with mortarmq.Producer(broker.address, declare=True) as p:
            p.topic("errs")
        members = []
        try:
            with self.assertRaises(mortarmq.MortarError) as caught:
                for i in range(10):
                    members.append(mortarmq.Consumer(broker.address, group="many-%d" % i,
                                                     topic="errs", reconnect_timeout=0))
            self.assertEqual(caught.exception.name, "GROUP_LIMIT_REACHED")
            self.assertEqual(caught.exception.retry, "backoff")
        finally:
            for m in members:
                m.close()

    def test_storage_full(self):
        with support.Mortard("--max-data-size", "64KiB", "--segment-size", "4KiB") as broker:
            with mortarmq.Producer(broker.address, declare=True, retry_timeout=0.5) as p:
                with self.assertRaises(mortarmq.MortarError) as caught:
                    for _ in range(200):
                        p.publish("full", b"x" * 2000)
                self.assertEqual(caught.exception.name, "STORAGE_FULL")


if __name__ == "__main__":
    unittest.main()
