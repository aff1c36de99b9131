"""Probe 8: an agent whose store's file system is full (a 40 MB tmpfs, root):
a big result made there, a value put there."""
import subprocess
import sys
import time

import zres


def make(n):
    return b"m" * n


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1}]) as c:
        b = subprocess.Popen([sys.executable, "-m", "zres", "agent", c.address, "--name",
                              "agent-b", "--state", "/tmp/hunt-small/b", "--keys", c.keys,
                              "--resources", "B=1", "--no-detect",
                              "--store-memory", str(100 << 30)],
                             stderr=open("/tmp/hunt-p8-agent.log", "w"))
        try:
            c.wait_for_agents(["agent-b"])
            cl = zres.Client(c.address)
            t0 = time.monotonic()
            try:
                r = cl.submit(make, 100 << 20, resources={"B": 1}).result(60)
                print("result: got", len(r))
            except Exception as exc:
                print(f"result: {type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}")
            t0 = time.monotonic()
            try:
                # agent-b has the most room in its store (100 GiB budget): puts go there
                f = cl.scatter(b"p" * (100 << 20))
                print("put: got", len(f.result(60)), "after", f"{time.monotonic()-t0:.1f}s")
            except Exception as exc:
                print(f"put: {type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}")
            cl.close()
        finally:
            b.terminate()
            b.wait()
