"""Probe 2: do small tasks of another client stall while 1 GB moves?  (ZRES_LOCAL_READS=never
to force the data ports, as between machines.)"""
import multiprocessing as mp
import os
import statistics
import sys
import time

import zres
from common import T, report

N = 1 << 30


def noop():
    return 1


def make_bytes(n):
    return b"\x01" * n


def size(v):
    return len(v)


def stream(address, keys, stop, out):
    os.environ["ZRES_KEYS"] = keys
    cl = zres.Client(address)
    lat = []
    while not stop.is_set():
        t = time.monotonic()
        cl.submit(noop).result()
        lat.append((t, time.monotonic() - t))
    out.put(lat)
    cl.close()


def summary(lat, a, b, label):
    xs = [d for t, d in lat if a <= t <= b]
    if xs:
        xs.sort()
        print(f"{label}: n={len(xs)} median={statistics.median(xs)*1e3:.1f}ms "
              f"p99={xs[int(len(xs)*0.99)-1]*1e3:.1f}ms max={xs[-1]*1e3:.1f}ms", flush=True)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 2, "MEMORY": 12e9}, {"B": 2, "MEMORY": 12e9}],
                           nworkers=2) as c:
        cl = zres.Client(c.address)
        stop, out = mp.Event(), mp.Queue()
        p = mp.Process(target=stream, args=(c.address, c.keys, stop, out))
        p.start()
        time.sleep(4)
        marks = {"start": time.monotonic()}
        time.sleep(3)
        marks["upload"] = time.monotonic()
        v = b"\x02" * N
        with T("1 GiB arg"):
            cl.submit(size, v, resources={"A": 1}).result()
        del v
        marks["make"] = time.monotonic()
        f = cl.submit(make_bytes, N, resources={"A": 1})
        f.exception()
        marks["dep"] = time.monotonic()
        with T("dependent on B"):
            cl.submit(size, f, resources={"B": 1}).result()
        marks["fetch"] = time.monotonic()
        with T("client fetch"):
            f.result()
        marks["end"] = time.monotonic()
        time.sleep(2)
        stop.set()
        lat = out.get()
        p.join()
        ks = list(marks)
        for a, b in zip(ks, ks[1:]):
            summary(lat, marks[a], marks[b], a)
        report(c)
        cl.close()
