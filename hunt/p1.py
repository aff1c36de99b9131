import time, sys, dask, dask.array as da, dask.bag as db, dask.dataframe as dd, numpy as np, pandas as pd
import zres
from dask import delayed
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2, http="127.0.0.1:0") as c:
    cl = zres.Client(c.address)
    t=time.time()
    x = da.ones((1000, 1000), chunks=(100, 100))
    print("sum", x.sum().compute(scheduler=cl.get), time.time()-t)
    # big intermediate
    y = (x + 1)
    print("persist/compute big", float(y.compute(scheduler=cl.get).sum()))
    # persist
    with dask.config.set(scheduler=cl.get):
        p = y.persist()
        print("persisted", type(p), float(p.sum().compute()))
        # delayed
        @delayed
        def inc(i): return i+1
        tot = delayed(sum)([inc(i) for i in range(2000)])
        t=time.time(); print("delayed", tot.compute(), time.time()-t)
        b = db.from_sequence(range(100), npartitions=10).map(lambda v: v*2)
        print("bag", b.sum().compute(), b.frequencies().compute()[:3])
        df = dd.from_pandas(pd.DataFrame({"a": range(100), "b": range(100)}), npartitions=4)
        print("df", df.groupby(df.a % 3).b.sum().compute().to_dict())
        print("df head", df.head(2))
        # errors
        def bad(v):
            raise ValueError("boom")
        try:
            b.map(bad).compute()
        except ValueError as e:
            print("err ok", e, getattr(e, "__notes__", None))
        # retries annotation
        with dask.annotate(retries=2):
            z = b.map(lambda v: v).sum()
        print("retries", z.compute())
        # dask.compute multiple
        print(dask.compute(b.sum(), x.sum()))
    fs = cl.compute([x.sum(), b.sum()])
    print("compute futures", [f.result() for f in fs])
    f = cl.compute(x)   # array of many chunks
    print(type(f), f)
    print(type(f.result()))
    st = cl.status()
    print(st if len(str(st))<3000 else str(st)[:3000])
