"""``zres demo``: the README's example on a local cluster shaped like a small lab."""

from __future__ import annotations

import time
from typing import Any

from .client.client import Client
from .core.context import get_task_context
from .local import LocalCluster


def load(n: int) -> dict[str, Any]:
    """Pretend to read input N."""
    time.sleep(0.05)
    return {"input": n, "values": list(range(n, n + 10)), "where": _where()}


def process(data: dict[str, Any]) -> dict[str, Any]:
    """Pretend to run a model on a GPU: the granted device is in CUDA_VISIBLE_DEVICES."""
    time.sleep(0.1)
    return {"input": data["input"], "total": sum(v * v for v in data["values"]),
            "where": _where()}


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine every processed input on the big-memory node."""
    print(f"combining {len(results)} results")  # (printed by the client, prefixed)
    return {"inputs": len(results), "total": sum(r["total"] for r in results),
            "where": _where()}


def _where() -> str:
    ctx = get_task_context()
    gpus = f" GPU {','.join(ctx.gpu_ids)}" if ctx.gpu_ids else ""
    return f"{ctx.agent}{gpus}"


def run(inputs: int = 20) -> int:
    """Start the cluster, run load -> process -> aggregate, print where each step ran."""
    print("starting a local cluster: gpu-a (GPU=2), gpu-b (GPU=2), bigmem (MEMORY=100e9)")
    started = time.perf_counter()
    with LocalCluster(agents=[{"GPU": 2}, {"GPU": 2}, {"MEMORY": 100e9}], nthreads=4,
                      names=["gpu-a", "gpu-b", "bigmem"]) as cluster, \
            Client(cluster.address) as client:
        print(f"cluster up at {cluster.address} in {time.perf_counter() - started:.2f}s\n")
        data = [client.submit(load, n) for n in range(inputs)]
        processed = [client.submit(process, d, resources={"GPU": 1}) for d in data]
        final = client.submit(aggregate, processed, resources={"MEMORY": 70e9})
        result = final.result(timeout=120)
        for d, p in zip(data, processed):
            loaded, done = d.result(), p.result()
            print(f"input {loaded['input']:2d}: load on {loaded['where']:<8}  "
                  f"process on {done['where']}")
        print(f"\naggregate on {result['where']}: {result['inputs']} inputs, "
              f"total {result['total']}")
    print(f"done in {time.perf_counter() - started:.2f}s")
    return 0
