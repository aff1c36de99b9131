"""zres.kill of an actor with calls running and queued; kill while restarting; a call on a
killed actor; get_actor of a killed named actor; get_if_exists racing from two clients."""
import os, sys, time, tempfile, threading
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, free_everywhere  # noqa


class A:
    def __init__(self, tag=""):
        self.tag = tag

    def hold(self, s):
        time.sleep(s)
        return s

    def tag_(self):
        return self.tag


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:160]


with zres.LocalCluster([{"CPU": 2, "foo": 1}]) as cluster, zres.Client(cluster.address) as client:
    a = client.actor(A, name="k")
    a.ready().result(30)
    fs = [a.hold(5), a.hold(0), a.hold(0)]
    time.sleep(0.5)
    t = time.monotonic()
    client.kill(a)
    for f in fs:
        print("  ", outcome(f))
    print("killed calls resolved in %.2f s" % (time.monotonic() - t))
    print("later call:", outcome(a.hold(0)))
    try:
        client.get_actor("k")
        print("get_actor of killed: found?!")
    except Exception as e:
        print("get_actor of killed:", type(e).__name__, str(e)[:120])
    wait(lambda: free_everywhere(client), 20, "free")
    # name reusable
    b = client.actor(A, "second", name="k")
    print("name reused:", outcome(b.tag_()))
    client.kill(b)
    # kill while restarting (no room: foo held by another)
    blocker = client.actor(A, resources={"foo": 1})
    blocker.ready().result(30)
    # get_if_exists race
    res = []
    def mk(c, tag):
        h = c.actor(A, tag, name="shared-one", get_if_exists=True)
        res.append(outcome(h.tag_()))
    with zres.Client(cluster.address) as c2:
        ts = [threading.Thread(target=mk, args=(c, t)) for c, t in ((client, "one"), (c2, "two"))]
        [t.start() for t in ts]; [t.join() for t in ts]
    print("get_if_exists race:", res)
    print("actors:", [(x.get("name"), x.get("state")) for x in client.status()["actors"]])
