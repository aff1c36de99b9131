import time, json, os, signal, urllib.request, subprocess, sys
import zres
from prometheus_client.parser import text_string_to_metric_families
from tests.tasks import hold
def scrape(url):
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}
def show(c, cl, tag):
    st = cl.status(); m = scrape(c.dashboard)
    api = json.loads(urllib.request.urlopen(c.dashboard + "api/status", timeout=10).read())
    mt = {k[1][0][1]: v for k, v in m.items() if k[0] == "zres_tasks"}
    mt = {k: v for k, v in mt.items() if v}
    run = {k: v for k, v in m.items() if k[0] == "zres_running_tasks" and v}
    wt = {k: v for k, v in m.items() if k[0] in ("zres_waiting_tasks", "zres_infeasible_tasks") and v}
    cli = subprocess.run([sys.executable, "-m", "zres", "status", c.address, "--keys", c.keys], capture_output=True, text=True).stdout
    print(f"--- {tag}\n status {st['counts']} running={len(st['running'])} waiting={[(w.get('count'), w.get('reason')) for w in st['waiting']]}\n metrics {mt} {run} {wt}\n api {api.get('counts')} agents={m.get(('zres_agents', ()))} clients={m.get(('zres_clients', ()))}")
    print(cli)
def slow(s):
    time.sleep(s); return s
with zres.LocalCluster(agents=[{"CPU": 2}, {"CPU": 2}], nthreads=2, http="127.0.0.1:0", heartbeat_interval=0.2, heartbeat_timeout=1.5) as c:
    cl = zres.Client(c.address)
    fs = cl.map(slow, [3]*200, retries=1)
    time.sleep(2); show(c, cl, "load")
    c.agents["agent-1"].kill(); time.sleep(3); show(c, cl, "agent killed")
    c.restart_broker(); time.sleep(2); show(c, cl, "broker restarted")
    cl.cancel(fs); time.sleep(2); show(c, cl, "cancelled")
    time.sleep(4); show(c, cl, "later")
