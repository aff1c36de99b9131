"""Reading a SUBMIT: each task's fields checked, before the broker records any of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import limits as L
from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import LimitExceeded, Limits, check_count, check_name, check_units
from ..core.resources import Units
from .actor_records import check_actor_spec
from .gangs.records import check_group_spec, check_placement
from .job_records import check_job_spec


@dataclass(slots=True)
class Submission:
    """One task as its client submitted it (ids are the client's own)."""

    local: int
    units: Units
    priority: int
    retries: int
    deps: list[int]
    name: str                            # (as a Task's ``label``)
    numbered: bool                       # ... and its ``numbered``
    strict: bool
    payload: tuple[Any, ...]
    kind: int                            # see kind_of
    actor: dict[str, Any] | None = None  # it constructs this actor
    call: str | None = None              # it calls a method of this actor
    job: dict[str, Any] | None = None    # it is this command job
    quiet: bool = False                  # its client wants no result, only its end
    workers: tuple[str, ...] = ()        # the agents it runs on, by name (none: any)
    call_in: int = -1                    # the input its call is in (put: too big inline)
    allow_other_workers: bool = False    # ... or only prefers
    detached: bool = False               # it outlives its client (a job: its spec says)
    recompute: bool = False              # a lost result of its runs it again, retries or not
    retry_oom: bool = False              # stopped for its memory, it spends a retry (if any)
    group: dict[str, Any] | None = None  # it makes this placement group (issue 31)
    placement: tuple[str, int] | None = None  # it runs in this bundle: (group id, index)


class SubmitReader:
    """A SUBMIT's tasks, read and checked a chunk at a time (``take``): a large submit is
    taken across turns of the broker's loop. What is wrong with the message as a whole is
    refused at once (ProtocolError naming the fault, LimitExceeded naming the limit); a
    fault in one task, when its chunk is read."""

    def __init__(self, msg: P.Message, limits: Limits) -> None:
        items = P.field(msg, "tasks", list)
        if len(items) > limits.tasks:
            raise LimitExceeded(f"a submit holds {len(items)} tasks, more than the broker's "
                                f"limit of {limits.tasks} (max_tasks)")
        if not all(isinstance(i, list) and len(i) in (8, 9) for i in items):
            raise ProtocolError("submit: each task must be an 8- or 9-item array")
        self._payloads = P.split_frames(msg.frames, [i[5] for i in items])
        self._items = items
        self._limits = limits
        self._shared = _Shared()
        self._at = 0

    def take(self, count: int) -> list[Submission]:
        """The next COUNT tasks (fewer at the end), checked."""
        start, self._at = self._at, min(self._at + count, len(self._items))
        return [_submission(item, self._shared.payload(payload), self._limits, self._shared)
                for item, payload in zip(self._items[start:self._at],
                                         self._payloads[start:self._at])]

    def done(self) -> bool:
        return self._at >= len(self._items)

    def new_for(self, known: Any) -> int:
        """How many of its tasks are not among KNOWN (the client's ids the broker has:
        a submit sent again after a restart may hold some)."""
        return sum(1 for item in self._items if item[0] not in known)

    def left(self, since: int) -> list[int]:
        """The client's ids of the tasks from the SINCE-th on (those a refusal fails)."""
        return [item[0] for item in self._items[since:] if type(item[0]) is int]

    @property
    def at(self) -> int:
        return self._at


class _Shared:
    """What the tasks of one submit have in common, kept once: a map's 1,000 tasks carry
    the same pickled function and ask for the same resources, and a million queued tasks
    must not hold a million copies (nor a million frames of a few bytes each, which cost
    far more than their bytes)."""

    def __init__(self) -> None:
        self._frames: dict[bytes, tuple[bytes, int]] = {}  # small frame -> itself, kind
        self._units: dict[tuple[tuple[str, int], ...], Units] = {}
        self._names: dict[str, str] = {}

    def payload(self, frames: list[Any]) -> tuple[Any, ...]:
        """FRAMES with each small one as bytes, the same bytes for equal ones (a large
        one stays the frame it came as: no copy)."""
        out = []
        for frame in frames:
            if len(frame) > _SMALL:
                out.append(frame)
                continue
            data = bytes(P.buffer(frame))
            known = self._frames.get(data)
            if known is None:
                known = self._frames[data] = (data, -1)
            out.append(known[0])
        return tuple(out)  # (a third smaller than a list)

    def name(self, name: str, local: int) -> tuple[str, bool]:
        """NAME, of the task LOCAL, as a ``Task``'s label and numbered: a map's tasks,
        named "{function}-{local}" by default, share their label."""
        head, dash, tail = name.rpartition("-")
        if dash and tail == str(local):
            return self._names.setdefault(head, head), True
        return name, False

    def kind(self, function: Any) -> int:
        """``kind_of`` FUNCTION, worked out once per distinct function of this submit."""
        if not isinstance(function, bytes):
            return kind_of(function)
        data, kind = self._frames[function]
        if kind == -1:
            kind = kind_of(function)
            self._frames[function] = (data, kind)
        return kind

    def units(self, units: Units) -> Units:
        return self._units.setdefault(tuple(sorted(units.items())), units)


_SMALL = 16 * 1024  # frames up to this many bytes are copied into bytes and shared


def _submission(item: list[Any], payload: tuple[Any, ...], limits: Limits,
                shared: _Shared) -> Submission:
    local, units, priority, retries, deps, _, name, strict, *rest = item
    extra = rest[0] if rest else {}
    if not (isinstance(local, int) and isinstance(priority, int)
            and isinstance(retries, int) and isinstance(deps, list)
            and (payload or "job" in extra or "group" in extra  # (neither carries a call)
                 or type(extra.get("payload")) is int)  # big to travel, an input's place
            and all(type(d) is int for d in deps) and isinstance(extra, dict)):
        raise ProtocolError("submit: malformed task")
    if (wrong := L.priority_error(priority)) is not None:  # (a raw peer sends anything)
        raise ProtocolError(f"submit: {wrong}")
    call = extra.get("call")
    if call is not None and not isinstance(call, str):
        raise ProtocolError("submit: call must name an actor id")
    check_count(len(deps), limits.deps, "submit: a task's dependencies", "max_deps")
    workers = extra.get("workers", [])
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise ProtocolError("submit: workers must be a list of agent names")
    return Submission(
        local, shared.units(check_units(units, limits, "submit")), priority, max(retries, 0),
        deps, *shared.name(check_name(name, limits, "submit: a task's name"), local),
        bool(strict), payload, shared.kind(payload[0]) if payload else 0,
        actor=check_actor_spec(extra["actor"], limits.name_bytes) if "actor" in extra else None,
        call=call,
        job=check_job_spec(extra["job"]) if "job" in extra else None,
        quiet=extra.get("quiet") is True,
        workers=tuple(check_name(w, limits, "submit: an agent name in workers")
                      for w in workers),
        allow_other_workers=extra.get("allow_other_workers") is True,
        detached=extra.get("detached") is True, call_in=_call_in(extra, deps),
        recompute=extra.get("recompute") is True, retry_oom=extra.get("retry_oom") is True,
        group=check_group_spec(extra["group"], limits) if "group" in extra else None,
        placement=check_placement(extra["placement"]) if "placement" in extra else None)


def kind_of(function: Any) -> int:
    """Hash a pickled function, reading at most 4 KiB of it (a closure can be large).

    Tasks of one kind (the same bytes for every task of a map, or of one module function)
    are expected to take alike, for pipelining.
    """
    view = memoryview(P.buffer(function))
    if view.nbytes <= 4096:
        return hash(bytes(view))
    return hash((view.nbytes, bytes(view[:2048]), bytes(view[-2048:])))


def _call_in(extra: dict[str, Any], deps: list[int]) -> int:
    """The place among DEPS of the value its call was put in (-1: it came inline)."""
    index = extra.get("payload", -1)
    if type(index) is not int or not -1 <= index < len(deps):
        raise ProtocolError("submit: payload must name one of the task's inputs")
    return index
