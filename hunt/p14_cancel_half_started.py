"""Cancel a 2-node job while rank 0 is sent to a stopped agent and rank 1 not yet sent;
SIGCONT the agent within the heartbeat timeout: the job ends cancelled, no rank process
runs, every resource comes back. MODE=close: the client goes instead of cancelling."""
from common import *  # noqa

mode = sys.argv[1] if len(sys.argv) > 1 else "cancel"
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 1}, {"gpu": 2}], names=["a", "b"],
                       heartbeat_interval=0.2, heartbeat_timeout=10) as c:
    cl = zres.Client(c.address)
    watch = zres.Client(c.address)
    os.kill(c.agents["a"].pid, signal.SIGSTOP)
    f = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1}, env={"OUT": out})
    wait(lambda: f.id is not None and job(cl, f) and
         [r["state"] for r in job(cl, f)["ranks"]] == ["sent", "placed"], msg="half sent")
    jid = f.id
    if mode == "cancel":
        cl.cancel([f], force=True)
    else:
        cl.close()
    time.sleep(1)
    os.kill(c.agents["a"].pid, signal.SIGCONT)
    j = lambda: [x for x in watch.jobs(all=True) if x["id"] == jid][0]
    wait(lambda: j()["state"] not in ("queued", "running"), 30, "job ended")
    print("job:", j()["state"], j()["reason"], j()["ranks"])
    time.sleep(2)
    print("pid files:", [(p.name, alive(int(p.read_text()))) for p in Path(out).glob("pid-*")])
    wait(lambda: free_everywhere(watch), 20, "free")
    print("all free")
    g = watch.submit_command(["true"], nodes=2, resources={"gpu": 1})
    print("next gang:", g.result(30).exit_code)
    Path(out, "go").touch()
    watch.close()
