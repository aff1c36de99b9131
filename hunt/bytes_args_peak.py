"""Probe: peak RSS growth of the client and the worker for a task taking a big bytes
argument (one 512 MiB value, or a list of 4 x 128 MiB). Run one scenario a process:

    PYTHONPATH=$PWD python hunt/bytes_args_peak.py single|list|bytearray
"""

from __future__ import annotations

import resource
import sys
import time

import zres

MiB = 1 << 20


def maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def baseline() -> int:
    return maxrss()


def consume(data):
    chunks = data if isinstance(data, list) else [data]
    return ([type(c).__name__ for c in chunks], sum(len(c) for c in chunks),
            maxrss(), rss())


def main(kind: str) -> None:
    if kind == "single":
        value = b"\x01" * (512 * MiB)
    elif kind == "bytearray":
        value = bytearray(512 * MiB)  # filled in place: a temporary would raise the baseline
        for at in range(0, len(value), MiB):
            value[at:at + MiB] = b"\x01" * MiB
    else:
        value = [bytes([i + 1]) * (128 * MiB) for i in range(4)]
    with zres.LocalCluster(nthreads=1) as cluster, zres.Client(cluster.address) as client:
        worker_before = client.submit(baseline).result(timeout=60)
        client_before = maxrss()
        t0 = time.monotonic()
        types, size, worker_peak, worker_now = client.submit(consume, value).result(
            timeout=300)
        took = time.monotonic() - t0
        client_peak = maxrss()
    print(f"{kind}: {size // MiB} MiB of {sorted(set(types))} in {took:.1f}s; "
          f"client peak growth {(client_peak - client_before) / MiB:.0f} MiB; "
          f"worker peak growth {(worker_peak - worker_before) / MiB:.0f} MiB "
          f"(worker RSS at return {worker_now / MiB:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1])
