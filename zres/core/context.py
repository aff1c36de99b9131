"""The task context: where and with what the current task runs (set by the worker)."""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ZresError

# A command job's environment carries its task token here (a Python task's is in its context).
TOKEN_ENV = "ZRES_TASK_TOKEN"


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
    # The broker's token for this task (with keys): a client made inside the task says it
    # in its hello and acts for the task's owner, whatever key the agent's host has.
    token: str = field(default="", repr=False)
    # The cores it is bound to (an agent started with --bind-cpus; else none: any of the
    # agent's).
    cpus: list[int] = field(default_factory=list)


_task: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "zres_task", default=None)


def get_task_context() -> TaskContext:
    """Return the running task's id, agent, granted resources and GPU ids."""
    ctx = _task.get()
    if ctx is None:
        raise ZresError("get_task_context() was called outside a zres task")
    return ctx


def set_task_context(ctx: TaskContext | None) -> contextvars.Token[TaskContext | None]:
    return _task.set(ctx)


def current_task() -> TaskContext | None:
    """Return the running task's context, or None outside a task (no error: cheap)."""
    return _task.get()


def token_owner(token: str) -> str | None:
    """The owner a task token names (its subject is "t<task id>:<owner>", or an actor's):
    None for no token."""
    subject = token.rpartition(".")[0]
    return subject.partition(":")[2] if subject else None


def task_token() -> str:
    """The token of the task this code runs in: a Python task's, else a command job's
    (from its environment); "" outside any (or without keys)."""
    ctx = _task.get()
    if ctx is not None and ctx.token:
        return ctx.token
    return os.environ.get(TOKEN_ENV, "")
