"""Each rank of alice's 2-node job runs `zres submit` with the host's admin key in reach:
the jobs they make are alice's (her token), not admin's, and count against her quota."""
from common import *  # noqa
from zres.core import keys as K

out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 2, names=["a", "b"],
                       env={"ZRES_QUOTAS__QUEUED__ALICE": "100"}) as c:
    K.keygen(c.keys, "client", "alice")
    alice = zres.Client(c.address, keys=key_dir(c, "client-alice"))
    admin_dir = key_dir(c, "admin")
    py = sys.executable
    cmd = (f'PYTHONPATH={Path(__file__).resolve().parent.parent} ZRES_KEYS={admin_dir} '
           f'{py} -m zres submit --broker {c.address} -r CPU=0 -- echo inner-$NODE_RANK '
           f'> "$OUT/sub-$NODE_RANK" 2>&1')
    f = alice.submit_command(["sh", "-c", cmd], nodes=2, resources={"gpu": 1},
                             env={"OUT": out})
    print("outer:", f.result(60).exit_code)
    for p in sorted(Path(out).iterdir()):
        print(p.name, p.read_text().strip()[:200])
    admin = zres.Client(c.address, keys=admin_dir)
    time.sleep(1)
    print("jobs:", [(j["id"], j["name"], j["owner"], j["state"]) for j in admin.jobs(all=True)])
    alice.close(); admin.close()
