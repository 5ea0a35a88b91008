#!/usr/bin/env python3
"""The disk's fdatasync floor, which bounds every durable figure in docs/BENCHMARKS.md.

usage: tools/fdatasync_floor.py [DIR] [N]   (default: a temporary dir under /tmp, 2000)

Writes N 1 KiB records, one fdatasync after each, three ways, on the same file system:
  growing       appended to a new file: each fdatasync also commits the new size and
                blocks (what a segment or journal file without a spare costs)
  preallocated  written over a file already filled with zeros and synced (what the
                journal's spare files give: the fdatasync commits data only)
  fallocated    written into a file posix_fallocate made (unwritten extents: the first
                write of each block still converts it, so a metadata commit remains)
Prints mean, p50, p99 and max in microseconds for each; rounds alternate the three so
that all see the same moments of a shared disk.
"""
import os, sys, tempfile, time

RECORD_BYTES = 1024
ROUNDS = 4

def sync_latencies_us(path, n, prepare):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        prepare(fd, n * RECORD_BYTES)
        record = b"r" * RECORD_BYTES
        out = []
        for i in range(n):
            os.pwrite(fd, record, i * RECORD_BYTES)
            t = time.perf_counter()
            os.fdatasync(fd)
            out.append((time.perf_counter() - t) * 1e6)
        return out
    finally:
        os.close(fd)
        os.unlink(path)

def grow(fd, size):
    pass

def zero_fill(fd, size):
    os.pwrite(fd, bytes(size), 0)
    os.fsync(fd)

def fallocate(fd, size):
    os.posix_fallocate(fd, 0, size)
    os.fsync(fd)

def main():
    base = sys.argv[1] if len(sys.argv) > 1 else None
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    kinds = {"growing": grow, "preallocated": zero_fill, "fallocated": fallocate}
    seen = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(dir=base) as d:
        for _ in range(ROUNDS):
            for name, prepare in kinds.items():
                seen[name] += sync_latencies_us(os.path.join(d, name), n // ROUNDS, prepare)
    for name, lat in seen.items():
        lat.sort()
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print(f"{name:13} fdatasyncs={len(lat)} mean_us={sum(lat) / len(lat):.0f} "
              f"p50_us={pick(0.5):.0f} p99_us={pick(0.99):.0f} max_us={lat[-1]:.0f}")

if __name__ == "__main__":
    main()
