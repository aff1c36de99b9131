"""Dask collections on a real cluster: annotations honoured with graph optimisation on.

One agent offers GPU=1 by declaration, the other none. Task bodies write where they ran
(agent, granted GPU) to a ledger file, one JSON line each, so the tests read what happened
rather than guess it.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import zres
import zres.dask
from tests.conftest import wait_until
from tests.tasks import hold, wait_for_file

pytestmark = pytest.mark.timeout(120)


def record(ledger: str, what: str, **extra: object) -> None:
    """Append where the calling task runs (nothing outside a task: Dask's meta inference)."""
    try:
        ctx = zres.get_task_context()
    except zres.ZresError:
        return
    line = json.dumps({"what": what, "agent": ctx.agent,
                       "gpu": ctx.resources.get("GPU", 0), **extra})
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read(ledger: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] \
        if ledger.exists() else []


def func1(block: np.ndarray, ledger: str) -> np.ndarray:
    record(ledger, "func1")
    return block + 1


def func2(block: np.ndarray, ledger: str) -> np.ndarray:
    record(ledger, "func2")
    return block * 2


@pytest.fixture(scope="module")
def cluster():
    with zres.LocalCluster(agents=[{"GPU": 1, "CPU": 2}, {"CPU": 2}], names=["gpu-a", "cpu-b"],
                           nthreads=2, heartbeat_interval=0.2) as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster):
    with zres.Client(cluster.address) as connected:
        yield connected


def test_annotated_blocks_run_on_the_gpu_agent_with_optimisation_on(client, tmp_path):
    ledger = tmp_path / "ledger"
    x = da.random.random((400, 400), chunks=(100, 100))
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(func1, ledger=str(ledger), dtype=float)
    z = y.map_blocks(func2, ledger=str(ledger), dtype=float)

    total = z.sum().compute(scheduler=client.get)

    expected = ((x + 1) * 2).sum().compute(scheduler="sync")
    assert total == pytest.approx(expected)
    ran = [r for r in read(ledger) if r["what"] == "func1"]
    assert len(ran) == 16, "every block of func1 ran once"
    assert {(r["agent"], r["gpu"]) for r in ran} == {("gpu-a", 1.0)}, \
        "every func1 block ran on the GPU agent with a GPU granted"


def test_the_same_with_the_default_client_as_configured_scheduler(client, tmp_path):
    ledger = tmp_path / "ledger"
    x = da.ones((40, 40), chunks=(10, 10))
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(func1, ledger=str(ledger), dtype=float)
    with dask.config.set(scheduler=zres.dask.get):
        total = y.sum().compute()
    assert total == 40 * 40 * 2
    assert {(r["agent"], r["gpu"]) for r in read(ledger)} == {("gpu-a", 1.0)}


def on_gpu(i: int, ledger: str) -> int:
    record(ledger, "delayed", i=i)
    return i * 10


def test_delayed_annotations_run_on_the_gpu_agent(client, tmp_path):
    ledger = tmp_path / "ledger"
    with dask.annotate(resources={"GPU": 1}):
        parts = [dask.delayed(on_gpu)(i, str(ledger)) for i in range(6)]
    total = dask.delayed(sum)(parts)
    assert total.compute(scheduler=client.get) == sum(i * 10 for i in range(6))
    ran = read(ledger)
    assert sorted(r["i"] for r in ran) == list(range(6))
    assert {(r["agent"], r["gpu"]) for r in ran} == {("gpu-a", 1.0)}


def tag_partition(frame: pd.DataFrame, ledger: str) -> pd.DataFrame:
    record(ledger, "partition", rows=len(frame))
    return frame.assign(y=frame.x * 2)


def test_a_dataframe_under_annotate_runs_every_partition_on_the_gpu_agent(client, tmp_path):
    ledger = tmp_path / "ledger"
    frame = dd.from_pandas(pd.DataFrame({"x": range(100)}), npartitions=5)
    meta = pd.DataFrame({"x": pd.Series([], dtype="int64"), "y": pd.Series([], dtype="int64")})
    mapped = frame.map_partitions(tag_partition, str(ledger), meta=meta)
    with zres.annotate(resources={"GPU": 1}):  # as dask.annotate around a compute does
        result = mapped.compute(scheduler=client.get)
    assert list(result.y) == [2 * i for i in range(100)]
    ran = read(ledger)
    assert sum(r["rows"] for r in ran) == 100
    assert {(r["agent"], r["gpu"]) for r in ran} == {("gpu-a", 1.0)}

    (tmp_path / "ledger").unlink()
    with dask.annotate(resources={"GPU": 1}):
        mapped.sum().compute(scheduler=client.get)
    assert {(r["agent"], r["gpu"]) for r in read(ledger)} == {("gpu-a", 1.0)}


def test_a_bag_map_annotated(client, tmp_path):
    ledger = tmp_path / "ledger"
    bag = db.from_sequence(range(12), npartitions=4)
    with dask.annotate(resources={"GPU": 1}):
        tens = bag.map(on_gpu, str(ledger))
    assert tens.sum().compute(scheduler=client.get) == sum(i * 10 for i in range(12))
    assert {(r["agent"], r["gpu"]) for r in read(ledger)} == {("gpu-a", 1.0)}


def anywhere(i: int, ledger: str) -> int:
    record(ledger, "plain", i=i)
    return i


def test_annotated_and_plain_tasks_of_one_compute_each_run_where_they_asked(client, tmp_path):
    """Delayed tasks built in and out of dask.annotate in one graph (Dask marks the plain
    ones with a tombstone), beside an annotated array and a plain bag."""
    ledger = str(tmp_path / "ledger")
    with dask.annotate(resources={"GPU": 1}):
        gpu = [dask.delayed(on_gpu)(i, ledger) for i in range(3)]
        blocks = da.ones((40,), chunks=10).map_blocks(func1, ledger=ledger, dtype=float)
    plain = [dask.delayed(anywhere)(i, ledger) for i in range(3)]
    bag = db.from_sequence(range(4), npartitions=2).map(anywhere, ledger)
    total, array_sum, bag_sum = dask.compute(dask.delayed(sum)(gpu + plain), blocks.sum(),
                                             bag.sum(), scheduler=client.get)
    assert (total, array_sum, bag_sum) == (30 + 3, 80, 6)
    ran = read(Path(ledger))
    assert {r["gpu"] for r in ran if r["what"] in ("delayed", "func1")} == {1.0}
    assert {r["gpu"] for r in ran if r["what"] == "plain"} == {0}
    assert len(ran) == 3 + 4 + 3 + 4


def first_waits(release: str, marker: str) -> int:
    Path(marker).touch()
    wait_for_file(release, timeout=60)
    return 0


def ordered(i: int, ledger: str) -> int:
    record(ledger, "ordered", i=i)
    return i


def test_a_priority_annotation_changes_the_order_on_a_busy_agent(tmp_path):
    ledger, release, marker = (str(tmp_path / n) for n in ("ledger", "release", "marker"))
    with zres.LocalCluster(agents=[{"CPU": 1}], nthreads=1, heartbeat_interval=0.2) as busy, \
            zres.Client(busy.address) as client:
        blocker = client.submit(first_waits, release, marker)
        wait_until(lambda: os.path.exists(marker), message="the agent to be busy")
        low = [dask.delayed(ordered)(i, ledger) for i in range(4)]
        with dask.annotate(priority=10):
            high = [dask.delayed(ordered)(i, ledger) for i in range(10, 14)]
        futures = client.compute(low + high)
        wait_until(lambda: client.status()["counts"].get("queued", 0) >= 8,
                   message="every task queued behind the busy agent")
        Path(release).touch()
        assert zres.gather(futures, timeout=60) == [0, 1, 2, 3, 10, 11, 12, 13]
        assert blocker.result(10) == 0
    order = [r["i"] for r in read(Path(ledger))]
    assert sorted(order[:4]) == [10, 11, 12, 13], f"priority 10 ran first: {order}"


def breaks_on(block: np.ndarray, bad: float) -> np.ndarray:
    if (block == bad).any():
        raise ValueError(f"block holding {bad} is bad")
    return block


def test_a_failing_block_raises_its_own_exception_naming_its_key(client, cluster):
    x = da.arange(40, chunks=10)
    y = x.map_blocks(breaks_on, 25.0, dtype=x.dtype)
    with pytest.raises(ValueError, match="block holding 25.0 is bad") as failure:
        (y + 1).sum().compute(scheduler=client.get)
    assert any("Dask task" in note and "breaks_on" in note
               for note in getattr(failure.value, "__notes__", [])), failure.value.__notes__
    wait_until(lambda: not any(client.status()["counts"].values()),
               message="nothing of the failed compute left at the broker")


def slow_input(release: str, marker: str) -> int:
    Path(marker).touch()
    wait_for_file(release, timeout=60)
    return 1


def test_intermediate_results_are_released_once_nothing_needs_them(client, tmp_path):
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    graph = {"a": (np.ones, 1000), "b": (sum, "a"),
             "c": (slow_input, release, marker), "d": (lambda b, c: b + c, "b", "c")}
    answer: list[object] = []
    run = threading.Thread(target=lambda: answer.append(client.get(graph, "d")))
    run.start()
    wait_until(lambda: os.path.exists(marker), message="c to run")
    # a's only reader, b, has ended: a is gone; b waits for d; c runs, d waits.
    wait_until(lambda: client.status()["counts"] == {"finished": 1, "running": 1, "waiting": 1},
               message="only b's result kept while c runs")
    Path(release).touch()
    run.join(30)
    assert answer == [1001.0]
    wait_until(lambda: not any(client.status()["counts"].values()),
               message="nothing kept once the compute returned")


def test_compute_returns_futures_that_submit_takes(client):
    x = da.arange(100, chunks=10)
    total, biggest = client.compute([x.sum(), x.max()])
    assert isinstance(total, zres.Future)
    doubled = client.submit(lambda a, b: 2 * a + b, total, biggest)
    assert doubled.result(30) == 2 * 4950 + 99
    single = client.compute(x.min())
    assert single.result(30) == 0


def test_legacy_graphs_keys_in_lists_and_bad_input(client):
    graph = {"x": 1, "y": (lambda v: v + 1, "x"), "z": (lambda a, b: a * b, "x", "y"),
             "w": "y"}
    assert client.get(graph, "y") == 2
    assert client.get(graph, ["z", ["w", "y"]]) == [2, [2, 2]]
    with pytest.raises(KeyError, match="'nope' is not in the graph"):
        client.get(graph, "nope")
    with pytest.raises(TypeError, match="unknown keywords: \\['worker'\\]; it takes "
                       "allow_other_workers, callbacks, priority, resources, retries, workers"):
        client.get(graph, "y", worker="a")
    with pytest.raises(ValueError, match="priority annotation must be a whole number"):
        client.get(graph, "y", priority=0.5)
    with pytest.raises(zres.ResourceSpecError):
        client.get(graph, "y", resources={"GPU": -1})


def ran_on(_: object) -> str:
    return zres.get_task_context().agent


def test_get_and_compute_place_every_task_on_the_named_agents(client):
    """Dask's workers= and allow_other_workers= on get and compute: agent names."""
    graph = {f"x{i}": (ran_on, i) for i in range(4)}
    assert set(client.get(graph, list(graph), workers=["cpu-b"])) == {"cpu-b"}
    assert set(client.get(graph, list(graph), workers="gpu-a")) == {"gpu-a"}
    assert set(client.get(graph, list(graph), workers="nobody",
                          allow_other_workers=True)) <= {"gpu-a", "cpu-b"}
    delayed = dask.delayed(ran_on)(0)
    assert client.compute(delayed, workers=["gpu-a"]).result(30) == "gpu-a"


def test_progress_callbacks_hear_every_task(client):
    from dask.callbacks import Callback
    from dask.diagnostics import ProgressBar

    began, ended = [], []
    x = da.ones((60, 60), chunks=(10, 10))
    out = io.StringIO()
    with Callback(pretask=lambda key, dsk, state: began.append(key),
                  posttask=lambda key, result, dsk, state, worker: ended.append(
                      (key, worker))), ProgressBar(out=out, dt=0.01):
        assert (x + 1).sum().compute(scheduler=client.get) == 60 * 60 * 2
    assert len(ended) >= 36 and sorted(map(str, began)) == sorted(str(k) for k, _ in ended)
    assert {worker for _, worker in ended} <= {"gpu-a", "cpu-b"}
    assert "100% Completed" in out.getvalue()


def fails(_: object) -> None:
    raise KeyError("on purpose")


def test_a_computes_cancelled_or_failed_output_cancels_what_has_not_begun(client, tmp_path):
    """As get does when a compute fails: once no output of a compute wants a task any more
    (the output was cancelled, or failed), what has not begun of it is cancelled; another
    output's tasks run on."""
    release, marker = str(tmp_path / "release"), str(tmp_path / "m")
    holds = [dask.delayed(hold)(release, f"{marker}-{i}") for i in range(10)]
    kept = dask.delayed(hold)(release, f"{marker}-kept")
    doomed_f, kept_f = client.compute([dask.delayed(sum)(holds), kept])
    wait_until(lambda: len(list(tmp_path.glob("m-*"))) == 4, message="every slot to be busy")
    assert "waiting" in repr(doomed_f)  # (for its inputs, as zres status says)
    doomed_f.cancel()

    def left() -> dict[str, int]:
        counts = client.status()["counts"]
        return {s: counts[s] for s in ("queued", "waiting") if counts.get(s)}
    # What runs goes on; of the rest, only the kept output's task (if not begun) is left.
    wait_until(lambda: sum(left().values()) <= 1, message=f"the doomed tasks cancelled {left()}")
    Path(release).touch()
    assert kept_f.result(30) == "released"
    assert len(list(tmp_path.glob("m-[0-9]*"))) < 10, "the doomed tasks did not all run"

    with dask.annotate(priority=10):  # (it starts first: ready ones start by priority)
        bad = dask.delayed(fails)(0)
    gate = str(tmp_path / "gate")
    more = [dask.delayed(hold)(gate, f"{marker}-more-{i}") for i in range(10)]
    failed = client.compute(dask.delayed(sum)([bad, *more]))
    with pytest.raises(KeyError, match="on purpose"):
        failed.result(30)
    wait_until(lambda: not left(), message=f"the failed compute's tasks cancelled {left()}")
    Path(gate).touch()
    wait_until(lambda: not client.status()["counts"].get("running"),
               message="nothing of either compute running")
    assert len(list(tmp_path.glob("m-more-*"))) <= 4
