"""zres submit --file with 2000 lines while the broker is SIGKILLed and restarted during
the submission: every line queued exactly once; printed ids match the table."""
import os, subprocess, sys, time, tempfile, threading
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa

d = tempfile.mkdtemp()
N = 2000
with zres.LocalCluster([{"foo": 1}], nthreads=1) as cluster, \
        zres.Client(cluster.address) as client:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(ZRES_KEYS=cluster.keys, ZRES_BROKER=cluster.address,
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    Path(d, "runs.txt").write_text("".join(f"echo {i} >> {d}/ran\n" for i in range(N)))
    for delay in (0.35, 0.5, 0.7):
        p = subprocess.Popen([sys.executable, "-m", "zres", "submit", "-r", "bar=1", "--file",
                              "runs.txt"], env=env, cwd=d, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        cluster.restart_broker()
        o, e = p.communicate(timeout=300)
        ids = o.split()
        jobs = [j for j in client.jobs(all=True)]
        print(f"delay {delay}: rc", p.returncode, "ids printed", len(ids), "unique", len(set(ids)),
              "jobs in table", len(jobs), "stderr", e[-300:].replace("\n", " | "))
        for j in jobs:
            pass
        # cancel them all for the next round
        subprocess.run([sys.executable, "-m", "zres", "cancel", *[str(j["id"]) for j in jobs
                                                                   if j["state"] not in ("cancelled",)]],
                       env=env, capture_output=True)
