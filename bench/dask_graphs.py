"""Dask collections on zres against Dask distributed, on the same cluster shape, in one run.

    /work/venv-peers/bin/python bench/dask_graphs.py [--quick] [--json out.json]

The cluster is compare.py's: a scheduler process and two worker nodes each running two
tasks at once, on 127.0.0.1, started afresh (zres: ``LocalCluster`` with two agents;
Dask: ``dask scheduler`` and two ``dask worker --nthreads 2``). Workloads, graph
optimisation on (Dask's default):

1. array: ``(sin(x) * 2).sum()`` of a 1,024-chunk random array (8,000 x 8,000 in blocks of
   250 x 250; quick: 256 chunks), computed with ``scheduler=client.get`` on zres and the
   distributed client on Dask;
2. delayed: 5,000 ``inc`` tasks summed by a binary tree of ``add`` tasks: 9,999 tasks
   (quick: 2,000 and 3,999).

Each runs ``--repeats`` times (default 3) after one warm-up; the best time is kept and every
sample is in the JSON. Both systems must give the same answer.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import DaskBackend, ZresBackend  # noqa: E402


def inc(x: int) -> int:
    return x + 1


def array_workload(chunks_per_side: int) -> Any:
    import dask.array as da
    import numpy as np

    x = da.random.default_rng(42).random((250 * chunks_per_side,) * 2, chunks=(250, 250))
    return (da.map_blocks(np.sin, x) * 2).sum()


def delayed_workload(leaves: int) -> Any:
    import dask

    layer = [dask.delayed(inc)(i) for i in range(leaves)]
    while len(layer) > 1:
        pairs = [dask.delayed(operator.add)(a, b) for a, b in zip(layer[::2], layer[1::2])]
        layer = pairs + ([layer[-1]] if len(layer) % 2 else [])
    return layer[0]


def timed(make: Callable[[], Any], run: Callable[[Any], Any], settle: Callable[[], None],
          repeats: int) -> tuple[float, list[float], Any]:
    """Run a fresh collection from MAKE (not timed) REPEATS times, after a warm-up (workers
    import numpy and dask); SETTLE waits until the cluster holds nothing of the last run
    (Dask's scheduler would hand back a result it still holds under the same key)."""
    run(make())
    settle()
    samples, answer = [], None
    for _ in range(repeats):
        collection = make()
        start = time.perf_counter()
        answer = run(collection)
        samples.append(time.perf_counter() - start)
        settle()
    return min(samples), samples, answer


def held_by_dask_scheduler(backend: Any) -> Callable[[], None]:
    def settle() -> None:
        deadline = time.monotonic() + 30
        while backend.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
            if time.monotonic() > deadline:
                raise RuntimeError("the Dask scheduler still holds tasks after 30 s")
            time.sleep(0.01)
    return settle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    side, leaves = (16, 2000) if args.quick else (32, 5000)
    workloads = {f"array reduction, {side * side} chunks": lambda: array_workload(side),
                 f"delayed graph, {2 * leaves - 1} tasks": lambda: delayed_workload(leaves)}
    results: dict[str, dict[str, Any]] = {}
    for system, backend in (("zres", ZresBackend()), ("dask", DaskBackend())):
        backend.start()
        try:
            for label, make in workloads.items():
                if system == "zres":
                    def run(c: Any, b: Any = backend) -> Any:
                        return c.compute(scheduler=b.client.get)

                    def settle() -> None:
                        pass  # (a compute holds nothing once it has returned)
                else:
                    def run(c: Any, b: Any = backend) -> Any:
                        return b.client.compute(c).result()

                    settle = held_by_dask_scheduler(backend)
                best, samples, answer = timed(make, run, settle, args.repeats)
                results.setdefault(label, {})[system] = {"best_s": best, "samples": samples,
                                                         "answer": float(answer)}
                print(f"{system:5} {label:32} {best:8.3f} s", flush=True)
        finally:
            backend.close()
    print(f"\n{'workload':34} {'zres (s)':>9} {'dask (s)':>9} {'dask/zres':>10}")
    for label, by in results.items():
        zres_s, dask_s = by["zres"]["best_s"], by["dask"]["best_s"]
        assert abs(by["zres"]["answer"] - by["dask"]["answer"]) <= 1e-6 * abs(
            by["dask"]["answer"]), f"{label}: the answers differ"
        print(f"{label:34} {zres_s:9.3f} {dask_s:9.3f} {dask_s / zres_s:9.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
