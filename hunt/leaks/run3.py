import os, sys, time, gc
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe as P
import zres
from tests.conftest import wait_until

def big(n): return b"x" * n

with zres.LocalCluster([{"CPU": 2}, {"CPU": 2}], names=["a1", "a2"], heartbeat_timeout=1.5,
                       heartbeat_interval=0.1) as lc:
    c = zres.Client(lc.address, forward_output=False)
    def meas(label):
        gc.collect()
        print(label, "client", P.proc_info(os.getpid()), "broker", P.proc_info(lc.broker.pid),
              "a1", P.proc_info(lc.agents["a1"].pid), flush=True)
    for r in range(int(sys.argv[1])):
        fs = c.map(big, [100_000] * 10)
        c.gather(fs); del fs
        meas(f"r{r} before kill")
        lc.agents["a2"].kill(); lc.agents["a2"].wait()
        wait_until(lambda: all(a["name"] != "a2" for a in c.status()["agents"]), 30)
        lc.add_agent({"CPU": 2}, name="a2")
        if sys.argv[2:] == ["new"]:
            c.close(); c = zres.Client(lc.address, forward_output=False)
    meas("end")
