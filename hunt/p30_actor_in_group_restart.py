"""An actor in bundle 0 of a named group; the broker restarts while the group's agent is
SIGSTOPped (the other agent comes back first); then SIGCONT: the group is taken back where
it was, the actor keeps its state; removing the group kills the actor; all free."""
from common import *  # noqa


class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}], strategy="PACK", name="g")
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    (holder,) = [b["agent"] for b in grp()[0]["bundles"]]
    actor = cl.actor(Counter, placement=(pg, 0), name="ctr")
    print("add:", actor.add(5).result(20))
    os.kill(c.agents[holder].pid, signal.SIGSTOP)
    c.restart_broker()
    other = "b" if holder == "a" else "a"
    wait(lambda: [a["name"] for a in cl.status()["agents"]] == [other], 20, "other back first")
    time.sleep(1)
    print("group while its agent is away:", grp()[0]["state"], [b["agent"] for b in grp()[0]["bundles"]])
    os.kill(c.agents[holder].pid, signal.SIGCONT)
    wait(lambda: len(cl.status()["agents"]) == 2, 20, "both")
    wait(lambda: grp()[0]["state"] == "ready", 20, "ready")
    print("group:", [b["agent"] for b in grp()[0]["bundles"]], "holder", holder)
    print("add after restart:", actor.add(1).result(20))
    pg.remove()
    try:
        print("add after remove:", actor.add(1).result(10))
    except Exception as e:
        print("add after remove:", type(e).__name__, str(e)[:120])
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
