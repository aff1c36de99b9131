"""An actor (restarts=1) and a task (retries=1) in bundle 1 of a group (restarts=1) on b; b
is SIGKILLed: the group is reserved again on a and c, the actor restarts in the new bundle
1 and answers calls, the task runs again there; retries=0 work waiting in the group moves
to the new bundles; all free at the end."""
from common import *  # noqa


class Box:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n, zres.get_task_context().agent


def hold(release):
    import os, time
    while not os.path.exists(release):
        time.sleep(0.05)
    return zres.get_task_context().agent


out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"gpu": 1}] * 3, names=["a", "b", "c"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    os.kill(c.agents["c"].pid, signal.SIGSTOP)
    time.sleep(2.5)
    pg = cl.placement_group([{"gpu": 1, "CPU": 2}] * 2, strategy="STRICT_SPREAD", restarts=1)
    pg.ready().result(20)
    os.kill(c.agents["c"].pid, signal.SIGCONT)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id][0]
    agents = [b["agent"] for b in grp()["bundles"]]
    box = cl.actor(Box, placement=(pg, 1), restarts=1, resources={"gpu": 1, "CPU": 1})
    print("actor:", box.add(1).result(20), "bundles", agents)
    t = cl.submit(hold, str(out / "go"), placement=(pg, 1), retries=1, resources={"CPU": 1})
    wait(lambda: t.running(), 20, "task runs")
    wait(lambda: "c" in [a["name"] for a in cl.status()["agents"]], 20, "c back")
    c.agents[agents[1]].kill()
    wait(lambda: grp()["state"] == "ready" and agents[1] not in
         [b["agent"] for b in grp()["bundles"]], 30, "re-reserved")
    print("re-reserved on", [b["agent"] for b in grp()["bundles"]])
    try:
        print("actor after:", box.add(1).result(30))
    except Exception as e:
        print("actor after:", type(e).__name__, e)
    (out / "go").touch()
    try:
        print("task:", t.result(30))
    except Exception as e:
        print("task:", type(e).__name__, e)
    cl.kill(box)
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
