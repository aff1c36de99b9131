"""No-op task throughput, submit-to-result latency and actor calls on a local cluster.

    python bench/throughput.py [--tasks 10000] [--latency 1000] [--json out.json]

Cluster shape: a broker and two agents with two threads each, all on loopback.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import zres


def noop(x: int = 0) -> int:
    return x


def throughput_map(client: zres.Client, n: int) -> float:
    start = time.perf_counter()
    futures = client.map(noop, range(n))
    zres.wait(futures)
    elapsed = time.perf_counter() - start
    assert all(f.result() == i for i, f in enumerate(futures))
    return n / elapsed


def throughput_submit(client: zres.Client, n: int, **kwargs: object) -> float:
    start = time.perf_counter()
    futures = [client.submit(noop, i, **kwargs) for i in range(n)]
    zres.wait(futures)
    elapsed = time.perf_counter() - start
    assert all(f.result() == i for i, f in enumerate(futures))
    return n / elapsed


def latency(client: zres.Client, n: int) -> tuple[float, float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        client.submit(noop, i).result()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


def actor_calls(client: zres.Client, n: int) -> tuple[float, float, float]:
    """Return the median and p99 call round trip (ms) and pipelined calls per second."""
    counter = client.actor(Counter)
    counter.ready().result()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        counter.add(1).result()
        samples.append(time.perf_counter() - start)
    samples.sort()
    start = time.perf_counter()
    zres.wait([counter.add(1) for _ in range(n * 5)])
    rate = n * 5 / (time.perf_counter() - start)
    client.kill(counter)
    return statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--latency", type=int, default=1_000)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with zres.LocalCluster(agents=[{"slot": 2}, {"slot": 2}], nthreads=2) as cluster, \
            zres.Client(cluster.address) as client:
        throughput_map(client, 1000)  # warm up worker processes and caches
        figures = {
            "map_tasks_per_s": throughput_map(client, args.tasks),
            "submit_tasks_per_s": throughput_submit(client, args.tasks),
            "slot_tasks_per_s": throughput_submit(client, args.tasks, resources={"slot": 1}),
        }
        median, p99 = latency(client, args.latency)
        figures |= {"latency_median_ms": median, "latency_p99_ms": p99}
        median, p99, rate = actor_calls(client, args.latency)
        figures |= {"actor_call_median_ms": median, "actor_call_p99_ms": p99,
                    "actor_calls_per_s": rate}
    for name, value in figures.items():
        print(f"{name:>22}: {value:,.1f}" if value > 10 else f"{name:>22}: {value:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
