"""How zres scales with the number of tasks queued at once (issue 28).

    python bench/scale.py [--sizes 10000,100000,1000000] [--chains 100000] [--json PATH]

Every run starts a fresh local cluster with the defaults a user gets (keys on, a state
directory) and one agent of two threads, all on loopback, and submits no-op tasks with
``map``:

- ``at once``: N tasks submitted while the agent is there, all gathered: the time per
  task (submit to the last result), the broker's longest loop turn.
- ``queued``: N tasks submitted before any agent joins, so that all of them wait at the
  broker: its resident memory per queued task, the client's per future, the time to hand
  them all over (until the broker has kept the last) and the longest loop turn meanwhile,
  how long another client's status and a why take with all of them queued; then an agent
  joins and runs them: the time per task from its joining, and the longest
  loop turn over the whole run.
- ``chains``: N tasks in chains of 10, each task taking the result of the one before.

The longest loop turn is what any other user's message may have waited behind: the
broker's own measure of its busiest turn (``status()["loop"]``), in wall time and in the
loop's own CPU time (on a loaded machine a turn waits for a CPU far longer than it works).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from typing import Any

import zres


def noop(x: int = 0) -> int:
    return x


def step(previous: int, x: int) -> int:
    return previous + x


def rss(pid: int | None = None) -> int:
    """Resident bytes of process PID (default: this one)."""
    with open(f"/proc/{pid or 'self'}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def kept_everything(client: zres.Client, timeout: float = 3600.0) -> float:
    """Wait until the broker has kept every task CLIENT sent; return when (monotonic)."""
    io = client._io
    deadline = time.monotonic() + timeout
    while io.outbox or io.unacked:
        if time.monotonic() > deadline:
            raise TimeoutError("the broker did not keep every task in time")
        time.sleep(0.01)
    return time.monotonic()


def loop(client: zres.Client) -> dict[str, Any]:
    return dict(client.status(timeout=120)["loop"])


def at_once(n: int) -> dict[str, Any]:
    with zres.LocalCluster(agents=[{}], nthreads=2) as cluster, \
            zres.Client(cluster.address) as client:
        start = time.perf_counter()
        futures = client.map(noop, range(n))
        zres.wait(futures)
        elapsed = time.perf_counter() - start
        assert futures[-1].result() == n - 1
        del futures
        gc.collect()
        turns = loop(client)
    return {"tasks": n, "seconds": round(elapsed, 2), "us_per_task": round(elapsed / n * 1e6, 1),
            "longest_turn_ms": round(turns["longest_turn"] * 1e3, 1),
            "longest_turn_cpu_ms": round(turns.get("longest_turn_cpu", 0.0) * 1e3, 1),
            "turns": turns["turns"]}


def queued(n: int) -> dict[str, Any]:
    with zres.LocalCluster(agents=[], nthreads=2) as cluster, \
            zres.Client(cluster.address) as client:
        assert cluster.broker is not None
        broker_idle, client_idle = rss(cluster.broker.pid), rss()
        start = time.perf_counter()
        futures = client.map(noop, range(n))
        submitted = time.perf_counter()
        kept = kept_everything(client)
        ingest = time.perf_counter() - start
        time.sleep(1.0)  # (the broker's last turn of them, and its allocator, settle)
        broker_queued, client_queued = rss(cluster.broker.pid), rss()
        arrived = loop(client)  # (the longest turns while they arrived)
        # What another user waits for a status and a why while all of them are queued.
        with zres.Client(cluster.address) as other:
            asked = []
            for _ in range(5):
                began = time.perf_counter()
                other.status(timeout=120)
                asked.append(time.perf_counter() - began)
        began = time.perf_counter()
        client.why(futures[-1], timeout=120)
        why = time.perf_counter() - began
        joined = time.perf_counter()
        cluster.add_agent({}, name="agent-0")
        zres.wait(futures)
        ran = time.perf_counter() - joined
        assert futures[-1].result() == n - 1
        del futures
        gc.collect()
        turns = loop(client)
    del kept
    return {"tasks": n, "map_seconds": round(submitted - start, 2),
            "ingest_seconds": round(ingest, 2),
            "broker_bytes_per_task": round((broker_queued - broker_idle) / n),
            "client_bytes_per_future": round((client_queued - client_idle) / n),
            "status_ms": [round(a * 1e3, 1) for a in asked], "why_ms": round(why * 1e3, 1),
            "ingest_longest_turn_ms": round(arrived["longest_turn"] * 1e3, 1),
            "ingest_longest_turn_cpu_ms": round(arrived.get("longest_turn_cpu", 0.0) * 1e3, 1),
            "run_seconds": round(ran, 2), "us_per_task": round(ran / n * 1e6, 1),
            "longest_turn_ms": round(turns["longest_turn"] * 1e3, 1),
            "longest_turn_cpu_ms": round(turns.get("longest_turn_cpu", 0.0) * 1e3, 1),
            "turns": turns["turns"]}


def chains(n: int, length: int = 10) -> dict[str, Any]:
    with zres.LocalCluster(agents=[{}], nthreads=2) as cluster, \
            zres.Client(cluster.address) as client:
        start = time.perf_counter()
        heads = client.map(noop, range(n // length))
        lasts = heads
        for _ in range(length - 1):
            lasts = client.map(step, lasts, range(len(lasts)))
        zres.wait(lasts)
        elapsed = time.perf_counter() - start
        total = (n // length) * length
        del heads, lasts
        gc.collect()
        turns = loop(client)
    return {"tasks": total, "seconds": round(elapsed, 2),
            "us_per_task": round(elapsed / total * 1e6, 1),
            "longest_turn_ms": round(turns["longest_turn"] * 1e3, 1),
            "longest_turn_cpu_ms": round(turns.get("longest_turn_cpu", 0.0) * 1e3, 1),
            "turns": turns["turns"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="numbers of no-op tasks, comma-separated")
    parser.add_argument("--chains", type=int, default=100_000,
                        help="tasks in chains of 10 (0: none)")
    parser.add_argument("--modes", default="at-once,queued",
                        help="at-once, queued or both (comma-separated)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    modes = args.modes.split(",")
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(),
                                           "python": platform.python_version()},
                               "zres": zres.__version__, "at_once": [], "queued": [],
                               "chains": []}
    for n in sizes:
        if "at-once" in modes:
            row = at_once(n)
            results["at_once"].append(row)
            print(f"at once {n:>9,}: {row['us_per_task']:8.1f} us/task "
                  f"({row['seconds']} s), longest turn {row['longest_turn_ms']} ms "
                  f"({row['longest_turn_cpu_ms']} ms CPU)", flush=True)
        if "queued" in modes:
            row = queued(n)
            results["queued"].append(row)
            print(f"queued  {n:>9,}: broker {row['broker_bytes_per_task']:,} B/task, client "
                  f"{row['client_bytes_per_future']:,} B/future, kept in "
                  f"{row['ingest_seconds']} s (longest turn {row['ingest_longest_turn_ms']} "
                  f"ms, {row['ingest_longest_turn_cpu_ms']} ms CPU); ran "
                  f"{row['us_per_task']:.1f} us/task, longest turn {row['longest_turn_ms']} "
                  f"ms ({row['longest_turn_cpu_ms']} ms CPU); with all queued, another "
                  f"client's status {min(row['status_ms'])}-{max(row['status_ms'])} ms, a why "
                  f"{row['why_ms']} ms", flush=True)
    if args.chains:
        row = chains(args.chains)
        results["chains"].append(row)
        print(f"chains  {row['tasks']:>9,}: {row['us_per_task']:8.1f} us/task "
              f"({row['seconds']} s), longest turn {row['longest_turn_ms']} ms "
                  f"({row['longest_turn_cpu_ms']} ms CPU)", flush=True)
    if results["at_once"] and len(results["at_once"]) > 1:
        first, last = results["at_once"][0], results["at_once"][-1]
        ratio = last["us_per_task"] / first["us_per_task"]
        print(f"time per task at {last['tasks']:,} is {ratio:.2f}x that at {first['tasks']:,}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
