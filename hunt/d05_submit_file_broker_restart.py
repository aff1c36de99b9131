"""DEFECT 5: zres submit --file (2000 lines) while the broker is SIGKILLed and restarted:
zres submit exits 1 ('the broker restarted before it answered'), printing no id, though
jobs were queued (the user cannot tell which: resubmitting duplicates them); are any
lines queued twice? Counts the job table by command line. argv[1]: delay before restart."""
import collections, os, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres  # noqa

d = tempfile.mkdtemp()
N = 2000
delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
with zres.LocalCluster([{"foo": 1}], nthreads=1) as cluster, \
        zres.Client(cluster.address) as client:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(ZRES_KEYS=cluster.keys, ZRES_BROKER=cluster.address,
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    Path(d, "runs.txt").write_text("".join(f"echo {i}\n" for i in range(N)))
    p = subprocess.Popen([sys.executable, "-m", "zres", "submit", "-r", "bar=1", "--file",
                          "runs.txt"], env=env, cwd=d, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(delay)
    cluster.restart_broker()
    o, e = p.communicate(timeout=300)
    ids = o.split()
    time.sleep(2)
    jobs = client.jobs(all=True)
    by_cmd = collections.Counter(str(j.get("argv")) for j in jobs)
    print("rc", p.returncode, "ids printed", len(ids), "unique", len(set(ids)),
          "| jobs in table", len(jobs), "distinct commands", len(by_cmd),
          "max copies", max(by_cmd.values(), default=0))
    print("stderr:", e[-300:].replace("\n", " | "))
    print("sample job keys:", sorted(jobs[0].keys()) if jobs else None)
