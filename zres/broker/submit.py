"""Reading a SUBMIT: each task's fields checked, before the broker records any of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import LimitExceeded, Limits, check_count, check_name, check_units
from ..core.resources import Units
from .actor_records import check_actor_spec
from .jobs import check_job_spec


@dataclass(slots=True)
class Submission:
    """One task as its client submitted it (ids are the client's own)."""

    local: int
    units: Units
    priority: int
    retries: int
    deps: list[int]
    name: str
    strict: bool
    payload: list[Any]
    kind: int                            # see kind_of
    actor: dict[str, Any] | None = None  # it constructs this actor
    call: str | None = None              # it calls a method of this actor
    job: dict[str, Any] | None = None    # it is this command job
    quiet: bool = False                  # its client wants no result, only its end
    workers: tuple[str, ...] = ()        # the agents it runs on, by name (none: any)
    allow_other_workers: bool = False    # ... or only prefers
    detached: bool = False               # it outlives its client (a job: its spec says)


def parse_submit(msg: P.Message, limits: Limits) -> list[Submission]:
    """Return the tasks of a SUBMIT; raise ProtocolError, naming the fault, if any is bad,
    or LimitExceeded naming the limit."""
    items = P.field(msg, "tasks", list)
    if len(items) > limits.tasks:
        raise LimitExceeded(f"a submit holds {len(items)} tasks, more than the broker's "
                            f"limit of {limits.tasks} (max_tasks)")
    if not all(isinstance(i, list) and len(i) in (8, 9) for i in items):
        raise ProtocolError("submit: each task must be an 8- or 9-item array")
    payloads = P.split_frames(msg.frames, [i[5] for i in items])
    return [_submission(item, payload, limits) for item, payload in zip(items, payloads)]


def _submission(item: list[Any], payload: list[Any], limits: Limits) -> Submission:
    local, units, priority, retries, deps, _, name, strict, *rest = item
    extra = rest[0] if rest else {}
    if not (isinstance(local, int) and isinstance(priority, int)
            and isinstance(retries, int) and isinstance(deps, list)
            and (payload or "job" in extra)  # a command job carries no call
            and all(type(d) is int for d in deps) and isinstance(extra, dict)):
        raise ProtocolError("submit: malformed task")
    call = extra.get("call")
    if call is not None and not isinstance(call, str):
        raise ProtocolError("submit: call must name an actor id")
    check_count(len(deps), limits.deps, "submit: a task's dependencies", "max_deps")
    workers = extra.get("workers", [])
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise ProtocolError("submit: workers must be a list of agent names")
    return Submission(
        local, check_units(units, limits, "submit"), priority, max(retries, 0), deps,
        check_name(name, limits, "submit: a task's name"),
        bool(strict), payload, kind_of(payload[0]) if payload else 0,
        actor=check_actor_spec(extra["actor"], limits.name_bytes) if "actor" in extra else None,
        call=call,
        job=check_job_spec(extra["job"]) if "job" in extra else None,
        quiet=extra.get("quiet") is True,
        workers=tuple(check_name(w, limits, "submit: an agent name in workers")
                      for w in workers),
        allow_other_workers=extra.get("allow_other_workers") is True,
        detached=extra.get("detached") is True)


def kind_of(function: Any) -> int:
    """Hash a pickled function, reading at most 4 KiB of it (a closure can be large).

    Tasks of one kind (the same bytes for every task of a map, or of one module function)
    are expected to take alike, for pipelining.
    """
    view = memoryview(P.buffer(function))
    if view.nbytes <= 4096:
        return hash(bytes(view))
    return hash((view.nbytes, bytes(view[:2048]), bytes(view[-2048:])))
