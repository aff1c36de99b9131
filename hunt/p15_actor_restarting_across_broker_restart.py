"""An actor restarting (its agent SIGKILLed, no other agent fits yet) with calls queued,
across a broker SIGKILL+restart; then an agent that fits joins: the calls run, in order,
once; a named lookup meanwhile works."""
import os, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class A:
    def __init__(self, path):
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"init {os.environ.get('ZRES_AGENT')}\n")

    def step(self, i):
        with open(self.path, "a") as fh:
            fh.write(f"step {i}\n")
        return i


out = tempfile.mktemp()
with zres.LocalCluster([{"foo": 1}, {"CPU": 1}], names=["a0", "a1"]) as cluster, \
        zres.Client(cluster.address) as client:
    a = client.actor(A, out, resources={"foo": 1}, restarts=-1, name="r")
    a.ready().result(60)
    cluster.agents["a0"].kill(); cluster.agents["a0"].wait()
    wait(lambda: any(x.get("state") == "restarting" for x in client.status()["actors"]), 30)
    futs = [a.step(i) for i in range(5)]
    time.sleep(0.5)
    cluster.restart_broker()
    print("after restart:", [(x.get("state"), x.get("agent")) for x in client.status()["actors"]])
    h = client.get_actor("r")
    futs += [h.step(i) for i in range(5, 8)]
    time.sleep(1)
    cluster.add_agent({"foo": 1}, name="a2")
    res = [f.result(60) for f in futs]
    print("results:", res)
    print(open(out).read().split("\n"))
