"""An actor whose __init__ goes past its MEMORY, restarts=-1 and 2: what ready() says, and
whether it restarts for ever."""
import os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class Big:
    def __init__(self):
        self.b = bytearray(400 << 20); self.b[::4096] = b"\1" * (len(self.b) // 4096)

    def ping(self):
        return 1


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:220]


with zres.LocalCluster([{"CPU": 2, "MEMORY": 2e9}]) as cluster, \
        zres.Client(cluster.address) as client:
    for restarts in (2, -1):
        a = client.actor(Big, resources={"MEMORY": 150e6}, restarts=restarts)
        t = time.monotonic()
        print(f"restarts={restarts} ready:", outcome(a.ready()), "%.1f s" % (time.monotonic() - t))
        print("   call:", outcome(a.ping(), 20))
        time.sleep(3)
        print("   status:", [(x.get("state"), x.get("restarts_left"), x.get("reason", "")[:80])
                           for x in client.status()["actors"] if x["id"] == a._id] if hasattr(a, "_id") else
              [(x.get("state"), x.get("restarts_left")) for x in client.status()["actors"]])
        try:
            client.kill(a)
        except Exception as e:
            print("kill:", e)
