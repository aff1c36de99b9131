"""Helpers shared by the hunt probes (not tests)."""
import os
import time

import psutil  # noqa


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            d = dict(l.split(":", 1) for l in fh)
        return int(d["VmRSS"].split()[0]) >> 10, int(d["VmHWM"].split()[0]) >> 10
    except FileNotFoundError:
        return (0, 0)


def tree(pid):
    p = psutil.Process(pid)
    return [p] + p.children(recursive=True)


def report(cluster, label=""):
    out = [f"broker rss/hwm MB={rss(cluster.broker.pid)}"]
    for name, proc in cluster.agents.items():
        for p in tree(proc.pid):
            out.append(f"{name}:{p.pid}:{p.name()[:12]} rss/hwm={rss(p.pid)}")
    out.append(f"self rss/hwm={rss(os.getpid())}")
    print(label, " | ".join(out), flush=True)


class T:
    def __init__(self, label):
        self.label = label
    def __enter__(self):
        self.t = time.monotonic()
        return self
    def __exit__(self, *a):
        self.dt = time.monotonic() - self.t
        print(f"{self.label}: {self.dt:.2f}s", flush=True)
