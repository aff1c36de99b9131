"""A STRICT_SPREAD group (restarts=1) on a, b; task X runs in bundle 0 on a; b is killed:
the group waits to be reserved again (a's gpu is X's, c alone is free). Then the broker is
SIGKILLed and restarted: X is offered back (it ran in a bundle no longer reserved); once
X ends the group is reserved again whole on a and c; X's result counts once; all free."""
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
    os.kill(c.agents["c"].pid, signal.SIGSTOP)   # (so the group lands on a and b)
    time.sleep(2)
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1, name="g")
    pg.ready().result(20)
    os.kill(c.agents["c"].pid, signal.SIGCONT)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    agents = [b["agent"] for b in grp()[0]["bundles"]]
    print("bundles on", agents)
    x = cl.submit(hold, str(out / "go"), str(out / "x"), placement=(pg, 0))
    wait(lambda: (out / "x").exists(), msg="x runs")
    wait(lambda: "c" in [a["name"] for a in cl.status()["agents"]], 20, "c back")
    c.agents[agents[1]].kill()
    wait(lambda: grp()[0]["state"] == "restarting", 20, "restarting")
    time.sleep(0.5)
    print("before restart:", grp()[0]["state"], slots(cl))
    c.restart_broker()
    time.sleep(4)
    print("after restart:", grp() and grp()[0]["state"], slots(cl), "broker alive:", c.broker.poll() is None)
    print("x:", x.running(), cl.why(x))
    (out / "go").touch()
    print("x result:", x.result(20), "ran", len((out / "x").read_text().split()), "time(s)")
    wait(lambda: grp() and grp()[0]["state"] == "ready", 20, "re-reserved")
    print("re-reserved on", [b["agent"] for b in grp()[0]["bundles"]])
    print("in bundle 1:", cl.submit(hold, str(out / "go"), str(out / "z"), placement=(pg, 1)).result(20))
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free:", slots(cl))
