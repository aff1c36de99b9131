"""The broker dies (TypeError in recheck_feasibility) when any agent is lost while a task
waits inside a placement group's bundle: the queue lane's shape ends with Inside, which
feasibility._request takes for a (name, amount) pair."""
from common import *  # noqa


def hold(release):
    import os, time
    while not os.path.exists(release):
        time.sleep(0.05)
    return "ok"


out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "c"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}], strategy="PACK")
    pg.ready().result(20)
    (holder,) = [b["agent"] for g in cl.status()["placement_groups"] for b in g["bundles"]]
    first = cl.submit(hold, str(out / "go"), placement=(pg, 0))
    second = cl.submit(hold, str(out / "go"), placement=(pg, 0))   # waits in the bundle
    time.sleep(1)
    other = "c" if holder == "a" else "a"
    print("bundle on", holder, "; killing", other)
    c.agents[other].kill()
    time.sleep(3)
    print("broker exit code:", c.broker.poll())
    (out / "go").touch()
    try:
        print("results:", first.result(10), second.result(10))
    except Exception as e:
        print("results:", type(e).__name__, e)
