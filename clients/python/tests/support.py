"""Shared by the tests: the repository root, the package under test (this source tree,
not an installed copy), and a real `mortard` on a free loopback port.

The broker binary is $MORTARD, else target/debug/mortard under the repository root
(`cargo build --bin mortard`); tests that need it are skipped with that advice when
neither exists, unless $MORTARMQ_REQUIRE_BROKER is set (tools/test.sh sets it, so CI
cannot pass by skipping).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.abspath(os.path.join(PACKAGE_ROOT, "..", ".."))

# The tests check the package next to them, whatever else is installed.
if sys.path[:1] != [PACKAGE_ROOT]:
    sys.path.insert(0, PACKAGE_ROOT)

START_TIMEOUT = 20.0


def mortard_path():
    path = os.environ.get("MORTARD") or os.path.join(REPO_ROOT, "target", "debug", "mortard")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def needs_broker(cls):
    """Skips a TestCase when no broker binary is built (fails instead under
    $MORTARMQ_REQUIRE_BROKER)."""
    if mortard_path() or os.environ.get("MORTARMQ_REQUIRE_BROKER"):
        return cls
    return unittest.skip("no mortard: run `cargo build --bin mortard` or set MORTARD")(cls)


def free_port():
    """A loopback port nobody listens on now. Binding port 0 and closing it leaves a
    small race with other processes; the broker reports a clear error if it loses it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mortard:
    """A `mortard` child process with a temporary data directory. It listens on one
    fixed port for its whole life, so a restart keeps the address clients know."""

    def __init__(self, *flags, port=None):
        path = mortard_path()
        if path is None:
            raise RuntimeError("no mortard binary: run `cargo build --bin mortard` or set MORTARD")
        self.binary = path
        self.flags = list(flags)
        self.tmp = tempfile.mkdtemp(prefix="mortarmq-py-")
        self.data_dir = os.path.join(self.tmp, "data")
        self.log_path = os.path.join(self.tmp, "mortard.log")
        self.port = port or free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.proc = None
        self.start()

    def start(self):
        log = open(self.log_path, "ab")
        args = [self.binary, "--listen", self.address, "--admin-listen", "off",
                "--data-dir", self.data_dir] + self.flags
        env = dict(os.environ, RUST_LOG=os.environ.get("MORTARD_LOG", "info"))
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=log, env=env)
        log.close()
        lines = []

        def read_first_line():
            lines.append(self.proc.stdout.readline().decode("utf-8", "replace"))

        reader = threading.Thread(target=read_first_line, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        line = lines[0].strip() if lines else ""
        if not line.startswith("listening "):
            self.kill9()
            raise RuntimeError("mortard did not start (%r); log:\n%s" % (line, self.log_text()))
        # The broker prints the address it bound; with a fixed port it must be ours.
        assert line.split()[1] == self.address, line
        # Later stdout lines are not needed; drain them so the pipe never fills.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def log_text(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill9(self):
        """SIGKILL: no chance to answer, flush or sync anything."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None

    def terminate(self):
        """SIGTERM, then the exit status: it answers what is in flight and syncs."""
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(30)
        proc.stdout.close()
        return status

    def restart(self, kill=False):
        if self.proc is not None:
            if kill:
                self.kill9()
            else:
                self.terminate()
        self.start()

    def stop(self):
        if self.proc is not None:
            self.kill9()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s" % what)
        time.sleep(0.02)


class Proxy:
    """A loopback TCP proxy in front of a broker, to lose an answer on purpose:
    after ``drop_next_answer()``, the next bytes the broker sends are discarded and
    that connection is cut, as if it broke after the broker acted on a request."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self._armed = threading.Event()
        self.dropped = threading.Event()
        self._socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next_answer(self):
        self.dropped.clear()
        self._armed.set()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src, dst, from_broker):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_broker and self._armed.is_set():
                    self._armed.clear()
                    self.dropped.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.listener.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
