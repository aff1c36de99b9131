"""The agent's task runner, with its worker processes stood in for: which grants start, in
what order, what is handed to a worker to start on its own, and what the broker is told
first (a direct grant, counted held by the broker from its assignment, goes at once; any
other is handed over only once the broker has heard it is held)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from zres.agent.grants import Grant
from zres.agent.running import DELEGATE, TaskRunner
from zres.agent.slots import SlotSpec
from zres.core.resources import UNIT


class FakeProc:
    pid = 1

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


class FakeWorker:
    def __init__(self, slot: int, devices: tuple[str, ...]) -> None:
        self.slot, self.gpus, self.proc = slot, devices, FakeProc()
        self.ready, self.backlog, self.running = True, [], set()
        self.ident = b"w"
        self.stopped_for = 0
        self.task, self.retired = 0, False  # (a pooled process: no task of its own)


class FakePool:
    """Records what is sent to the one worker of each slot, in order."""

    def __init__(self) -> None:
        self.by_slot: dict[Any, FakeWorker] = {}
        self.sent: list[tuple[int, dict[str, Any]]] = []   # task id, context
        self.log: list[tuple[str, Any]] = []               # ("run", id) or (kind, body)
        self.touched: list[FakeWorker] = []
        self.start_log: set[int] = set()                   # what the start log still has

    def start(self, slot: int, devices: tuple[str, ...], nthreads: int,
              keep: Any = None) -> FakeWorker:
        worker = self.by_slot[(slot, devices)] = FakeWorker(slot, devices)
        return worker

    def send(self, worker: FakeWorker, item: list[Any], frames: list[Any]) -> None:
        if not worker.ready:  # (as the real pool: sent once the process says it is ready)
            worker.backlog.append(([item], frames))
            return
        self.sent.append((item[0], item[3]))
        self.log.append(("run", item[0]))

    def tell(self, worker: FakeWorker, kind: str, body: dict[str, Any]) -> None:
        self.log.append((kind, body))

    def touch(self, worker: FakeWorker) -> None:
        self.touched.append(worker)

    def started_by(self, worker: FakeWorker) -> set[int]:
        return self.start_log

    def task_workers(self) -> list[FakeWorker]:
        return list(self.by_slot.values())

    def forget(self, worker: FakeWorker) -> None:
        self.by_slot = {k: w for k, w in self.by_slot.items() if w is not worker}


class Events:
    """The broker's side: what it heard, and the hand-offs waiting for its ack."""

    def __init__(self) -> None:
        self.heard: list[int] = []
        self.waiting: list[Callable[[], None]] = []
        self.results: dict[int, tuple[str, dict[str, Any]]] = {}
        self.returned: list[int] = []

    def held(self, task_id: int) -> None:
        self.heard.append(task_id)

    def fenced(self, task_id: int) -> None:  # (a direct grant: said with the next report)
        self.heard.append(task_id)

    def then(self, action: Callable[[], None]) -> None:
        self.waiting.append(action)

    def after(self, action: Callable[[], None]) -> None:
        if self.waiting:
            self.waiting.append(action)
        else:
            action()

    def ack(self) -> None:
        actions, self.waiting = self.waiting, []
        for action in actions:
            action()

    def started(self, task_id: int) -> None:
        pass

    def result(self, task_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None:
        self.results[task_id] = (outcome, info)

    def give_back(self, task_id: int) -> None:
        self.returned.append(task_id)


def runner(**capacity: float) -> tuple[TaskRunner, FakePool, Events]:
    pool, events = FakePool(), Events()
    spec = SlotSpec({n: int(a * UNIT) for n, a in capacity.items()}, [], 4)
    return TaskRunner([spec], pool, events, lambda: True), pool, events  # type: ignore[arg-type]


def grant(task: int, priority: int = 0, direct: bool = False, since: float | None = None,
          **taken: float) -> Grant:
    units = {n: int(a * UNIT) for n, a in (taken or {"CPU": 1}).items()}
    return Grant(task, 0, units, (), [task, 1, [], {}], [b"x"], (-priority, task),
                 time.monotonic() if since is None else since, direct)


def started(pool: FakePool) -> list[int]:
    """Tasks sent to run now (not handed over to start later)."""
    return [t for t, ctx in pool.sent if not ctx.get("queued")]


def test_a_direct_grant_goes_at_once_and_a_queued_one_once_acknowledged():
    # The broker kept that a direct grant may have begun before it sent it: no round trip
    # (it is still reported held). A grant the agent starts on its own word (queued at
    # the broker, fitting here now) waits for the broker to hear it.
    run, pool, events = runner(CPU=2)
    run.add([grant(1, direct=True)])
    assert events.heard == [1] and started(pool) == [1], "a direct grant waited for an ack"
    run.add([grant(2)])
    assert events.heard == [1, 2] and started(pool) == [1], "sent before the broker heard"
    events.ack()
    assert started(pool) == [1, 2]


def test_a_direct_grant_starts_nothing_while_the_lease_has_lapsed():
    pool, events, lease = FakePool(), Events(), [False]
    run = TaskRunner([SlotSpec({"CPU": 2 * UNIT}, [], 4)], pool, events,  # type: ignore[arg-type]
                     lambda: lease[0])
    run.add([grant(1, direct=True)])
    assert pool.sent == [] and events.heard == [], "handed over with the lease lapsed"
    lease[0] = True
    run.lease_renewed()
    assert events.heard == [1] and started(pool) == [1]


def test_queued_grants_start_by_priority_and_fitting_ones_pass_a_blocked_one():
    run, pool, events = runner(CPU=4, R=1)
    run.add([grant(1, R=1, CPU=1, direct=True)])             # holds R
    run.placements[99] = (0, {"CPU": 2 * UNIT})              # an actor holds 2 CPUs
    run.slots[0].used["CPU"] += 2 * UNIT
    run.slots[0].placements += 1
    run.add([grant(2, priority=1, R=1, CPU=1), grant(3, priority=5, CPU=1),
             grant(4, priority=9, CPU=2)])
    events.ack()
    # 4 (priority 9) needs 2 CPUs, only 1 is free: it waits; 3 fits beside it and starts;
    # 2 needs R, held by 1.
    assert started(pool) == [1, 3]
    run.free(1)
    events.ack()
    assert started(pool) == [1, 3, 2]


def test_a_starving_grant_is_no_longer_passed_over():
    run, pool, events = runner(CPU=2)
    run.placements[99] = (0, {"CPU": UNIT})
    run.slots[0].used["CPU"] = UNIT
    run.slots[0].placements = 1
    long_ago = time.monotonic() - 60
    run.add([grant(1, priority=1, since=long_ago, CPU=2), grant(2, CPU=1)])
    events.ack()
    assert started(pool) == [], "a grant that has waited past starve is not overtaken"


def test_a_worker_holds_at_most_delegate_queued_grants_announced_as_held():
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    run.add([grant(t) for t in range(2, 2 + 3 * DELEGATE)])
    events.ack()
    handed = [t for t, ctx in pool.sent if ctx.get("queued")]
    assert len(handed) == DELEGATE and set(handed) <= set(events.heard)
    assert all(ctx["taken"] == {"CPU": UNIT} for _, ctx in pool.sent)


def _one_running_and_one_delegated() -> tuple[TaskRunner, FakePool, Events]:
    """Task 1 runs on the slot's one CPU; task 2 is handed to its worker to start later
    (announced held; the hand-off itself waits for the broker's ack)."""
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    run.add([grant(2)])
    assert 2 in run.slots[0].delegated and events.waiting
    return run, pool, events


def test_a_queued_grant_cancelled_before_its_hand_off_is_acknowledged_never_reaches_it():
    # The broker cancels only what it has not heard held; the cancel overtakes the ack.
    run, pool, events = _one_running_and_one_delegated()
    run.cancel(2)
    events.ack()
    assert ("run", 2) not in pool.log, "the cancelled grant reached its worker and ran"
    assert events.results[2][1]["type"] == "CancelledError"
    assert 2 not in run.slots[0].delegated and 2 not in run.grants


def test_a_grant_cancelled_before_its_hand_off_is_acknowledged_frees_what_it_took():
    run, pool, events = runner(CPU=1)
    run.add([grant(1)])  # (queued at the broker: the agent starts it, once acknowledged)
    run.cancel(1)
    events.ack()
    assert ("run", 1) not in pool.log, "the cancelled grant reached its worker and ran"
    assert events.results[1][1]["type"] == "CancelledError"
    assert run.slots[0].used.get("CPU", 0) == 0
    run.add([grant(2, direct=True)])
    events.ack()
    assert started(pool) == [2]


def test_a_grant_cancelled_before_its_worker_is_ready_is_never_sent():
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    worker.ready = False  # a new process, still starting
    run.add([grant(2)])
    run.cancel(2)
    assert events.results[2][1]["type"] == "CancelledError"
    events.ack()
    assert 2 not in [t for t, _ in pool.sent], "a cancelled grant was handed over"


def test_a_direct_grant_cancelled_while_its_process_starts_never_runs():
    # The broker asks (a direct grant may have begun the moment it arrived): one still in
    # the backlog of a process that is starting has not, and is cancelled for good.
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    (worker,) = pool.by_slot.values()
    run.free(1)
    worker.ready = False  # (it died, and a new one is starting, say)
    run.add([grant(2, direct=True)])
    assert worker.backlog and 2 not in [t for t, _ in pool.sent]
    run.cancel(2)
    assert worker.backlog == [] and events.results[2][1]["type"] == "CancelledError"
    assert run.slots[0].used.get("CPU", 0) == 0 and 2 not in run.grants
    run.cancel(1)  # (ended: nothing to do)


def test_a_grant_given_back_while_its_worker_starts_is_never_sent():
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    worker.ready = False
    run.add([grant(2)])
    events.ack()  # sent: into the backlog of a process not ready yet
    worker.backlog = [([[2, 1, [], {}]], [b"x"])]
    run.give_back_unstarted()
    assert worker.backlog == [], "a grant given back would still start once it is ready"


def test_a_task_its_worker_said_started_is_lost_with_it_though_its_start_log_forgot():
    """The start log is a ring: a long task's entry can be overwritten by later starts.
    What the worker reported started is known started all the same."""
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [1], "results": []}, [])  # type: ignore[arg-type]
    pool.start_log = set()  # overwritten
    worker.proc.returncode = -9
    run.reap()
    assert events.results[1][1]["type"] == "WorkerLostError", (
        "a task that began was taken for one that never did (it would run again)")
    assert 1 not in run.grants


def test_renewing_the_lease_wakes_a_worker_holding_queued_grants():
    run, pool, events = _one_running_and_one_delegated()
    events.ack()
    (worker,) = pool.by_slot.values()
    run.lease_renewed()
    assert pool.touched == [worker], (
        "a worker that held queued grants while the lease lapsed never starts them")



def test_a_forced_cancel_kills_the_worker_of_a_call_that_does_not_stop():
    run, pool, events = runner(CPU=2)
    run.add([grant(1, direct=True), grant(2, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [1, 2], "results": []}, [])  # type: ignore[arg-type]
    run.cancel(1, force=True)
    assert ("cancel", {"ids": [1], "force": True}) in pool.log
    run.slots[0].stopping[1] = 0.0  # its grace is over
    run.reap()
    assert worker.proc.returncode == -9 and worker.stopped_for == 1
    run.reap()  # the process is gone
    assert events.results[1][1]["type"] == "CancelledError"
    lost = events.results[2][1]
    assert lost["type"] == "WorkerLostError" and "cancelled with force" in lost["message"]


def test_a_task_stopped_for_its_nodes_memory_fails_so_and_its_bystanders_are_told_why():
    run, pool, events = runner(CPU=2)
    run.add([grant(1, direct=True), grant(2, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [1, 2], "results": []}, [])  # type: ignore[arg-type]
    error = {"type": "MemoryLimitError", "message": "node out of memory on agent a: ..."}
    run.cancel(1, force=True, error=error)
    run.slots[0].stopping[1] = 0.0  # its grace is over
    run.reap()
    run.reap()  # the process is gone
    assert events.results[1][1] == error
    lost = events.results[2][1]["message"]
    assert "killed to stop task 1, stopped as its node ran low on memory" in lost, lost
    assert not run.slots[0].stop_errors


def test_a_task_stopped_for_its_nodes_memory_that_ends_in_time_leaves_nothing_behind():
    run, pool, events = runner(CPU=2)
    run.add([grant(1, direct=True)])
    events.ack()
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [1], "results": []}, [])  # type: ignore[arg-type]
    run.cancel(1, force=True, error={"type": "MemoryLimitError", "message": "node out"})
    run.free(1)  # (its call unwound: the worker reported it failed)
    run.reap()
    assert not run.slots[0].stopping and not run.slots[0].stop_errors


def test_a_forced_cancel_of_a_grant_waiting_for_its_starting_worker_frees_it_unstarted():
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    run.free(1)
    (worker,) = pool.by_slot.values()
    worker.ready = False  # a new process, still starting: grant 2 waits in its backlog
    run.add([grant(2, direct=True)])
    events.ack()
    worker.backlog = [([[2, 1, [], {}]], [b"x"])]  # where the pool keeps it meanwhile
    run.cancel(2, force=True)
    assert events.results[2][1]["type"] == "CancelledError"
    assert not worker.backlog and 2 not in run.grants
    assert run.slots[0].used.get("CPU", 0) == 0


# -- recalls: queued grants the broker asks back ------------------------------------------


def test_a_recalled_grant_its_worker_had_not_begun_is_given_back_once_dropped():
    run, pool, events = _one_running_and_one_delegated()
    events.ack()  # (handed over: its worker holds it, to start when room frees)
    assert ("run", 2) in pool.log
    run.recall([2])
    assert ("cancel", {"ids": [2]}) in pool.log and events.returned == []
    assert run.settling(), "given back only once its worker says it dropped it"
    run.recall([2])  # (asked again: asked of its worker once)
    assert pool.log.count(("cancel", {"ids": [2]})) == 1
    (worker,) = pool.by_slot.values()
    run.done(worker, {"results": [], "dropped": [2]}, [])  # type: ignore[arg-type]
    assert events.returned == [2] and 2 not in run.grants and not run.settling()
    assert 2 not in events.results, "a grant given back is not a result"


def test_a_recalled_grant_its_worker_began_as_it_was_asked_runs_on_and_is_not_given_back():
    # The request crossed the start: the worker began it (room freed) before the cancel
    # reached it. It runs here, once; it is never given back to run elsewhere.
    run, pool, events = _one_running_and_one_delegated()
    events.ack()
    run.recall([2])
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [2], "results": [[1, "ok", 0, {}]]}, [[]])  # type: ignore
    assert events.returned == [] and 2 in run.grants and run.grants[2].running
    assert not run.settling(), "an answered request still counted as waiting"
    run.recall([2])  # (asked again after it began: left alone)
    assert events.returned == [] and pool.log.count(("cancel", {"ids": [2]})) == 1


def test_a_recalled_grant_whose_hand_off_waits_for_the_ack_never_reaches_its_worker():
    run, pool, events = _one_running_and_one_delegated()
    run.recall([2])
    assert events.returned == [2] and 2 not in run.grants
    assert 2 not in run.slots[0].delegated and not run.slots[0].delegated_taken.get("CPU")
    events.ack()
    assert ("run", 2) not in pool.log, "a grant given back reached its worker"


def test_recalled_grants_waiting_here_go_back_and_begun_or_direct_ones_stay():
    run, pool, events = runner(CPU=1)
    run.add([grant(1, direct=True)])
    events.ack()
    run.add([grant(t) for t in range(2, 4 + DELEGATE)])  # (past what its worker may hold)
    waiting = [g.task for g in run.slots[0].waiting]
    assert waiting
    run.recall([1, *waiting, 999])
    assert events.returned == waiting and not run.slots[0].waiting
    assert 1 in run.grants, "a running (direct) grant was given back"


def test_a_recalled_grant_whose_worker_died_unasked_is_given_back_not_run_again():
    # Asked of its worker, which died before it answered: the grant never began (its
    # start log says so), and it was asked back: it goes back now, not to a new worker
    # (where, held again, a later request would take it for one already asked).
    run, pool, events = _one_running_and_one_delegated()
    run.add([grant(3)])
    events.ack()
    run.recall([2, 3])
    assert pool.log.count(("cancel", {"ids": [2]})) == 1
    (worker,) = pool.by_slot.values()
    worker.proc.returncode = -9
    run.reap()  # (1 never began either: it runs again, in a new process)
    assert sorted(events.returned) == [2, 3] and set(run.grants) == {1}
    assert not run.slots[0].delegated and not run.settling()


def test_a_recalled_grant_its_worker_began_is_asked_back_again_if_it_comes_back():
    # It began as it was asked (then its worker died: lost, retried here, queued again).
    # Asked back again, it must be asked of its new worker, not taken for one asked.
    run, pool, events = _one_running_and_one_delegated()
    events.ack()
    run.recall([2])
    (worker,) = pool.by_slot.values()
    run.done(worker, {"started": [2], "results": [[1, "ok", 0, {}]]}, [[]])  # type: ignore
    worker.proc.returncode = -9
    run.reap()
    assert events.results[2][1]["type"] == "WorkerLostError"
    run.add([grant(4, direct=True), grant(2)])  # (the broker's retry, behind another)
    events.ack()
    assert 2 in run.slots[0].delegated
    run.recall([2])
    assert pool.log.count(("cancel", {"ids": [2]})) == 2, "the new worker was never asked"
