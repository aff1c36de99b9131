"""Reproducer: a dependent whose input cannot be fetched into its agent's store (that
store's file system is full) is granted again and again, uncharged, for ever: its future
never resolves, and the agent spins.  Needs root (a 40 MB tmpfs):
    mkdir -p /tmp/hunt-small && mount -t tmpfs -o size=40m tmpfs /tmp/hunt-small"""
import os
import subprocess
import sys
import time

import zres


def make(n):
    return b"m" * n


def size(v):
    return len(v)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1}]) as c:
        # agent-b's memory tier in its state directory (a budget /dev/shm has no room for),
        # on a file system of 40 MB
        b = subprocess.Popen([sys.executable, "-m", "zres", "agent", c.address, "--name",
                              "agent-b", "--state", "/tmp/hunt-small/b", "--keys", c.keys,
                              "--resources", "B=1", "--no-detect",
                              "--store-memory", str(100 << 30)],
                             stderr=open("/tmp/hunt-r3-agent.log", "w"))
        try:
            c.wait_for_agents(["agent-b"])
            cl = zres.Client(c.address)
            f = cl.submit(make, 100 << 20, resources={"A": 1})
            f.result(60)
            d = cl.submit(size, f, resources={"B": 1})
            t0 = time.monotonic()
            try:
                print("got", d.result(timeout=20), f"after {time.monotonic()-t0:.1f}s")
            except Exception as exc:
                print(f"{type(exc).__name__} after {time.monotonic()-t0:.1f}s: {str(exc)[:300]}")
            print("agent-b cpu seconds:", sum(os.times()[:0]) or
                  open(f"/proc/{b.pid}/stat").read().split()[13:15])
            print(os.listdir("/tmp/hunt-small/b"), subprocess.run(["df", "-h", "/tmp/hunt-small"],
                  capture_output=True, text=True).stdout)
            cl.close()
        finally:
            b.terminate()
            b.wait()
