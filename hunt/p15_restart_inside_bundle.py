"""Broker SIGKILLed while one task runs in bundle 0 of a group and another waits in that
bundle; restarted on its state: the group is taken back, the waiting one runs after the
first, nothing runs twice; then agent b (bundle 1) is SIGKILLed: the group (restarts=1)
is reserved again, and b's absence makes nothing fatal."""
from common import *  # noqa


def hold(release, marker):
    import os, time
    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    while not os.path.exists(release):
        time.sleep(0.05)
    return zres.get_task_context().agent


out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"gpu": 1}] * 3, names=["a", "b", "c"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1, name="g")
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    agents = [b["agent"] for b in grp()[0]["bundles"]]
    print("bundles on", agents)
    x = cl.submit(hold, str(out / "go-x"), str(out / "x"), placement=(pg, 0))
    wait(lambda: (out / "x").exists(), msg="x runs")
    y = cl.submit(hold, str(out / "go-y"), str(out / "y"), placement=(pg, 0))
    time.sleep(0.5)
    print("y why:", cl.why(y))
    c.restart_broker()
    wait(lambda: grp() and grp()[0]["state"] == "ready", 30, "group back")
    print("after restart:", grp()[0]["state"], [b["agent"] for b in grp()[0]["bundles"]],
          "| y:", cl.why(y))
    (out / "go-x").touch()
    print("x:", x.result(20))
    wait(lambda: (out / "y").exists(), 20, "y runs")
    print("y running on", agents[0])
    other = agents[1]
    c.agents[other].kill()
    wait(lambda: grp()[0]["state"] == "restarting", 20, "restarting")
    time.sleep(1)
    print("restarting while y holds a's gpu:", cl.why(pg))
    (out / "go-y").touch()
    wait(lambda: grp() and grp()[0]["state"] == "ready" and other not in
         [b["agent"] for b in grp()[0]["bundles"]], 30, "re-reserved")
    print("re-reserved on", [b["agent"] for b in grp()[0]["bundles"]])
    print("y:", y.result(20), "x ran", len((out / "x").read_text().split()), "time(s); y",
          len((out / "y").read_text().split()))
    print("broker alive:", c.broker.poll() is None)
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
