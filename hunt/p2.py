import time, gc, dask, dask.array as da, numpy as np
import zres
from tests.conftest import wait_until
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    def store(): return cl.status()["agents"][0]["store"]
    x = da.ones((1000, 1000), chunks=(100, 100))
    print("A", (x+1).sum().compute(scheduler=cl.get), store())
    time.sleep(1); print("A+1s", store())
    r = (x + 1).compute(scheduler=cl.get); print("B", store(), cl.status()["counts"])
    time.sleep(1); print("B+1s", store())
    f = cl.compute(x + 2)
    f.result(); print("C", store(), cl.status()["counts"])
    time.sleep(1); print("C+1s", store())
    del f; gc.collect(); time.sleep(1); print("D", store(), cl.status()["counts"])
