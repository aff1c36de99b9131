"""Quotas at the edge: alice gpu=1 with ten gpu=0.1 tasks (all ten at once, exactly);
queued quota 5 against `zres submit --file` of 8 jobs (refused whole, naming the quota)
and against a group of 6 bundles; the quota lowered across a broker restart."""
from common import *  # noqa
from zres.core import keys as K


def hold(release, marker):
    import os, time
    open(marker, "w").close()
    while not os.path.exists(release):
        time.sleep(0.05)
    return "ok"


out = Path(tempfile.mkdtemp())
env = {"ZRES_QUOTAS__ALICE": "gpu=1", "ZRES_QUOTAS__QUEUED__ALICE": "50"}
with zres.LocalCluster(agents=[{"gpu": 4, "CPU": 16}], env=env, heartbeat_interval=0.2,
                       nthreads=16) as c:
    K.keygen(c.keys, "client", "alice")
    ak = key_dir(c, "client-alice")
    alice = zres.Client(c.address, keys=ak)
    fs = [alice.submit(hold, str(out / "go"), str(out / f"t{i}"), resources={"gpu": 0.1, "CPU": 0})
          for i in range(11)]
    time.sleep(3)
    print("running of 11 gpu=0.1 under gpu=1:", sum(f.running() for f in fs),
          "markers:", len(list(out.glob("t*"))))
    (out / "go").touch()
    [f.result(20) for f in fs]
    c._env["ZRES_QUOTAS__QUEUED__ALICE"] = "5"
    c.restart_broker()
    wait(lambda: c.status()["agents"], 20, "agent back")
    lines = out / "jobs.txt"
    lines.write_text("".join(f"sleep 0.1 # {i}\n" for i in range(8)))
    r = cli("submit", "--broker", c.address, "-r", "gpu=1", "--file", str(lines), keys=ak)
    print("submit --file 8 over queued 5:", r.returncode, (r.stdout + r.stderr).strip()[:300])
    r = cli("submit", "--broker", c.address, "-r", "gpu=1", "--", "true", keys=ak)
    print("one more submit:", r.returncode, (r.stdout + r.stderr).strip()[:300])
    pg = alice.placement_group([{"gpu": 0.1}] * 6, strategy="PACK")
    try:
        pg.ready().result(5)
        print("group of 6 bundles with queued quota 5: ready")
    except Exception as e:
        print("group of 6 bundles with queued quota 5:", type(e).__name__, e)
    pg.remove()
    time.sleep(1)
    # quota lowered across a restart: two gpu=0.5 tasks run, then quota gpu=0.5
    (out / "go").unlink()
    for p in out.glob("t*"):
        p.unlink()
    two = [alice.submit(hold, str(out / "go"), str(out / f"t{i}"), resources={"gpu": 0.5, "CPU": 0})
           for i in range(2)]
    wait(lambda: len(list(out.glob("t*"))) == 2, 20, "two run")
    c._env["ZRES_QUOTAS__ALICE"] = "gpu=0.5"
    c.restart_broker()
    time.sleep(3)
    third = alice.submit(hold, str(out / "go"), str(out / "t3"), resources={"gpu": 0.5, "CPU": 0})
    time.sleep(2)
    print("after restart with gpu=0.5: third running?", third.running(), "| why:", alice.why(third))
    print("owners:", [(o["owner"], o["holds"], o.get("quota")) for o in alice.status()["owners"]])
    (out / "go").touch()
    print([f.result(30) for f in two + [third]])
    c._env["ZRES_QUOTAS__ALICE"] = "gpu=x"
    try:
        c.restart_broker(timeout=20)
        print("bad quota: broker started?!")
    except Exception as e:
        print("bad quota:", type(e).__name__, str(e)[:200])
    alice.close()
