"""Actor calls in flight and queued across a broker SIGKILL+restart: order kept, none lost,
none run twice (README, Broker restarts). max_concurrency=1 and 3."""
import os, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class Log:
    def __init__(self, path):
        self.path = path

    def step(self, i, hold):
        with open(self.path, "a") as fh:
            fh.write(f"start {i}\n")
        time.sleep(hold)
        with open(self.path, "a") as fh:
            fh.write(f"end {i}\n")
        return i

    def pid(self):
        return os.getpid()


def run(conc):
    out = tempfile.mktemp()
    with zres.LocalCluster([{"CPU": 2}]) as cluster, zres.Client(cluster.address) as client:
        a = client.actor(Log, out, max_concurrency=conc, name=f"log{conc}")
        a.ready().result(timeout=60)
        futs = [a.step(i, 0.3) for i in range(20)]
        wait(lambda: os.path.exists(out) and open(out).read().count("start") >= 2, 30)
        t = time.monotonic()
        cluster.restart_broker()
        print("restart took", round(time.monotonic() - t, 2))
        res = [f.result(timeout=120) for f in futs]
        assert res == list(range(20)), res
        lines = open(out).read().split()
        starts = [int(lines[i + 1]) for i in range(0, len(lines), 2) if lines[i] == "start"]
        print(conc, "starts", starts)
        assert len(starts) == 20 and sorted(starts) == list(range(20)), "dup/lost"
        if conc == 1:
            assert starts == list(range(20)), "order"
        # more calls after
        assert a.step(99, 0).result(timeout=30) == 99
        print("ok", conc)


for c in (1, 3):
    run(c)
