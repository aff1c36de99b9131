"""SIGSTOP agent b only, submit a 2-node job; once one rank runs and the other is sent to
the stopped agent, kill and restart the broker, then SIGCONT b. Expect: runs whole once,
or is stopped and retried / fails; no rank left alone; all free afterwards."""
from common import *  # noqa

retries = int(sys.argv[1]) if len(sys.argv) > 1 else 0
STOP = sys.argv[2] if len(sys.argv) > 2 else "b"
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 1}, {"gpu": 2}], names=["a", "b"], heartbeat_interval=0.2,
                       heartbeat_timeout=8) as c, zres.Client(c.address) as cl:
    os.kill(c.agents[STOP].pid, signal.SIGSTOP)
    f = cl.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                          env={"OUT": out}, retries=retries)
    wait(lambda: f.id is not None and job(cl, f) and any(r["state"] == "sent" for r in job(cl, f)["ranks"]), msg="sent")
    time.sleep(1.5)
    print("before kill:", job(cl, f)["state"], job(cl, f).get("ranks"))
    c.restart_broker()
    os.kill(c.agents[STOP].pid, signal.SIGCONT)
    time.sleep(5)
    print("after restart:", job(cl, f)["state"], job(cl, f).get("ranks"))
    print("pid files:", sorted(p.name for p in Path(out).glob("pid-*")),
          [alive(int(p.read_text())) for p in sorted(Path(out).glob("pid-*"))])
    Path(out, "go").touch()
    try:
        print("result:", f.result(40))
    except Exception as e:
        print("job ended:", type(e).__name__, e)
    print("job:", job(cl, f)["state"], job(cl, f)["reason"], job(cl, f).get("ranks"))
    print("pid files:", sorted(p.name for p in Path(out).glob("pid-*")))
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
