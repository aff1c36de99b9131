"""zres logs --follow of a job whose agent is SIGKILLed (not restarted): it must end
(the job lost), not follow for ever."""
import os, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa

with zres.LocalCluster([{"CPU": 1}]) as cluster, zres.Client(cluster.address) as client:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(ZRES_KEYS=cluster.keys, ZRES_BROKER=cluster.address,
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    f = client.submit_command("echo hi; sleep 100", shell=True)
    wait(f.running, 30)
    lf = subprocess.Popen([sys.executable, "-m", "zres", "logs", "--follow", str(f.id)], env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.5)
    t = time.monotonic()
    cluster.agents["agent-0"].kill()
    o, e = lf.communicate(timeout=60)
    print("follow ended after %.1f s rc %d" % (time.monotonic() - t, lf.returncode), repr(o), repr(e[-200:]))
    os.system("pkill -9 -f 'sleep 100' 2>/dev/null || true") if False else None
    j = [x for x in client.jobs(all=True) if x["id"] == f.id][0]
    print(j["state"], j["reason"])
