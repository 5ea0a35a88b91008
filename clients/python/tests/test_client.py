"""Producer and Consumer against a real mortard: round trips, idempotent resends after
a lost answer and after kill -9, consumers resuming after restarts, dead letters,
rebalancing, PULL mode, heartbeats and idle connections."""

import os
import subprocess
import threading
import time
import unittest
import zlib

import support
import mortarmq
from mortarmq.producer import partition_for

# Short consume-plane timers, and ack-wait long enough that a slow shared machine never
# expires a delivery a test holds on purpose.
FAST = ["--nack-delay", "100ms", "--commit-interval", "100ms", "--revoke-timeout", "1s",
        "--ack-wait", "20s"]


def drain(consumer, idle=1.0, ack=True, limit=None):
    """Messages until none arrives for ``idle`` seconds (acknowledged unless ack=False)."""
    got = []
    while limit is None or len(got) < limit:
        m = consumer.poll(idle)
        if m is None:
            break
        got.append(m)
        if ack:
            m.ack()
    consumer.flush(10)
    return got


@support.needs_broker
class RoundTrip(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.broker = support.Mortard(*FAST)

    @classmethod
    def tearDownClass(cls):
        cls.broker.stop()

    def test_publish_and_consume_every_record_once_in_partition_order(self):
        with mortarmq.Producer(self.broker.address, declare=True, partitions=4) as p:
            receipts = [p.publish("rt", b"value-%d" % i, key=b"key-%d" % (i % 7))
                        for i in range(40)]
        for i, r in enumerate(receipts):
            self.assertEqual(r.partition, zlib.crc32(b"key-%d" % (i % 7)) % 4)
            self.assertEqual(r.durability, mortarmq.Durability.FSYNCED)
            self.assertFalse(r.deduplicated)
        with mortarmq.Consumer(self.broker.address, group="g", topic="rt") as c:
            got = drain(c)
            self.assertEqual(c.assignment, [0, 1, 2, 3])
        self.assertEqual(sorted(m.value for m in got), sorted(b"value-%d" % i for i in range(40)))
        by_partition = {}
        for m in got:
            self.assertEqual(m.topic, "rt")
            self.assertEqual(m.attempt, 1)
            self.assertIsNone(m.origin)
            self.assertEqual(m.partition, partition_for(m.key, 4))
            by_partition.setdefault(m.partition, []).append(m.sequence)
        for seqs in by_partition.values():
            self.assertEqual(seqs, list(range(1, len(seqs) + 1)))
        # Everything was acknowledged: the group gets nothing more, another group all.
        with mortarmq.Consumer(self.broker.address, group="g", topic="rt") as c:
            self.assertEqual(drain(c, idle=0.5), [])
        with mortarmq.Consumer(self.broker.address, group="other", topic="rt") as c:
            self.assertEqual(len(drain(c)), 40)

    def test_start_latest_skips_what_was_published_before(self):
        with mortarmq.Producer(self.broker.address, declare=True) as p:
            p.publish("latest", b"old")
            with mortarmq.Consumer(self.broker.address, group="g", topic="latest",
                                   start="latest") as c:
                self.assertIsNone(c.poll(0.5))
                p.publish("latest", b"new")
                self.assertEqual([m.value for m in drain(c)], [b"new"])

    def test_pipelined_send_keeps_order_around_a_refused_record(self):
        # DURABILITY_UNAVAILABLE refuses the 4th record for good: its producer_seq is a
        # hole, so the records behind it are refused too and must be renumbered and
        # resent, in order, without a gap or a copy.
        with mortarmq.Producer(self.broker.address, declare=True, partitions=1) as p:
            handles = [p.send("holes", b"%d" % i,
                              durability="replicated" if i == 3 else None) for i in range(8)]
            p.flush()
            with self.assertRaises(mortarmq.MortarError) as caught:
                handles[3].result()
            self.assertEqual(caught.exception.name, "DURABILITY_UNAVAILABLE")
            seqs = [h.result().sequence for i, h in enumerate(handles) if i != 3]
            self.assertEqual(seqs, list(range(1, 8)))
            self.assertEqual(p.publish("holes", b"8").sequence, 8)
        with mortarmq.Consumer(self.broker.address, group="g", topic="holes") as c:
            values = [m.value for m in drain(c)]
        self.assertEqual(values, [b"0", b"1", b"2", b"4", b"5", b"6", b"7", b"8"])

    def test_pull_mode(self):
        with mortarmq.Producer(self.broker.address, declare=True, partitions=2) as p:
            for i in range(10):
                p.send("pulled", b"%d" % i, partition=i % 2)
            p.flush()
        with mortarmq.Consumer(self.broker.address, group="g", topic="pulled", pull=True,
                               credit=3) as c:
            got = drain(c)
        self.assertEqual(sorted(int(m.value) for m in got), list(range(10)))

    def test_nack_retry_redelivers_with_the_next_attempt(self):
        with mortarmq.Producer(self.broker.address, declare=True) as p:
            p.publish("retried", b"again")
        with mortarmq.Consumer(self.broker.address, group="g", topic="retried") as c:
            first = c.poll(5)
            self.assertTrue(first.nack_retry())
            second = c.poll(5)
            self.assertEqual((second.sequence, second.attempt), (first.sequence, 2))
            self.assertTrue(second.ack())
            self.assertFalse(second.ack(), "a message is settled once")
            c.flush()
            self.assertIsNone(c.poll(0.5))

    def test_credit_bounds_the_unsettled_deliveries(self):
        with mortarmq.Producer(self.broker.address, declare=True) as p:
            for i in range(3):
                p.send("credited", b"%d" % i)
            p.flush()
        with mortarmq.Consumer(self.broker.address, group="g", topic="credited") as c:
            granted = c.set_credit(count=1)
            self.assertEqual(granted.granted_count, 1)
            first = c.poll(5)
            # The window is full until the first is settled.
            self.assertIsNone(c.poll(0.5))
            first.ack()
            second = c.poll(5)
            self.assertEqual((first.value, second.value), (b"0", b"1"))
            second.ack()
            self.assertEqual(c.poll(5).value, b"2")

    def test_progress_keeps_a_slow_delivery(self):
        broker = support.Mortard("--ack-wait", "1500ms")
        try:
            with mortarmq.Producer(broker.address, declare=True) as p:
                p.publish("slow", b"work")
            with mortarmq.Consumer(broker.address, group="g", topic="slow") as c:
                m = c.poll(5)
                for _ in range(4):  # 2 s in all: past the ack-wait without PROGRESS
                    time.sleep(0.5)
                    self.assertTrue(m.progress())
                    c.flush()
                self.assertIsNone(c.poll(0.1), "no redelivery while in progress")
                m.ack()
                c.flush()
                self.assertIsNone(c.poll(1.0))
        finally:
            broker.stop()

    def test_two_members_share_partitions_and_the_survivor_takes_over(self):
        with mortarmq.Producer(self.broker.address, declare=True, partitions=4) as p:
            for i in range(40):
                p.send("shared", b"%d" % i, partition=i % 4)
            p.flush()
        assigned, revoked = [], []
        a = mortarmq.Consumer(self.broker.address, group="g", topic="shared", credit=1,
                              on_assign=assigned.append, on_revoke=revoked.append)
        b = mortarmq.Consumer(self.broker.address, group="g", topic="shared", credit=1)
        seen = []
        deadline = time.monotonic() + 20
        while (len(a.assignment) + len(b.assignment) < 4 or not a.assignment
               or not b.assignment) and time.monotonic() < deadline:
            for c in (a, b):
                m = c.poll(0.05)
                if m is not None:
                    seen.append(m.value)
                    m.ack()
        self.assertEqual(sorted(a.assignment + b.assignment), [0, 1, 2, 3])
        self.assertTrue(a.assignment and b.assignment, "both members hold partitions")
        self.assertTrue(revoked, "the first member gave partitions up for the second")
        b.close()
        while True:
            m = a.poll(1.5)
            if m is None:
                break
            seen.append(m.value)
            m.ack()
        a.flush()
        self.assertEqual(a.assignment, [0, 1, 2, 3])
        a.close()
        self.assertEqual(sorted(set(int(v) for v in seen)), list(range(40)))

    def test_partition_of_a_key_matches_mortarctl(self):
        ctl = os.path.join(support.REPO_ROOT, "target", "debug", "mortarctl")
        if not os.path.exists(ctl):
            if os.environ.get("MORTARMQ_REQUIRE_BROKER"):
                self.fail("no target/debug/mortarctl")
            self.skipTest("no target/debug/mortarctl")
        with mortarmq.Producer(self.broker.address, declare=True, partitions=7) as p:
            p.topic("keyed")
            for key in ("customer-42", "a", "k", "orders/7", "\u00e9t\u00e9"):
                out = subprocess.run(
                    [ctl, "--broker", self.broker.address, "pub", "keyed", "--key", key,
                     "--value", "v"], check=True, capture_output=True, text=True).stdout
                ctl_partition = int(out.split(" partition ")[1].split()[0])
                self.assertEqual(p.publish("keyed", b"v", key=key).partition, ctl_partition, key)


@support.needs_broker
class Restarts(unittest.TestCase):
    def setUp(self):
        self.broker = support.Mortard(*FAST)

    def tearDown(self):
        self.broker.stop()

    def test_a_lost_answer_is_resent_and_deduplicated(self):
        proxy = support.Proxy(self.broker.port)
        try:
            with mortarmq.Producer(proxy.address, declare=True) as p:
                first = p.publish("dedup", b"one")
                proxy.drop_next_answer()
                # The broker appends it, its answer is lost with the connection: the
                # producer reconnects and resends the same (producer_id, producer_seq).
                again = p.publish("dedup", b"two")
                self.assertTrue(proxy.dropped.is_set())
                self.assertTrue(again.deduplicated)
                self.assertEqual(again.sequence, first.sequence + 1)
                self.assertEqual(p.publish("dedup", b"three").sequence, first.sequence + 2)
        finally:
            proxy.close()
        with mortarmq.Consumer(self.broker.address, group="g", topic="dedup") as c:
            self.assertEqual([m.value for m in drain(c)], [b"one", b"two", b"three"])

    def test_kill9_in_the_middle_of_a_stream_leaves_exactly_one_copy(self):
        self._restart_in_a_stream(kill=True)

    def test_sigterm_in_the_middle_of_a_stream_leaves_exactly_one_copy(self):
        # A stopping broker answers what it read and refuses the rest with
        # SHUTTING_DOWN (close): those are resent to the next broker.
        self._restart_in_a_stream(kill=False)

    def _restart_in_a_stream(self, kill):
        p = mortarmq.Producer(self.broker.address, declare=True, partitions=3,
                              durability="written")
        handles = []
        errors = []
        stop = threading.Event()

        def produce():
            try:
                i = 0
                while not stop.is_set():
                    handles.append(p.send("once", b"%d" % i, key=b"%d" % (i % 11)))
                    i += 1
                p.flush()
            except Exception as e:  # reported by the test thread below
                errors.append(e)

        def answered():
            return sum(h.done() for h in handles[:])

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            support.wait_until(lambda: answered() >= 500, what="500 answered records")
            self.broker.restart(kill=kill)
            # The stream goes on through the restart, so the stop hit it mid-flight.
            sent_by_then = len(handles)
            support.wait_until(lambda: answered() >= sent_by_then + 500, timeout=30,
                               what="500 more answered records after the restart")
        finally:
            stop.set()
            worker.join(60)
        self.assertFalse(worker.is_alive())
        self.assertEqual(errors, [])
        total = len(handles)
        receipts = [h.result() for h in handles]
        self.assertGreaterEqual(p.reconnects, 1)
        p.close()
        with mortarmq.Consumer(self.broker.address, group="g", topic="once", credit=1000) as c:
            values = [int(m.value) for m in drain(c, idle=1.5)]
        self.assertEqual(len(values), total, "no record lost or doubled")
        self.assertEqual(sorted(values), list(range(total)))
        # Each receipt names the one copy.
        by_partition = {}
        for r in receipts:
            by_partition.setdefault(r.partition, set()).add(r.sequence)
        self.assertEqual(sum(len(s) for s in by_partition.values()), total)

    def _consumer_resumes(self, kill):
        with mortarmq.Producer(self.broker.address, declare=True, partitions=2) as p:
            for i in range(10):
                p.send("resume", b"%d" % i, partition=i % 2)
            p.flush()
        revoked = []
        c = mortarmq.Consumer(self.broker.address, group="g", topic="resume",
                              on_revoke=revoked.append, heartbeat_interval=0.5)
        first = drain(c, limit=4)
        self.assertEqual(len(first), 4)
        time.sleep(0.3)  # a commit interval: positions reach the disk even after kill -9
        self.broker.restart(kill=kill)
        rest = drain(c, idle=3.0)
        c.close()
        self.assertEqual(sorted(revoked), [0, 1], "a lost connection revokes everything")
        before = {int(m.value) for m in first}
        after = {int(m.value) for m in rest}
        self.assertEqual(before | after, set(range(10)))
        if not kill:
            # SIGTERM saves positions: nothing acknowledged comes back.
            self.assertEqual(before & after, set())

    def test_consumer_resumes_after_sigterm_restart(self):
        self._consumer_resumes(kill=False)

    def test_consumer_resumes_after_kill9_restart(self):
        self._consumer_resumes(kill=True)

    def test_producer_waits_for_a_broker_that_comes_back(self):
        with mortarmq.Producer(self.broker.address, declare=True) as p:
            p.publish("back", b"before")
            self.broker.kill9()
            threading.Timer(1.0, self.broker.start).start()
            r = p.publish("back", b"after")
            self.assertEqual(r.sequence, 2)

    def test_producer_gives_up_after_retry_timeout(self):
        with mortarmq.Producer(self.broker.address, declare=True, retry_timeout=1.0) as p:
            p.publish("gone", b"x")
            self.broker.kill9()
            started = time.monotonic()
            with self.assertRaises(ConnectionError):
                p.publish("gone", b"y")
            self.assertLess(time.monotonic() - started, 10)
            self.broker.start()
            # A fresh producer_id after the unknown outcome: nothing is refused.
            self.assertGreaterEqual(p.publish("gone", b"z").sequence, 2)


@support.needs_broker
class DeadLetters(unittest.TestCase):
    def test_rejected_message_shows_up_with_its_origin(self):
        with support.Mortard(*FAST) as broker:
            with mortarmq.Producer(broker.address, declare=True, partitions=2) as p:
                p.publish("orders", b"fine", key=b"k0", partition=1)
                poison = p.publish("orders", b"poison-value", key=b"poison-key", partition=1)
                topic_id, _ = p.topic("orders")
            with mortarmq.Consumer(broker.address, group="billing", topic="orders") as c:
                fine, bad = c.poll(5), c.poll(5)
                self.assertEqual(bad.value, b"poison-value")
                fine.ack()
                self.assertTrue(bad.reject())
                c.flush()
                self.assertIsNone(c.poll(0.5), "settled by the dead letter")
            with mortarmq.Consumer(broker.address, group="dlq-reader", topic="orders.dlq") as d:
                m = d.poll(5)
                self.assertIsNone(d.poll(0.3))
                m.ack()
            self.assertEqual((m.topic, m.partition, m.key, m.value),
                             ("orders.dlq", 1, b"poison-key", b"poison-value"))
            self.assertEqual(m.origin, mortarmq.DeadLetterOrigin(
                topic_id=topic_id, topic="orders", partition=1, sequence=poison.sequence,
                attempts=1, reason=mortarmq.OriginReason.REJECTED))

    def test_max_attempts_dead_letters_with_the_attempt_count(self):
        with support.Mortard("--max-attempts", "2", "--nack-delay", "50ms") as broker:
            with mortarmq.Producer(broker.address, declare=True) as p:
                p.publish("flaky", b"never-acked", key=b"key")
            with mortarmq.Consumer(broker.address, group="g", topic="flaky") as c:
                for attempt in (1, 2):
                    m = c.poll(5)
                    self.assertEqual(m.attempt, attempt)
                    m.nack_retry()
                c.flush()
                self.assertIsNone(c.poll(0.5))
            with mortarmq.Consumer(broker.address, group="g", topic="flaky.dlq") as d:
                m = d.poll(5)
            self.assertEqual(m.value, b"never-acked")
            self.assertEqual((m.origin.topic, m.origin.attempts, m.origin.reason),
                             ("flaky", 2, mortarmq.OriginReason.MAX_ATTEMPTS))

    def test_a_producer_addresses_the_twin_through_its_source(self):
        with support.Mortard() as broker:
            with mortarmq.Producer(broker.address, declare=True, partitions=3) as p:
                source = p.topic("replay")
                self.assertEqual(p.topic("replay.dlq"), (source[0] + 1, 3))
                self.assertEqual(p.publish("replay.dlq", b"by hand").sequence, 1)


@support.needs_broker
class Liveness(unittest.TestCase):
    def test_heartbeats_keep_a_busy_member_in_its_group(self):
        with support.Mortard("--session-timeout", "1500ms") as broker:
            with mortarmq.Producer(broker.address, declare=True) as p:
                p.topic("busy")
                revoked = []
                with mortarmq.Consumer(broker.address, group="g", topic="busy",
                                       heartbeat_interval=0.2, on_revoke=revoked.append) as c:
                    self.assertIsNone(c.poll(0.5))
                    member = c._sub.member_id
                    time.sleep(3.0)  # "busy": no poll, only the heartbeat thread
                    p.publish("busy", b"still here")
                    self.assertEqual(c.poll(5).value, b"still here")
                    self.assertEqual((c._sub.member_id, revoked), (member, []))

    def test_an_expelled_member_joins_again(self):
        with support.Mortard("--session-timeout", "500ms") as broker:
            with mortarmq.Producer(broker.address, declare=True) as p:
                p.publish("expel", b"first")
                with mortarmq.Consumer(broker.address, group="g", topic="expel",
                                       heartbeat_interval=60) as c:
                    first = c.poll(5)
                    time.sleep(1.5)  # silent past the session timeout
                    first.ack()  # answered UNKNOWN_SUBSCRIPTION: join again
                    again = c.poll(5)
                    self.assertEqual(again.value, b"first", "redelivered after the rejoin")
                    again.ack()
                    c.flush()

    def test_idle_connections_closed_by_the_broker_are_replaced(self):
        with support.Mortard("--idle-timeout", "1s") as broker:
            with mortarmq.Producer(broker.address, declare=True) as p:
                p.publish("idle", b"1")
                time.sleep(1.5)
                self.assertEqual(p.publish("idle", b"2").sequence, 2)
                self.assertEqual(p.reconnects, 1, "the broker had closed the idle connection")
            with mortarmq.Consumer(broker.address, group="g", topic="idle",
                                   heartbeat_interval=0.2) as c:
                first = drain(c, idle=0.8)
                self.assertEqual([m.value for m in first], [b"1", b"2"])
                gen = c._gen
                time.sleep(1.5)
                self.assertIsNone(c.poll(0.2))
                self.assertEqual(c._gen, gen, "heartbeats kept the connection open")


if __name__ == "__main__":
    unittest.main()
