"""Two CPU=1 tasks run on an agent of CPU=2; its capacity is lowered to CPU=1 (README:
running tasks finish); the broker is SIGKILLed and restarted: the agent offers both back,
only one fits its (lowered) capacity. retries=0: neither body may begin twice."""
from common import *  # noqa


def noted(ledger, release):
    import os, time
    with open(ledger, "a") as fh:
        fh.write(f"start {os.getpid()}\n")
    while not os.path.exists(release):
        time.sleep(0.05)
    return os.getpid()


out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"CPU": 2}], names=["a"], heartbeat_interval=0.2,
                       nthreads=2) as c, zres.Client(c.address) as cl:
    fs = [cl.submit(noted, str(out / f"l{i}"), str(out / "go")) for i in range(2)]
    wait(lambda: all((out / f"l{i}").exists() for i in range(2)), 20, "both run")
    print("lowered:", cl.set_resources("a", {"CPU": 1}))
    c.restart_broker()
    time.sleep(3)
    print("after restart:", [cl.why(f) for f in fs], slots(cl))
    (out / "go").touch()
    for f in fs:
        try:
            print("result:", f.result(20))
        except Exception as e:
            print("result:", type(e).__name__, e)
    print("starts:", {p.name: len(p.read_text().splitlines()) for p in out.glob("l*")})
