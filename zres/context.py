"""What surrounds a call: annotations at submit time, the task context at run time."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import ZresError


@dataclass(frozen=True, slots=True)
class TaskContext:
    """Where and with what the current task runs."""

    task_id: int
    agent: str
    resources: dict[str, float]
    gpu_ids: list[str] = field(default_factory=list)
    attempt: int = 0
    # What the task tells the broker besides its result (a command's exit code, say):
    # plain msgpack-able values only, sent with the result and never unpickled.
    report: dict[str, Any] = field(default_factory=dict)


_task: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "zres_task", default=None)
_annotations: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "zres_annotations", default=MappingProxyType({}))


def get_task_context() -> TaskContext:
    """Return the running task's id, agent, granted resources and GPU ids."""
    ctx = _task.get()
    if ctx is None:
        raise ZresError("get_task_context() was called outside a zres task")
    return ctx


def set_task_context(ctx: TaskContext | None) -> contextvars.Token[TaskContext | None]:
    return _task.set(ctx)


_ANNOTATABLE = frozenset({"resources", "priority", "retries", "infeasible"})


@contextlib.contextmanager
def annotate(**defaults: Any) -> Iterator[None]:
    """Use DEFAULTS (resources=, priority=, retries=, infeasible=) for submits inside.

    Blocks nest: an inner block's resources are merged over the outer's, and an explicit
    argument to submit wins over both.
    """
    unknown = set(defaults) - _ANNOTATABLE
    if unknown:
        raise TypeError(f"annotate() got unknown settings: {', '.join(sorted(unknown))}; "
                        f"expected {', '.join(sorted(_ANNOTATABLE))}")
    outer = _annotations.get()
    merged = {**outer, **defaults}
    if isinstance(outer.get("resources"), Mapping) and isinstance(defaults.get("resources"),
                                                                  Mapping):
        merged["resources"] = {**outer["resources"], **defaults["resources"]}
    token = _annotations.set(merged)
    try:
        yield
    finally:
        _annotations.reset(token)


def current_annotations() -> Mapping[str, Any]:
    return _annotations.get()
