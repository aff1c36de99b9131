"""On a machine with NVIDIA GPUs: an agent detects them through the real NVML path, and tasks
and a command job run real CUDA work on the devices they were granted.

    python bench/gpu_smoke.py [--json out.json]

Starts a broker and one agent that detects this machine (no --resources, so NVML is asked),
then runs: a task asking GPU=1 that opens CUDA (PyTorch if installed, else nvidia-smi) and
says what it sees; two tasks asking GPU=0.5 each (they pack onto one device); a task asking
no GPU (it must see none); and a command job asking GPU=1 running ``nvidia-smi -L``. Prints
what the agent offered and, for each, CUDA_VISIBLE_DEVICES, the granted ids and the device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import zres


def cuda_view(hold: float = 0.0) -> dict[str, Any]:
    """What this task sees of CUDA: its visible devices, the granted ids, the device name."""
    import time
    ctx = zres.get_task_context()
    seen: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "gpu_ids": ctx.gpu_ids, "granted": ctx.resources,
                            "agent": ctx.agent, "pid": os.getpid()}
    try:
        import torch
        seen["torch_device_count"] = torch.cuda.device_count()
        if torch.cuda.device_count():
            x = torch.ones(1024, 1024, device="cuda")
            seen["torch_device"] = torch.cuda.get_device_name(0)
            seen["torch_sum"] = float((x @ x).sum())
    except ImportError:
        try:
            seen["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                text=True).stdout.strip()
        except FileNotFoundError:  # (a fake device list: ZRES_TEST_FAKE_GPUS)
            seen["nvidia_smi"] = "not installed"
    seen["start"] = time.time()
    time.sleep(hold)
    seen["end"] = time.time()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with zres.LocalCluster(names=["gpu-node"]) as cluster:  # (its one agent detects)
        with zres.Client(cluster.address) as client:
            agent = client.status()["agents"][0]
            report["offered"] = [{"total": s["total"], "gpus": s["gpus"]} for s in agent["slots"]]
            whole = client.submit(cuda_view, resources={"GPU": 1})
            halves = [client.submit(cuda_view, 2.0, resources={"GPU": 0.5}) for _ in range(2)]
            none = client.submit(cuda_view, resources={"GPU": 0})
            job = client.submit_command(
                ["sh", "-c", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; nvidia-smi -L "
                 "|| true"],
                resources={"GPU": 1})
            report["GPU=1"] = whole.result(120)
            report["GPU=0.5 x2"] = [f.result(120) for f in halves]
            a, b = report["GPU=0.5 x2"]
            report["halves overlapped"] = a["start"] < b["end"] and b["start"] < a["end"]
            report["GPU=0"] = none.result(120)
            result = job.result(120)
            report["job"] = {"exit_code": result.exit_code}
            report["job log"] = subprocess.run(
                [sys.executable, "-m", "zres", "logs", str(client.job_ids([job])[0]),
                 "--broker", cluster.address], capture_output=True, text=True,
                env={**os.environ, "ZRES_KEYS": str(cluster.keys)}).stdout.strip()
    print(json.dumps(report, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
