"""client.why(pg) for a group ready, waiting again after a loss (it said "finished"), and
removed."""
from common import *  # noqa

with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1)
    pg.ready().result(20)
    print("ready:", cl.why(pg))
    c.agents["b"].kill()
    wait(lambda: [g["state"] for g in cl.status()["placement_groups"]] == ["restarting"], 20, "r")
    print("restarting:", cl.why(pg))
    pg.remove()
    print("removed:", cl.why(pg))
