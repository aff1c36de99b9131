"""SIGKILL agent b, then at once (before it is declared lost) ask a group over every agent
(STRICT_SPREAD x3, restarts=R) and a 3-node job (retries=R): they are placed with b in
them; when b is found lost: with R=0 the group fails and the job fails naming the rank
(its other ranks stopped); with R=1 both wait (infeasible, 2 agents) and run once d joins."""
from common import *  # noqa

R = int(sys.argv[1]) if len(sys.argv) > 1 else 0
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 1}] * 3, names=["a", "b", "c"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    c.agents["b"].kill()
    pg = cl.placement_group([{"gpu": 1}] * 3, strategy="STRICT_SPREAD", restarts=R)
    try:
        pg.ready().result(5)
        print("group ready (with b in it)")
    except Exception as e:
        print("group:", type(e).__name__, e)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    wait(lambda: not grp() or grp()[0]["state"] != "ready", 10, "group noticed")
    print("group after loss:", grp() and (grp()[0]["state"], grp()[0]["cause"]) or "gone")
    if grp():
        pg.remove()
    wait(lambda: free_everywhere(cl), 10, "free")
    f = cl.submit_command(["sh", "-c", 'echo $$ >> "$OUT/runs-$ZRES_AGENT"; sleep 0.5'],
                          nodes=2, resources={"gpu": 1}, env={"OUT": out}, retries=R)
    time.sleep(0.3)
    cl2 = c.agents["c"].kill()
    try:
        print("job:", f.result(15).exit_code, job(cl, f)["agents"])
    except Exception as e:
        print("job:", type(e).__name__, str(e)[:150], job(cl, f)["state"])
    if R:
        c.add_agent({"gpu": 1}, name="d")
        print("job after d joined:", f.result(30).exit_code, job(cl, f)["agents"])
    print("runs:", {p.name: len(p.read_text().split()) for p in Path(out).glob("runs-*")})
    wait(lambda: free_everywhere(cl), 10, "free")
    print("all free:", slots(cl))
