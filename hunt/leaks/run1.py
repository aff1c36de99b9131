import os, sys, time, signal, subprocess, gc
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe as P
import zres
from tests.conftest import wait_until

def big(n): return b"x" * n
def add(a, b): return a + b
def slow(t):
    import time; time.sleep(t); return t

class Counter:
    def __init__(self): self.n = 0
    def inc(self): self.n += 1; return self.n

KILLED = r'''
import sys, zres, time
c = zres.Client(sys.argv[1], keys=sys.argv[2])
fs = [c.submit(pow, 2, i) for i in range(3)]
c.gather(fs)
f = c.submit(time.sleep, 30)
print("ready", flush=True)
time.sleep(60)
'''

def short_client(addr):
    with zres.Client(addr, keys=P.KEYS, forward_output=False) as c:
        fs = c.map(add, range(5), range(5))
        assert c.gather(fs) == [2 * i for i in range(5)]
        r = c.submit(big, 100_000)
        assert len(r.result(30)) == 100_000
        s = c.scatter(b"y" * 200_000)
        assert c.submit(len, s).result(30) == 200_000
        c.submit(slow, 5)  # left pending on close
        f = c.submit(slow, 10)
        wait_until(f.running, 20)
        c.cancel([f], force=True)
        a = c.actor(Counter)
        assert a.inc().result(30) == 1
        c.kill(a)
        j = c.submit_command(["true"])
        j.result(30)

def killed_client(addr):
    p = subprocess.Popen([sys.executable, "-c", KILLED, addr, P.KEYS], stdout=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"ready")
    p.kill(); p.wait(); p.stdout.close()

def main():
    b = P.start_broker()
    addr = b.address
    agents = {n: P.agent(n, addr) for n in ("a1", "a2")}
    with zres.Client(addr, keys=P.KEYS) as c:
        wait_until(lambda: len(c.status()["agents"]) == 2, 60)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    short_client(addr); killed_client(addr)
    time.sleep(3)
    base = P.snapshot(agents)
    prev = base
    for r in range(rounds):
        t0 = time.time()
        for _ in range(per):
            short_client(addr)
        killed_client(addr)
        time.sleep(4)  # let grace expire
        gc.collect()
        cur = P.snapshot(agents)
        P.diff(prev, cur, f"round {r} ({time.time()-t0:.1f}s)")
        prev = cur
    P.diff(base, prev, "TOTAL")
    with P.lock:
        b2 = P.box["b"]
        print("clients", len(b2.clients), "tasks", len(b2.graph.tasks))
    P.stop.set()
    for p in agents.values(): p.terminate()
    for p in agents.values(): p.wait(10)

main()
