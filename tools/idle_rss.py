#!/usr/bin/env python3
"""Measures what an idle mortard costs in resident memory, and what idle connections add.

Starts a release mortard as an operator would (default flags, except port 0 for the client
and admin listeners and a temporary data dir), waits until it is idle, and prints its
VmRSS (/proc/PID/status) and what it is made of (/proc/PID/smaps), one row per part:
mortard's text, read-only data and writable data, each shared library by name, the heap,
each thread's stack (named by thread; found from the stack pointer in
/proc/PID/task/TID/syscall), glibc's per-thread malloc arenas and the rest of the
anonymous memory. Then it opens N connections that each CONNECT and stay idle, and prints
the RSS with them and the bytes each costs.

usage: tools/idle_rss.py [N] [--max-idle-kib KIB] [--binary PATH]
  N                 idle connections to open after the breakdown (default 5000; 0: none)
  --max-idle-kib    exit 1 when the idle VmRSS is above KIB (issue 14's target is 2048)
  --binary          the mortard to measure (default target/release/mortard; run
                    `cargo build --release` first)

The breakdown is a benchmark's report, not a test: VmRSS counts the file pages the kernel
maps around each page fault (64 KiB windows), so it moves with the machine's page cache.
"""
import argparse, os, resource, socket, struct, subprocess, sys, tempfile, time

# glibc reserves a 64 MiB region per extra malloc arena (HEAP_MAX_SIZE on 64-bit), aligned
# to its size; an anonymous mapping starting on that alignment is an arena.
ARENA_ALIGN = 64 << 20
# Idle: no CPU time used over this long (a fresh data dir has its journal's spare file
# zero-filled by an fsync worker after start), waited for at most IDLE_WAIT_MAX_S.
IDLE_QUIET_S = 0.5
IDLE_WAIT_MAX_S = 60.0


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def wait_idle(pid):
    deadline, last, quiet_since = time.time() + IDLE_WAIT_MAX_S, -1, time.time()
    while time.time() < deadline:
        ticks = cpu_ticks(pid)
        if ticks != last:
            last, quiet_since = ticks, time.time()
        elif time.time() - quiet_since >= IDLE_QUIET_S:
            return
        time.sleep(0.05)
    sys.exit(f"idle_rss: mortard still busy after {IDLE_WAIT_MAX_S:.0f} s")


def thread_stacks(pid):
    """Thread name per stack pointer, from /proc/PID/task/TID/syscall (`nr args.. sp pc`)."""
    sps = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                fields = f.read().split()
        except OSError:
            continue
        if len(fields) >= 3 and fields[0] != "running":
            sps[int(fields[-2], 16)] = f"stack of thread {name}"
    return sps


def kind_of(start, end, perms, name, binary, stacks):
    if name == binary:
        return {"r-xp": "mortard text", "r--p": "mortard rodata/relro"}.get(perms, "mortard data")
    if name.startswith("/"):
        return os.path.basename(name)
    if name in ("[heap]", "[vdso]", "[vvar]"):
        return name
    if name == "[stack]":
        return "stack of thread mortard (main)"
    for sp, thread in stacks.items():
        if start <= sp < end:
            return thread
    if start % ARENA_ALIGN == 0:
        return "malloc arenas (threads')"
    return "other anonymous" if not name else name


def rss_parts_kib(pid, binary):
    """Resident KiB per part, from /proc/PID/smaps."""
    stacks = thread_stacks(pid)
    parts, kind = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                name = fields[5] if len(fields) > 5 else ""
                kind = kind_of(start, end, fields[1], name, binary, stacks)
            elif fields[0] == "Rss:":
                parts[kind] = parts.get(kind, 0) + int(fields[1])
    return parts


def start(binary, data_dir, nofile):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--data-dir", data_dir, "--max-connections", str(nofile)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile + 1024, hard)))


def idle_connections(pid, host, port, n, before):
    connect = struct.pack(">IBBHHI", 10, 1, 1, 0, 0, 0)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(connect)
        socks.append(s)
    for s in socks:
        assert s.recv(16)[4] == 9, "CONNECT not answered with OK"
    time.sleep(0.5)
    after = status_kib(pid, "VmRSS")
    print(f"rss_with_{n}_idle_kib={after} bytes_per_idle_connection="
          f"{(after - before) * 1024 / n:.0f}")
    for s in socks:
        s.close()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        usage="tools/idle_rss.py [N] [--max-idle-kib KIB] [--binary PATH]")
    ap.add_argument("n", nargs="?", type=int, default=5000)
    ap.add_argument("--max-idle-kib", type=int)
    ap.add_argument("--binary", default=os.path.join(here, "..", "target", "release", "mortard"))
    a = ap.parse_args()
    binary = os.path.realpath(a.binary)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, a.n + 1024)), hard))
    with tempfile.TemporaryDirectory() as d:
        proc = start(binary, os.path.join(d, "data"), a.n + 10)
        try:
            host, port = proc.stdout.readline().decode().split()[1].rsplit(":", 1)
            wait_idle(proc.pid)
            parts = rss_parts_kib(proc.pid, binary)
            idle = status_kib(proc.pid, "VmRSS")
            for kind, kib in sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])):
                if kib:
                    print(f"idle rss: {kib:5} KiB {kind}")
            print(f"idle rss: {status_kib(proc.pid, 'RssAnon'):5} KiB of it anonymous, "
                  f"{status_kib(proc.pid, 'RssFile'):5} KiB file pages, "
                  f"{status_kib(proc.pid, 'Threads')} threads")
            print(f"idle_rss_kib={idle}")
            if a.n:
                idle_connections(proc.pid, host, port, a.n, idle)
        finally:
            proc.terminate()
            proc.wait()
    if a.max_idle_kib is not None and idle > a.max_idle_kib:
        print(f"idle_rss: {idle} KiB is over --max-idle-kib {a.max_idle_kib}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
