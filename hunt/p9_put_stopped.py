"""Probe 9: the agent a client uploads a big argument to is SIGSTOPped (then SIGCONT after
10 s), or SIGKILLed, mid-upload."""
import os
import signal
import sys
import threading
import time

import zres
from p3_faults import store_files

N = 1 << 30


def size(v):
    return len(v)


def scenario(kind):
    print(f"--- {kind} the agent being uploaded to", flush=True)
    with zres.LocalCluster([{"X": 1, "MEMORY": 12e9}, {"X": 1, "MEMORY": 4e9}]) as c:
        cl = zres.Client(c.address)
        target = c.agents["agent-0"]  # (the most room in its store: puts go there)
        v = b"\x07" * N

        def hit():
            if kind == "stop":
                os.kill(target.pid, signal.SIGSTOP)
                threading.Timer(10, lambda: os.kill(target.pid, signal.SIGCONT)).start()
            else:
                target.kill()
        threading.Timer(2.0, hit).start()
        t0 = time.monotonic()
        try:
            r = cl.submit(size, v, resources={"X": 1}).result(120)
            print(f"  got {r} after {time.monotonic()-t0:.1f}s", flush=True)
        except Exception as exc:
            print(f"  {type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}",
                  flush=True)
        time.sleep(15)
        print("  store files:", store_files(c), flush=True)
        print("  agents:", [(a["name"], a.get("store")) for a in c.status()["agents"]])
        cl.close()


if __name__ == "__main__":
    for kind in sys.argv[1:] or ["stop", "kill"]:
        scenario(kind)
