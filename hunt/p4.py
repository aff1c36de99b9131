import time, os, signal, threading, dask, dask.bag as db
import zres
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2) as c:
    cl = zres.Client(c.address)
    def slow(v):
        time.sleep(20); return v
    b = db.from_sequence(range(20), npartitions=20).map(slow)
    threading.Timer(2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t = time.time()
    try:
        b.sum().compute(scheduler=cl.get)
    except KeyboardInterrupt:
        print("KI after", time.time()-t)
    time.sleep(1); s = cl.status(); print(s["counts"])
    def failing(v):
        if v == 0: raise ValueError("zero")
        time.sleep(20); return v
    f = cl.compute(db.from_sequence(range(20), npartitions=20).map(failing).sum())
    try: f.result(timeout=30)
    except Exception as e: print("compute err", type(e).__name__, time.time()-t)
    time.sleep(1); s = cl.status(); print("after failed compute", s["counts"])
