"""SIGSTOP the agent holding rank 1 of a running 2-node job past the heartbeat timeout,
then SIGCONT: the job should fail naming rank 1 lost, rank 0 stopped, rank 1's process
on b stopped when b comes back, and all resources free."""
from common import *  # noqa

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    f = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                          env={"OUT": out})
    wait(lambda: f.id is not None and all(pids(out, a, f.id) for a in "ab"), msg="ranks")
    b = c.agents["b"]
    os.kill(b.pid, signal.SIGSTOP)
    try:
        f.result(20)
    except Exception as e:
        print("job ended:", type(e).__name__, e)
    print("job:", job(cl, f)["state"], job(cl, f)["reason"])
    time.sleep(0.5)
    print("rank0 alive?", alive(pids(out, "a", f.id)[0]))
    os.kill(b.pid, signal.SIGCONT)
    time.sleep(5)
    print("rank1 alive after SIGCONT?", alive(pids(out, "b", f.id)[0]))
    print("slots:", slots(cl))
    print("agents:", [(a["name"], a.get("state")) for a in cl.status()["agents"]])
    # can a new gang run?
    g = cl.submit_command(["sh", "-c", "echo ok"], nodes=2, resources={"gpu": 2})
    print("new gang:", g.result(30).exit_code)
    Path(out, "go").touch()
