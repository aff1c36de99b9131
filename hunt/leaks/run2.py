import os, sys, time, signal, subprocess, gc, threading
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe as P
import zres
from zres.broker.server import Broker
from tests.conftest import wait_until

def add(a, b): return a + b
def big(n): return b"x" * n

def restart_broker():
    old = P.box["b"]; addr = old.address
    P.box["b"] = None
    P.box["t"].join()
    old.close()
    P.start_broker(addr)

def workers(agents):
    out = {}
    for n, p in agents.items():
        for pid, st in P.children(p.pid):
            out[f"{n}/{pid}"] = (P.proc_info(pid), st)
    return out

def main():
    b = P.start_broker()
    addr = b.address
    agents = {n: P.agent(n, addr) for n in ("a1", "a2")}
    c = zres.Client(addr, keys=P.KEYS, forward_output=False)
    wait_until(lambda: len(c.status()["agents"]) == 2, 60)
    base = P.snapshot(agents); prev = base
    for r in range(int(sys.argv[1])):
        t0 = time.time()
        # a long-lived client doing work with big results
        for _ in range(3):
            fs = c.map(big, [100_000] * 20)
            assert all(len(x) == 100_000 for x in c.gather(fs)); del fs
        # kill agent a2 and restart it under the same name
        agents["a2"].kill(); agents["a2"].wait()
        wait_until(lambda: all(a["name"] != "a2" for a in c.status()["agents"]), 30)
        agents["a2"] = P.agent("a2", addr)
        wait_until(lambda: any(a["name"] == "a2" for a in c.status()["agents"]), 60)
        # an agent with a fresh name each time (default HOST-PID), killed
        tmp = P.agent(f"tmp{r}", addr)
        wait_until(lambda: any(a["name"] == f"tmp{r}" for a in c.status()["agents"]), 60)
        tmp.kill(); tmp.wait()
        if r % 2 == 1:
            restart_broker()
            wait_until(lambda: len(c.status()["agents"]) >= 2, 60)
        fs = c.map(add, range(50), range(50)); c.gather(fs); del fs
        time.sleep(2); gc.collect()
        cur = P.snapshot(agents)
        P.diff(prev, cur, f"round {r} ({time.time()-t0:.1f}s)")
        print("   workers", workers(agents))
        prev = cur
    P.diff(base, prev, "TOTAL")
    c.close()
    P.stop.set()
    for p in agents.values(): p.terminate()
    for p in agents.values(): p.wait(10)

main()
