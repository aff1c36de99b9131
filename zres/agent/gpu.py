"""Discover this node's GPUs through NVML.

``discover()`` is what agents call. The real NVML path is the default; machines without
GPUs (tests, CI) may inject a fake device list by setting ``ZRES_TEST_FAKE_GPUS`` to a JSON
list such as ``[{"name": "Fake A100", "memory": 40e9}]``, which reaches agents started as
subprocesses. Any NVML failure (no library, no driver) means "no GPUs", never a crash.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..logs import get_logger

log = get_logger("zres.gpu")
FAKE_ENV = "ZRES_TEST_FAKE_GPUS"


@dataclass(slots=True, frozen=True)
class GpuDevice:
    """One device as a task should see it: ``id`` is what goes in CUDA_VISIBLE_DEVICES."""

    id: str
    name: str
    memory: int          # bytes
    uuid: str


def discover() -> list[GpuDevice]:
    """Return the GPUs this process may use, honouring its own CUDA_VISIBLE_DEVICES."""
    fake = os.environ.get(FAKE_ENV)
    devices = _fake(fake) if fake is not None else _nvml()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devices
    # The agent itself was confined (Slurm, a container): offer only those devices, and
    # hand tasks the same ids the agent was given, so nested visibility stays correct.
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    by_key = {d.id: d for d in devices} | {d.uuid: d for d in devices}
    return [GpuDevice(w, by_key[w].name, by_key[w].memory, by_key[w].uuid)
            for w in wanted if w in by_key]


def _fake(text: str) -> list[GpuDevice]:
    entries = json.loads(text)
    return [GpuDevice(str(i), str(e.get("name", "Fake GPU")), int(float(e.get("memory", 0))),
                      str(e.get("uuid", f"GPU-fake-{i}"))) for i, e in enumerate(entries)]


def _nvml() -> list[GpuDevice]:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no permission: no GPUs
        log.debug("nvml_unavailable", error=str(exc))
        return []
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            devices.append(GpuDevice(str(i), _text(name), int(memory), _text(uuid)))
        return devices
    except Exception as exc:
        log.warning("nvml_query_failed", error=str(exc))
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
