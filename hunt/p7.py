import time, json, urllib.request, dask, dask.bag as db
import zres
from dask import delayed
with zres.LocalCluster(agents=[{"CPU": 1}], nthreads=1, http="127.0.0.1:0") as c:
    cl = zres.Client(c.address)
    def slow(v): time.sleep(0.05); return v
    def add(a, b): return a + b
    leaves = [delayed(slow)(i) for i in range(1500)]
    while len(leaves) > 1:
        leaves = [delayed(add)(leaves[i], leaves[i+1]) if i+1 < len(leaves) else leaves[i] for i in range(0, len(leaves), 2)]
    f = cl.compute(leaves[0])
    time.sleep(2)
    for i in range(3):
        t = time.time(); st = cl.status(); t1 = time.time()-t
        t = time.time(); urllib.request.urlopen(c.dashboard + "metrics").read(); t2 = time.time()-t
        print("status", round(t1,3), "metrics", round(t2,3), st["counts"], [ (g.get("count"), g.get("reason")[:80]) for g in st["groups"]][:5])
        time.sleep(1)
    print("why out", cl.why(f))
    print(f)
    print(f.result(120))
    st = cl.status(); print(st["counts"], st["owners"])
