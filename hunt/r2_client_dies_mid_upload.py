"""Reproducer: a client killed (SIGKILL, or Ctrl-C) while it uploads a big argument leaves
the partial upload in the agent's memory tier (/dev/shm) for as long as the agent runs
(until 64 later uploads push it out)."""
import glob
import multiprocessing as mp
import os
import signal
import sys
import time

import zres

N = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 1 << 30


def size(v):
    return len(v)


def uploader(address, keys):
    os.environ["ZRES_KEYS"] = keys
    cl = zres.Client(address)
    v = b"\x05" * N
    print("uploading", flush=True)
    cl.submit(size, v).result()


def parts(c):
    where = open(os.path.join(c.state_dir, "agent-agent-0", "object-store")).read()
    return [(os.path.basename(f), os.path.getsize(f), os.stat(f).st_blocks * 512)
            for f in glob.glob(where + "/*")]


if __name__ == "__main__":
    os.environ["ZRES_LOCAL_READS"] = "never"
    with zres.LocalCluster([{"CPU": 1}]) as c:
        p = mp.Process(target=uploader, args=(c.address, c.keys))
        p.start()
        deadline = time.monotonic() + 60
        while not any(".part" in f[0] and f[2] > N // 4 for f in parts(c)):
            assert time.monotonic() < deadline, "no upload seen"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        print("client killed mid-upload:", parts(c), flush=True)
        t0 = time.monotonic()
        for wait in (5, 30, 75):
            time.sleep(max(0.0, t0 + wait - time.monotonic()))
            print(f"after {wait}s:", parts(c), "broker tasks:",
                  c.status().get("tasks", c.status().get("counts")), flush=True)
