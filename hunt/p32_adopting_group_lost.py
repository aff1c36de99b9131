"""A reserved group (restarts=1) on a and b; the broker is SIGKILLed; b is killed and comes
back smaller (gpu=1: no room for its gpu=2 bundle); the broker restarted: the bundle is
lost, the group must be reserved again, whole, once room appears (agent c joins)."""
from common import *  # noqa

with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 2}] * 2, strategy="STRICT_SPREAD", restarts=1, name="g")
    pg.ready().result(20)
    grp = lambda: [g for g in cl.status()["placement_groups"] if g["id"] == pg.id]
    c.broker.kill()
    c.broker.wait()
    c.agents["b"].kill()
    c.agents["b"].wait()
    c.restart_broker()
    c.add_agent({"gpu": 1}, name="b")
    wait(lambda: grp() and grp()[0]["state"] != "adopting", 20, "b's bundle judged")
    print("group:", grp()[0]["state"], grp()[0]["cause"], grp()[0]["restarts_left"])
    c.add_agent({"gpu": 2}, name="c")
    try:
        wait(lambda: grp()[0]["state"] == "ready", 15, "reserved again")
        print("reserved again on", [b["agent"] for b in grp()[0]["bundles"]])
    except AssertionError:
        print("NOT reserved again:", grp()[0]["state"], "| status groups:",
              [(g["state"], g["bundles"]) for g in cl.status()["placement_groups"]])
    pg.remove()
