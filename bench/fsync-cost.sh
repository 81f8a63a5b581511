#!/usr/bin/env bash
# What one durable commit costs this machine in CPU, not in time: a loop
# of a 16 KiB `pwrite` and an `fdatasync` of the same file (the shape of a
# WAL commit), against the same writes without the sync. Reports wall
# time and CPU (user+system, from getrusage) per call. On a virtual
# machine the sync's CPU (the block layer, the device's doorbell, the
# completion's interrupt) can be larger than a whole proxied request,
# which is what bounds the SQLite store's new-key row with
# synchronous=FULL (docs/benchmarks-history.md, "What limits the rows still
# short").
#
# IDEM_BENCH_DIR: the directory (the disk) to measure, by default the
# one bench/gateway.sh puts its store in ($TMPDIR or /tmp).
# IDEM_BENCH_N: syncs to time (default 3000).
set -euo pipefail
DIR="${IDEM_BENCH_DIR:-${TMPDIR:-/tmp}}"
N="${IDEM_BENCH_N:-3000}"
python3 - "$DIR" "$N" <<'PY'
import os, resource, sys, tempfile, time

directory, n = sys.argv[1], int(sys.argv[2])
fd, path = tempfile.mkstemp(dir=directory, prefix="idem-fsync-cost-")
try:
    page = b"x" * 16384
    os.pwrite(fd, page * 64, 0)
    os.fdatasync(fd)

    def measure(sync):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for i in range(n):
            os.pwrite(fd, page, (i % 64) * len(page))
            if sync:
                os.fdatasync(fd)
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        user = r1.ru_utime - r0.ru_utime
        system = r1.ru_stime - r0.ru_stime
        return 1e6 * (t1 - t0) / n, 1e6 * (user + system) / n, 1e6 * system / n

    print(f"{n} calls each, file in {directory}")
    print("| loop | wall µs a call | CPU µs a call | of it system |")
    print("|---|---:|---:|---:|")
    for name, sync in (("pwrite 16 KiB", False), ("pwrite 16 KiB + fdatasync", True)):
        wall, cpu, system = measure(sync)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {system:.1f} |")
finally:
    os.close(fd)
    os.unlink(path)
PY
