"""MEMORY edges: a task asking less than its interpreter needs; ten MEMORY tasks at once
in one slot; a job whose grandchild goes past the limit (watcher + auto); a task that
forks a grandchild which outlives the task (is it cleaned up?)."""
import os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, job, alive  # noqa

MODE = sys.argv[1] if len(sys.argv) > 1 else "auto"


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:220]


def pid():
    import os, time
    time.sleep(0.5)
    return os.getpid()


def leave_grandchild():
    import subprocess
    p = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!"], stdout=subprocess.PIPE, text=True)
    return int(p.stdout.readline())


with zres.LocalCluster([{"CPU": 10, "MEMORY": 2e9}], nthreads=10,
                       env={"ZRES_AGENT__MEMORY_LIMITS": MODE}) as cluster, \
        zres.Client(cluster.address) as client:
    print("tiny:", outcome(client.submit(pid, resources={"MEMORY": 5e6})))
    t = time.monotonic()
    fs = [client.submit(pid, resources={"MEMORY": 150e6}, pure=False) for _ in range(10)]
    print("ten at once:", len({outcome(f) for f in fs}), "pids in %.1f s" % (time.monotonic() - t))
    code = ("import subprocess,sys; subprocess.run(['sh','-c', sys.executable + ' -c \"b=bytearray(400<<20); "
            "b[::4096]=bytes(len(b)//4096); import time; time.sleep(20)\"'])")
    f = client.submit_command([sys.executable, "-c", code], resources={"MEMORY": 200e6})
    print("job grandchild:", outcome(f))
    gc = client.submit(leave_grandchild, resources={"MEMORY": 200e6}).result(30)
    time.sleep(1)
    print("task's leftover grandchild alive after the task:", alive(gc))
    gc2 = client.submit(leave_grandchild).result(30)
    time.sleep(1)
    print("pooled task's leftover grandchild alive:", alive(gc2))
    for p in (gc, gc2):
        if alive(p):
            os.kill(p, 9)
