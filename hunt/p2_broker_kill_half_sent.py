"""Kill the broker while a 2-node job has rank 0 sent and rank 1 not (both agents
SIGSTOPped so rank 0 never reports its master), restart it on the same state, SIGCONT
the agents: README says the job is stopped and run again (a retry) or fails; no rank
left running alone; resources free afterwards."""
from common import *  # noqa

retries = int(sys.argv[1]) if len(sys.argv) > 1 else 0
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.2,
                       heartbeat_timeout=8) as c, zres.Client(c.address) as cl:
    for p in c.agents.values():
        os.kill(p.pid, signal.SIGSTOP)
    f = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                          env={"OUT": out}, retries=retries)
    wait(lambda: f.id is not None and job(cl, f) and any(r["state"] == "sent" for r in job(cl, f)["ranks"]),
         msg="placed")
    print("before kill:", job(cl, f)["state"], job(cl, f).get("ranks"))
    c.restart_broker()
    for p in c.agents.values():
        os.kill(p.pid, signal.SIGCONT)
    time.sleep(4)
    print("after restart:", job(cl, f)["state"], job(cl, f).get("ranks"))
    Path(out, "go").touch()
    try:
        print("result:", f.result(40))
    except Exception as e:
        print("job ended:", type(e).__name__, e)
    print("job:", job(cl, f)["state"], job(cl, f)["reason"], job(cl, f).get("ranks"))
    print("pid files:", sorted(p.name for p in Path(out).glob("pid-*")))
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
