"""Producer and Consumer against a real 3-node cluster: given any node's address, they
follow NOT_LEADER to the leader (man/mortarmq.7, REPLICATION)."""

import unittest

import support
import mortarmq
from mortarmq import wire
from mortarmq._conn import leader_address
from mortarmq.errors import MortarError


class LeaderAddress(unittest.TestCase):
    def test_the_text_of_not_leader_names_the_leader(self):
        self.assertEqual(leader_address(MortarError(0x6001, "leader 2 127.0.0.1:7412")),
                         "127.0.0.1:7412")
        for text in ("", "leader", "leader x 127.0.0.1:1", "leader 2 a:1 b"):
            self.assertIsNone(leader_address(MortarError(0x6001, text)), text)
        self.assertIsNone(leader_address(MortarError(0x6002, "leader 2 127.0.0.1:1")))


@support.needs_broker
class FollowTheLeader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        peers = ",".join("%d=127.0.0.1:%d" % (i, support.free_port()) for i in (1, 2, 3))
        cls.nodes = []
        for i in (1, 2, 3):
            cls.nodes.append(support.Mortard("--node-id", str(i), "--peers", peers))

    @classmethod
    def tearDownClass(cls):
        for n in cls.nodes:
            n.stop()

    def test_a_producer_and_a_consumer_given_any_node_work_through_the_leader(self):
        # At least two of the three are followers: without the redirect their
        # NOT_LEADER is retried on the same node until retry_timeout fails it.
        for i, node in enumerate(self.nodes):
            with mortarmq.Producer(node.address, declare=True, retry_timeout=15.0,
                                   timeout=5.0) as p:
                r = p.publish("orders", b"v%d" % i, durability="replicated")
                self.assertEqual(r.durability, wire.Durability.REPLICATED)
                self.assertEqual(r.sequence, i + 1)
        for i, node in enumerate(self.nodes):
            with mortarmq.Consumer(node.address, group="g%d" % i, topic="orders",
                                   timeout=5.0, reconnect_timeout=15.0) as c:
                got = []
                while len(got) < 3:
                    m = c.poll(10.0)
                    self.assertIsNotNone(m, "a record within 10 s from node %d" % (i + 1))
                    got.append(m.value)
                    m.ack()
                self.assertEqual(got, [b"v0", b"v1", b"v2"])


if __name__ == "__main__":
    unittest.main()
