"""The agent's node guard: reserve set so ~700 MB is left; a pooled task (no MEMORY) that
grows by 1.2 GB slowly must be stopped with MemoryLimitError('node out of memory ...'),
its neighbour (a small pooled task) and the agent survive; then a task asking MEMORY
versus one that did not: the one that did not goes first."""
import os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa
from zres.agent.memory import node


def grow(mb, tag):
    import time
    kept = []
    for _ in range(mb // 16):
        b = bytearray(16 << 20)
        b[::4096] = b"\1" * (len(b) // 4096)
        kept.append(b)
        time.sleep(0.05)
    time.sleep(3)
    return f"{tag} not stopped"


def small(path):
    import os, time
    while not os.path.exists(path):
        time.sleep(0.05)
    return "small done"


def outcome(f, t=90):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:250]


avail = node.available()
reserve = avail - 700_000_000
print("available", avail >> 20, "MiB; reserve", reserve >> 20)
env = {"ZRES_AGENT__MEMORY_RESERVE": str(reserve)}
with zres.LocalCluster([{"CPU": 3, "MEMORY": 8e9}], env=env, nthreads=3) as cluster, \
        zres.Client(cluster.address) as client:
    go = f"/tmp/p06-go-{os.getpid()}"
    s = client.submit(small, go)
    f = client.submit(grow, 1200, "pooled")
    t = time.monotonic()
    print("grow ->", outcome(f), round(time.monotonic() - t, 1), "s")
    agents = client.status()["agents"]
    print("agent memory:", {k: v for k, v in agents[0]["memory"].items() if k != "tasks"})
    open(go, "w").close()
    print("small ->", outcome(s))
    wait(lambda: not client.status()["agents"][0]["memory"]["low"], 30, "well again")
    # one that asked MEMORY beside one that did not: the latter goes first
    f1 = client.submit(grow, 500, "asked", resources={"MEMORY": 1e9})
    f2 = client.submit(grow, 800, "none")
    print("asked ->", outcome(f1), "| none ->", outcome(f2))
    print("agent alive:", cluster.agents["agent-0"].poll() is None)
