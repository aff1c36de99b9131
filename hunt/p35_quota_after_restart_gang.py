"""Alice's quota gpu=2; her 2-node job (gpu=1 each) and her group (gpu=1 bundle, made by
an admin-less... her own) hold it; the broker restarts: what it takes back counts, so a new
gpu=1 task of hers waits for her quota, bob's runs."""
from common import *  # noqa
from zres.core import keys as K


def where():
    return zres.get_task_context().agent


out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], heartbeat_interval=0.2,
                       env={"ZRES_QUOTAS__ALICE": "gpu=3"}) as c:
    for n in ("alice", "bob"):
        K.keygen(c.keys, "client", n)
    alice = zres.Client(c.address, keys=key_dir(c, "client-alice"))
    bob = zres.Client(c.address, keys=key_dir(c, "client-bob"))
    f = alice.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1}, env={"OUT": out})
    pg = alice.placement_group([{"gpu": 1}], name="hers")
    pg.ready().result(20)
    wait(lambda: len(list(Path(out).glob("pid-*"))) == 2, 20, "ranks")
    c.restart_broker()
    wait(lambda: len(alice.status()["agents"]) == 2, 20, "agents back")
    time.sleep(1)
    print("owners:", [(o["owner"], o["holds"]) for o in alice.status()["owners"]])
    t = alice.submit(where, resources={"gpu": 1, "CPU": 0})
    time.sleep(1.5)
    print("alice's new task:", "running/done" if t.done() else alice.why(t))
    print("bob's task:", bob.submit(where, resources={"gpu": 1, "CPU": 0}).result(20))
    Path(out, "go").touch()
    print("job:", f.result(20).exit_code, "alice's task then:", t.result(20))
    pg.remove()
    alice.close(); bob.close()
