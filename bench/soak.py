"""Run many tasks in a row and watch the cluster's memory: it must not grow without bound.

    python bench/soak.py [--tasks 100000] [--batch 2000]

Submits BATCH no-op tasks at a time, gathers them, drops the futures, and every tenth of
the run prints the resident memory of the broker, each agent and this client, plus the
number of task records the broker still holds.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import zres


def noop(x: int) -> int:
    return x


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2_000)
    args = parser.parse_args()
    with zres.LocalCluster(agents=[{"slot": 2}, {"slot": 2}], nthreads=2) as cluster, \
            zres.Client(cluster.address) as client:
        pids = {"broker": cluster.broker.pid,  # type: ignore[union-attr]
                **{name: proc.pid for name, proc in cluster.agents.items()},
                "client": os.getpid()}
        print(f"{'tasks':>8} {'seconds':>8} " + " ".join(f"{n + ' MiB':>14}" for n in pids)
              + f" {'broker records':>15}")
        started, done, step = time.perf_counter(), 0, max(args.tasks // 10, args.batch)
        next_report = 0
        while done < args.tasks:
            futures = client.map(noop, range(args.batch))
            assert sum(client.gather(futures)) == args.batch * (args.batch - 1) // 2
            del futures
            gc.collect()
            done += args.batch
            if done >= next_report:
                next_report += step
                records = sum(client.status()["counts"].values())
                print(f"{done:>8} {time.perf_counter() - started:>8.1f} "
                      + " ".join(f"{rss_mib(pid):>14.1f}" for pid in pids.values())
                      + f" {records:>15}")


if __name__ == "__main__":
    main()
