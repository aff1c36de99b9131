"""Broker SIGKILLed right after an actor's process is SIGKILLed (restarts=2), with calls
queued; and broker down while the actor's process dies. Calls queued must run once each,
in order, on the new instance; the begun one fails ActorDiedError."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class A:
    def __init__(self, path):
        self.path = path
        with open(path, "a") as fh:
            fh.write(f"init {os.getpid()}\n")

    def step(self, i, go):
        with open(self.path, "a") as fh:
            fh.write(f"start {i}\n")
        while not os.path.exists(go):
            time.sleep(0.02)
        return i


def outcome(f, t=90):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:150]


def pid_of(out):
    return [int(l.split()[1]) for l in open(out).read().splitlines() if l.startswith("init")][-1]


for case in ("kill-then-restart", "kill-while-down"):
    out = tempfile.mktemp(); go = tempfile.mktemp()
    with zres.LocalCluster([{"CPU": 2}]) as cluster, zres.Client(cluster.address) as client:
        a = client.actor(A, out, restarts=2, name="x")
        a.ready().result(60)
        futs = [a.step(i, go) for i in range(6)]
        wait(lambda: "start 0" in open(out).read(), 30)
        if case == "kill-then-restart":
            os.kill(pid_of(out), signal.SIGKILL)
            time.sleep(0.05)
            cluster.restart_broker()
        else:
            cluster.broker.kill(); cluster.broker.wait()
            os.kill(pid_of(out), signal.SIGKILL)
            time.sleep(1)
            cluster.restart_broker()
        wait(lambda: open(out).read().count("init") >= 2, 60, "restart")
        open(go, "w").close()
        res = [outcome(f) for f in futs]
        starts = [l.split()[1] for l in open(out).read().splitlines() if l.startswith("start")]
        print(case, res, "starts:", starts, "inits:", open(out).read().count("init"))
        print("  later:", outcome(a.step(9, go)))
