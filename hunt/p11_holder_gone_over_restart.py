"""Probe 11: the broker restarted while the only holder of a big result is dead (never
back): a client fetching it, and a dependent waiting for it; retries=0 and recompute."""
import sys
import time

import zres


def make(n):
    return b"m" * n


def size(v):
    return len(v)


if __name__ == "__main__":
    recompute = len(sys.argv) > 1
    with zres.LocalCluster([{"A": 1, "X": 1}, {"X": 1}]) as c:
        cl = zres.Client(c.address)
        f = cl.submit(make, 8 << 20, resources={"X": 1}, workers=["agent-0"],
                      allow_other_workers=True, recompute=recompute)
        f.exception(30)
        c.agents["agent-0"].kill()
        c.restart_broker()
        t0 = time.monotonic()
        d = cl.submit(size, f, resources={"X": 1})
        for what, fut in (("client fetch", f), ("dependent", d)):
            try:
                r = fut.result(150)
                print(f"{what}: got {len(r) if isinstance(r, bytes) else r} after "
                      f"{time.monotonic()-t0:.1f}s", flush=True)
            except Exception as exc:
                print(f"{what}: {type(exc).__name__} after {time.monotonic()-t0:.1f}s: "
                      f"{str(exc)[:250]}", flush=True)
        import psutil
        for name, pid in (("broker", c.broker.pid), ("agent-1", c.agents["agent-1"].pid)):
            p = psutil.Process(pid)
            cpu = sum(p.cpu_times()[:2]) + sum(sum(ch.cpu_times()[:2]) for ch in p.children(recursive=True))
            print(f"{name} cpu seconds (with its workers): {cpu:.1f}", flush=True)
        cl.close()
