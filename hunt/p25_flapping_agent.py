"""An agent holding bundles of a group (restarts=-1) and a rank of a 2-node job
(retries=3) is SIGSTOPped past the heartbeat timeout and SIGCONTed three times: each
time the group is reserved again and the job runs again whole; at the end everything is
consistent: the group ready on live agents, capacity exact, nothing leaked."""
from common import *  # noqa

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 3, names=["a", "b", "c"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 3, strategy="STRICT_SPREAD", restarts=-1)
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id][0]
    f = cl.submit_command(["sh", "-c", 'echo $$ >> "$OUT/runs-$ZRES_AGENT"; ' + RANK],
                          nodes=2, resources={"gpu": 1}, env={"OUT": out}, retries=3)
    for cycle in range(3):
        wait(lambda: grp()["state"] == "ready", 30, "group ready")
        wait(lambda: f.id is not None and job(cl, f)["state"] == "running" and
             all(r["state"] == "running" for r in job(cl, f)["ranks"]), 30, "job running")
        victim = job(cl, f)["ranks"][cycle % 2]["agent"]
        os.kill(c.agents[victim].pid, signal.SIGSTOP)
        wait(lambda: grp()["state"] != "ready" or job(cl, f)["state"] != "running", 20, "noticed")
        time.sleep(0.5)
        os.kill(c.agents[victim].pid, signal.SIGCONT)
        print(f"cycle {cycle}: stopped {victim}; group {grp()['state']} starts {grp()['starts']}"
              f"; job {job(cl, f)['state']}")
    wait(lambda: grp()["state"] == "ready", 30, "group ready")
    wait(lambda: job(cl, f)["state"] == "running", 30, "job running")
    Path(out, "go").touch()
    print("job:", f.result(30).exit_code, "runs per agent:",
          {p.name: len(p.read_text().split()) for p in Path(out).glob("runs-*")})
    alive_ranks = [pid for p in Path(out).glob("runs-*") for pid in p.read_text().split()
                   if alive(int(pid))]
    print("rank processes alive:", alive_ranks)
    print("slots:", slots(cl))
    print("group:", grp()["state"], [b["agent"] for b in grp()["bundles"]], grp()["starts"])
    pg.remove()
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free; broker alive:", c.broker.poll() is None)
