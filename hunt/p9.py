import time, threading, dask, dask.array as da, numpy as np
import zres
def slowblock(b):
    time.sleep(0.3); return b + 1
with zres.LocalCluster(agents=[{"CPU": 2}, {"CPU": 2}], nthreads=2, heartbeat_interval=0.1, heartbeat_timeout=1.5) as c:
    cl = zres.Client(c.address)
    for retries in (3, 0):
        x = da.ones((2000, 2000), chunks=(200, 200))  # 100 chunks of 320 KB
        with dask.annotate(retries=retries):
            y = x.map_blocks(slowblock, dtype=float)
        z = (y.T @ y).sum()  # lots of intermediates read across
        threading.Timer(3, lambda: c.agents["agent-1"].kill()).start()
        t = time.time()
        try:
            print(retries, "result", z.compute(scheduler=cl.get), time.time() - t)
        except Exception as e:
            print(retries, "raised", type(e).__name__, str(e)[:300], time.time() - t)
        time.sleep(1)
        print(" counts", cl.status()["counts"], [a["name"] for a in cl.status()["agents"]])
        c.add_agent({"CPU": 2}, name="agent-1")
