import time, urllib.request, gc
import zres
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import wait_until
def scrape(url):
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
def fin(m): return {k[1][0][1]: v for k, v in m.items() if k[0] == "zres_tasks_finished_total"}
def tasks(m): return {k[1][0][1]: v for k, v in m.items() if k[0] == "zres_tasks" and v}
def slow(s): time.sleep(s); return s
def bad(): raise ValueError
with zres.LocalCluster(agents=[{"CPU": 2}], nthreads=2, http="127.0.0.1:0") as c:
    cl = zres.Client(c.address)
    fs = cl.map(slow, [0.0]*50); zres.wait(fs)
    e = cl.submit(bad); zres.wait([e])
    long = cl.map(slow, [2.0]*6)
    time.sleep(0.5); q = cl.map(slow, [0]*5); cl.cancel(q)
    time.sleep(0.5)
    m = scrape(c.dashboard); print("before", fin(m), tasks(m))
    c.restart_broker()
    wait_until(lambda: urllib.request.urlopen(c.dashboard + "health").status == 200)
    time.sleep(1)
    m = scrape(c.dashboard); print("after restart", fin(m), tasks(m), cl.status()["counts"])
    zres.wait(long, timeout=60)
    time.sleep(1)
    m = scrape(c.dashboard); print("after long", fin(m), tasks(m), cl.status()["counts"])
    del fs, e, long, q; gc.collect(); time.sleep(1.5)
    m = scrape(c.dashboard); print("after release", fin(m), tasks(m), cl.status()["counts"])
