"""Alice's quota gpu=2 against gangs: a group at exactly her quota, work inside its
bundles (counted again?), a 2-node job at the quota, a group over her quota forever."""
from common import *  # noqa
from zres.core import keys as K


def where():
    return zres.get_task_context().agent


env = {"ZRES_QUOTAS__ALICE": "gpu=2", "ZRES_QUOTAS__QUEUED__ALICE": "5"}
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"], env=env) as c:
    K.keygen(c.keys, "client", "alice")
    alice = zres.Client(c.address, keys=key_dir(c, "client-alice"))
    pg = alice.placement_group([{"gpu": 1}] * 2, strategy="SPREAD")
    try:
        pg.ready().result(10)
        print("group at quota: ready")
    except Exception as e:
        print("group at quota:", type(e).__name__, e, alice.why(pg))
    try:
        fs = [alice.submit(where, placement=(pg, k)) for k in range(2)]
        print("work inside bundles:", [f.result(10) for f in fs])
    except Exception as e:
        print("work inside bundles:", type(e).__name__, e, [alice.why(f) for f in fs])
    try:
        fs = [alice.submit(where, placement=(pg, k), resources={"gpu": 1}) for k in range(2)]
        print("work inside bundles w/ gpu=1:", [f.result(10) for f in fs])
    except Exception as e:
        print("work inside bundles w/ gpu=1:", type(e).__name__, e, [alice.why(f) for f in fs])
    try:
        a = alice.actor(dict, placement=(pg, 0))
        a.ready().result(10)
        print("actor in bundle: ready")
    except Exception as e:
        print("actor in bundle:", type(e).__name__, e)
    print("owners:", [(o["owner"], o["holds"], o.get("waiting")) for o in alice.status()["owners"]])
    pg.remove()
    time.sleep(1)
    j = alice.submit_command(["true"], nodes=2, resources={"gpu": 1})
    try:
        print("2-node job at quota:", j.result(15).exit_code)
    except Exception as e:
        print("2-node job at quota:", type(e).__name__, e, alice.why(j))
    big = alice.placement_group([{"gpu": 1}] * 3, strategy="SPREAD")
    time.sleep(2)
    print("group over quota:", alice.why(big))
    j2 = alice.submit_command(["true"], nodes=2, resources={"gpu": 2})
    time.sleep(2)
    print("job over quota:", alice.why(j2), job(alice, j2)["state"], job(alice, j2)["reason"])
    print("owners:", [(o["owner"], o["holds"], o.get("waiting")) for o in alice.status()["owners"]])
    alice.close()
