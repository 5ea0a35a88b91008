#!/usr/bin/env python3
"""Publish and consume throughput through the Python client (clients/python), in
msgs/s, to set beside `mortar-bench` (docs/BENCHMARKS.md).

    python3 tools/py_bench.py [--broker ADDR] [--count N] [--value-size BYTES]
        [--durability written|fsync] [--max-in-flight W] [--credit C] [--pull]

Without --broker it starts target/release/mortard (or $MORTARD) on a free loopback port
with a temporary data directory, and stops it at the end. Phases, one topic of one
partition, values of --value-size bytes:

  publish   one Producer: send() x N pipelined (--max-in-flight), then flush()
  publish1  one Producer: publish() x N/50, each waiting for its answer
  consume   one Consumer (push, --credit; or PULL): poll() + ack() x N, then flush()

Each prints `NAME msgs/s MB/s seconds`, and the run ends with the same figures as one
JSON line on stderr.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import mortarmq  # noqa: E402  (the source tree's package, found through the path above)


def start_broker(durability):
    binary = os.environ.get("MORTARD") or os.path.join(ROOT, "target", "release", "mortard")
    if not os.path.exists(binary):
        sys.exit("py_bench: no %s: run `cargo build --release --bin mortard`, set MORTARD, "
                 "or pass --broker" % binary)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="py-bench-")
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:%d" % port, "--admin-listen", "off",
         "--data-dir", os.path.join(tmp, "data"), "--durability", durability],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode().split()
    if line[:1] != ["listening"]:
        proc.kill()
        sys.exit("py_bench: mortard did not start")
    return proc, tmp, line[1]


def report(results, name, count, value_size, seconds):
    rate = count / seconds
    results[name] = {"msgs_per_s": round(rate), "mb_per_s": round(rate * value_size / 1e6, 1),
                     "seconds": round(seconds, 3), "count": count}
    print("%-9s %10.0f msgs/s %8.1f MB/s %8.3f s" % (name, rate, rate * value_size / 1e6,
                                                    seconds))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", help="broker address (default: start one)")
    ap.add_argument("--count", type=int, default=200000)
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--durability", choices=("written", "fsync"), default="fsync")
    ap.add_argument("--max-in-flight", type=int, default=256)
    ap.add_argument("--credit", type=int, default=256)
    ap.add_argument("--pull", action="store_true")
    args = ap.parse_args()

    proc = tmp = None
    address = args.broker
    if address is None:
        proc, tmp, address = start_broker(args.durability)
    topic = "py-bench-%d" % os.getpid()
    value = b"v" * args.value_size
    results = {}
    try:
        with mortarmq.Producer(address, declare=True, partitions=1,
                               durability=args.durability,
                               max_in_flight=args.max_in_flight) as p:
            p.topic(topic)
            t0 = time.perf_counter()
            for _ in range(args.count):
                p.send(topic, value)
            p.flush()
            report(results, "publish", args.count, args.value_size, time.perf_counter() - t0)

            one = max(1, args.count // 50)
            t0 = time.perf_counter()
            for _ in range(one):
                p.publish(topic, value)
            report(results, "publish1", one, args.value_size, time.perf_counter() - t0)

        total = args.count + one
        with mortarmq.Consumer(address, group="py-bench", topic=topic, pull=args.pull,
                               credit=args.credit) as c:
            t0 = time.perf_counter()
            for _ in range(total):
                m = c.poll(30)
                if m is None:
                    sys.exit("py_bench: the consumer got nothing for 30 s")
                m.ack()
            c.flush()
            report(results, "consume", total, args.value_size, time.perf_counter() - t0)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    results["config"] = {k: v for k, v in vars(args).items() if k != "broker"}
    results["python"] = sys.version.split()[0]
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
