"""SIGSTOP the broker for 3 heartbeat timeouts while a 2-node job runs and a group is
reserved, then SIGCONT: README says nothing happens (sessions resume): the job finishes
once, the group stays ready on the same agents, all free at the end."""
from common import *  # noqa

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=0)
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    before = [b["agent"] for b in grp()[0]["bundles"]]
    f = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1}, env={"OUT": out},
                          retries=0)
    wait(lambda: f.id is not None and len(list(Path(out).glob("pid-*"))) == 2, msg="ranks")
    os.kill(c.broker.pid, signal.SIGSTOP)
    time.sleep(4.5)
    os.kill(c.broker.pid, signal.SIGCONT)
    time.sleep(3)
    print("job:", job(cl, f)["state"], [r["state"] for r in job(cl, f)["ranks"]])
    print("group:", grp() and (grp()[0]["state"], [b["agent"] for b in grp()[0]["bundles"]]),
          "before", before)
    Path(out, "go").touch()
    try:
        print("job result:", f.result(30).exit_code)
    except Exception as e:
        print("job result:", type(e).__name__, e)
    print("pid files:", sorted(p.name for p in Path(out).glob("pid-*")))
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
