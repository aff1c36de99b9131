"""Probe 3: the holder of a 1 GiB result killed or stopped while it is fetched (over data
ports: ZRES_LOCAL_READS=never) by the client or a dependent on another agent."""
import glob
import os
import signal
import sys
import threading
import time

import zres
from common import T

N = 1 << 30


def make_bytes(n):
    return b"\x01" * n


def size(v):
    return len(v)


def later(seconds, fn):
    threading.Timer(seconds, fn).start()


def store_files(c):
    out = {}
    for name in c.agents:
        state = os.path.join(c.state_dir, f"agent-{name}")
        try:
            where = open(os.path.join(state, "object-store")).read()
        except OSError:
            continue
        files = glob.glob(where + "/*") + glob.glob(state + "/spill/*")
        out[name] = [(os.path.basename(f), os.path.getsize(f)) for f in files]
    return out


def scenario(kind, who, retries):
    print(f"--- {kind} holder while {who} fetches, retries={retries}", flush=True)
    with zres.LocalCluster([{"X": 1, "MEMORY": 12e9}, {"B": 1, "MEMORY": 12e9},
                            {"X": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        f = cl.submit(make_bytes, N, resources={"X": 1}, workers=["agent-0"],
                      allow_other_workers=True, retries=retries, recompute=retries > 0)
        f.exception()
        holder = c.agents["agent-0"]
        if kind == "kill":
            later(1.0, holder.kill)
        else:
            later(1.0, lambda: os.kill(holder.pid, signal.SIGSTOP))
            later(9.0, lambda: os.kill(holder.pid, signal.SIGCONT))
        t0 = time.monotonic()
        try:
            if who == "client":
                r = len(f.result(timeout=120))
            else:
                r = cl.submit(size, f, resources={"B": 1}).result(timeout=120)
            print(f"  got {r} after {time.monotonic()-t0:.1f}s", flush=True)
        except Exception as exc:
            print(f"  {type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}",
                  flush=True)
        time.sleep(12)
        print("  agents:", [(a["name"], a.get("state"), a.get("store")) for a in
                            c.status()["agents"]], flush=True)
        print("  store files:", store_files(c), flush=True)
        del f
        time.sleep(3)
        print("  store files after del:", store_files(c), flush=True)
        cl.close()


if __name__ == "__main__":
    kinds = sys.argv[1:] or ["kill:client:1", "kill:client:0", "kill:dep:1", "kill:dep:0",
                             "stop:client:1", "stop:dep:0"]
    for k in kinds:
        kind, who, retries = k.split(":")
        scenario(kind, who, int(retries))
