"""What zres status shows for a running limited task, job and actor (memory figures), and
for the agent (memory limits mode)."""
import os, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa


class A:
    def __init__(self):
        self.b = bytearray(50 << 20); self.b[::4096] = b"\1" * (len(self.b) // 4096)

    def ping(self):
        return 1


def hold(go):
    b = bytearray(80 << 20); b[::4096] = b"\1" * (len(b) // 4096)
    while not os.path.exists(go):
        time.sleep(0.05)
    return 1


go = tempfile.mktemp()
with zres.LocalCluster([{"CPU": 3, "MEMORY": 2e9}], nthreads=3) as cluster, \
        zres.Client(cluster.address) as client:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(ZRES_KEYS=cluster.keys, ZRES_BROKER=cluster.address)
    print(subprocess.run([sys.executable, "-m", "zres", "status"], env=env, text=True,
                         capture_output=True).stdout)
    a = client.actor(A, resources={"MEMORY": 300e6}); a.ping().result(30)
    t = client.submit(hold, go, resources={"MEMORY": 300e6})
    j = client.submit_command(["python3", "-c", f"import os,time\nb=bytearray(70<<20); b[::4096]=b'\\1'*(len(b)//4096)\nwhile not os.path.exists('{go}'): time.sleep(0.05)"],
                              resources={"MEMORY": 300e6})
    time.sleep(2)
    print(subprocess.run([sys.executable, "-m", "zres", "status"], env=env, text=True,
                         capture_output=True).stdout)
    print(subprocess.run([sys.executable, "-m", "zres", "jobs"], env=env, text=True,
                         capture_output=True).stdout)
    open(go, "w").close()
    t.result(30); j.result(30)
    print(subprocess.run([sys.executable, "-m", "zres", "jobs", "--all"], env=env, text=True,
                         capture_output=True).stdout)
