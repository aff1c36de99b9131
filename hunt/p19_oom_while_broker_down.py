"""A task and an actor going past their MEMORY while the broker is stopped (SIGSTOP, then
SIGKILL + restart): the task fails MemoryLimitError (no retry spent), the actor's begun
call fails MemoryLimitError and its queued call runs on the restarted instance."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


def hog_after(go, mb):
    import os, time
    while not os.path.exists(go):
        time.sleep(0.02)
    kept = []
    for _ in range(mb // 16):
        b = bytearray(16 << 20); b[::4096] = b"\1" * (len(b) // 4096); kept.append(b)
    return "not stopped"


class H:
    def hog(self, go, mb):
        self.kept = hog_after(go, mb)
        return "not stopped"

    def pid(self):
        return os.getpid()


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:200]


go = tempfile.mktemp()
with zres.LocalCluster([{"CPU": 3, "MEMORY": 2e9}]) as cluster, \
        zres.Client(cluster.address) as client:
    a = client.actor(H, resources={"MEMORY": 250e6}, restarts=1)
    p1 = a.pid().result(30)
    t = client.submit(hog_after, go, 600, resources={"MEMORY": 200e6}, retries=2)
    c1, c2 = a.hog(go, 600), a.pid()
    wait(lambda: t.running(), 30)
    time.sleep(1)
    os.kill(cluster.broker.pid, signal.SIGSTOP)
    open(go, "w").close()
    time.sleep(3)
    cluster.restart_broker()
    print("task:", outcome(t))
    print("actor call:", outcome(c1))
    print("queued call on new instance:", outcome(c2), "old", p1)
