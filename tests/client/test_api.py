"""The Python API end to end: futures, errors, dependencies, annotations, helpers.

Each test starts a real broker and agent (subprocesses on loopback) and uses only what a
user can see: results, exceptions, ``why``, ``status`` and marker files written by tasks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import announce_and_wait


class Boom(Exception):
    """A user exception type, defined where workers cannot import it."""


# -- task functions -----------------------------------------------------------------------


def explode(message: str) -> None:
    raise Boom(message)


def fail_value(x: int) -> int:
    raise ValueError(f"bad value {x}")


def inc(x: int) -> int:
    return x + 1


def add(x: int, y: int = 0) -> int:
    return x + y


def echo(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


def flip(data: bytearray) -> bytearray:
    return bytearray(reversed(data))


def digest(parts: list[bytearray]) -> list[tuple[int, int]]:
    return [(len(p), sum(p[::997])) for p in parts]


async def async_double(x: int) -> int:
    await asyncio.sleep(0.01)
    return 2 * x


def hold(release: str, marker: str, timeout: float = 30.0) -> bool:
    """Create MARKER, then run until RELEASE exists."""
    return announce_and_wait(release, marker, timeout)


def record(path: str, label: str) -> str:
    """Append LABEL to PATH (one line per task, in the order they ran)."""
    with open(path, "a") as f:
        f.write(label + "\n")
    return label


def context() -> dict[str, Any]:
    ctx = zres.get_task_context()
    return {"task_id": ctx.task_id, "agent": ctx.agent, "resources": dict(ctx.resources),
            "gpu_ids": list(ctx.gpu_ids), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


# -- errors -------------------------------------------------------------------------------


def test_exceptions_keep_their_type_and_carry_the_remote_traceback(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    with pytest.raises(Boom, match="kaboom") as info:
        client.submit(explode, "kaboom").result(30)
    cause = str(info.value.__cause__)
    assert "Traceback" in cause and "explode" in cause and "kaboom" in cause, cause
    with pytest.raises(ValueError, match="bad value 3") as info:
        client.submit(fail_value, 3).result(30)
    assert "fail_value" in str(info.value.__cause__)
    future = client.submit(fail_value, 4)
    assert isinstance(future.exception(30), ValueError)
    # A result that cannot be pickled says so: the result, of which task, where.
    agent = re.escape(cluster.status()["agents"][0]["name"])
    with pytest.raises(TypeError, match=rf"the result of task \d+ \(make_lock\) on agent "
                       rf"{agent} cannot be pickled to be sent back: TypeError: cannot pickle"):
        client.submit(make_lock).result(30)
    # So does a big result its agent's store cannot keep (here its directory is gone, as
    # when /dev/shm is emptied under an agent; a full file system alike): a bare
    # FileNotFoundError naming a file of zres's read as the body's own failure.
    with open(os.path.join(cluster.state_dir, f"agent-{cluster.status()['agents'][0]['name']}",
                           "object-store")) as fh:
        shutil.rmtree(fh.read())
    with pytest.raises(OSError, match=rf"the result of task \d+ \(some_bytes\) on agent "
                       rf"{agent} could not be kept in its store at /\S+: No such file or "
                       "directory"):
        client.submit(some_bytes, 1 << 20).result(30)


def some_bytes(n: int) -> bytes:
    return b"x" * n


def make_lock() -> Any:
    import threading
    return threading.Lock()


def test_a_failed_dependency_fails_its_dependents_with_the_same_type(make_cluster,
                                                                      make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    bad = client.submit(explode, "root cause")
    child = client.submit(inc, bad)
    grandchild = client.submit(add, 1, y=[child])
    for future in (bad, child, grandchild):
        with pytest.raises(Boom, match="root cause"):
            future.result(30)
    late = client.submit(inc, bad)  # submitted after the dependency already failed
    with pytest.raises(Boom, match="root cause"):
        late.result(30)


# -- dependencies and structure -----------------------------------------------------------


def test_futures_nested_in_arguments_are_replaced_by_results(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 4}])
    client = make_client(cluster.address)
    one, two, three, four = (client.submit(inc, n) for n in range(4))
    result = client.submit(echo, [one, (two, {"k": three})], extra={"x": [four]}).result(30)
    assert result == (([1, (2, {"k": 3})],), {"extra": {"x": [4]}})
    chain = client.submit(inc, client.submit(inc, client.submit(inc, 1)))
    assert chain.result(30) == 4
    # Dask's pure= is taken and changes nothing (it used to reach the function).
    assert client.submit(echo, 1, pure=False, k=2).result(30) == ((1,), {"k": 2})
    assert [f.result(30) for f in client.map(inc, [1, 2], pure=False)] == [2, 3]


def test_large_buffers_travel_as_arguments_results_and_dependencies(make_cluster,
                                                                     make_client):
    cluster = make_cluster(agents=[{"CPU": 2}, {"CPU": 2}])
    client = make_client(cluster.address)
    blobs = [bytearray(os.urandom(size)) for size in (300_000, 70_000, 1_000)]
    flipped = [client.submit(flip, blob) for blob in blobs]
    assert [f.result(30) for f in flipped] == [bytearray(reversed(b)) for b in blobs]
    summary = client.submit(digest, flipped).result(30)
    assert summary == [(len(b), sum(bytearray(reversed(b))[::997])) for b in blobs]


def test_map_returns_futures_with_results_in_order(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 4}])
    client = make_client(cluster.address)
    futures = client.map(add, range(50), range(100, 150))
    assert len(futures) == 50 and all(isinstance(f, zres.Future) for f in futures)
    assert [f.result(30) for f in futures] == [x + 100 + x for x in range(50)]
    base = client.submit(inc, 9)
    shifted = client.map(add, [1, 2, 3], y=base)
    assert [f.result(30) for f in shifted] == [11, 12, 13]


def test_gather_keeps_structure(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 4}])
    client = make_client(cluster.address)
    a, b, c = client.map(inc, [1, 2, 3])
    shape = {"list": [a, b], "tuple": (c, "plain"), "nested": {"x": [(a,)]}}
    expected = {"list": [2, 3], "tuple": (4, "plain"), "nested": {"x": [(2,)]}}
    assert zres.gather(shape, timeout=30) == expected
    assert client.gather(shape, timeout=30) == expected
    assert zres.gather(a) == 2


# -- waiting ------------------------------------------------------------------------------


def test_await_future_inside_asyncio_run(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)

    async def main() -> list[int]:
        first = await client.submit(inc, 1)
        rest = await asyncio.gather(*client.map(inc, [10, 20]))
        return [first, *rest]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [2, 11, 21]


def test_concurrent_futures_wait_and_as_completed(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 4}])
    client = make_client(cluster.address)
    futures = client.map(inc, range(20))
    done, not_done = cf.wait(futures, timeout=30)
    assert len(done) == 20 and not not_done
    more = client.map(inc, range(20))
    assert sorted(f.result() for f in cf.as_completed(more, timeout=30)) == list(range(1, 21))
    again = client.map(inc, range(5))
    assert set(zres.as_completed(again, timeout=30)) == set(again)
    done, _ = zres.wait([client.submit(fail_value, 1), *client.map(inc, range(3))],
                        timeout=30, return_when=zres.FIRST_EXCEPTION)
    assert any(isinstance(f.exception(), ValueError) for f in done)


def test_cancelling_a_queued_task(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], nthreads=4)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    blocker = client.submit(hold, release, str(tmp_path / "blocker"), resources={"foo": 1})
    wait_until(lambda: (tmp_path / "blocker").exists(), message="the blocker to start")
    queued = client.submit(hold, release, str(tmp_path / "cancelled"), resources={"foo": 1})
    wait_until(lambda: "needs" in client.why(queued), message="the task to queue")
    assert queued.cancel()
    with pytest.raises(cf.CancelledError):
        queued.result(5)
    Path(release).touch()
    assert blocker.result(30)
    after = client.submit(hold, release, str(tmp_path / "after"), resources={"foo": 1})
    assert after.result(30), "foo must be free again after the cancellation"
    assert not (tmp_path / "cancelled").exists(), "a cancelled task ran anyway"


# -- annotations and context --------------------------------------------------------------


def test_annotate_sets_resources_and_priority_and_explicit_arguments_win(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], nthreads=4)
    client = make_client(cluster.address)
    release, order = str(tmp_path / "release"), str(tmp_path / "order")
    blocker = client.submit(hold, release, str(tmp_path / "blocker"), resources={"foo": 1})
    wait_until(lambda: (tmp_path / "blocker").exists(), message="the blocker to start")
    plain = client.submit(record, order, "plain", resources={"foo": 1})
    with zres.annotate(resources={"foo": 1}, priority=5):
        high = client.submit(record, order, "high")
        low = client.submit(record, order, "low", priority=-5)
        side = client.submit(context, resources={"CPU": 1})
        side_result = side.result(30)  # runs now: it does not ask for the busy foo
    assert "foo" not in side_result["resources"]
    wait_until(lambda: "needs" in client.why(low), message="the annotated tasks to queue")
    assert "foo=1" in client.why(high)
    Path(release).touch()
    assert [f.result(30) for f in (high, plain, low)] == ["high", "plain", "low"]
    assert Path(order).read_text().split() == ["high", "plain", "low"]
    assert blocker.result(30)


def test_task_context_inside_tasks(make_cluster, make_client):
    cluster = make_cluster(agents=[{"GPU": 1, "foo": 2}], nthreads=2, names=["node"])
    client = make_client(cluster.address)
    plain, gpu = client.submit(context), client.submit(context, resources={"GPU": 1, "foo": 2})
    a, b = plain.result(30), gpu.result(30)
    assert isinstance(a["task_id"], int) and isinstance(b["task_id"], int)
    assert a["task_id"] != b["task_id"]
    assert a["agent"] == b["agent"] == "node"
    assert a["resources"] == {"CPU": 1} and a["gpu_ids"] == []
    assert b["resources"] == {"CPU": 1, "GPU": 1, "foo": 2}
    assert len(b["gpu_ids"]) == 1 and b["cuda"] == b["gpu_ids"][0]
    with pytest.raises(zres.ZresError):
        zres.get_task_context()


def test_async_def_task_function(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    assert client.submit(async_double, 21).result(30) == 42
    assert [f.result(30) for f in client.map(async_double, [1, 2, 3])] == [2, 4, 6]


def test_module_level_submit_and_map_use_the_newest_client(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    older = make_client(cluster.address)
    newer = make_client(cluster.address)
    future = zres.submit(inc, 1)
    assert future.client is newer and future.result(30) == 2
    mapped = zres.map(add, [1, 2], [3, 4])
    assert all(f.client is newer for f in mapped)
    assert [f.result(30) for f in mapped] == [4, 6]
    newer.close()
    again = zres.submit(inc, 2)
    assert again.client is older and again.result(30) == 3


# -- introspection and cleanup ------------------------------------------------------------


def test_why_right_after_submit_knows_the_task(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], nthreads=2)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    blocker = client.submit(hold, release, str(tmp_path / "blocker"), resources={"foo": 1})
    wait_until(lambda: (tmp_path / "blocker").exists(), message="the blocker to start")
    answers = []
    futures = []
    for _ in range(20):
        futures.append(client.submit(inc, 1, resources={"foo": 1}))
        answers.append(client.why(futures[-1]))
    Path(release).touch()
    assert blocker.result(30) and [f.result(30) for f in futures] == [2] * 20
    unknown = [a for a in answers if a.startswith("unknown task")]
    assert not unknown, f"{len(unknown)} of 20 why() calls right after submit said {unknown[0]!r}"


def test_failed_tasks_are_freed_on_the_broker(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    failed = client.map(fail_value, range(50))
    zres.wait(failed, timeout=30)
    assert client.status()["counts"] == {"error": 50}
    del failed
    gc.collect()
    wait_until(lambda: not client.status()["counts"], timeout=10,
               message="the broker to forget the failed tasks")


def test_a_cancelled_task_is_freed_on_the_broker(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], nthreads=2)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    blocker = client.submit(hold, release, str(tmp_path / "blocker"), resources={"foo": 1})
    wait_until(lambda: (tmp_path / "blocker").exists(), message="the blocker to start")
    queued = client.submit(hold, release, str(tmp_path / "queued"), resources={"foo": 1})
    wait_until(lambda f=queued: "needs" in client.why(f), message="the task to queue")
    assert queued.cancel()
    Path(release).touch()
    assert blocker.result(30)
    del queued, blocker
    gc.collect()
    counts: dict[str, int] = {}

    def forgotten() -> bool:
        counts.clear()
        counts.update(client.status()["counts"])
        return not counts

    try:
        wait_until(forgotten, timeout=5, message="the broker to forget the cancelled task")
    except AssertionError:
        pytest.fail(f"the broker still holds {counts} after the cancelled future was dropped")


# -- the client survives bad input and strict warning filters ------------------------------


def test_warnings_turned_into_errors_do_not_break_the_client(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    with warnings.catch_warnings():
        warnings.simplefilter("error", zres.InfeasibleWarning)
        stuck = client.submit(inc, 1, resources={"nope": 1})
        wait_until(lambda: "infeasible" in client.why(stuck, timeout=2), timeout=10,
                   message="the broker to find the task infeasible")
        assert client.submit(inc, 2).result(10) == 3, "the client stopped working"
    assert not stuck.done()


def test_a_bad_task_key_is_rejected_and_the_client_keeps_working(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    try:
        future = client.submit(inc, 1, key=object())
    except (TypeError, ValueError):
        pass  # rejected where it was typed: fine
    else:
        assert future.result(5) == 2
    assert client.submit(inc, 2).result(10) == 3, "the client stopped working"
