"""`zres status` (text and --json) as alice, bob and admin while alice has work queued and
running: each should answer, listing owners and (for bob) nothing private of alice's."""
from common import *  # noqa
from zres.core import keys as K


def nap(s):
    import time
    time.sleep(s)
    return s


with zres.LocalCluster(agents=[{"CPU": 2}], heartbeat_interval=0.2,
                       env={"ZRES_QUOTAS__BOB": "CPU=1"}) as c:
    for n in ("alice", "bob"):
        K.keygen(c.keys, "client", n)
    keys = {n: key_dir(c, s) for n, s in (("alice", "client-alice"), ("bob", "client-bob"),
                                           ("admin", "admin"))}
    alice = zres.Client(c.address, keys=keys["alice"])
    flood = alice.map(nap, [0.5] * 50)
    j = alice.submit_command(["sh", "-c", "sleep 30 # SECRETARG"], resources={"CPU": 0})
    time.sleep(1.5)
    for who, k in keys.items():
        st = cli("status", c.address, keys=k)
        print(f"--- zres status as {who}: rc={st.returncode} stderr={st.stderr.strip()[:300]!r}")
        print("\n".join(st.stdout.splitlines()[:40]))
        print("SECRETARG shown:", "SECRETARG" in st.stdout)
    alice.cancel(flood + [j], force=True)
    alice.close()
