"""A group with X running and Y waiting in its bundle 0; the broker is SIGKILLed and
restarted; then the group is removed. README: removing a group fails the work waiting in
it and stops what runs in it. Does it, for the work a restarted broker took back?"""
from common import *  # noqa


def hold(release, marker):
    import os, time
    open(marker, "w").close()
    while not os.path.exists(release):
        time.sleep(0.05)
    return "released"


out = Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}], strategy="PACK", name="g")
    pg.ready().result(20)
    x = cl.submit(hold, str(out / "go"), str(out / "x"), placement=(pg, 0))
    wait(lambda: (out / "x").exists(), msg="x runs")
    y = cl.submit(hold, str(out / "go"), str(out / "y"), placement=(pg, 0))
    time.sleep(0.5)
    if len(sys.argv) > 1 and sys.argv[1] == "restart":
        c.restart_broker()
        wait(lambda: [g["state"] for g in cl.status()["placement_groups"]] == ["ready"], 30, "back")
        time.sleep(1)
        print("restarted; x:", cl.why(x), "| y:", cl.why(y))
    pg.remove()
    time.sleep(3)
    for name, f in (("x", x), ("y", y)):
        if f.done():
            print(name, "ended:", "cancelled" if f.cancelled() else
                  repr(f.exception()) if f.exception() else f.result())
        else:
            print(name, "NOT ENDED:", cl.why(f))
    print("slots:", slots(cl))
    (out / "go").touch()
