import time, json, urllib.request, subprocess, sys, tempfile, pathlib
import zres, dask
from zres.core import keys as K
from tests.e2e.test_security import key_dir
from prometheus_client.parser import text_string_to_metric_families
def scrape(url):
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
def slow(s): time.sleep(s); return s
QUOTAS = {"ZRES_QUOTAS__ALICE": "foo=2", "ZRES_QUOTAS__QUEUED__ALICE": "350"}
tmp = pathlib.Path(tempfile.mkdtemp())
with zres.LocalCluster(agents=[{"CPU": 2, "foo": 4}], http="127.0.0.1:0", env=QUOTAS, heartbeat_interval=0.2) as c:
    for n in ("alice", "bob"): K.keygen(c.keys, "client", n)
    a = zres.Client(c.address, keys=key_dir(c, tmp, "client-alice"))
    b = zres.Client(c.address, keys=key_dir(c, tmp, "client-bob"))
    fa = a.map(slow, [1]*300, resources={"foo": 1})
    fb = b.map(slow, [1]*100, resources={"foo": 1})
    dfut = a.compute(dask.delayed(sum)([dask.delayed(slow)(1) for _ in range(20)]))
    time.sleep(2.5)
    st = c.status(); m = scrape(c.dashboard)
    print("counts", st["counts"])
    for o in st["owners"]: print(" owner", o)
    print(" metrics tasks", {k[1][0][1]: v for k, v in m.items() if k[0]=="zres_tasks" and v})
    print(" metrics running", {k[1]: v for k, v in m.items() if k[0]=="zres_running_tasks" and v})
    print(" metrics waiting", {k[1]: v for k, v in m.items() if k[0] in ("zres_waiting_tasks","zres_infeasible_tasks") and v})
    print(" groups", [(g.get("count"), g.get("owner"), g.get("reason")) for g in st["groups"]])
    print(" why", a.why(fa[-1]), "|", b.why(fb[-1]), "|", a.why(dfut))
    print(subprocess.run([sys.executable, "-m", "zres", "status", c.address, "--keys", c.keys], capture_output=True, text=True).stdout)
    a.close()
    time.sleep(2)
    st = c.status(); m = scrape(c.dashboard); print("after alice closed", st["counts"], [ (o["owner"], o["waiting"], o["grants"]) for o in st["owners"]])
    print(" metrics tasks", {k[1][0][1]: v for k, v in m.items() if k[0]=="zres_tasks" and v}, {k[1]: v for k, v in m.items() if k[0]=="zres_running_tasks" and v})
