"""Command jobs: one ignoring SIGTERM, cancelled (grace 2 s, then SIGKILL); one that
daemonizes (setsid + double fork) and exits 0; one leaving a background child behind.
README: resources come back only once the whole process group has gone; leftovers are
stopped. A daemon that setsid()s leaves the process group: is it stopped?"""
import os, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, alive, job, free_everywhere  # noqa


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:200]


d = tempfile.mkdtemp()
env = {"ZRES_AGENT__JOB_GRACE": "2", "ZRES_AGENT__MEMORY_LIMITS": sys.argv[1] if len(sys.argv) > 1 else "auto"}
with zres.LocalCluster([{"CPU": 2}], env=env) as cluster, zres.Client(cluster.address) as client:
    # 1. ignores SIGTERM
    f = client.submit_command(f"trap '' TERM; echo $$ > {d}/p1; while true; do sleep 0.1; done",
                              shell=True)
    wait(lambda: os.path.exists(f"{d}/p1") and open(f"{d}/p1").read().strip(), 30)
    pid = int(open(f"{d}/p1").read())
    t = time.monotonic()
    client.cancel(f, force=True)
    wait(lambda: not alive(pid), 20, "term-ignoring job to die")
    print("SIGTERM-ignoring job died after", round(time.monotonic() - t, 2), "s;",
          job(client, f)["state"], job(client, f).get("reason"))
    wait(lambda: free_everywhere(client), 20, "free")
    # 2. daemonizes: setsid + double fork
    code = ("import os,time,sys\n"
            "if os.fork(): sys.exit(0)\n"
            "os.setsid()\n"
            "if os.fork(): sys.exit(0)\n"
            f"open('{d}/p2','w').write(str(os.getpid()))\n"
            "time.sleep(120)\n")
    f = client.submit_command([sys.executable, "-c", code])
    print("daemon job ->", outcome(f))
    wait(lambda: os.path.exists(f"{d}/p2") and open(f"{d}/p2").read(), 10)
    pid2 = int(open(f"{d}/p2").read())
    time.sleep(2)
    print("daemon (setsid) still alive after job ended:", alive(pid2))
    # 3. background child in the same group
    f = client.submit_command(f"(sleep 120 & echo $! > {d}/p3); exit 0", shell=True)
    print("bg job ->", outcome(f))
    pid3 = int(open(f"{d}/p3").read())
    time.sleep(1)
    print("background child alive after job ended:", alive(pid3))
    print("free:", free_everywhere(client))
    for p in (pid2, pid3):
        if alive(p):
            os.kill(p, 9)
