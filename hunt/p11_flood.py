"""Alice floods 20,000 queued tasks at priority 1000; bob's tasks (priority -1000) are
served within a turn or two of room freeing; alice's cancel of her flood frees all."""
from common import *  # noqa
from zres.core import keys as K


def nap(s):
    import time
    time.sleep(s)
    return s


with zres.LocalCluster(agents=[{"CPU": 2}], heartbeat_interval=0.2) as c:
    for n in ("alice", "bob"):
        K.keygen(c.keys, "client", n)
    alice = zres.Client(c.address, keys=key_dir(c, "client-alice"))
    bob = zres.Client(c.address, keys=key_dir(c, "client-bob"))
    t0 = time.monotonic()
    flood = alice.map(nap, [0.05] * 20000, priority=1000)
    wait(lambda: any(f.done() for f in flood[:50]), 60, "flood runs")
    print(f"flood submitted and running after {time.monotonic()-t0:.1f}s")
    lat = []
    for i in range(5):
        t = time.monotonic()
        bob.submit(nap, 0.0, priority=-1000).result(60)
        lat.append(round(time.monotonic() - t, 3))
    print("bob's latencies:", lat, "alice done so far:", sum(f.done() for f in flood))
    o = {x["owner"]: (x["holds"], x["waiting"], round(x["share"], 3)) for x in bob.status()["owners"]}
    print("owners as bob:", o)
    st = cli("status", c.address, keys=key_dir(c, "client-bob"))
    print("zres status as bob:\n" + "\n".join(st.stdout.splitlines()[:25]))
    t = time.monotonic()
    alice.cancel(flood, force=True)
    wait(lambda: all(f.done() for f in flood), 120, "flood cancelled")
    print(f"cancel took {time.monotonic()-t:.1f}s")
    wait(lambda: free_everywhere(bob), 30, "free")
    print("free; status counts:", bob.status().get("counts") or bob.status().get("tasks"))
    alice.close(); bob.close()
