"""What becomes of results lost with the agents that held them (issue 29).

A result kept on agents (``objects``) is lost when the last of them goes. If it is still
needed (a client holds its future, or a task waits for it), its task runs again when it
may: it had retries left (one is spent) or was submitted with ``recompute=True``, and it
still has its call and its inputs (kept for that: see the task graph). Its dependents
that had not begun wait for it again; one that had (its worker could not fetch the input)
says so, having run nothing, and waits too; so does one granted before the loss that goes
again (its agent or worker lost): its new grant must carry the input made again. A task
that may not run again (``retries=0``: its body runs at most once, whatever fails) is lost
for good: what waits for it fails with ``ResultLostError`` naming the agent, and its
client's future fails so when it asks for the result. So does a task made again that
fails (its agent lost while it ran with no retries left, it raised, it was cancelled), and
so does a task that would be made again from it: nothing waits for a result that is no
longer being made. A task that cannot read an input whose holders are all away (a broker
restarted, and they are not back yet) waits for one of them, or for the input's loss.
A task restored by a restarted broker is made again only if it has no inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.tasks import NO_INFO, Task, TaskState
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from .graph import TaskGraph

log = get_logger("zres.broker")
LOST = "ResultLostError"


class Lineage:
    """Running lost results' tasks again, over GRAPH and SCHED: ENQUEUE(task) queues a
    task for resources; CHANGED(task) writes it again (the state store)."""

    def __init__(self, graph: TaskGraph, sched: Scheduler, enqueue: Callable[[Task], None],
                 changed: Callable[[Task], None]) -> None:
        self._graph = graph
        self._sched = sched
        self._enqueue = enqueue
        self._changed = changed
        # Tasks waiting for an input whose holders are all away (a broker restarted, and
        # they have not come back yet): task id -> that input's. Queued again, their
        # workers failed to find it at once, again and again, for the whole grace period.
        self._parked: dict[int, int] = {}

    def lost(self, tasks: list[Task], why: str) -> None:
        """TASKS' results have no copy left (WHY: where they were); inputs first."""
        for task in sorted(tasks, key=lambda t: t.id):
            if task.state is not TaskState.DONE or task.id not in self._graph.tasks:
                continue
            # (an input lost for good, or whose own making again failed: it cannot run)
            gone = next(filter(None, (gone_why(self._graph.tasks.get(d), d)
                                      for d in task.deps)), "")
            may = task.retries > 0 or task.recompute
            if may and task.payload and not gone:
                if not task.recompute:  # (recompute=True: it was asked for, at no charge)
                    task.retries -= 1
                log.warning("result_lost_run_again", task=task.name, id=task.id, why=why,
                            retries_left=task.retries)
                self._again(task)
            else:
                if may and not gone:  # (restored by a broker restarted: see keeping)
                    gone = "its inputs were not kept when the broker restarted"
                task.lost = (f"the result of task {task.name} was lost with {why}, and it "
                             + (f"cannot be made again: {gone}" if gone else
                                "may not run again (retries=0: its body runs at most once; "
                                "submit(recompute=True) lets it)"))
                log.warning("result_lost", task=task.name, id=task.id, why=why)
                self._gone(task)
            self._changed(task)

    def _again(self, task: Task) -> None:
        """Run TASK (done, its result lost) again; what had not begun waits for it."""
        task.outcome, task.result, task.info, task.size, task.held_at = "", (), NO_INFO, 0, ()
        task.held = task.begun = False
        task.missing = sum(1 for d in task.deps if not _usable(self._graph.tasks[d]))
        if task.missing:  # an input of its own is being made again too: after it
            self._graph.set_state(task, TaskState.WAITING)
            for dep_id in task.deps:
                dep = self._graph.tasks[dep_id]
                if not _usable(dep) and task.id not in dep.dependents:
                    dep.dependents = [*dep.dependents, task.id]
        else:
            self._graph.set_state(task, TaskState.QUEUED)
            self._enqueue(task)
        for dependent_id in task.dependents:
            dependent = self._graph.get(dependent_id)
            if dependent is None:
                continue
            if dependent.state is TaskState.WAITING:
                if self._parked.pop(dependent_id, None) != task.id:  # (counted if parked)
                    dependent.missing += 1
            elif dependent.state is TaskState.QUEUED and not dependent.actor:
                self._sched.dequeue(dependent.id)
                self._graph.set_state(dependent, TaskState.WAITING)
                dependent.missing += 1

    def waits_again(self, task: Task) -> bool:
        """TASK (granted, and going again: its agent or worker was lost, or it never
        started there) may have inputs lost since it was granted: if one is being made
        again, it waits for it; if one is lost for good, it fails. Return whether it was
        so (else it may be queued: its inputs are there). Queued at once, its grant would
        carry what such an input has now, nothing, and its call would find no input."""
        waits = 0
        for dep_id in task.deps:
            dep = self._graph.get(dep_id)
            why = gone_why(dep, dep_id)
            if dep is None or why:
                self._graph.fail(task, LOST, f"task {task.name} cannot run: {why}")
                return True
            if not _usable(dep):
                waits += 1
                if task.id not in dep.dependents:
                    dep.dependents = [*dep.dependents, task.id]
        if waits:
            self._graph.set_state(task, TaskState.WAITING)
            task.missing = waits
        return bool(waits)

    def _gone(self, task: Task) -> None:
        """TASK's result is lost for good: what waits for it fails (what runs with it as
        an input fails when it cannot read it: see ``input_lost``)."""
        for dependent_id in task.dependents:
            dependent = self._graph.get(dependent_id)
            if dependent is None or dependent.state not in (TaskState.WAITING,
                                                            TaskState.QUEUED):
                continue
            if dependent.state is TaskState.QUEUED and not dependent.actor:
                self._sched.dequeue(dependent.id)
            self._parked.pop(dependent_id, None)
            self._graph.fail(dependent, LOST, f"task {dependent.name} cannot run: {task.lost}")

    def input_lost(self, task: Task, info: dict[str, Any],
                   again: Callable[[Task], None]) -> None:
        """TASK's worker could not read an input (INFO names it) and ran nothing: it runs
        again, uncharged (AGAIN queues it), when the input is there; or it fails with it."""
        dep = self._graph.get(info.get("input"))  # type: ignore[arg-type]
        why = gone_why(dep, info.get("input"))
        if dep is None or why:
            self._graph.fail(task, LOST, f"task {task.name} cannot run: {why}")
        elif _usable(dep) and self._graph.refer(dep) is not None:
            again(task)  # (its holder still answers, or another has a copy)
        else:  # it is being made again, or its holders are away: after it, or them
            self._graph.set_state(task, TaskState.WAITING)
            task.held = task.begun = False
            task.missing += 1
            if task.id not in dep.dependents:
                dep.dependents = [*dep.dependents, task.id]
            if _usable(dep):
                self._parked[task.id] = dep.id  # (see holders_back, and _again, _gone)

    def holders_back(self) -> None:
        """An agent came back: queue the tasks parked on an input it holds."""
        for task_id, dep_id in list(self._parked.items()):
            task, dep = self._graph.get(task_id), self._graph.get(dep_id)
            if task is None or task.state is not TaskState.WAITING or dep is None:
                del self._parked[task_id]  # (ended meanwhile: cancelled, failed)
            elif _usable(dep) and self._graph.refer(dep) is not None:
                del self._parked[task_id]
                task.missing -= 1
                if not task.missing:
                    self._graph.set_state(task, TaskState.QUEUED)
                    self._enqueue(task)


def gone_why(task: Task | None, task_id: Any) -> str:
    """Why the result of TASK (TASK_ID; None: no longer held) can never be read again, or
    "" while it can be, or is being made again. A task made again that failed (its agent
    was lost while it ran, with no retries left; it raised; it was cancelled) is lost for
    good: whoever waited for it to be made again is told so, never left waiting."""
    if task is None:
        return f"its input {task_id} is gone"
    if task.lost or task.state is not TaskState.FAILED:
        return task.lost
    how = ("its body raised an exception" if task.outcome == P.RAISED else
           f"it failed: {task.info.get('message') or task.info.get('type') or 'unsaid'}")
    return f"the result of task {task.name} was lost with its agent, and when it ran again {how}"


def _usable(task: Task) -> bool:
    """Whether TASK's result can be read now (inline, or held somewhere)."""
    return task.state is TaskState.DONE and (not task.size or bool(task.held_at))
