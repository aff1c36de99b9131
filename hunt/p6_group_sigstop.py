"""A SPREAD group (restarts=1) on a, b (gpu=2 each) with a task running in each bundle;
SIGSTOP b past the heartbeat timeout, SIGCONT: the group is reserved again whole (on a,
or a and b once b is back), the task in b's bundle is lost, a's task carries on; at the
end everything is free. Then the same with restarts=0 (the group fails)."""
from common import *  # noqa


def hold(release, marker):
    import os, time
    open(marker, "w").close()
    while not os.path.exists(release):
        time.sleep(0.05)
    return os.getpid()


def where():
    return zres.get_task_context().agent


restarts = int(sys.argv[1]) if len(sys.argv) > 1 else 1
out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="SPREAD", restarts=restarts)
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    agents = [b["agent"] for b in grp()[0]["bundles"]]
    print("bundles on", agents)
    futs = [cl.submit(hold, str(out / "go"), str(out / f"in{k}"), placement=(pg, k))
            for k in range(2)]
    wait(lambda: all((out / f"in{k}").exists() for k in range(2)), msg="started")
    stopped = agents[1]
    os.kill(c.agents[stopped].pid, signal.SIGSTOP)
    try:
        print("task in stopped bundle:", futs[1].result(15))
    except Exception as e:
        print("task in stopped bundle:", type(e).__name__, e)
    print("group now:", grp() and (grp()[0]["state"], [b["agent"] for b in grp()[0]["bundles"]]))
    print("slots:", slots(cl))
    os.kill(c.agents[stopped].pid, signal.SIGCONT)
    time.sleep(4)
    print("after SIGCONT group:", grp() and (grp()[0]["state"], [b["agent"] for b in grp()[0]["bundles"]]))
    print("slots:", slots(cl))
    (out / "go").touch()
    print("task in other bundle:", futs[0].result(15))
    if grp():
        for k in range(2):
            print("new task in bundle", k, cl.submit(where, placement=(pg, k)).result(15))
    else:
        try:
            cl.submit(where, placement=(pg, 0)).result(10)
        except Exception as e:
            print("work in failed group:", type(e).__name__, e)
    pg.remove()
    time.sleep(1)
    wait(lambda: free_everywhere(cl), 10, "free")
    print("all free:", slots(cl), "groups:", cl.status()["placement_groups"])
