"""SIGKILL of an actor's process mid-call with queued calls; restarts 0 / 2 / -1;
max_concurrency 1 and 2. README: begun call fails ActorDiedError, queued run on new instance;
with no restarts left every pending call fails ActorDiedError naming the cause."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, free_everywhere  # noqa


class A:
    def __init__(self, path):
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"init {os.getpid()}\n")

    def hold(self, i, go):
        with open(self.path, "a") as fh:
            fh.write(f"start {i} {os.getpid()}\n")
        while not os.path.exists(go):
            time.sleep(0.02)
        return i


def run(client, restarts, conc):
    out = tempfile.mktemp(); go = tempfile.mktemp()
    a = client.actor(A, out, max_concurrency=conc, restarts=restarts, resources={"CPU": 1})
    a.ready().result(timeout=60)
    futs = [a.hold(i, go) for i in range(5)]
    wait(lambda: open(out).read().count("start") >= conc, 30)
    pid = int(open(out).read().split("\n")[0].split()[1])
    os.kill(pid, signal.SIGKILL)
    if restarts != 0:
        wait(lambda: open(out).read().count("init") >= 2, 60, "restart")
        open(go, "w").close()
    outcomes = []
    for f in futs:
        try:
            outcomes.append(f.result(timeout=60))
        except Exception as e:
            outcomes.append(f"{type(e).__name__}: {e}"[:150])
    print(f"restarts={restarts} conc={conc}:")
    for o in outcomes:
        print("   ", o)
    try:
        r = a.hold(7, go).result(timeout=30)
    except Exception as e:
        r = f"{type(e).__name__}: {e}"[:150]
    print("    later call:", r)
    if restarts != 0:
        client.kill(a)
    wait(lambda: free_everywhere(client), 30, "free")


with zres.LocalCluster([{"CPU": 2}]) as cluster, zres.Client(cluster.address) as client:
    for restarts in (0, 2, -1):
        for conc in (1, 2):
            run(client, restarts, conc)
