"""The task graph: every task the broker holds, its dependencies, outcome and result.

A task is held by its client's reference and by each unfinished dependent, and dropped
once it has finished and nobody holds it. Outcomes pass down the graph: a result readies
the dependents that waited only for it; a failure fails every dependent, transitively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core import protocol as P
from ..core.tasks import FINISHED, Task, TaskState, set_state, state_word
from .census import Census


class TaskGraph:
    """Tasks by id, linked to their dependencies.

    ON_READY(task) is called when a task's last dependency has its result (the caller
    queues it); ON_RECORDED(task) after a task's outcome is recorded, before it is passed
    on to its dependents (the caller delivers it and updates jobs and actors).
    """

    def __init__(self, on_ready: Callable[[Task], None],
                 on_recorded: Callable[[Task], None],
                 reserve_ids: Callable[[int], int] | None = None, first_id: int = 1,
                 on_dropped: Callable[[Task], None] = lambda task: None) -> None:
        self.tasks: dict[int, Task] = {}
        # A reference to a result kept on agents (the broker's ``objects`` sets it).
        self.refer: Callable[[Task], Any] = lambda task: None
        # Held tasks by state, kept as they change (every change goes through here).
        self.census = Census()
        # Tasks finished in this broker's life, by how (finished, error, cancelled): for its
        # metrics.
        self.finished: dict[str, int] = {"finished": 0, "error": 0, "cancelled": 0}
        self._on_dropped = on_dropped  # a finished task nobody holds is forgotten
        self._next_id = first_id - 1
        self._on_ready = on_ready
        self._on_recorded = on_recorded
        # RESERVE_IDS(above) durably notes a new ceiling for ids (the state store), so
        # that a restarted broker never hands out an id again; None: ids live in memory.
        self._reserve_ids = reserve_ids
        self._ceiling = self._next_id

    def new_id(self) -> int:
        """Return a task id never used before on this cluster."""
        self._next_id += 1
        if self._reserve_ids is not None and self._next_id > self._ceiling:
            self._ceiling = self._reserve_ids(self._next_id)
        return self._next_id

    def skip_past(self, task_id: int) -> None:
        """Never hand out TASK_ID or below from now (an agent runs a task of that id, from
        a state this broker no longer has)."""
        if task_id > self._next_id:
            self._next_id = task_id
            if self._reserve_ids is not None and self._next_id > self._ceiling:
                self._ceiling = self._reserve_ids(self._next_id)

    def get(self, task_id: int) -> Task | None:
        return self.tasks.get(task_id)

    def add(self, task: Task) -> None:
        """Hold TASK (link its dependencies next, unless it fails first)."""
        self.tasks[task.id] = task
        self.census.enter(task)

    def set_state(self, task: Task, new: TaskState) -> None:
        """Move TASK, held here, to NEW (as ``core.tasks.set_state`` allows)."""
        self.census.leave(task)
        try:
            set_state(task, new)
        finally:
            self.census.enter(task)

    def restored_as(self, task: Task, state: TaskState) -> None:
        """Put TASK, just restored from the state store, in STATE as it was kept."""
        self.census.leave(task)
        task.state = state
        self.census.enter(task)

    def drop(self, task: Task) -> None:
        """Stop holding TASK (finished, or restored and needed by nobody)."""
        if self.tasks.pop(task.id, None) is not None:
            self.census.leave(task)

    def link(self, task: Task, deps: list[int]) -> None:
        """Make TASK wait for DEPS (ids of tasks held here); ready or fail it at once if
        they have all finished already."""
        failed_dep: Task | None = None
        if deps:
            task.deps = [*task.deps, *deps]
        for dep_id in deps:
            dep = self.tasks[dep_id]
            dep.holders += 1
            if dep.state is TaskState.FAILED:
                failed_dep = dep
            elif dep.state is not TaskState.DONE or dep.size:
                # (a result kept on agents knows who reads it too: lost with them, its
                # readers that have not begun wait for it again, or fail: see lineage)
                if dep.state is not TaskState.DONE:
                    task.missing += 1
                if isinstance(dep.dependents, list):
                    dep.dependents.append(task.id)
                else:
                    dep.dependents = [task.id]
        if failed_dep is not None:
            self.finish(task, failed_dep.outcome, failed_dep.result, failed_dep.info)
        elif task.missing == 0:
            self._on_ready(task)

    def inputs(self, task: Task) -> tuple[list[int], list[Any], dict[int, Any]]:
        """Return how many frames each dependency's result has, those frames in order, and
        references to the results kept on agents (by the dependency's place; its count
        -1): what a worker needs besides the call itself."""
        counts: list[int] = []
        frames: list[Any] = []
        refs: dict[int, Any] = {}
        for index, dep_id in enumerate(task.deps):
            dep = self.tasks[dep_id]
            if dep.size:
                counts.append(-1)
                # (no holder connected, a broker restarted before they came back: its
                # worker says it cannot read it, and the task goes again, uncharged)
                refs[index] = self.refer(dep) or [dep.id, dep.size, b"", []]
                continue
            counts.append(len(dep.result))
            frames.extend(dep.result)
        return counts, frames, refs

    def unhold(self, task: Task) -> None:
        """One holder of TASK let go (its client, or a dependent that finished): one that
        has finished and that nobody holds is dropped, letting go of its inputs in turn
        (a worklist: a chain of 100,000 is dropped without deep recursion)."""
        work = [task]
        while work:
            current = work.pop()
            current.holders -= 1
            if current.holders <= 0 and current.state in FINISHED:
                self._forget(current, work)

    def _forget(self, task: Task, work: list[Task]) -> None:
        """Drop TASK, finished and held by nobody; put its inputs on WORK to let go of."""
        self.drop(task)
        self._on_dropped(task)
        work.extend(self.tasks[d] for d in task.deps if d in self.tasks)
        task.deps = []

    def fail(self, task: Task, error: str, message: str) -> None:
        """Fail TASK with the zres error type ERROR (a class name) and MESSAGE."""
        self.finish(task, P.FAILED, [], {"type": error, "message": message})

    def finish(self, task: Task, outcome: str, frames: Sequence[Any],
               info: dict[str, Any]) -> None:
        """Record TASK's outcome and pass a failure on to its dependents.

        A worklist, not recursion: a failure at the head of a chain of 100,000 tasks fails
        them all without overflowing the stack.
        """
        work = [task]
        while work:
            current = work.pop()
            failed = self._record(current, outcome, frames, info)
            if outcome != P.OK:
                work.extend(failed)

    def _record(self, task: Task, outcome: str, frames: Sequence[Any],
                info: dict[str, Any]) -> list[Task]:
        """Finish one task; return the waiting dependents a failure must also fail."""
        new = TaskState.DONE if outcome == P.OK else TaskState.FAILED
        if task.state in FINISHED:
            self.set_state(task, new)  # (raises: a task ends once, its outcome kept)
        # A result kept on an agent may be lost with it (see ``lineage``): its task keeps
        # its dependents (they wait for it again, or fail), and, while it may run again
        # (retries left, or recompute=True), its call and its inputs.
        kept = outcome == P.OK and task.size > 0
        again = kept and (task.retries > 0 or task.recompute)
        # Its outcome first: the census counts a failure as error or cancelled by it.
        task.outcome, task.result, task.info = outcome, frames, info
        if not again:
            task.payload = []
        self.set_state(task, new)
        self.finished[state_word(task)] += 1
        self._on_recorded(task)
        failed: list[Task] = []
        for dependent_id in task.dependents:
            dependent = self.tasks.get(dependent_id)
            if dependent is None or dependent.state is not TaskState.WAITING:
                continue
            if outcome != P.OK:
                failed.append(dependent)
            else:
                dependent.missing -= 1
                if dependent.missing == 0:
                    self._on_ready(dependent)
        if not kept:
            task.dependents = []
        if not again:  # (the dependencies' results are no longer needed by this task)
            for dep_id in task.deps:
                if dep_id in self.tasks:
                    self.unhold(self.tasks[dep_id])
            task.deps = []
        if task.holders <= 0 and task.id in self.tasks:
            inputs: list[Task] = []
            self._forget(task, inputs)
            for dep in inputs:  # (those kept to run it again: see above)
                self.unhold(dep)
        return failed

    def waiting_for(self, task: Task) -> str:
        """Say which dependencies a waiting TASK still waits for."""
        names = [self.tasks[d].name for d in task.deps
                 if d in self.tasks and self.tasks[d].state not in FINISHED]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                         else "")
        return f"waiting for {task.missing} of {len(task.deps)} dependencies: {shown}"
