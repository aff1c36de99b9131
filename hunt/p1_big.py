"""Probe 1: big arguments and results (bytes, NumPy), dependents on another agent, gather."""
import sys
import time

import numpy as np

import zres
from common import T, report

GB = int(float(sys.argv[1]) * (1 << 30)) if len(sys.argv) > 1 else 1 << 30


def size(v):
    return len(v) if isinstance(v, (bytes, bytearray)) else v.nbytes


def make_bytes(n):
    return b"\x01" * n


def make_array(n):
    return np.ones(n // 8)


def ident(v):
    return v


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1, "MEMORY": 12e9}, {"B": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        report(c, "start")
        v = b"\x02" * GB
        with T(f"bytes arg {GB>>20} MiB -> len"):
            assert cl.submit(size, v, resources={"A": 1}).result() == GB
        report(c, "after arg")
        del v
        with T("bytes result made on A"):
            f = cl.submit(make_bytes, GB, resources={"A": 1})
            zres.wait([f]) if hasattr(zres, "wait") else f.exception()
        with T("dependent on B (fetch A->B)"):
            assert cl.submit(size, f, resources={"B": 1}).result() == GB
        report(c, "after dep")
        with T("client fetches result"):
            r = f.result()
        assert len(r) == GB
        del r, f
        report(c, "after fetch")
        a = np.ones(GB // 8)
        with T("numpy arg"):
            assert cl.submit(size, a, resources={"B": 1}).result() == GB
        del a
        with T("numpy result + fetch"):
            g = cl.submit(make_array, GB, resources={"A": 1})
            r = g.result()
        assert r.nbytes == GB
        del r, g
        report(c, "after numpy")
        with T("gather 8 x 64 MiB from two agents"):
            fs = [cl.submit(make_bytes, 64 << 20, resources={"AB"[i % 2]: 1})
                  for i in range(8)]
            out = cl.gather(fs)
        assert sum(map(len, out)) == 8 * (64 << 20)
        del out, fs
        report(c, "end")
        time.sleep(1)
        print(c.status()["agents"][0].get("store"), c.status()["agents"][1].get("store"))
        cl.close()
