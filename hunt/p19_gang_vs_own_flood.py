"""(Same as p18, the gang and the flood both bob's: no fair share to help, only
the starvation reservation.) Bob floods 2,000 CPU=1 tasks of 0.2 s on two agents of CPU=2; alice asks a group of
two CPU=2 bundles (STRICT_SPREAD: both agents wholly free at once) and a 2-node job of
CPU=2 each. README: blocked for starvation_after (5 s) it reserves the agents; it must be
placed within about that plus one task's length, not after the flood."""
from common import *  # noqa
from zres.core import keys as K


def nap(s):
    import time
    time.sleep(s)
    return s


with zres.LocalCluster(agents=[{"CPU": 2}] * 2, names=["a", "b"], heartbeat_interval=0.2) as c:
    for n in ("alice", "bob"):
        K.keygen(c.keys, "client", n)
    alice = zres.Client(c.address, keys=key_dir(c, "client-alice"))
    bob = zres.Client(c.address, keys=key_dir(c, "client-bob"))
    flood = bob.map(nap, [0.2] * 2000)
    wait(lambda: sum(f.done() for f in flood[:20]) >= 4, 30, "flood runs")
    t = time.monotonic()
    pg = bob.placement_group([{"CPU": 2}] * 2, strategy="STRICT_SPREAD")
    try:
        pg.ready().result(30)
        print(f"group ready after {time.monotonic()-t:.1f}s; flood done {sum(f.done() for f in flood)}")
    except Exception as e:
        print("group:", type(e).__name__, e, bob.why(pg))
    pg.remove()
    t = time.monotonic()
    j = bob.submit_command(["true"], nodes=2, resources={"CPU": 2})
    try:
        print(f"job result {j.result(30).exit_code} after {time.monotonic()-t:.1f}s; "
              f"flood done {sum(f.done() for f in flood)}")
    except Exception as e:
        print("job:", type(e).__name__, e, bob.why(j))
    bob.cancel(flood, force=True)
    wait(lambda: free_everywhere(alice), 30, "free")
    print("all free")
    alice.close(); bob.close()
