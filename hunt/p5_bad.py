"""Probe 5: bad input: unpicklable results, results that raise on unpickling in the client,
sizes exactly at the limits, zero-byte and empty NumPy values."""
import os
import sys
import threading
import time
import traceback

import numpy as np

import zres

KIB64 = 64 * 1024


class Bomb:
    """Unpickles fine in a worker, raises in the client (ZRES_HUNT_CLIENT set there)."""

    def __init__(self, n):
        self.pad = b"x" * n

    def __reduce__(self):
        return (_rebuild, (self.pad,))


def _rebuild(pad):
    if os.environ.get("ZRES_HUNT_CLIENT"):
        raise ValueError("refusing to unpickle in the client")
    b = Bomb.__new__(Bomb)
    b.pad = pad
    return b


def unpicklable(n):
    return [threading.Lock(), b"x" * n]


def bomb(n):
    return Bomb(n)


def ident(v):
    return v


def padlen(b):
    return len(b.pad)


def sized(n):
    return b"y" * n


def show(label, fn):
    t0 = time.monotonic()
    try:
        r = fn()
        r = repr(r)[:80]
        print(f"{label}: OK {r} ({time.monotonic()-t0:.1f}s)", flush=True)
    except Exception as exc:
        print(f"{label}: {type(exc).__name__}: {str(exc)[:240]} ({time.monotonic()-t0:.1f}s)",
              flush=True)


if __name__ == "__main__":
    limit = 10 << 20
    os.environ["ZRES_BROKER__MAX_OBJECT_BYTES"] = str(limit)
    with zres.LocalCluster([{"A": 1}, {"B": 1}]) as c:
        os.environ["ZRES_HUNT_CLIENT"] = "1"
        cl = zres.Client(c.address)
        for n in (10, 1 << 20):
            show(f"unpicklable result {n}", lambda: cl.submit(unpicklable, n).result(30))
            f = cl.submit(bomb, n, resources={"A": 1})
            show(f"result raising on unpickle {n}", lambda: f.result(30))
            show(f"  again", lambda: f.result(30))
            show(f"  as input on B", lambda: cl.submit(padlen, f, resources={"B": 1}).result(30))
            show(f"  gather", lambda: zres.gather([f, cl.submit(sized, 3)]))
        for v in (b"", np.empty(0), np.empty((0, 5)), np.zeros(0, dtype=[("a", "i4")]),
                  bytearray(), memoryview(b"")):
            show(f"empty {type(v).__name__} arg+result", lambda: cl.submit(ident, v).result(30))
            show(f"  scatter", lambda: cl.scatter(v).result(30))
        for n in (KIB64 - 200, KIB64 - 64, KIB64 - 1, KIB64, KIB64 + 1):
            show(f"result bytes {n}", lambda: len(cl.submit(sized, n).result(30)))
        for n in ((1 << 20) - 300, (1 << 20) - 100, 1 << 20, (1 << 20) + 1):
            show(f"arg bytes {n}", lambda: len(cl.submit(ident, b"z" * n).result(30)))
        from zres.core import objects as O
        from zres.core.serialize import dumps
        for delta in (-1, 0, 1):
            # a value whose object is exactly the limit +delta
            n = limit - 200
            while O.object_size(dumps(b"q" * n)) < limit + delta:
                n += 1
            size = O.object_size(dumps(b"q" * n))
            show(f"scatter object size limit{delta:+d} ({size})",
                 lambda: len(cl.scatter(b"q" * n).result(30)))
            show(f"result object size limit{delta:+d}",
                 lambda: len(cl.submit(sized, n).result(30)))
        cl.close()
