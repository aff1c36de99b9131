"""A 2-node job runs; the broker is SIGKILLed; while it is down, rank FAIL exits 3 (or
both end well); the broker restarted on its state: the job ends once (failed naming the
rank, the other rank stopped; or done), all free."""
from common import *  # noqa

FAIL = sys.argv[1] if len(sys.argv) > 1 else "none"
SH = ('echo $$ > "$OUT/pid-$NODE_RANK"; '
      'while [ ! -e "$OUT/go" ]; do sleep 0.05; done; '
      'if [ "$NODE_RANK" = "$FAIL" ]; then exit 3; fi; '
      'if [ "$FAIL" = none ]; then exit 0; fi; while true; do sleep 0.05; done')
out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    f = cl.submit_command(["sh", "-c", SH], nodes=2, resources={"gpu": 1},
                          env={"OUT": out, "FAIL": FAIL})
    wait(lambda: len(list(Path(out).glob("pid-*"))) == 2, 20, "ranks")
    c.broker.kill()
    c.broker.wait()
    Path(out, "go").touch()
    time.sleep(1)
    c.restart_broker()
    try:
        print("result:", f.result(30).exit_code)
    except Exception as e:
        print("result:", type(e).__name__, str(e)[:160])
    print("job:", job(cl, f)["state"], job(cl, f)["reason"], [r["state"] for r in job(cl, f)["ranks"]])
    time.sleep(1)
    print("rank processes alive:", {p.name: alive(int(p.read_text())) for p in Path(out).glob("pid-*")})
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
