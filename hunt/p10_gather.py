"""Probe 10: gather of several hundred MB from two agents (over the data ports when
ZRES_LOCAL_READS=never), the client's memory meanwhile."""
import time

import numpy as np

import zres
from common import rss


def make(i, n):
    return bytes([i]) * n


def arr(i, n):
    return np.full(n // 8, float(i))


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 2, "MEMORY": 8e9}, {"B": 2, "MEMORY": 8e9}], nworkers=2) as c:
        cl = zres.Client(c.address)
        for fn, label in ((make, "bytes"), (arr, "numpy")):
            fs = [cl.submit(fn, i, 48 << 20, resources={"AB"[i % 2]: 1}) for i in range(12)]
            cl.gather(fs[:1])
            zres.wait(fs)
            before = rss(0 if False else __import__("os").getpid())
            t = time.monotonic()
            out = cl.gather(fs)
            dt = time.monotonic() - t
            total = sum(len(o) if isinstance(o, bytes) else o.nbytes for o in out)
            print(f"gather {label} {total >> 20} MiB: {dt:.2f}s ({total / dt / 1e6:.0f} MB/s), "
                  f"client rss before/after/hwm MB {before[0]} {rss(__import__('os').getpid())}",
                  flush=True)
            del out, fs
        cl.close()
