import os, sys, time, gc, subprocess, sqlite3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe as P
import zres
def add(a, b): return a + b
def big(n): return b"x" * n
with zres.LocalCluster([{"CPU": 2}, {"CPU": 2}], names=["a1", "a2"]) as lc:
    db = os.path.join(lc.state_dir, "state.sqlite3")
    def meas(label):
        gc.collect()
        wal = os.path.getsize(db + "-wal") // 1024 if os.path.exists(db + "-wal") else 0
        print(label, "me", P.proc_info(os.getpid()), "broker", P.proc_info(lc.broker.pid),
              "a1", P.proc_info(lc.agents["a1"].pid), "db", os.path.getsize(db)//1024, "wal", wal,
              "shm", len(os.listdir("/dev/shm")), flush=True)
    meas("start")
    for r in range(int(sys.argv[1])):
        for _ in range(10):
            with zres.Client(lc.address, forward_output=False) as c:
                c.gather(c.map(add, range(20), range(20)))
                c.submit(big, 100_000).result()
                s = c.scatter(b"y" * 100_000)
                c.submit(len, s).result()
                c.submit_command(["true"]).result()
        meas(f"r{r}")
