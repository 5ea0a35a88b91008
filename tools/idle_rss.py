#!/usr/bin/env python3
"""Measures what idle connections cost mortard: starts a release mortard on a free
port with a temporary data dir, opens N connections that each CONNECT and then stay
idle, and prints the daemon's RSS before and after (from /proc/PID/status), and what
the idle RSS is made of (from /proc/PID/smaps: the daemon's own code and data, shared
libraries, heap, thread stacks and other anonymous memory).

usage: tools/idle_rss.py [N] (default 5000; run `cargo build --release` first)
"""
import os, resource, socket, struct, subprocess, sys, tempfile, time

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def rss_parts_kib(pid, binary):
    """Resident KiB per kind of mapping."""
    parts, kind = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                perms, name = fields[1], (fields[5] if len(fields) > 5 else "")
                if name == binary:
                    kind = "mortard code" if "x" in perms else "mortard data"
                elif name.startswith("/"):
                    kind = "shared libraries"
                elif name == "[heap]":
                    kind = "heap"
                elif name == "[stack]":
                    kind = "main stack"
                else:
                    kind = "other anonymous (thread stacks, mmap'd heap)" if not name else name
            elif fields[0] == "Rss:":
                parts[kind] = parts.get(kind, 0) + int(fields[1])
    return parts

def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 1024)), hard))
    binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "mortard")
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--admin-listen", "off",
             "--data-dir", os.path.join(d, "data"), "--max-connections", str(n + 10)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n + 1024, hard)))
        line = proc.stdout.readline().decode().split()
        host, port = line[1].rsplit(":", 1)
        time.sleep(0.3)
        before = rss_kib(proc.pid)
        for kind, kib in sorted(rss_parts_kib(proc.pid, os.path.realpath(binary)).items(),
                                key=lambda kv: -kv[1]):
            if kib:
                print(f"idle rss: {kib:5} KiB {kind}")
        connect = struct.pack(">IBBHHI", 10, 1, 1, 0, 0, 0)
        socks = []
        for _ in range(n):
            s = socket.create_connection((host, int(port)))
            s.sendall(connect)
            socks.append(s)
        for s in socks:
            assert s.recv(16)[4] == 9, "CONNECT not answered with OK"
        time.sleep(0.5)
        after = rss_kib(proc.pid)
        per = (after - before) * 1024 / n
        print(f"idle_rss_kib={before} rss_with_{n}_idle_kib={after} bytes_per_idle_connection={per:.0f}")
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait()

if __name__ == "__main__":
    main()
