"""Dask computes under faults: a worker dies (the retries annotation), the broker is
SIGKILLed mid-compute and started again on its state (the compute carries on)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import dask
import numpy as np
import pytest

import zres
from tests.conftest import LOSS, stop_process, wait_until
from tests.tasks import wait_for_file

pytestmark = pytest.mark.timeout(120)


def exit_on_first_attempt(marker: str, value: int) -> int:
    """Kill the worker process the first time; return VALUE afterwards."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return value
    os._exit(3)


def test_a_task_lost_running_runs_again_as_dask_allowed_failures_says(make_cluster,
                                                                       make_client, tmp_path):
    """Dask distributed reschedules a task whose worker died under it, up to its
    allowed-failures (3), before it fails it with KilledWorker: so does a compute on zres,
    unless the task's retries annotation says how many times (0: its body begins at most
    once)."""
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    unannotated = [dask.delayed(exit_on_first_attempt)(str(tmp_path / "plain"), 5)]
    assert dask.delayed(sum)(unannotated).compute(scheduler=client.get) == 5

    with dask.annotate(retries=1):
        parts = [dask.delayed(exit_on_first_attempt)(str(tmp_path / "once"), 5)]
    assert dask.delayed(sum)(parts).compute(scheduler=client.get) == 5

    with dask.annotate(retries=0):
        at_most_once = [dask.delayed(exit_on_first_attempt)(str(tmp_path / "never"), 5)]
    with pytest.raises(zres.WorkerLostError):
        dask.delayed(sum)(at_most_once).compute(scheduler=client.get)

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        configured = [dask.delayed(exit_on_first_attempt)(str(tmp_path / "configured"), 5)]
        with pytest.raises(zres.WorkerLostError):
            dask.delayed(sum)(configured).compute(scheduler=client.get)
    with dask.config.set({"distributed.scheduler.allowed-failures": -1}):
        with pytest.raises(ValueError, match="allowed-failures must be a whole number"):
            dask.delayed(sum)([dask.delayed(noted)(str(tmp_path / "unbegun"), "k", 1)]
                              ).compute(scheduler=client.get)
    assert not os.path.exists(tmp_path / "unbegun")  # (refused before anything ran)


def big_part(ledger: str) -> bytes:
    """Over 64 KiB: kept on the agent that made it, not sent to the broker."""
    with open(ledger, "a") as fh:
        fh.write("made\n")
    return bytes(range(256)) * 1024


def combined(part: bytes, other: int) -> int:
    return len(part) + other


def test_an_intermediate_lost_with_its_agent_is_made_again_as_dask_does(
        make_cluster, make_client, tmp_path):
    """Dask's tasks are pure by contract, and Dask distributed computes a lost intermediate
    again: so does a compute on zres, with no retries annotation (the user cannot pass
    recompute=True to a Dask task; it failed with ResultLostError, telling them to)."""
    cluster = make_cluster(agents=[{"a": 1}], names=["agent-a"], **LOSS)
    client = make_client(cluster.address)
    ledger = str(tmp_path / "ledger")
    with dask.annotate(resources={"a": 1}):
        part = dask.delayed(big_part)(ledger)
    with dask.annotate(resources={"c": 1}):  # (no agent offers c yet: it waits)
        total = dask.delayed(combined)(part, dask.delayed(len)("xy"))
    future = client.compute(total)
    wait_until(lambda: os.path.exists(ledger), message="the intermediate to begin")
    # (made, and known to be: killed while it still ran, it would be lost running, which
    # no recompute covers)
    wait_until(lambda: (counts := client.status()["counts"]).get("finished", 0) >= 1
               and not counts.get("running"), message="the intermediate to be made")
    os.kill(cluster.agents["agent-a"].pid, 9)
    wait_until(lambda: "agent-a" not in [a["name"] for a in client.status()["agents"]],
               message="agent-a to be declared lost")
    cluster.add_agent({"a": 1, "c": 1}, name="agent-c")
    assert future.result(60) == 256 * 1024 + 2
    assert open(ledger).read() == "made\nmade\n"


def noted(ledger: str, key: str, value: object, gate: str | None = None) -> object:
    with open(ledger, "a") as fh:
        fh.write(f"{key}\n")
    if gate is not None:
        wait_for_file(gate, timeout=60)
    return value


def test_a_compute_lives_through_a_broker_kill(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"CPU": 2}], nthreads=2)
    client = make_client(cluster.address)
    ledger, gate = str(tmp_path / "ledger"), str(tmp_path / "gate")
    # big is large (its result is not kept over a restart: were it needed after, it would
    # be computed again), total reads it and is small, slow runs through the kill, out
    # waits for total and slow.
    graph = {"big": (noted, ledger, "a", np.ones(100_000)),
             "total": (lambda v: float(v.sum()), "big"),
             "slow": (noted, ledger, "c", 2.0, gate),
             "out": (lambda b, c: b + c, "total", "slow")}
    answer: list[object] = []
    run = threading.Thread(target=lambda: answer.append(client.get(graph, ["out", "total"])))
    run.start()
    wait_until(lambda: Path(ledger).exists() and "c" in Path(ledger).read_text().split(),
               message="c to run")
    wait_until(lambda: client.status()["counts"] == {"finished": 1, "running": 1, "waiting": 1},
               message="big released, total done, slow running and out waiting")
    cluster.restart_broker()
    Path(gate).touch()
    run.join(60)
    assert answer == [[100_002.0, 100_000.0]]
    assert sorted(Path(ledger).read_text().split()) == ["a", "c"], "something ran twice"
    seen: dict[str, object] = {}

    def nothing_held() -> bool:
        seen.update(client.status())
        return not any(seen["counts"].values())  # type: ignore[attr-defined]

    try:
        wait_until(nothing_held, message="nothing kept once the compute returned")
    except AssertionError:
        raise AssertionError(f"still held: {seen['counts']}, {seen['waiting']}") from None


def inc(x: int) -> int:
    return x + 1


def test_a_compute_whose_broker_dies_before_keeping_it_is_sent_again_and_let_go(
        make_cluster, make_client):
    """compute() lets go of its intermediates at once. Sent to a broker that never reads
    them (SIGSTOPped, then SIGKILLed), the submits go again to the restarted broker, and
    so must the releases: without them the intermediates were held until the client
    left."""

    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    stop_process(cluster.broker.pid)
    total = client.compute(dask.delayed(sum)([dask.delayed(inc)(i) for i in range(5)]))
    cluster.restart_broker()
    assert total.result(60) == 15
    del total
    wait_until(lambda: not any(client.status()["counts"].values()),
               message="nothing held once the output is dropped")
