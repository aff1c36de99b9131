"""Bob (a client key) against alice's multi-node job and placement group: logs (whole and
--rank), cancel (job and --task of a rank's id), status/jobs --json leaking argv/env,
removing her group by id. Everything must be refused or hidden."""
import json
from common import *  # noqa
from zres.core import keys as K

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"]) as c:
    for n in ("alice", "bob"):
        K.keygen(c.keys, "client", n)
    ak, bk = key_dir(c, "client-alice"), key_dir(c, "client-bob")
    where = ("--broker", c.address)
    alice = zres.Client(c.address, keys=ak)
    bob = zres.Client(c.address, keys=bk)
    f = alice.submit_command(["sh", "-c", "echo SECRET-$NODE_RANK; " + RANK], nodes=2,
                             resources={"gpu": 1}, env={"OUT": out, "TOKEN": "hush"})
    wait(lambda: f.id is not None and len(list(Path(out).glob("pid-*"))) == 2, msg="ranks run")
    pg = alice.placement_group([{"gpu": 1}] * 2, strategy="SPREAD", name="alices")
    pg.ready().result(20)
    jid = f.id
    for args in (("logs", str(jid)), ("logs", str(jid), "--rank", "1"), ("cancel", str(jid))):
        r = cli(*args, *where, keys=bk)
        print(args, "->", r.returncode, (r.stdout + r.stderr).strip()[:160])
    st = cli("status", "--json", *where, keys=bk)
    print("bob status --json leaks SECRET/hush?", "SECRET" in st.stdout, "hush" in st.stdout)
    js = cli("jobs", "--all", "--json", *where, keys=bk)
    print("bob jobs --json leaks?", "SECRET" in js.stdout, "hush" in js.stdout, "OUT" in js.stdout)
    stt = cli("status", *where, keys=bk)
    print("bob status text leaks?", "SECRET" in stt.stdout, "hush" in stt.stdout)
    ranks = [r for j in alice.jobs() if j["id"] == jid for r in j.get("ranks", [])]
    print("ranks:", ranks)
    status = bob.status()
    running = status.get("running", [])
    print("bob sees running:", [(r.get("id"), r.get("name"), r.get("owner")) for r in running][:6])
    for r in running:
        rid = r.get("id")
        if rid is None:
            continue
        res = cli("cancel", "--task", str(rid), *where, keys=bk)
        print("cancel --task", rid, "->", res.returncode, (res.stdout + res.stderr).strip()[:160])
    try:
        g = zres.get_placement_group("alices", client=bob) if "client" in zres.get_placement_group.__code__.co_varnames else None
        print("bob get_placement_group:", g)
    except Exception as e:
        print("bob get_placement_group:", type(e).__name__, e)
    time.sleep(1)
    print("job still running?", not f.done(), job(alice, f)["state"])
    print("alive ranks:", [alive(int(p.read_text())) for p in Path(out).glob("pid-*")])
    Path(out, "go").touch()
    print("result:", f.result(30).exit_code)
    alice.close(); bob.close()
