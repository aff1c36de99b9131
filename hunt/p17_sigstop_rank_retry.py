"""A 2-node job with retries=1; the agent holding one rank is SIGSTOPped past the timeout
and SIGCONTed: the job runs again whole (on a and b once b is back), the first run's
ranks are all stopped, the second's run once each; all free at the end."""
from common import *  # noqa

RUNS = ('echo $$ >> "$OUT/runs-$ZRES_AGENT-$NODE_RANK"; ' + RANK)
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    f = cl.submit_command(["sh", "-c", RUNS], nodes=2, resources={"gpu": 1},
                          env={"OUT": out}, retries=1)
    wait(lambda: f.id is not None and len(list(Path(out).glob("runs-*"))) == 2, msg="ranks")
    first = {p.name: p.read_text().split() for p in Path(out).glob("runs-*")}
    os.kill(c.agents["b"].pid, signal.SIGSTOP)
    wait(lambda: job(cl, f)["state"] in ("queued", "infeasible"), 20, "requeued")
    print("requeued:", job(cl, f)["state"], job(cl, f)["reason"])
    os.kill(c.agents["b"].pid, signal.SIGCONT)
    wait(lambda: sum(len(p.read_text().split()) for p in Path(out).glob("runs-*")) == 4, 30,
         "second run")
    runs = {p.name: p.read_text().split() for p in Path(out).glob("runs-*")}
    print("runs:", runs)
    print("first run's processes alive:",
          [alive(int(pids[0])) for pids in first.values()])
    Path(out, "go").touch()
    print("result:", f.result(30).exit_code, job(cl, f)["agents"])
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free; agents:", [a["name"] for a in cl.status()["agents"]])
