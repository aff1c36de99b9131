"""How many tasks the broker holds in each state, kept as they change: what ``status``,
the dashboard and ``/metrics`` report, without walking every task on the loop.

Every change of a held task's state goes through the task graph, which tells the census
what left and what entered. It counts them by state in the words users read
(``core.report.STATES``: a failed task is ``error`` or ``cancelled`` by its outcome's
type, recorded before it enters), the running ones also by owner and by whether their
client is gone; it keeps the running tasks in the order they began (the status lists the
first ones), and groups of tasks waiting outside the scheduler's queue (for dependencies,
or queued behind an actor's earlier calls) by request, each with a few member ids to
recognise it by. Every change costs O(1).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..core.report import STATES
from ..core.tasks import Task, TaskState, state_word
from ..scheduler.records import Shape, shape_of

_SAMPLES = 3  # member ids a group keeps, to name a few of its tasks

# A group of waiting tasks: the state they wait in, their request, and their actor (a
# method call's; "" for other tasks).
GroupKey = tuple[TaskState, Shape, str]


class Group:
    """Tasks waiting alike: how many, and a few of them (ids, oldest kept first)."""

    __slots__ = ("count", "samples")

    def __init__(self) -> None:
        self.count = 0
        self.samples: list[int] = []


class Census:
    """Counts of held tasks by state, the running ones in order, and waiting groups."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {word: 0 for word in STATES}
        self.running: dict[int, None] = {}   # started or granted, in the order granted
        # Running tasks (started or granted) by owner and whether their client is gone.
        self.owners: dict[tuple[str, bool], int] = {}
        self.groups: dict[GroupKey, Group] = {}
        # Tasks waiting (for dependencies or resources) by owner: its queued quota.
        self.waiting_by_owner: dict[str, int] = {}
        # The group each grouped task was counted in (a call's request changes once it
        # is made: what it left must be the group it entered).
        self._grouped: dict[int, GroupKey] = {}

    def enter(self, task: Task) -> None:
        """TASK is held in its current state."""
        state = task.state
        self.counts[state_word(task)] += 1
        if state is TaskState.WAITING or state is TaskState.QUEUED:
            self.waiting_by_owner[task.owner] = self.waiting_by_owner.get(task.owner, 0) + 1
        if state is TaskState.RUNNING:
            self.running[task.id] = None
            self._owned(task, 1)
        elif state is TaskState.WAITING or (state is TaskState.QUEUED and task.actor):
            key = (state, shape_of(task.units), task.actor)
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group()
            group.count += 1
            if len(group.samples) < _SAMPLES:
                group.samples.append(task.id)
            self._grouped[task.id] = key

    def leave(self, task: Task) -> None:
        """TASK is no longer held in its current state (it changes state, or is dropped)."""
        self.counts[state_word(task)] -= 1
        if task.state is TaskState.WAITING or task.state is TaskState.QUEUED:
            left = self.waiting_by_owner[task.owner] - 1
            if left:
                self.waiting_by_owner[task.owner] = left
            else:
                del self.waiting_by_owner[task.owner]
        if task.state is TaskState.RUNNING:
            self.running.pop(task.id, None)
            self._owned(task, -1)
            return
        key = self._grouped.pop(task.id, None)
        if key is None:
            return
        group = self.groups[key]
        group.count -= 1
        if group.count == 0:
            del self.groups[key]
        elif task.id in group.samples:
            group.samples.remove(task.id)

    def waiting_of(self, owner: str) -> int:
        """How many of OWNER's tasks wait, for dependencies or for resources."""
        return self.waiting_by_owner.get(owner, 0)

    def client_gone(self, task: Task) -> None:
        """TASK's client went before it ended: so marked, and counted so if it runs."""
        if task.client_gone:
            return
        if task.state is TaskState.RUNNING:
            self._owned(task, -1)
            task.client_gone = True
            self._owned(task, 1)
        task.client_gone = True

    def _owned(self, task: Task, change: int) -> None:
        key = (task.owner, task.client_gone)
        count = self.owners.get(key, 0) + change
        if count:
            self.owners[key] = count
        else:
            del self.owners[key]

    def waiting_groups(self) -> Iterator[tuple[GroupKey, Group]]:
        return iter(self.groups.items())
