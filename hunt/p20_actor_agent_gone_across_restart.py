"""An actor's agent SIGKILLed while the broker is down (restarts=1, another agent fits):
after the restart the broker waits 60 s for the agent, then restarts the actor elsewhere;
queued calls (never handed over) run on the new instance, the begun one fails."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class A:
    def __init__(self, path):
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"init {os.environ.get('ZRES_AGENT', '?')} {os.getpid()}\n")

    def step(self, i, go):
        with open(self.path, "a") as fh:
            fh.write(f"start {i}\n")
        while not os.path.exists(go):
            time.sleep(0.02)
        return i


def outcome(f, t=150):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:170]


out = tempfile.mktemp(); go = tempfile.mktemp()
with zres.LocalCluster([{"foo": 1}, {"foo": 1}], names=["a0", "a1"]) as cluster, \
        zres.Client(cluster.address) as client:
    a = client.actor(A, out, restarts=1, resources={"foo": 1})
    a.ready().result(60)
    agent = client.status()["actors"][0]["agent"]
    futs = [a.step(i, go) for i in range(4)]
    wait(lambda: "start 0" in open(out).read(), 30)
    cluster.broker.kill(); cluster.broker.wait()
    cluster.agents[agent].kill(); cluster.agents[agent].wait()
    t = time.monotonic()
    cluster.restart_broker()
    wait(lambda: open(out).read().count("init") >= 2, 150, "restart elsewhere")
    print("restarted elsewhere after %.1f s" % (time.monotonic() - t))
    open(go, "w").close()
    for f in futs:
        print("  ", outcome(f))
    print(open(out).read().splitlines())
