"""Gangs as the dispatcher moves them (mixed into ``Dispatcher``): a group's construction
queued as its gang, bundles reserved, bundles lost with their agents, work in ended groups
ended, and whether a gang could ever be placed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.tasks import FINISHED, Task, TaskState
from ...scheduler.records import Grant
from ..actor_records import ActorState
from .records import GroupState

if TYPE_CHECKING:
    from ...scheduler.policy import Scheduler
    from ..actors import ActorRouting
    from ..graph import TaskGraph
    from .groups import GroupTable
    from .ranks import RankTable

# An actor in one of these runs (constructed, or being): a failed group's carries on.
_RUNS = frozenset({ActorState.STARTING, ActorState.ALIVE})


class GangRouting:
    """Mixed into the ``Dispatcher``, whose records it changes."""

    if TYPE_CHECKING:  # (the dispatcher's own, used here)
        _graph: TaskGraph
        _sched: Scheduler
        _actors: ActorRouting
        _groups: GroupTable
        _ranks: RankTable

        def cancel(self, task: Task, force: bool = False) -> Any: ...
        def warn_infeasible(self, task: Task, reason: str) -> None: ...

    def _queue_gang(self, task: Task) -> None:
        """TASK, a placement group's construction or a multi-node job, is ready."""
        if task.group:
            reason = self._groups.queue(task)
        else:
            reason = self._ranks.queue(task)
        if reason is not None:
            self._gang_infeasible(task, reason)

    def _gang_infeasible(self, task: Task, reason: str) -> None:
        """No agents could ever hold TASK's gang: warn its client, or fail it (strict)."""
        if not task.strict:
            self.warn_infeasible(task, reason)
            return
        what = f"{self._groups.groups[task.group].label()}" if task.group else \
            f"job {task.name} (id {task.id})"
        self._graph.fail(task, "InfeasibleError", f"{what} is infeasible: {reason}")
        if task.group:
            group = self._groups.groups[task.group]
            self._groups.end(group, GroupState.FAILED, f"infeasible: {reason}")
        else:
            self._ranks.forget(task)

    def _recheck_gang(self, gang_id: int) -> None:
        """Judge gang GANG_ID again against the agents there now."""
        task = self._graph.get(gang_id)
        if task is None or task.state is not TaskState.QUEUED:
            return  # (a group reserved again after a loss: its construction has ended)
        reason = self._sched.gang_infeasible(gang_id)
        if reason is None:
            task.warned = ""
        else:
            self._gang_infeasible(task, reason)

    def _gang_placed(self, grant: Grant) -> None:
        """GRANT is a gang's bundle (the scheduler placed all of the gang's in one pass)."""
        if grant.task in self._groups.of_bundle:
            self._groups.placed(grant)
        else:
            self._ranks.placed(grant)

    def _bundles_lost(self, lost: list[int], why: str, left: bool = False) -> None:
        """Of LOST (the grants of a lost agent; LEFT: one that left, drained), the gangs'
        bundles: their gangs go."""
        for task_id in lost:
            if task_id in self._groups.of_bundle:
                self._groups.bundle_lost(task_id, why, left)
            elif self._ranks.is_rank(task_id):
                self._ranks.lost(task_id, why)

    def end_in_group(self, group_id: str, members: list[int], why: str,
                     stop_running: bool = True) -> None:
        """End the work placed in group GROUP_ID (MEMBERS: its tasks' ids), which ended
        (WHY): what waits fails; what runs is stopped and its actors are killed, unless
        not STOP_RUNNING (a group that failed, a bundle lost: what runs in its other
        bundles carries on until it ends, holding what it took, as when it is reserved
        again; an actor placed there that must restart cannot, its group gone)."""
        for actor in [a for a in self._actors.actors.values()
                      if a.bundle is not None and a.bundle[0] == group_id]:
            if stop_running or actor.state not in _RUNS:
                self._actors.kill(actor, f"{actor.label()} ended: {why}")
        for task_id in members:
            task = self._graph.get(task_id)
            if task is None or task.state in FINISHED:
                continue
            if task.state is TaskState.RUNNING:
                if stop_running:
                    self.cancel(task, force=True)
                continue
            if task.state is TaskState.QUEUED:
                self._sched.dequeue(task.id)
            self._graph.fail(task, "ZresError", f"task {task.name} (id {task.id}) cannot "
                             f"run: {why}")
