"""Probe 7: reads racing the spill thread: results past a 64 MiB store budget read by
dependents on the same agent, on another, and by the client, many at once."""
import os
import sys
import time

import zres

M = 1 << 20


def make(i, n):
    return bytes([i % 256]) * n


def check(v, i):
    return len(v) if v[:1] == bytes([i % 256]) and v[-1:] == bytes([i % 256]) else -1


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with zres.LocalCluster([{"A": 2, "MEMORY": 100e6}, {"B": 2, "MEMORY": 100e6}],
                           nworkers=2) as c:
        cl = zres.Client(c.address)
        bad = 0
        for r in range(rounds):
            t0 = time.monotonic()
            srcs = [cl.submit(make, i, 12 * M, resources={"A": 1}) for i in range(24)]
            deps = [cl.submit(check, s, i, resources={"AB"[(i // 2) % 2]: 1})
                    for i, s in enumerate(srcs)]
            try:
                got = cl.gather(deps)
                bad += sum(g != 12 * M for g in got)
                vals = cl.gather(srcs)
                bad += sum(len(v) != 12 * M for v in vals)
            except Exception as exc:
                bad += 1
                print(f"round {r}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            st = {a["name"]: a.get("store") for a in c.status()["agents"]}
            print(f"round {r}: {time.monotonic()-t0:.1f}s bad={bad} {st}", flush=True)
            del srcs, deps
            vals = got = None
        cl.close()
