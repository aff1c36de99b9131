"""The broker's task record and its state machine."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from .resources import Units


class TaskState(enum.Enum):
    WAITING = "waiting"      # for dependencies
    QUEUED = "queued"        # ready, waiting for resources
    RUNNING = "running"
    DONE = "done"            # finished with a result
    FAILED = "failed"        # raised, lost, infeasible or cancelled

    # (members are singletons, equal only to themselves: hashed by identity, in C, not by
    # Enum's own __hash__, a Python call per lookup: ~20 lookups per task on the broker)
    __hash__ = object.__hash__


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
class TaskMore:
    """What a task holds once it has run or ended, or was asked for something few tasks
    ask for: made the first time one of these is set (a queued task has none: ``Task``)."""

    outcome: str = ""
    result: Sequence[Any] = ()
    info: dict[str, Any] = field(default_factory=lambda: NO_INFO)
    agent: str = ""
    warned: str = ""         # the infeasibility reason last reported, if any
    actor: str = ""          # for a method call: the actor it goes to
    creates: str = ""        # for an actor's construction: the actor it makes
    # The agents it runs on, by name (Dask's workers=; none: any); its flag
    # allow_other_workers: it only prefers them.
    workers: tuple[str, ...] = ()
    started_at: float = 0.0  # when its grant started, by the broker's clock
    attempt: int = 0         # grants so far: the current one's number
    # A result kept on agents (issue 29): its size in bytes (0: none such, its frames are
    # in ``result``) and the agents holding a copy, the one that made it first.
    size: int = 0
    held_at: Sequence[str] = ()
    lost: str = ""           # why its result kept on agents is gone for good ("": it is not)
    call_in: int = -1        # the input its call was put in (too big to travel inline)
    # Gangs (issue 31): the placement group it makes (its construction: it ends once
    # every bundle is reserved), or the bundle it runs in, (group id, index).
    group: str = ""
    bundle: tuple[str, int] | None = None


_NONE = TaskMore()  # (never written to: read as every field's default)
_PLAIN = (str, int, float, tuple)  # (types whose values equal to a default can stand for it)


def _more(name: str) -> Any:
    """A ``Task`` attribute kept in its ``TaskMore``, read as the default while it has none."""
    default = getattr(_NONE, name)
    read = attrgetter(name)

    def get(task: Task) -> Any:
        more = task.more
        return default if more is None else read(more)

    def put(task: Task, value: Any) -> None:
        more = task.more
        if more is None:
            if value is default or (type(value) is type(default)
                                    and type(default) in _PLAIN and value == default):
                return  # (the default, unchanged: nothing to make)
            more = task.more = TaskMore()
        setattr(more, name, value)
    return property(get, put)


def _flag(bit: int) -> Any:
    """A ``Task`` attribute (a bool) kept as BIT of its ``flags``."""

    def get(task: Task) -> bool:
        return task.flags & bit != 0

    def put(task: Task, value: bool) -> None:
        task.flags = task.flags | bit if value else task.flags & ~bit
    return property(get, put)


@dataclass(slots=True)
class Task:
    """A task the broker holds. A million of them may wait at once (issue 28: at most
    1 KB of the broker each), so what few tasks have is in ``more``, made when first set,
    and its yes-or-no attributes are bits of one int; both read and written as
    attributes of their own names."""

    id: int
    client: bytes            # routing id of the submitting client
    local_id: int            # the client's own id for it
    units: Units
    priority: int
    retries: int             # retries left for losses while running
    # Its name; or, with ``numbered``, what comes before "-{local_id}" in it (a map's
    # tasks are named so by default: they share this one string): see ``name``.
    label: str
    strict: bool             # fail at once if infeasible, rather than wait
    payload: Sequence[Any]   # opaque frames: the pickled call
    # Its dependencies and dependents start as the one shared empty value: a million
    # queued tasks hold none of their own.
    deps: Sequence[int]
    state: TaskState = TaskState.WAITING
    missing: int = 0         # dependencies not finished yet
    dependents: Sequence[int] = ()
    holders: int = 1         # the client's reference plus each unfinished dependent
    kind: int = 0            # hash of the pickled function: tasks of a kind run alike
    # The name of the key that submitted it (for a client made inside a task: that task's
    # owner); "" without keys.
    owner: str = ""
    # The attributes made by _flag below; the usual ones in the low bits, so that their
    # usual sums are Python's shared small ints rather than an int object per task.
    flags: int = 0
    more: TaskMore | None = None

    outcome = _more("outcome")
    result = _more("result")
    info = _more("info")
    agent = _more("agent")
    warned = _more("warned")
    actor = _more("actor")
    creates = _more("creates")
    workers = _more("workers")
    started_at = _more("started_at")
    attempt = _more("attempt")
    size = _more("size")
    held_at = _more("held_at")
    lost = _more("lost")
    call_in = _more("call_in")
    group = _more("group")
    bundle = _more("bundle")
    # (Dask's allow_other_workers: it only prefers its ``workers``)
    allow_other_workers = _flag(128)
    # What its agent has said of the current grant: handed to a worker process (so it may
    # have started), and begun. A lost agent's other grants never started: they go again
    # with no retry spent.
    held = _flag(8)
    begun = _flag(16)
    # A direct grant (it fits its slot now) is counted held from its assignment, written
    # before the grant leaves (its agent hands it over at once, asking nothing); until
    # its agent says it holds it, one that turns out never to have reached it (a session
    # resumed without it) goes again with no retry spent.
    unheard = _flag(4096)
    # A forced cancel is stopping it where it runs: it ends cancelled once its agent says
    # it is gone (its resources free then), never retried.
    stopping = _flag(256)
    # Its client asked to cancel it once it was held: its agent says whether it had begun
    # (it runs on) or not (it ends cancelled, and so it does if it comes back unstarted).
    cancelling = _flag(512)
    # Written to the broker's state store (a client's Python task): restored after a
    # restart.
    kept = _flag(1)
    # Its client wants to know when it ends, not its result (a Dask graph's intermediate,
    # which only its dependents read): a success is told without the result's frames.
    quiet = _flag(4)
    # It outlives its client (submit(detached=True), Client(detach=True), a detached job):
    # when its client goes it runs on, listed, for its owner to find and cancel by id.
    detached = _flag(32)
    # Its client went (closed, killed, silent) before it ended: nobody waits for it.
    client_gone = _flag(1024)
    # Its result, lost with its agents, is made again even with no retries left (opted in
    # with submit(recompute=True): its body may run more than once).
    recompute = _flag(64)
    # Stopped for its memory (MemoryLimitError), it runs again if it has retries left
    # (submit(retry_oom=True)); by default it fails, as it would most likely fail again.
    retry_oom = _flag(2048)
    numbered = _flag(2)   # (see ``label``)

    @property
    def name(self) -> str:
        """Its name, as its client gave it."""
        return f"{self.label}-{self.local_id}" if self.flags & 2 else self.label


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
