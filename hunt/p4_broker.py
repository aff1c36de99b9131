"""Probe 4: the broker SIGKILLed while 1 GiB moves (fetch by the client, by a dependent, an
upload), restarted on its state directory (LocalCluster.restart_broker)."""
import glob
import os
import sys
import threading
import time

import zres
from p3_faults import make_bytes, size, store_files

N = 1 << 30


def restart_later(c, seconds):
    def go():
        t = time.monotonic()
        c.restart_broker()
        print(f"  broker restarted ({time.monotonic()-t:.1f}s)", flush=True)
    th = threading.Thread(target=lambda: (time.sleep(seconds), go()))
    th.start()
    return th


def scenario(who):
    print(f"--- broker killed while {who}", flush=True)
    with zres.LocalCluster([{"A": 1, "MEMORY": 12e9}, {"B": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        f = cl.submit(make_bytes, N, resources={"A": 1})
        f.exception()
        t0 = time.monotonic()
        try:
            if who == "client fetches":
                th = restart_later(c, 1.0)
                r = len(f.result(timeout=120))
            elif who == "dependent fetches":
                d = cl.submit(size, f, resources={"B": 1})
                th = restart_later(c, 1.5)
                r = d.result(timeout=120)
            elif who == "client uploads":
                v = b"\x03" * N
                th = restart_later(c, 1.0)
                r = cl.submit(size, v, resources={"B": 1}).result(timeout=120)
                del v
            elif who == "result made meanwhile":
                th = restart_later(c, 0.5)
                g = cl.submit(make_bytes, N, resources={"B": 1})
                r = cl.submit(size, g, resources={"A": 1}).result(timeout=120)
                r = (r, len(g.result(timeout=60)))
                del g
            print(f"  got {r} after {time.monotonic()-t0:.1f}s", flush=True)
        except Exception as exc:
            print(f"  {type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}",
                  flush=True)
        th.join()
        time.sleep(2)
        print("  store files:", store_files(c), flush=True)
        try:
            print("  f again:", len(f.result(timeout=60)), flush=True)
        except Exception as exc:
            print(f"  f again: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del f
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(store_files(c).values()):
            time.sleep(0.5)
        print("  store files after del:", store_files(c), flush=True)
        cl.close()


if __name__ == "__main__":
    for who in sys.argv[1:] or ["client fetches", "dependent fetches", "client uploads",
                                "result made meanwhile"]:
        scenario(who)
