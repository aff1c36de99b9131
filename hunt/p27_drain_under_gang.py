"""SIGTERM (drain, grace 5 s) the agent holding a rank of a running 2-node job and a
bundle of a group (restarts=1) with a task in it: the rank and the task end within the
grace and count; then the agent leaves, the group is reserved again elsewhere; a new gang
avoids the drained agent; nothing leaks."""
from common import *  # noqa


def nap(s):
    import time
    time.sleep(s)
    return zres.get_task_context().agent


out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 3, names=["a", "b", "c"], heartbeat_interval=0.2,
                       drain_grace=5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1)
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id][0]
    f = cl.submit_command(["sh", "-c", 'echo $$ > "$OUT/pid-$ZRES_AGENT"; sleep 2'], nodes=2,
                          resources={"gpu": 1}, env={"OUT": out})
    wait(lambda: len(list(Path(out).glob("pid-*"))) == 2, 20, "ranks")
    victim = job(cl, f)["ranks"][1]["agent"]
    k = [b["agent"] for b in grp()["bundles"]].index(victim) if victim in \
        [b["agent"] for b in grp()["bundles"]] else 0
    t = cl.submit(nap, 2, placement=(pg, k))
    wait(lambda: t.running(), 20, "task in bundle")
    print("victim", victim, "bundles", [b["agent"] for b in grp()["bundles"]])
    c.agents[victim].terminate()
    try:
        print("job:", f.result(30).exit_code)
    except Exception as e:
        print("job:", type(e).__name__, e)
    try:
        print("task in bundle:", t.result(30))
    except Exception as e:
        print("task in bundle:", type(e).__name__, e)
    c.agents[victim].wait(30)
    wait(lambda: grp()["state"] == "ready" and victim not in [b["agent"] for b in grp()["bundles"]],
         20, "group re-reserved")
    print("group:", grp()["state"], [b["agent"] for b in grp()["bundles"]], grp()["restarts_left"])
    g = cl.submit_command(["true"], nodes=2, resources={"gpu": 1})
    print("new gang:", g.result(30).exit_code, job(cl, g)["agents"])
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free:", slots(cl))
