import time, dask, dask.bag as db
import zres
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    t = time.time()
    def failing(v):
        if v == 0: raise ValueError("zero")
        time.sleep(10); return v
    f = cl.compute(db.from_sequence(range(20), npartitions=20).map(failing).sum())
    try: f.result(timeout=60)
    except Exception as e: print("compute err", type(e).__name__, e, time.time()-t)
    time.sleep(1); s = cl.status(); print("after failed compute", s["counts"], s["running"])
    time.sleep(10); s = cl.status(); print("after 10 s", s["counts"])
