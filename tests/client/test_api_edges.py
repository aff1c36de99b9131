"""The Python API at its edges, as users of concurrent.futures, Dask and Ray meet them:
bad calls refused at submit naming what was wrong, done-callbacks that wait or close their
client, futures that outlive their client, and exceptions that cannot be rebuilt here.

One cluster serves the module; a test that closes a client makes its own.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zres
from tests.conftest import stop_process, wait_until

pytestmark = pytest.mark.timeout(60)


class NeedsTwo(Exception):
    """Pickles, but cannot be rebuilt from its args (its __init__ takes two)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


def raise_needs_two() -> None:
    raise NeedsTwo("left", "right")


def inc(x: int) -> int:
    return x + 1


def ident(x: Any) -> Any:
    return x


def big_list(n: int) -> list[int]:
    return list(range(n))  # (over 64 KiB pickled: kept on its agent, fetched when read)


def wait_for(path: str) -> str:
    from tests.tasks import wait_for_file
    wait_for_file(path)
    return path


@pytest.fixture(scope="module")
def cluster() -> Iterator[zres.LocalCluster]:
    with zres.LocalCluster(agents=[{"CPU": 2}], heartbeat_interval=0.2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: zres.LocalCluster) -> Iterator[zres.Client]:
    with zres.Client(cluster.address) as client:
        yield client


def test_submit_refuses_what_cannot_be_called_or_pickled_naming_it(client):
    with pytest.raises(TypeError, match=r"submit\(\) takes the function to run first, not int"):
        client.submit(5)
    with pytest.raises(TypeError, match=r"map\(\) takes the function to run first"):
        client.map(None, [1])
    lock = threading.Lock()
    with pytest.raises(TypeError, match="the arguments of ident cannot be pickled to be "
                                        "sent: TypeError: cannot pickle '_thread.lock'"):
        client.submit(ident, {"lock": lock})
    with pytest.raises(TypeError, match="the function .*<lambda> cannot be pickled"):
        client.submit(lambda: lock.locked())
    assert client.submit(inc, 1).result(30) == 2  # (nothing was left half-sent)


def test_an_exception_that_cannot_be_rebuilt_keeps_its_words_and_traceback(client):
    with pytest.raises(zres.RemoteError, match="the task raised .*NeedsTwo: left/right, an "
                                               "exception that cannot be unpickled") as caught:
        client.submit(raise_needs_two).result(30)
    assert isinstance(caught.value.__cause__, zres.core.errors.RemoteTraceback)
    assert "raise_needs_two" in str(caught.value.__cause__)


def test_waiting_in_a_done_callback_on_a_pending_future_is_refused(client, tmp_path):
    release = str(tmp_path / "release")
    other = client.submit(wait_for, release)
    seen: list[Any] = []

    def callback(future: zres.Future) -> None:
        for read in (other.result, other.exception, future.result):
            try:
                seen.append(read())
            except RuntimeError as exc:
                seen.append(str(exc))

    client.submit(inc, 1).add_done_callback(callback)
    wait_until(lambda: len(seen) == 3)
    for said in seen[:2]:
        assert "cannot be waited for in a done-callback" in said and "wait_for" in said
    assert seen[2] == 2  # (its own future has ended: read as usual)
    (tmp_path / "release").touch()
    assert other.result(30) == release  # the I/O thread never blocked


def test_a_client_closed_in_a_done_callback_closes(cluster, tmp_path):
    client = zres.Client(cluster.address)
    pending = client.submit(wait_for, str(tmp_path / "never"))
    said: list[str] = []

    def close(_: zres.Future) -> None:
        try:
            client.close()
            said.append("closed")
        except Exception as exc:
            said.append(repr(exc))

    client.submit(inc, 1).add_done_callback(close)
    wait_until(lambda: said)
    assert said == ["closed"]
    with pytest.raises(zres.ZresError, match="the client was closed before the task finished"):
        pending.result(30)


def test_after_close_results_on_agents_and_requests_fail_at_once(cluster):
    client = zres.Client(cluster.address, broker_timeout=30)
    small, big = client.submit(inc, 1), client.submit(big_list, 100_000)
    zres.wait([small, big], timeout=30)
    client.close()
    assert small.result() == 2  # (it came with the answer: kept by its future)
    with pytest.raises(zres.ZresError, match=r"the result of big_list-2 \(id \d+\) was kept on "
                                             "an agent, and was let go of when its client"):
        big.result()  # not the reconnect window's wait, then "the broker did not answer"
    with pytest.raises(zres.ZresError, match="this client is closed"):
        client.status(timeout=30)


def stopped(pid: int) -> bool:
    """Whether process PID is stopped (SIGSTOP)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def touch(path: Any) -> str:
    with open(path, "w"):
        pass
    return str(path)


def test_a_map_with_an_item_that_cannot_be_pickled_submits_none_of_it(client, tmp_path):
    paths = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(TypeError, match=r"map\(\): item 2: the arguments of touch cannot be "
                                        r"pickled .*_thread.lock.*; no task of the map was "
                                        "submitted"):
        client.map(touch, [*paths, threading.Lock()])
    # Both CPUs of the agent: it runs only once everything queued before it has ended.
    after = client.submit(touch, tmp_path / "after", resources={"CPU": 2})
    assert after.result(30) == str(tmp_path / "after")
    assert not any(path.exists() for path in paths)  # nothing of the map ran
    assert client.gather(client.map(inc, [1, 2])) == [2, 3]


@pytest.mark.parametrize("back", ["resumed", "restarted"])
def test_cancel_while_the_broker_is_stopped_returns_and_goes_through_once_it_is_back(
        make_cluster, make_client, tmp_path, back: str):
    """BACK: the same broker goes on (SIGCONT), or another starts on its state (the cancel
    it never read is asked again of it)."""
    cluster = make_cluster(agents=[{"CPU": 1}])
    client = make_client(cluster.address)  # (its reconnect window: 300 s)
    release, ran = tmp_path / "release", tmp_path / "ran"
    blocker = client.submit(wait_for, str(release))  # holds the only CPU
    queued = client.submit(touch, ran)
    wait_until(lambda: blocker.running() and queued.id is not None,
               message="the blocker to run and the broker to take the other")
    broker = cluster.broker.pid
    stop_process(broker)
    said: list[bool] = []
    try:
        threading.Thread(target=lambda: said.append(queued.cancel()), daemon=True).start()
        wait_until(lambda: said, timeout=30, message="cancel() to return, the broker stopped")
        assert stopped(broker), "the broker ran meanwhile"
    finally:
        if back == "resumed":
            os.kill(broker, signal.SIGCONT)
        else:
            cluster.restart_broker()
    assert said == [False]  # (it could not know that the task will never run)
    wait_until(queued.cancelled, message="the cancel to go through once the broker is back")
    release.touch()
    assert blocker.result(30) == str(release)
    assert not ran.exists()


def test_gather_keeps_each_containers_type_and_makes_an_iterator_a_list(client):
    small = client.map(inc, [1, 2, 3])
    big = client.submit(bytes, 100_000)  # (over 64 KiB: kept on its agent, fetched)
    assert client.gather(set(small)) == {2, 3, 4}
    assert client.gather(frozenset([*small, big])) == frozenset({2, 3, 4, bytes(100_000)})
    assert client.gather(tuple(small)) == (2, 3, 4)
    assert client.gather(f for f in small) == [2, 3, 4]
    assert zres.gather(iter(small)) == [2, 3, 4]
    assert client.gather({"a": small[0], "b": [{small[1]}, (small[2],)]}) == \
        {"a": 2, "b": [{3}, (4,)]}


def test_a_done_futures_result_kept_on_an_agent_is_read_with_a_timeout_of_0(client):
    """concurrent.futures' result(timeout=0) of a done future returns its value: the
    timeout bounds the wait for the task to end, not the fetch of what it made."""
    made = client.map(bytes, [100_000, 100_001, 100_002])  # (kept on the agent: fetched)
    zres.wait(made, timeout=30)
    assert all(f.done() for f in made)
    assert len(made[0].result(timeout=0)) == 100_000
    assert made[1].exception(timeout=0) is None
    assert [len(v) for v in zres.gather(made[1:], timeout=0)] == [100_001, 100_002]
