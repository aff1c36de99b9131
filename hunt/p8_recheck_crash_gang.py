"""The broker dies (TypeError in Feasibility.recheck_feasibility -> _request) when an agent
is lost while a gang (a placement group or a multi-node job) waits in the queue: the lane's
shape ends with the gang, which _request takes for a (name, amount) pair."""
from common import *  # noqa

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 1}] * 2 + [{"CPU": 1}], names=["a", "b", "c"],
                       heartbeat_interval=0.1, heartbeat_timeout=1.5) as c, \
        zres.Client(c.address) as cl:
    first = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                              env={"OUT": out})
    wait(lambda: first.id is not None and len(list(Path(out).glob("pid-*"))) == 2, msg="running")
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="SPREAD")   # waits: gpus taken
    time.sleep(1)
    print("group:", [g["state"] for g in cl.status()["placement_groups"]])
    c.agents["c"].kill()            # an agent that holds nothing of either
    try:
        wait(lambda: c.broker.poll() is not None, 6, "broker exit")
        print("BROKER DIED, exit code", c.broker.poll())
    except AssertionError:
        print("broker process alive; status answers?", end=" ")
        try:
            c.status(timeout=3)
            print("yes")
        except Exception as e:
            print("no:", type(e).__name__, e)
    Path(out, "go").touch()
