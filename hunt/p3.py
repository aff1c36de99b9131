import time, threading, _thread, dask, dask.bag as db
import zres
from dask import delayed
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    def slow(v):
        time.sleep(30); return v
    b = db.from_sequence(range(20), npartitions=20).map(slow)
    threading.Timer(2, _thread.interrupt_main).start()
    t = time.time()
    try:
        b.sum().compute(scheduler=cl.get)
    except KeyboardInterrupt:
        print("KI after", time.time()-t)
    for i in range(8):
        s = cl.status(); print(round(time.time()-t,1), s["counts"], len(s["running"]), s["waiting"][:2]); time.sleep(0.5)
    # now compute() futures and cancel
    fs = cl.compute(b.sum())
    time.sleep(1)
    print(fs); fs.cancel(); time.sleep(1.5)
    s = cl.status(); print("after cancel", s["counts"], len(s["running"]))
    try: print(fs.result(timeout=5))
    except Exception as e: print("res", type(e), e)
    time.sleep(2); s = cl.status(); print("later", s["counts"], len(s["running"]))
