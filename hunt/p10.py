import time, gc, dask, dask.array as da
import zres
from tests.conftest import wait_until
def slowblock(b):
    time.sleep(0.05); return b + 1
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    x = da.ones((1000, 1000), chunks=(100, 100))
    y = x.map_blocks(slowblock, dtype=float)
    f = cl.compute((y @ y.T).sum())
    time.sleep(1.5); print("before", cl.status()["counts"])
    c.restart_broker()
    print("result", f.result(120))
    wait_until(lambda: cl.status()["counts"] == {"finished": 1}, message="only the output")
    print("after", cl.status()["counts"])
    del f; gc.collect()
    wait_until(lambda: not cl.status()["counts"], message="nothing")
    print("ok")
