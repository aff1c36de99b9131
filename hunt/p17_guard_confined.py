"""The node guard, the agent confined to a 1.4 GB cgroup with a 1 GB reserve (as the
tests do): an actor with no MEMORY growing by 600 MB must be stopped ('node out of memory'),
restart (restarts=1), the agent survive; a command job likewise."""
import os, sys, time, uuid
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import zres, wait  # noqa
from tests.e2e.test_limits import confine


class G:
    def __init__(self):
        self.kept = []

    def grow(self, mb):
        for _ in range(mb // 16):
            b = bytearray(16 << 20)
            b[::4096] = b"\1" * (len(b) // 4096)
            self.kept.append(b)
            time.sleep(0.02)
        return "not stopped"

    def ping(self):
        return os.getpid()


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:230]


with zres.LocalCluster([{"CPU": 1}], env={"ZRES_AGENT__MEMORY_LIMITS": "watcher"}) as cluster:
    guarded = cluster.add_agent({"CPU": 2}, name="guarded",
                                extra_args=["--memory-reserve", str(int(1e9)),
                                            "--memory-limits", "watcher"])
    made = confine(guarded.pid, int(1.4e9))
    try:
        with zres.Client(cluster.address) as client:
            a = client.actor(G, restarts=1, workers="guarded") if False else \
                client.actor(G, restarts=1, resources={"CPU": 2})
            p1 = outcome(a.ping())
            print("actor on:", [x.get("agent") for x in client.status()["actors"]])
            t = time.monotonic()
            print("actor grow ->", outcome(a.grow(700)), round(time.monotonic() - t, 1))
            p2 = outcome(a.ping())
            print("restarted:", p1 != p2, p1, p2)
            f = client.submit_command(
                [sys.executable, "-c", "b=bytearray(700<<20); b[::4096]=bytes(len(b)//4096); import time; time.sleep(30)"],
                resources={"CPU": 1})
            print("job ->", outcome(f))
            print("agent alive:", guarded.poll() is None)
    finally:
        guarded.kill(); guarded.wait()
        if made is not None:
            deadline = time.time() + 20
            while os.path.exists(made.base) and time.time() < deadline:
                made.close(); time.sleep(0.2)
