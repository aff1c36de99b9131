"""Bad input on gang commands: --nodes 0 / 5000 / abc, logs --rank out of range, a group
with 0 bundles or a bad strategy, placement index out of range: clear errors, no hang."""
from common import *  # noqa

with zres.LocalCluster(agents=[{"gpu": 1}] * 2, names=["a", "b"]) as c, zres.Client(c.address) as cl:
    where = ("--broker", c.address)
    env_keys = c.keys  # the admin key finds them
    for args in (["--nodes", "0"], ["--nodes", "5000"], ["--nodes", "abc"], ["--nodes", "1.5"]):
        r = cli("submit", *where, *args, "-r", "gpu=1", "--", "true", keys=env_keys)
        print("submit", args, "->", r.returncode, (r.stdout + r.stderr).strip()[:160])
    f = cl.submit_command(["sh", "-c", "echo hi"], nodes=2, resources={"gpu": 1})
    f.result(30)
    for rank in ("7", "-1", "x", "1"):
        r = cli("logs", str(f.id), "--rank", rank, *where, keys=env_keys)
        print("logs --rank", rank, "->", r.returncode, (r.stdout + r.stderr).strip()[:160])
    for bundles, strategy in (([], "PACK"), ([{"gpu": 1}], "NOPE"), ([{}], "PACK"),
                              ([{"gpu": -1}], "PACK")):
        try:
            pg = cl.placement_group(bundles, strategy=strategy)
            pg.ready().result(5)
            print("group", bundles, strategy, "-> ready?!")
        except Exception as e:
            print("group", bundles, strategy, "->", type(e).__name__, str(e)[:140])
    pg = cl.placement_group([{"gpu": 1}])
    pg.ready().result(10)
    for k in (1, -1):
        try:
            cl.submit(print, placement=(pg, k)).result(5)
            print("placement", k, "-> ran?!")
        except Exception as e:
            print("placement", k, "->", type(e).__name__, str(e)[:140])
    try:
        print(cl.submit_command(["true"], nodes=0).result(5))
    except Exception as e:
        print("nodes=0 ->", type(e).__name__, str(e)[:140])
