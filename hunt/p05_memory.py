"""MEMORY limits: a task over it (itself, a child, a grandchild), a job over it, a task
allocating slowly just under it (must not be killed). Mode from argv[1]: auto | watcher."""
import os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa

MODE = sys.argv[1] if len(sys.argv) > 1 else "auto"
MB = 1 << 20


def hog(n_mb, how):
    import subprocess, sys
    code = f"b = bytearray({n_mb} * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(30)"
    if how == "self":
        exec(code)
    elif how == "child":
        subprocess.run([sys.executable, "-c", code])
    elif how == "grandchild":
        subprocess.run([sys.executable, "-c",
                        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"])
    return "survived"


def slow(limit_mb, margin_mb):
    import time
    chunks = []
    target = (limit_mb - margin_mb) * 1024 * 1024
    import resource
    while True:
        rss = int(open("/proc/self/statm").read().split()[1]) * 4096
        if rss + 8 * 1024 * 1024 > target:
            break
        c = bytearray(4 * 1024 * 1024)
        for i in range(0, len(c), 4096):
            c[i] = 1
        chunks.append(c)
        time.sleep(0.05)
    time.sleep(2)
    return rss // (1024 * 1024)


def outcome(f, t=60):
    try:
        return f.result(timeout=t)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:250]


env = {"ZRES_AGENT__MEMORY_LIMITS": MODE}
with zres.LocalCluster([{"CPU": 2, "MEMORY": 4e9}], env=env) as cluster, \
        zres.Client(cluster.address) as client:
    st = client.status()
    print("mode:", [a.get("memory") for a in st["agents"]])
    for how in ("self", "child", "grandchild"):
        t = time.monotonic()
        f = client.submit(hog, 400, how, resources={"MEMORY": 200 * MB})
        print(how, "->", outcome(f), round(time.monotonic() - t, 2), "s")
        try:
            print("   why:", client.why(f))
        except Exception as e:
            print("   why err", e)
    f = client.submit(slow, 300, 30, resources={"MEMORY": 300 * MB})
    print("slow under ->", outcome(f))
    f = client.submit_command(
        ["python3", "-c", "import subprocess,sys; subprocess.run([sys.executable,'-c','b=bytearray(500<<20)\\nfor i in range(0,len(b),4096): b[i]=1\\nimport time; time.sleep(30)'])"],
        resources={"MEMORY": 200 * MB})
    print("job ->", outcome(f))
    j = [x for x in client.jobs(all=True) if x["id"] == f.id][0]
    print("   job:", j["state"], j.get("reason"), j.get("peak_memory"))
    # retry_oom
    f = client.submit(hog, 400, "self", resources={"MEMORY": 200 * MB}, retries=2, retry_oom=True)
    print("retry_oom ->", outcome(f, 90))
    f = client.submit(hog, 400, "self", resources={"MEMORY": 200 * MB}, retries=2)
    print("retries no oom ->", outcome(f, 90))
    st = client.status()
    print("free:", [[(s['free'], s['total']) for s in a['slots']] for a in st['agents']])
