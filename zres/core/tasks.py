"""The broker's task record and its state machine."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .resources import Units


class TaskState(enum.Enum):
    WAITING = "waiting"      # for dependencies
    QUEUED = "queued"        # ready, waiting for resources
    RUNNING = "running"
    DONE = "done"            # finished with a result
    FAILED = "failed"        # raised, lost, infeasible or cancelled


FINISHED = frozenset({TaskState.DONE, TaskState.FAILED})

_ALLOWED = {
    TaskState.WAITING: {TaskState.QUEUED, TaskState.FAILED},
    # QUEUED -> WAITING, RUNNING -> WAITING: an input it was to read was lost with its
    # agent, and is being made again (issue 29's lineage).
    TaskState.QUEUED: {TaskState.RUNNING, TaskState.FAILED, TaskState.WAITING},
    # RUNNING -> QUEUED is a retry after its agent or worker was lost.
    TaskState.RUNNING: {TaskState.DONE, TaskState.FAILED, TaskState.QUEUED,
                        TaskState.WAITING},
    # DONE -> QUEUED or WAITING: its result, kept on an agent, was lost with it, and it
    # runs again (it had retries left).
    TaskState.DONE: {TaskState.QUEUED, TaskState.WAITING},
    TaskState.FAILED: set(),
}


class IllegalTransition(RuntimeError):
    pass


class _NoInfo(dict):  # type: ignore[type-arg]
    """The info of every task that has no outcome yet: one empty map, never written to."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a task's info is replaced whole, never changed in place")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse  # type: ignore[assignment]


NO_INFO: dict[str, Any] = _NoInfo()


@dataclass(slots=True)
class Task:
    id: int
    client: bytes            # routing id of the submitting client
    local_id: int            # the client's own id for it
    units: Units
    priority: int
    retries: int             # retries left for losses while running
    name: str
    strict: bool             # fail at once if infeasible, rather than wait
    payload: list[Any]       # opaque frames: the pickled call
    # What a task holds besides (its dependencies, dependents, result, outcome's info)
    # starts as the one shared empty value: a million queued tasks hold none of their own.
    deps: Sequence[int]
    state: TaskState = TaskState.WAITING
    missing: int = 0         # dependencies not finished yet
    dependents: Sequence[int] = ()
    holders: int = 1         # the client's reference plus each unfinished dependent
    outcome: str = ""
    result: Sequence[Any] = ()
    info: dict[str, Any] = field(default_factory=lambda: NO_INFO)
    agent: str = ""
    warned: str = ""         # the infeasibility reason last reported, if any
    actor: str = ""          # for a method call: the actor it goes to
    creates: str = ""        # for an actor's construction: the actor it makes
    kind: int = 0            # hash of the pickled function: tasks of a kind run alike
    # The agents it runs on, by name (Dask's workers=; none: any); allow_other_workers:
    # it only prefers them.
    workers: tuple[str, ...] = ()
    allow_other_workers: bool = False
    started_at: float = 0.0  # when its grant started, by the broker's clock
    attempt: int = 0         # grants so far: the current one's number
    # What its agent has said of the current grant: handed to a worker process (so it may
    # have started), and begun. A lost agent's other grants never started: they go again
    # with no retry spent.
    held: bool = False
    begun: bool = False
    # A forced cancel is stopping it where it runs: it ends cancelled once its agent says
    # it is gone (its resources free then), never retried.
    stopping: bool = False
    # Its client asked to cancel it once it was held: its agent says whether it had begun
    # (it runs on) or not (it ends cancelled, and so it does if it comes back unstarted).
    cancelling: bool = False
    # Written to the broker's state store (a client's Python task): restored after a
    # restart.
    kept: bool = False
    # Its client wants to know when it ends, not its result (a Dask graph's intermediate,
    # which only its dependents read): a success is told without the result's frames.
    quiet: bool = False
    # The name of the key that submitted it (for a client made inside a task: that task's
    # owner); "" without keys.
    owner: str = ""
    # It outlives its client (submit(detached=True), Client(detach=True), a detached job):
    # when its client goes it runs on, listed, for its owner to find and cancel by id.
    detached: bool = False
    # Its client went (closed, killed, silent) before it ended: nobody waits for it.
    client_gone: bool = False
    # A result kept on agents (issue 29): its size in bytes (0: none such, its frames are
    # in ``result``) and the agents holding a copy, the one that made it first.
    size: int = 0
    held_at: Sequence[str] = ()
    lost: str = ""           # why its result kept on agents is gone for good ("": it is not)
    # Its result, lost with its agents, is made again even with no retries left (opted in
    # with submit(recompute=True): its body may run more than once).
    recompute: bool = False
    # Stopped for its memory (MemoryLimitError), it runs again if it has retries left
    # (submit(retry_oom=True)); by default it fails, as it would most likely fail again.
    retry_oom: bool = False
    call_in: int = -1        # the input its call was put in (too big to travel inline)
    # Gangs (issue 31): the placement group it makes (its construction: it ends once
    # every bundle is reserved), or the bundle it runs in, (group id, index).
    group: str = ""
    bundle: tuple[str, int] | None = None


def state_word(task: Task) -> str:
    """TASK's state in the words users read (``core.report.STATES``): a failed task is
    ``cancelled`` if it was cancelled (or stopped, or its input was), else ``error``."""
    if task.state is TaskState.FAILED:
        return "cancelled" if task.info.get("type") == "CancelledError" else "error"
    return _WORDS[task.state]


_WORDS = {TaskState.WAITING: "waiting", TaskState.QUEUED: "queued",
          TaskState.RUNNING: "running", TaskState.DONE: "finished"}


def set_state(task: Task, new: TaskState) -> None:
    """Move TASK to NEW, refusing any transition the table does not allow."""
    if new not in _ALLOWED[task.state]:
        raise IllegalTransition(f"task {task.id}: {task.state.value} -> {new.value}")
    task.state = new
