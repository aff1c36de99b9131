"""A 3-node job and a 3-bundle STRICT_SPREAD group asked of 2 agents while a third joins
(started at the same moment): both run once it has joined; nothing is lost or leaked."""
from common import *  # noqa
import threading

with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    th = threading.Thread(target=lambda: c.add_agent({"gpu": 2}, name="c"))
    th.start()
    f = cl.submit_command(["sh", "-c", "echo $NODE_RANK"], nodes=3, resources={"gpu": 1})
    pg = cl.placement_group([{"gpu": 1}] * 3, strategy="STRICT_SPREAD")
    th.join()
    print("job:", f.result(30).exit_code, job(cl, f)["agents"])
    pg.ready().result(30)
    print("group ready:", [b["agent"] for g in cl.status()["placement_groups"] for b in g["bundles"]])
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
