"""An actor with MEMORY: a call past the limit (itself; via a child) with calls queued
behind it, restarts=1: the begun call fails MemoryLimitError, queued ones run on the new
instance; status shows the actor's memory."""
import os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa

MODE = sys.argv[1] if len(sys.argv) > 1 else "auto"


class H:
    def __init__(self):
        self.kept = []
        self.pid = os.getpid()

    def grow(self, mb):
        for _ in range(mb // 16):
            b = bytearray(16 << 20)
            b[::4096] = b"\1" * (len(b) // 4096)
            self.kept.append(b)
            time.sleep(0.01)
        return len(self.kept) * 16

    def child(self, mb):
        code = f"b = bytearray({mb} << 20); b[::4096] = b'\\1' * (len(b) // 4096); import time; time.sleep(5)"
        return subprocess.run([sys.executable, "-c", code]).returncode

    def who(self):
        return self.pid


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:200]


with zres.LocalCluster([{"CPU": 2, "MEMORY": 4e9}],
                       env={"ZRES_AGENT__MEMORY_LIMITS": MODE}) as cluster, \
        zres.Client(cluster.address) as client:
    a = client.actor(H, resources={"MEMORY": 300 << 20}, restarts=2)
    print("who", outcome(a.who()))
    print("grow 64:", outcome(a.grow(64)))
    time.sleep(1.5)
    st = client.status()
    print("status actor:", [(x.get("memory"), x.get("peak_memory"), x.get("memory_shown"))
                            for x in st["actors"]])
    fs = [a.grow(800), a.who(), a.grow(16)]
    for f in fs:
        print("  ", outcome(f))
    fs = [a.child(800), a.who()]
    for f in fs:
        print("  child:", outcome(f))
    time.sleep(1)
    print("after:", outcome(a.who()))
    st = client.status()
    print([(x.get("state"), x.get("restarts")) for x in st["actors"]])
