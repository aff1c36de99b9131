"""Probe 6: how long a put (scatter of a small value, a call just over 1 MiB) takes."""
import statistics
import time

import zres


def ident(v):
    return len(v)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1}], heartbeat_interval=float(__import__("os").environ.get("HB", "0.5"))) as c:
        cl = zres.Client(c.address)
        for label, make in (("scatter 10 B", lambda: cl.scatter(b"x" * 10).result(30)),
                            ("scatter 2 MiB", lambda: cl.scatter(b"x" * (2 << 20)).result(30)),
                            ("submit 2 MiB arg", lambda: cl.submit(ident, b"x" * (2 << 20)).result(30)),
                            ("submit 0.9 MiB arg", lambda: cl.submit(ident, b"x" * 900_000).result(30))):
            ts = []
            for _ in range(15):
                t = time.monotonic()
                make()
                ts.append(time.monotonic() - t)
            print(f"{label}: median {statistics.median(ts)*1e3:.0f} ms, max {max(ts)*1e3:.0f} ms",
                  flush=True)
        cl.close()
