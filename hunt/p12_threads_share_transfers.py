"""Probe 12: one client, two threads: one uploads a 1 GiB argument, the other fetches a
small stored result (100 KB) meanwhile (over the ports: ZRES_LOCAL_READS=never)."""
import threading
import time

import zres


def make(n):
    return b"s" * n


def size(v):
    return len(v)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1, "MEMORY": 12e9}, {"B": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        small = [cl.submit(make, 100_000, resources={"B": 1}) for _ in range(5)]
        zres.wait(small)
        v = b"x" * (1 << 30)
        t = threading.Thread(target=lambda: cl.submit(size, v, resources={"A": 1}).result())
        t0 = time.monotonic()
        t.start()
        time.sleep(0.8)
        for f in small:
            t1 = time.monotonic()
            f.result()
            print(f"small fetch at {t1 - t0:.1f}s took {time.monotonic() - t1:.2f}s", flush=True)
        t.join()
        print(f"big submit done at {time.monotonic() - t0:.1f}s")
        cl.close()
