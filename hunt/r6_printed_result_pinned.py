"""Reproducer: a big result whose task printed is kept on its agent after its future is
dropped, until the client's next printed output (the client's output thread holds the
last batch of futures it settled)."""
import gc
import time

import zres


def noisy(n):
    print("making", n, "bytes" * 2000)
    return b"r" * n


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1}]) as c:
        cl = zres.Client(c.address)
        leaked = 0
        for i in range(10):
            f = cl.submit(noisy, 8 << 20)
            f.result(30)
            del f
            gc.collect()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                held = c.status()["agents"][0]["store"].get("objects", 0)
                if not held:
                    break
                time.sleep(0.05)
            leaked += bool(held)
            print(f"round {i}: objects still held 5 s after the future was dropped: {held}",
                  flush=True)
        print("rounds with the result still held:", leaked)
        cl.close()
