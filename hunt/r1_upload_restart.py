"""Reproducer: the broker killed (and restarted on its state) while a client uploads a big
argument makes submit() raise a bare IndexError."""
import threading
import time
import traceback

import zres

N = 256 << 20


def size(v):
    return len(v)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        v = b"\x03" * N
        threading.Timer(0.3, c.restart_broker).start()
        t0 = time.monotonic()
        try:
            for i in range(20):
                r = cl.submit(size, v, resources={"A": 1}).result(timeout=120)
            print("got", r, f"{time.monotonic()-t0:.1f}s")
        except Exception:
            traceback.print_exc()
        cl.close()
