"""What a task of its own process costs: tasks asking MEMORY (each in a process started for
it and stopped after it, limited to what it asked: README's *Limits*) against the same tasks
asking none (run by the slot's pooled process), on a local cluster of one agent.

    python bench/limits.py [--tasks N] [--modes auto,watcher]

For each enforcement mode: the median and p90 of N sequential submit-then-result calls, and
the time for N submitted at once (the agent offers CPU=2: two run at a time), with and
without MEMORY=200MB. The difference is what one process per task costs here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import zres


def noop() -> int:
    return 1


def measure(client: zres.Client, count: int, resources: dict[str, float]) -> dict[str, float]:
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        client.submit(noop, resources=resources).result(60)
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    start = time.perf_counter()
    zres.wait(client.map(noop, range(count), resources=resources), timeout=600)
    batch = time.perf_counter() - start
    return {"median_ms": 1000 * statistics.median(latencies),
            "p90_ms": 1000 * latencies[int(0.9 * (len(latencies) - 1))],
            "batch_s": batch, "per_task_ms": 1000 * batch / count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--modes", default="auto,watcher")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        with zres.LocalCluster(agents=[{"CPU": 2, "MEMORY": 4e9}], nthreads=2,
                               env={"ZRES_AGENT__MEMORY_LIMITS": mode}) as cluster, \
                zres.Client(cluster.address) as client:
            limits = client.status()["agents"][0]  # (its mode, once it has beaten)
            zres.wait(client.map(noop, range(20)), timeout=60)  # (warm: a worker is up)
            plain = measure(client, args.tasks, {})
            own = measure(client, args.tasks, {"MEMORY": 200e6})
            limits = client.status()["agents"][0].get("memory", {}).get("limits", mode)
            print(f"mode {limits}: {args.tasks} tasks")
            for label, row in (("pooled (no MEMORY)", plain), ("own process (MEMORY)", own)):
                print(f"  {label:<22} sequential median {row['median_ms']:7.1f} ms  p90 "
                      f"{row['p90_ms']:7.1f} ms   {args.tasks} at once {row['batch_s']:6.2f} s "
                      f"({row['per_task_ms']:.1f} ms a task)")
            print(f"  a process of its own costs {own['median_ms'] - plain['median_ms']:.0f} ms "
                  "a task, sequentially")


if __name__ == "__main__":
    main()
