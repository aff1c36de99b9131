"""A job writing 200 MB of output fast; meanwhile time a stream of no-op tasks (the agent's
loop must stay responsive); check the log's size, zres logs, and disk use."""
import os, sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, job, cli  # noqa


def noop():
    return 1


with zres.LocalCluster([{"CPU": 2}], nthreads=2) as cluster, \
        zres.Client(cluster.address) as client:
    def lat(n=50):
        xs = []
        for _ in range(n):
            t = time.perf_counter()
            client.submit(noop, pure=False).result(30)
            xs.append(time.perf_counter() - t)
        return xs
    base = lat()
    print("no-op round trip before: median %.1f ms, max %.1f ms" %
          (1e3 * statistics.median(base), 1e3 * max(base)))
    t0 = time.monotonic()
    f = client.submit_command("head -c 200000000 /dev/zero | tr '\\0' 'x' | fold -w 99", shell=True)
    during = []
    while not f.done():
        during += lat(10)
    r = f.result(60)
    print("job took %.1f s" % (time.monotonic() - t0))
    print("no-op during: n=%d median %.1f ms, max %.1f ms" %
          (len(during), 1e3 * statistics.median(during), 1e3 * max(during)))
    print("log size", os.path.getsize(r.log))
    t = time.monotonic()
    out = cli("logs", str(r.job_id), "--address", cluster.address, keys=cluster.keys, timeout=120) \
        if False else None
    import subprocess
    env = {**os.environ, "ZRES_KEYS": cluster.keys, "ZRES_BROKER": cluster.address}
    p = subprocess.run([sys.executable, "-m", "zres", "logs", str(r.job_id)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    print("zres logs: rc", p.returncode, "bytes", len(p.stdout), "in %.1f s" % (time.monotonic() - t),
          p.stderr[-300:])
