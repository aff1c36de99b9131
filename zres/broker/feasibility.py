"""Whether queued work could ever run on the agents there now (mixed into ``Dispatcher``):
a task no registered agent could hold is *infeasible*: its client is told at once (once
per reason), a strict one fails, and all are judged again as agents come and go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import protocol as P
from ..core.tasks import Task
from ..logs import get_logger
from ..scheduler.gangs import Gang
from ..scheduler.records import Inside, Shape, Workers, workers, workers_of

if TYPE_CHECKING:
    from ..scheduler.policy import Scheduler
    from .graph import TaskGraph
    from .outbox import Send

log = get_logger("zres.broker")


class Feasibility:
    """Mixed into the ``Dispatcher``, whose records it reads."""

    if TYPE_CHECKING:  # (the dispatcher's own, used here)
        _send: Send
        _graph: TaskGraph
        _sched: Scheduler
        _warned: set[int]

        def _recheck_gang(self, task_id: int) -> None: ...

    def warn_infeasible(self, task: Task, reason: str) -> None:
        """Tell TASK's client, once per reason, that no agent could ever run it."""
        if task.warned == reason:
            return
        task.warned = reason
        self._warned.add(task.id)
        log.warning("task_infeasible", task=task.name, id=task.id, reason=reason)
        self._send(task.client, P.WARN, {"id": task.local_id, "reason": reason})

    def recheck_feasibility(self) -> None:
        """Judge the queued tasks again against the agents there now: each shape of request
        once (its tasks fit or fail alike), then task by task only the tasks of a shape
        that cannot run and those told before that theirs could not (the first agent to
        join a million queued tasks held the loop for a second, judging each)."""
        queue, waiting = self._sched.queue, self._sched.waiting
        never = {lane for lane in queue.lanes() if not _gang_lane(lane[1])
                 and self._sched.infeasible_reason(*_request(lane[1])) is not None}
        ids = {task_id for task_id in self._warned if task_id in waiting}
        ids.update(task_id for lane in never for task_id in queue.members(lane))
        ids.update(self._sched.gangs.gangs)  # (few; each judged whole, across agents)
        self._warned = set()
        for task_id in sorted(ids):  # (in the order they came)
            if self._sched.gang(task_id) is not None:
                self._recheck_gang(task_id)
                continue
            task = self._graph.get(task_id)
            if task is None:
                continue  # an actor's restart: it waits for a fitting agent to join
            reason = None if task.bundle else self._sched.infeasible_reason(task.units,
                                                                             where(task))
            if reason is None:
                task.warned = ""
            elif task.strict:
                self._sched.dequeue(task.id)
                self._graph.fail(task, "InfeasibleError",
                                 f"task {task.name} (id {task.id}) is infeasible: {reason}")
            else:
                self.warn_infeasible(task, reason)


def _gang_lane(shape: Shape) -> bool:
    """Whether SHAPE is a gang's, or work's inside a bundle (its tail is no resource):
    gangs are judged whole below, and work in a bundle draws on that bundle alone."""
    return bool(shape) and type(shape[-1]) in (Gang, Inside)


def _request(shape: Shape) -> tuple[dict[str, int], Workers | None]:
    """The resources and the agents (None: any) of a request of SHAPE."""
    where = workers_of(shape)
    return dict(shape[:-1] if where is not None else shape), where


def where(task: Task) -> Workers | None:
    """The agents TASK may run on, or prefers, as the scheduler takes them (None: any)."""
    return workers(task.workers, task.allow_other_workers) if task.workers else None
