"""`zres status` (text and --json) while a group is adopting (its agent stopped across a
broker restart) and restarting (a bundle lost): it answers, and says so."""
from common import *  # noqa

with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], heartbeat_interval=0.1,
                       heartbeat_timeout=1.5) as c, zres.Client(c.address) as cl:
    pg = cl.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1, name="g")
    pg.ready().result(20)
    os.kill(c.agents["b"].pid, signal.SIGSTOP)
    c.restart_broker()
    time.sleep(1)
    st = cli("status", c.address, keys=c.keys)
    print("adopting rc", st.returncode, st.stderr.strip()[:200])
    print("\n".join(l for l in st.stdout.splitlines() if "group" in l or "bundle" in l or " g " in l)[:800])
    c.agents["b"].kill()
    wait(lambda: [g["state"] for g in cl.status()["placement_groups"]] == ["restarting"], 90, "restarting")
    st = cli("status", c.address, keys=c.keys)
    print("restarting rc", st.returncode, st.stderr.strip()[:200])
    print("\n".join(l for l in st.stdout.splitlines() if "group" in l or "bundle" in l)[:800])
    js = cli("status", "--json", c.address, keys=c.keys)
    print("json rc", js.returncode)
