"""CPython's own tests of concurrent.futures, run against ``client.executor()``.

The executor-agnostic tests of ``Lib/test/test_concurrent_futures`` (executor, wait,
as_completed, shutdown, future), under their upstream class and test names. They are
adapted only where a task runs in another process here: a ``threading.Event`` shared with
a task is a ``FileEvent``, a task's ``print`` is a marker file, a test's own sleeps and
waits are shorter (the same order of events), and the module-level futures in a given
state (``PENDING_FUTURE``...) are plain ``concurrent.futures.Future`` objects as upstream.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
    Future,
)
from pathlib import Path
from typing import Any

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import FileEvent

pytestmark = pytest.mark.timeout(60)


def create_future(state: str = PENDING, exception: BaseException | None = None,
                  result: Any = None) -> Future:  # type: ignore[type-arg]
    f: Future = Future()  # type: ignore[type-arg]
    f._state = state
    f._exception = exception
    f._result = result
    return f


PENDING_FUTURE = create_future(state=PENDING)
RUNNING_FUTURE = create_future(state=RUNNING)
CANCELLED_FUTURE = create_future(state=CANCELLED)
CANCELLED_AND_NOTIFIED_FUTURE = create_future(state=CANCELLED_AND_NOTIFIED)
EXCEPTION_FUTURE = create_future(state=FINISHED, exception=OSError())
SUCCESSFUL_FUTURE = create_future(state=FINISHED, result=42)


def mul(x: int, y: int) -> int:
    return x * y


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()


def wait_and_raise(e: FileEvent) -> None:
    e.wait()
    raise Exception("this is an exception")


@pytest.fixture(scope="module")
def cluster() -> Iterator[zres.LocalCluster]:
    with zres.LocalCluster(agents=[{"CPU": 5}], heartbeat_interval=0.2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: zres.LocalCluster) -> Iterator[zres.Client]:
    with zres.Client(cluster.address) as client:
        yield client


class ExecutorMixin:
    """Upstream's ExecutorMixin: a fresh executor per test, shut down (waiting) after."""

    worker_count = 5

    @pytest.fixture(autouse=True)
    def _executor(self, client: zres.Client, cluster: zres.LocalCluster,
                  tmp_path: Path) -> Iterator[None]:
        self.client = client
        self.cluster = cluster
        self.tmp_path = tmp_path
        self._events = itertools.count()
        self.executor = client.executor()
        yield
        self.executor.shutdown(wait=True)

    def create_event(self) -> FileEvent:
        return FileEvent(str(self.tmp_path / f"event-{next(self._events)}"))

    def run_touching(self, main: list[str]) -> subprocess.CompletedProcess[bytes]:
        """Run a program whose main runs the lines MAIN, with upstream's sleep_and_touch
        defined."""
        return self.run_program("\n".join([
            "import time, pathlib, zres",
            "def sleep_and_touch(t, path):",
            "    time.sleep(t)",
            "    pathlib.Path(path).touch()",
            'if __name__ == "__main__":', *(f"    {line}" for line in main)]))

    def run_program(self, code: str) -> subprocess.CompletedProcess[bytes]:
        """Run CODE in a new interpreter using this cluster, as upstream's
        assert_python_ok does (it must exit 0)."""
        env = {**os.environ, "ZRES_BROKER": self.cluster.address, "ZRES_KEYS": self.cluster.keys}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              timeout=50)
        assert done.returncode == 0, done.stderr.decode()
        return done


class TestExecutor(ExecutorMixin):
    """Upstream: executor.py, ExecutorTest."""

    def test_submit(self) -> None:
        future = self.executor.submit(pow, 2, 8)
        assert 256 == future.result()

    def test_submit_keyword(self) -> None:
        future = self.executor.submit(mul, 2, y=8)
        assert 16 == future.result()
        future = self.executor.submit(capture, 1, self=2, fn=3)
        assert future.result() == ((1,), {"self": 2, "fn": 3})
        with pytest.raises(TypeError):
            self.executor.submit(fn=capture, arg=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            self.executor.submit(arg=1)  # type: ignore[call-arg]

    def test_submit_passes_what_the_client_reserves(self) -> None:
        # (zres) resources=, priority=, retries= and key= are the function's, not ours.
        future = self.executor.submit(capture, resources=1, priority=2, retries=3, key=4)
        assert future.result() == ((), {"resources": 1, "priority": 2, "retries": 3,
                                        "key": 4})

    def test_map(self) -> None:
        assert list(self.executor.map(pow, range(10), range(10))) == list(
            map(pow, range(10), range(10)))
        assert list(self.executor.map(pow, range(10), range(10), chunksize=3)) == list(
            map(pow, range(10), range(10)))

    def test_map_exception(self) -> None:
        i = self.executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5])
        assert i.__next__() == (0, 1)
        assert i.__next__() == (0, 1)
        with pytest.raises(ZeroDivisionError):
            i.__next__()

    def test_map_timeout(self) -> None:
        results = []
        try:
            for i in self.executor.map(time.sleep, [0, 0, 3], timeout=1.5):
                results.append(i)
        except futures.TimeoutError:
            pass
        else:
            pytest.fail("expected TimeoutError")
        assert [None, None] == results

    def test_shutdown_race_issue12456(self) -> None:
        self.executor.map(str, [2] * (self.worker_count + 1))
        self.executor.shutdown()

    def test_no_stale_references(self) -> None:
        my_object = MyObject()
        my_object_collected = threading.Event()
        my_object_callback = weakref.ref(  # noqa: F841
            my_object, lambda obj: my_object_collected.set())
        # Deliberately discarding the future.
        self.executor.submit(my_object.my_method)
        del my_object
        assert my_object_collected.wait(timeout=10), (
            "Stale reference not collected within timeout.")

    def test_max_workers_negative(self) -> None:
        # (zres) An executor's defaults are checked when it is made, as max_workers is.
        for number in (-2, -1):
            with pytest.raises(ValueError, match="retries must be >= 0"):
                self.client.executor(retries=number)

    def test_free_reference(self) -> None:
        for obj in self.executor.map(make_dummy_object, range(10)):
            wr = weakref.ref(obj)
            del obj
            assert wr() is None


class TestWait(ExecutorMixin):
    """Upstream: test_wait.py, WaitTests and ThreadPoolWaitTests."""

    def test_20369(self) -> None:
        future = self.executor.submit(mul, 1, 2)
        done, not_done = futures.wait([future, future], return_when=futures.ALL_COMPLETED)
        assert {future} == done
        assert set() == not_done

    def test_first_completed(self) -> None:
        event = self.create_event()
        future1 = self.executor.submit(mul, 21, 2)
        future2 = self.executor.submit(event.wait)
        try:
            done, not_done = futures.wait([CANCELLED_FUTURE, future1, future2],
                                          return_when=futures.FIRST_COMPLETED)
            assert {future1} == done
            assert {CANCELLED_FUTURE, future2} == not_done
        finally:
            event.set()
        future2.result()

    def test_first_completed_some_already_completed(self) -> None:
        event = self.create_event()
        future1 = self.executor.submit(event.wait)
        try:
            finished, pending = futures.wait(
                [CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE, future1],
                return_when=futures.FIRST_COMPLETED)
            assert {CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE} == finished
            assert {future1} == pending
        finally:
            event.set()
        future1.result()

    def test_first_exception(self) -> None:
        event1 = self.create_event()
        event2 = self.create_event()
        try:
            future1 = self.executor.submit(mul, 2, 21)
            future2 = self.executor.submit(wait_and_raise, event1)
            future3 = self.executor.submit(event2.wait)

            def wait_for_future1() -> None:
                future1.result()
                event1.set()

            t = threading.Thread(target=wait_for_future1)
            t.start()
            finished, pending = futures.wait([future1, future2, future3],
                                             return_when=futures.FIRST_EXCEPTION)
            assert {future1, future2} == finished
            assert {future3} == pending
            t.join()
        finally:
            event1.set()
            event2.set()
        future3.result()

    def test_first_exception_some_already_complete(self) -> None:
        event = self.create_event()
        future1 = self.executor.submit(divmod, 21, 0)
        future2 = self.executor.submit(event.wait)
        try:
            finished, pending = futures.wait(
                [SUCCESSFUL_FUTURE, CANCELLED_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE,
                 future1, future2], return_when=futures.FIRST_EXCEPTION)
            assert {SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, future1} == finished
            assert {CANCELLED_FUTURE, future2} == pending
        finally:
            event.set()
        future2.result()

    def test_first_exception_one_already_failed(self) -> None:
        event = self.create_event()
        future1 = self.executor.submit(event.wait)
        try:
            finished, pending = futures.wait([EXCEPTION_FUTURE, future1],
                                             return_when=futures.FIRST_EXCEPTION)
            assert {EXCEPTION_FUTURE} == finished
            assert {future1} == pending
        finally:
            event.set()
        future1.result()

    def test_all_completed(self) -> None:
        future1 = self.executor.submit(divmod, 2, 0)
        future2 = self.executor.submit(mul, 2, 21)
        finished, pending = futures.wait(
            [SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, future1,
             future2], return_when=futures.ALL_COMPLETED)
        assert {SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, future1,
                future2} == finished
        assert set() == pending

    def test_timeout(self) -> None:
        short_timeout = 0.050
        event = self.create_event()
        future = self.executor.submit(event.wait)
        try:
            finished, pending = futures.wait(
                [CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future],
                timeout=short_timeout, return_when=futures.ALL_COMPLETED)
            assert {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE,
                    SUCCESSFUL_FUTURE} == finished
            assert {future} == pending
        finally:
            event.set()
        future.result()

    def test_pending_calls_race(self) -> None:
        event = self.create_event()
        old_switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            fs = {self.executor.submit(event.wait) for _ in range(100)}
            event.set()
            futures.wait(fs, return_when=futures.ALL_COMPLETED)
        finally:
            sys.setswitchinterval(old_switch_interval)

    def test_a_cancelled_future_counts_as_done(self) -> None:
        # (zres, issue 15) cancel() must notify wait() and as_completed() as a
        # ThreadPoolExecutor's worker does: they used to wait for ever.
        event = self.create_event()
        blockers = [self.executor.submit(event.wait) for _ in range(self.worker_count)]
        try:
            wait_until(lambda: all(f.running() for f in blockers), 30,
                       message="every CPU busy")
            queued = self.executor.submit(mul, 2, 3)
            assert queued.cancel()
            done, _ = futures.wait([queued], timeout=10)
            assert done == {queued}
            assert list(futures.as_completed([queued], timeout=10)) == [queued]
            assert zres.wait([queued], timeout=10).done == {queued}
        finally:
            event.set()


class TestAsCompleted(ExecutorMixin):
    """Upstream: test_as_completed.py, AsCompletedTests."""

    def test_no_timeout(self) -> None:
        future1 = self.executor.submit(mul, 2, 21)
        future2 = self.executor.submit(mul, 7, 6)
        completed = set(futures.as_completed(
            [CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future1,
             future2]))
        assert {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future1,
                future2} == completed

    def test_future_times_out(self) -> None:
        already_completed = {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE,
                             SUCCESSFUL_FUTURE}
        short_timeout = 0.100
        for timeout in (0, short_timeout):
            completed_futures = set()
            future = self.executor.submit(time.sleep, short_timeout * 10)
            try:
                for f in futures.as_completed(already_completed | {future}, timeout):
                    completed_futures.add(f)
            except futures.TimeoutError:
                pass
            assert completed_futures == already_completed

    def test_duplicate_futures(self) -> None:
        future1 = self.executor.submit(time.sleep, 0.5)
        completed = list(futures.as_completed(itertools.repeat(future1, 3)))
        assert len(completed) == 1

    def test_free_reference_yielded_future(self) -> None:
        futures_list: list[Any] = [Future() for _ in range(8)]
        futures_list.append(create_future(state=CANCELLED_AND_NOTIFIED))
        futures_list.append(create_future(state=FINISHED, result=42))
        with pytest.raises(futures.TimeoutError):
            for future in futures.as_completed(futures_list, timeout=0):
                futures_list.remove(future)
                wr = weakref.ref(future)
                del future
                assert wr() is None
        futures_list[0].set_result("test")
        for future in futures.as_completed(futures_list):
            futures_list.remove(future)
            wr = weakref.ref(future)
            del future
            assert wr() is None
            if futures_list:
                futures_list[0].set_result("test")

    def test_correct_timeout_exception_msg(self) -> None:
        futures_list = [CANCELLED_AND_NOTIFIED_FUTURE, PENDING_FUTURE, RUNNING_FUTURE,
                        SUCCESSFUL_FUTURE]
        with pytest.raises(futures.TimeoutError) as cm:
            list(futures.as_completed(futures_list, timeout=0))
        assert str(cm.value) == "2 (of 4) futures unfinished"


class TestExecutorShutdown(ExecutorMixin):
    """Upstream: test_shutdown.py, ExecutorShutdownTest and ThreadPoolShutdownTest."""

    def test_run_after_shutdown(self) -> None:
        self.executor.shutdown()
        with pytest.raises(RuntimeError):
            self.executor.submit(pow, 2, 5)

    def test_interpreter_shutdown(self) -> None:
        # The atexit hook: a program that ends with work pending waits for it.
        marker = self.tmp_path / "apple"
        done = self.run_touching(["t = zres.Client().executor()",
                                  f"t.submit(sleep_and_touch, 1.0, {str(marker)!r})"])
        assert not done.stderr
        assert marker.exists(), "the program ended without running its pending task"

    def test_submit_after_interpreter_shutdown(self) -> None:
        done = self.run_program("""if 1:
            import atexit
            @atexit.register
            def run_last():
                try:
                    t.submit(id, None)
                except RuntimeError:
                    print("runtime-error")
                    raise
            import zres
            if __name__ == "__main__":
                t = zres.Client().executor()
                t.submit(id, 42).result()
            """)
        assert "RuntimeError: cannot schedule new futures" in done.stderr.decode()
        assert done.stdout.strip() == b"runtime-error"

    def test_hang_issue12364(self) -> None:
        fs = [self.executor.submit(time.sleep, 0.1) for _ in range(50)]
        self.executor.shutdown()
        for f in fs:
            f.result()

    def test_cancel_futures(self) -> None:
        assert self.worker_count <= 5, "test needs few workers"
        fs = [self.executor.submit(time.sleep, .1) for _ in range(50)]
        # A thread pool's threads take the first calls at once; a cluster's agents take
        # them a round trip later, and cancel() is exact (only what has not begun), so
        # the port waits for the first to begin, as CPython's test assumes it has.
        wait_until(lambda: fs[0].running() or fs[0].done(), timeout=30)
        self.executor.shutdown(cancel_futures=True)
        cancelled = [fut for fut in fs if fut.cancelled()]
        assert len(cancelled) > 20
        others = [fut for fut in fs if not fut.cancelled()]
        for fut in others:
            assert fut.done(), f"{fut._state=}"
            assert fut.exception() is None
        assert len(others) > 0

    def test_hang_gh83386(self) -> None:
        """shutdown(wait=False) doesn't hang at exit with running futures."""
        marker = self.tmp_path / "apple"
        done = self.run_touching(["t = zres.Client().executor()",
                                  f"t.submit(sleep_and_touch, 1.0, {str(marker)!r})",
                                  "t.shutdown(wait=False)"])
        assert not done.stderr
        assert marker.exists()

    def test_hang_gh94440(self) -> None:
        """shutdown(wait=True) doesn't hang when a future was submitted and quickly
        canceled right before shutdown."""
        executor = self.client.executor()
        executor.submit(int).result()
        executor.submit(int).cancel()
        finished = threading.Event()
        threading.Thread(target=lambda: (executor.shutdown(wait=True), finished.set()),
                         daemon=True).start()
        assert finished.wait(5), "timed out waiting for shutdown"

    def test_context_manager_shutdown(self) -> None:
        with self.client.executor() as e:
            executor = e
            assert list(e.map(abs, range(-5, 5))) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
        assert executor.outstanding() == []

    def test_leaving_with_waits_for_pending_work(self) -> None:
        # (zres, issue 15) leaving a with block used to fail what was pending.
        event = self.create_event()
        with self.client.executor() as e:
            future = e.submit(event.wait)
            threading.Timer(0.3, event.set).start()
        assert future.done() and future.exception() is None

    def test_cancel_futures_wait_false(self) -> None:
        marker = self.tmp_path / "apple"
        done = self.run_touching(["t = zres.Client().executor()",
                                  f"t.submit(sleep_and_touch, .1, {str(marker)!r})",
                                  "t.shutdown(wait=False, cancel_futures=True)"])
        assert not done.stderr


class TestFuture(ExecutorMixin):
    """Upstream: test_future.py, FutureTests, on futures an executor made."""

    def blocked(self) -> tuple[FileEvent, list[Any], Any]:
        """Every CPU busy until the event is set, and a pending future behind them."""
        event = self.create_event()
        blockers = [self.executor.submit(event.wait) for _ in range(self.worker_count)]
        wait_until(lambda: all(f.running() for f in blockers), 30, message="every CPU busy")
        return event, blockers, self.executor.submit(mul, 6, 7)

    def test_done_callback_with_result(self) -> None:
        callback_result = []
        f = self.executor.submit(mul, 5, 1)
        f.add_done_callback(lambda fut: callback_result.append(fut.result()))
        f.result()
        wait_until(lambda: callback_result, 10)
        assert [5] == callback_result

    def test_done_callback_with_exception(self) -> None:
        callback_exception = []
        f = self.executor.submit(divmod, 1, 0)
        f.add_done_callback(lambda fut: callback_exception.append(fut.exception()))
        wait_until(lambda: callback_exception, 10)
        assert isinstance(callback_exception[0], ZeroDivisionError)

    def test_done_callback_with_cancel(self) -> None:
        event, _, f = self.blocked()
        was_cancelled = []
        f.add_done_callback(lambda fut: was_cancelled.append(fut.cancelled()))
        assert f.cancel()
        assert was_cancelled == [True]
        event.set()

    def test_done_callback_already_successful(self) -> None:
        callback_result = []
        f = self.executor.submit(mul, 5, 1)
        f.result()
        f.add_done_callback(lambda fut: callback_result.append(fut.result()))
        assert [5] == callback_result

    def test_done_callback_already_cancelled(self) -> None:
        event, _, f = self.blocked()
        assert f.cancel()
        was_cancelled = []
        f.add_done_callback(lambda fut: was_cancelled.append(fut.cancelled()))
        assert was_cancelled == [True]
        event.set()

    def test_cancel(self) -> None:
        event, blockers, pending = self.blocked()
        failed = self.executor.submit(divmod, 1, 0)
        succeeded = self.executor.submit(mul, 1, 5)
        assert pending.cancel() and pending.cancelled()
        assert pending.cancel(), "a cancelled future says so again"
        running = blockers[0]
        assert running.running()
        assert not running.cancel(), "a running task was taken for cancelled"
        assert running.running() and not running.cancelled()
        event.set()
        for f in (failed, succeeded):
            futures.wait([f], timeout=30)
            assert not f.cancel() and f.done()
        assert running.result(30) is True

    def test_running_done_cancelled(self) -> None:
        # test_cancelled, test_done and test_running, on one future of each state.
        event, blockers, pending = self.blocked()
        running = blockers[0]
        assert (pending.running(), pending.done(), pending.cancelled()) == (False,) * 3
        assert (running.running(), running.done(), running.cancelled()) == (
            True, False, False)
        assert pending.cancel()
        assert (pending.running(), pending.done(), pending.cancelled()) == (
            False, True, True)
        event.set()
        running.result(30)
        assert (running.running(), running.done(), running.cancelled()) == (
            False, True, False)

    def test_result_with_timeout(self) -> None:
        event, blockers, pending = self.blocked()
        with pytest.raises(futures.TimeoutError):
            pending.result(timeout=0)
        with pytest.raises(futures.TimeoutError):
            blockers[0].result(timeout=0)
        assert pending.cancel()
        with pytest.raises(futures.CancelledError):
            pending.result(timeout=0)
        event.set()
        failed = self.executor.submit(divmod, 1, 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=30)
        assert self.executor.submit(mul, 6, 7).result(timeout=30) == 42

    def test_exception_with_timeout(self) -> None:
        event, blockers, pending = self.blocked()
        with pytest.raises(futures.TimeoutError):
            pending.exception(timeout=0)
        with pytest.raises(futures.TimeoutError):
            blockers[0].exception(timeout=0)
        assert pending.cancel()
        with pytest.raises(futures.CancelledError):
            pending.exception(timeout=0)
        event.set()
        assert isinstance(self.executor.submit(divmod, 1, 0).exception(timeout=30),
                          ZeroDivisionError)
        assert self.executor.submit(mul, 6, 7).exception(timeout=30) is None

    def test_result_with_cancel(self) -> None:
        event, _, f1 = self.blocked()
        threading.Timer(0.2, f1.cancel).start()
        with pytest.raises(futures.CancelledError):
            f1.result(timeout=30)
        event.set()
