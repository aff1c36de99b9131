"""A job's agent SIGSTOPped past the heartbeat timeout, then SIGCONTed: what becomes of the
job (state, its process), with --retries 0 and 1; zres wait's answer."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait, job, alive  # noqa

d = tempfile.mkdtemp()
with zres.LocalCluster([{"CPU": 1}, {"CPU": 1}], names=["a0", "a1"]) as cluster, \
        zres.Client(cluster.address) as client:
    for retries in (0, 1):
        script = f'echo $$ $ZRES_AGENT >> {d}/pids-{retries}; while [ ! -e {d}/go-{retries} ]; do sleep 0.05; done; echo done'
        f = client.submit_command(script, shell=True, retries=retries)
        wait(lambda: os.path.exists(f"{d}/pids-{retries}"), 30)
        pid, agent = open(f"{d}/pids-{retries}").read().split()
        p = cluster.agents[agent]
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(5)
        j = job(client, f)
        print(f"retries={retries} while stopped:", j["state"], j.get("reason"), j.get("agent"))
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(3)
        print("   job process alive after SIGCONT:", alive(int(pid)))
        print("   runs:", open(f"{d}/pids-{retries}").read().split("\n"))
        open(f"{d}/go-{retries}", "w").close()
        try:
            r = f.result(30)
            print("   result:", r.exit_code, r.agent)
        except Exception as e:
            print("   result:", type(e).__name__, str(e)[:200])
        j = job(client, f)
        print("   final:", j["state"], j.get("reason"), j.get("agent"))
