"""An actor's agent SIGSTOPped past the heartbeat timeout (restarts=-1, one agent only),
then SIGCONTed: the old actor process must be stopped (not two instances), the actor
restarts, calls queued meanwhile run once."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, alive  # noqa


class A:
    def __init__(self, path):
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"init {os.getpid()}\n")

    def step(self, i):
        with open(self.path, "a") as fh:
            fh.write(f"step {i} {os.getpid()}\n")
        return i


out = tempfile.mktemp()
with zres.LocalCluster([{"CPU": 2}]) as cluster, zres.Client(cluster.address) as client:
    a = client.actor(A, out, restarts=-1)
    a.ready().result(60)
    pid1 = int(open(out).read().split()[1])
    agent = cluster.agents["agent-0"]
    os.kill(agent.pid, signal.SIGSTOP)
    time.sleep(4.5)
    futs = [a.step(i) for i in range(4)]
    time.sleep(1)
    print("while stopped:", [(x.get("state"), x.get("agent")) for x in client.status()["actors"]])
    os.kill(agent.pid, signal.SIGCONT)
    print([f.result(60) for f in futs])
    time.sleep(2)
    inits = [int(l.split()[1]) for l in open(out).read().splitlines() if l.startswith("init")]
    print("inits:", inits, "alive:", [alive(p) for p in inits])
    print(open(out).read().splitlines())
