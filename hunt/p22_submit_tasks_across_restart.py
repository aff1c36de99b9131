"""2000 Python tasks (detached and not) submitted while the broker is SIGKILLed and
restarted: each queued exactly once (counted by the tasks' runs), every future resolves."""
import os, sys, time, tempfile, threading
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres  # noqa

N = 2000


def note(path, i):
    with open(path, "a") as fh:
        fh.write(f"{i}\n")
    return i


for detached in (True, False):
    for delay in (0.05, 0.15):
        out = tempfile.mktemp()
        with zres.LocalCluster([{"CPU": 1}], nthreads=1) as cluster, \
                zres.Client(cluster.address) as client:
            client.submit(note, out, -1).result(30)
            futs = []
            def go():
                for i in range(N):
                    futs.append(client.submit(note, out, i, detached=detached, pure=False))
            t = threading.Thread(target=go); t.start()
            time.sleep(delay)
            cluster.restart_broker()
            t.join()
            res, errs = [], []
            for f in futs:
                try:
                    res.append(f.result(120))
                except Exception as e:
                    errs.append(f"{type(e).__name__}: {e}"[:120])
            lines = open(out).read().split()
            from collections import Counter
            c = Counter(lines)
            print(f"detached={detached} delay={delay}: ok {len(res)} errors {len(errs)} "
                  f"{set(errs) if errs else ''} runs {len(lines)-1} distinct {len(c)-1} "
                  f"max runs {max(c.values())}")
