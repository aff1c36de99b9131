"""An actor's agent SIGKILLed mid-call (restarts=1, other agent fits), then the new agent
SIGSTOPped past the heartbeat timeout and SIGCONTed; named lookup during restart."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, free_everywhere  # noqa


class A:
    def __init__(self, path):
        self.path = path
        self.n = 0
        with open(path, "a") as fh:
            fh.write(f"init {os.getpid()} {os.environ.get('ZRES_AGENT')}\n")

    def hold(self, i, go):
        with open(self.path, "a") as fh:
            fh.write(f"start {i}\n")
        while not os.path.exists(go):
            time.sleep(0.02)
        self.n += 1
        return i, self.n

    def where(self):
        from zres import get_task_context
        return get_task_context().agent if hasattr(get_task_context(), "agent") else None


def outcome(f, t=90):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:160]


with zres.LocalCluster([{"CPU": 2}, {"CPU": 2}], names=["a0", "a1"]) as cluster, \
        zres.Client(cluster.address) as client:
    out = tempfile.mktemp(); go = tempfile.mktemp()
    a = client.actor(A, out, restarts=-1, name="shared", resources={"CPU": 1})
    a.ready().result(timeout=60)
    st = client.status()
    agent = [x["agent"] for x in st["actors"]][0]
    print("actor on", agent, st["actors"][0].get("state"))
    futs = [a.hold(i, go) for i in range(4)]
    wait(lambda: "start 0" in open(out).read(), 30)
    t0 = time.monotonic()
    cluster.agents[agent].kill()
    # named lookup during restart
    looked = []
    for _ in range(40):
        try:
            h = client.get_actor("shared", timeout=5)
            looked.append("ok")
        except Exception as e:
            looked.append(type(e).__name__ + ":" + str(e)[:80])
        if open(out).read().count("init") >= 2:
            break
        time.sleep(0.2)
    print("lookups:", set(looked))
    wait(lambda: open(out).read().count("init") >= 2, 60, "restart")
    print("restarted after", round(time.monotonic() - t0, 2))
    open(go, "w").close()
    for f in futs:
        print("  ", outcome(f))
    st = client.status()
    agent2 = st["actors"][0]["agent"]
    print("now on", agent2)
    # SIGSTOP its agent past the heartbeat timeout
    os.remove(go)
    futs = [a.hold(10 + i, go) for i in range(3)]
    wait(lambda: "start 10" in open(out).read(), 30)
    p = cluster.agents[agent2]
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(6)
    st = client.status()
    print("while stopped:", [(x["name"], x.get("state")) for x in st["agents"]],
          [(x.get("agent"), x.get("state")) for x in st["actors"]])
    os.kill(p.pid, signal.SIGCONT)
    open(go, "w").close()
    for f in futs:
        print("  ", outcome(f))
    print("inits:", open(out).read().count("init"))
    print("later:", outcome(a.hold(20, go)))
    time.sleep(4)
    st = client.status()
    print("actors:", [(x.get("agent"), x.get("state")) for x in st["actors"]])
    print("agents:", [(x["name"], [(s['free'], s['total']) for s in x['slots']]) for x in st["agents"]])
