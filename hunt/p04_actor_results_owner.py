"""An actor call whose result is unpicklable / 100 MB; two clients on one shared actor;
the owning client SIGKILLed (unnamed actor must die, named/detached must live)."""
import os, signal, subprocess, sys, time, tempfile, threading
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, free_everywhere  # noqa


class A:
    def __init__(self):
        self.n = 0

    def bad(self):
        return threading.Lock()

    def big(self, n):
        return b"x" * n

    def inc(self):
        self.n += 1
        return self.n

    def pid(self):
        return os.getpid()


def outcome(f, t=90):
    try:
        r = f.result(timeout=t)
        return r if not isinstance(r, bytes) else f"bytes {len(r)}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:200]


OWNER = r'''
import sys, time, os
sys.path.insert(0, {hunt!r})
from common import zres
class A:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n
    def pid(self):
        return os.getpid()
c = zres.Client({addr!r})
a = c.actor(A, name="named1", detached=True)
b = c.actor(A)
print(a.pid().result(timeout=60), b.pid().result(timeout=60), flush=True)
time.sleep(600)
'''

if __name__ == "__main__":
    with zres.LocalCluster([{"CPU": 2}]) as cluster, zres.Client(cluster.address) as client:
        a = client.actor(A, name="s")
        a.ready().result(timeout=60)
        print("unpicklable:", outcome(a.bad()))
        print("after:", outcome(a.inc()))
        t = time.monotonic()
        print("100MB:", outcome(a.big(100_000_000)), round(time.monotonic() - t, 2), "s")
        print("after:", outcome(a.inc()))
        if "--owner-only" not in sys.argv:
            pass
        # two clients
        with zres.Client(cluster.address) as c2:
            h = c2.get_actor("s")
            fs = [h.inc() for _ in range(50)] + [a.inc() for _ in range(50)]
            r = sorted(f.result(timeout=60) for f in fs)
            print("two clients:", r[0], r[-1], len(set(r)))
        # owning client killed
        code = OWNER.format(hunt=str(Path(__file__).resolve().parent), addr=cluster.address)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "ZRES_KEYS": cluster.keys})
        line = p.stdout.readline()
        pa, pb = map(int, line.split())
        print("owner pids", pa, pb)
        p.kill(); p.wait()
        t = time.monotonic()
        wait(lambda: not os.path.exists(f"/proc/{pb}"), 30, "unnamed actor dies")
        print("unnamed died after", round(time.monotonic() - t, 2))
        time.sleep(2)
        print("named alive:", os.path.exists(f"/proc/{pa}"))
        h = client.get_actor("named1")
        print("named call:", outcome(h.inc()))
        st = client.status()
        print([(x.get("name"), x.get("state"), x.get("owner")) for x in st["actors"]])
