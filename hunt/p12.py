import time, threading, warnings, _thread, dask, dask.array as da
import zres
warnings.simplefilter("always")
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    x = da.ones((100, 100), chunks=(50, 50))
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(lambda b: b + 1, dtype=float)
    f = cl.compute(y.sum(), optimize_graph=False)
    time.sleep(2)
    print(f, "|", cl.why(f))
    print([ (g["count"], g["reason"]) for g in cl.status()["groups"]])
