"""Jobs at the documented size limits (command line + environment vs max_header_bytes,
16 MiB), and a job whose cwd disappears before it starts."""
import os, shutil, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, job  # noqa


def outcome(f, t=60):
    try:
        r = f.result(timeout=t)
        return f"ok exit={r.exit_code}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]


with zres.LocalCluster([{"CPU": 1}], nthreads=1) as cluster, \
        zres.Client(cluster.address) as client:
    # argv: 1 MB argument (Linux's MAX_ARG_STRLEN is 128 KiB per string!)
    for size in (100_000, 200_000, 1_000_000):
        f = client.submit_command(["sh", "-c", "echo ${#0}", "x" * size], export="NONE")
        print(f"argv arg {size}:", outcome(f), (job(client, f) or {}).get("reason"))
    # env 10 MB total in many vars (over ARG_MAX 2 MiB?)
    env = {f"V{i}": "y" * 1000 for i in range(3000)}
    f = client.submit_command(["true"], env=env, export="NONE")
    print("env 3 MB:", outcome(f), (job(client, f) or {}).get("reason"))
    env = {f"V{i}": "y" * 1000 for i in range(17000)}
    t = time.monotonic()
    try:
        f = client.submit_command(["true"], env=env, export="NONE")
        print("env 17 MB:", outcome(f), (job(client, f) or {}).get("reason"))
    except Exception as e:
        print("env 17 MB raised:", type(e).__name__, str(e)[:200])
    print("  took %.1f s" % (time.monotonic() - t))
    print("still serves:", outcome(client.submit_command(["true"])))
    # cwd disappears while the job is queued
    d = tempfile.mkdtemp()
    go = d + "-go"
    blocker = client.submit_command(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                                    resources={"CPU": 1})
    f = client.submit_command(["pwd"], cwd=d, resources={"CPU": 1})
    wait(lambda: blocker.running(), 20)
    shutil.rmtree(d)
    open(go, "w").close()
    print("cwd gone:", outcome(f), (job(client, f) or {}).get("reason"))
    # cwd removed while running
    d = tempfile.mkdtemp()
    f = client.submit_command(["sh", "-c", "sleep 1; pwd; ls; echo done"], cwd=d)
    wait(lambda: f.running(), 20)
    shutil.rmtree(d)
    print("cwd removed while running:", outcome(f))
    os.remove(go)
