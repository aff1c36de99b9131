"""Gangs at odd sizes on two agents of gpu=2: a group bigger than the cluster by total
(PACK/SPREAD 3 x gpu=2), by agents (STRICT_SPREAD 3), by one agent (STRICT_PACK 2 x gpu=2),
a gang of 1, a job on more nodes than agents, a bundle only across agents. Expect a clear
InfeasibleWarning / error, never a silent wait."""
import warnings
from common import *  # noqa

def try_group(cl, bundles, strategy):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pg = cl.placement_group(bundles, strategy=strategy)
        try:
            pg.ready().result(4)
            res = "ready"
        except Exception as e:
            res = f"{type(e).__name__}: {e}"
        time.sleep(0.3)
        warned = [str(x.message) for x in w]
    why = cl.why(pg) if res != "ready" else ""
    print(f"{strategy} {bundles}: {res}; warned={warned}; why={why!r}")
    pg.remove()

with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    try_group(cl, [{"gpu": 2}] * 3, "PACK")
    try_group(cl, [{"gpu": 2}] * 3, "SPREAD")
    try_group(cl, [{"gpu": 1}] * 3, "STRICT_SPREAD")
    try_group(cl, [{"gpu": 2}] * 2, "STRICT_PACK")
    try_group(cl, [{"gpu": 3}], "PACK")
    try_group(cl, [{"gpu": 1}], "STRICT_SPREAD")
    try_group(cl, [{"gpu": 1, "CPU": 5}], "PACK")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = cl.submit_command(["true"], nodes=3, resources={"gpu": 1})
        time.sleep(1)
        print("3-node job:", [str(x.message) for x in w], job(cl, f)["state"], job(cl, f)["reason"])
        cl.cancel([f])
    g = cl.submit_command(["sh", "-c", "echo $NODE_RANK $WORLD_SIZE"], nodes=1, resources={"gpu": 1})
    print("1-node job:", g.result(20))
    f = cl.submit_command(["true"], nodes=2)
    try:
        print("2-node job, no resources:", f.result(10))
    except Exception as e:
        print("2-node job, no resources:", type(e).__name__, e)
    wait(lambda: free_everywhere(cl), 10, "free")
    print("all free:", slots(cl))
