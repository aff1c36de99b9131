"""A task's outcome, as the broker tells it, made its future's result or exception."""

from __future__ import annotations

import concurrent.futures as cf
from concurrent.futures import _base
from typing import Any

from ..core import errors
from ..core import protocol as P
from ..core.errors import BrokerLostError, InfeasibleError, ZresError
from ..core.serialize import loads, loads_exception
from .fetching import Remote
from .futures import Future

# zres's own errors by the name the broker gives (anything else: ZresError)
_ERRORS: dict[str, type[BaseException]] = {
    "AgentLostError": errors.AgentLostError, "WorkerLostError": errors.WorkerLostError,
    "InfeasibleError": InfeasibleError, "BrokerLostError": BrokerLostError,
    "ActorDiedError": errors.ActorDiedError, "ValueError": ValueError,
    "CommandFailed": errors.CommandFailed, "ZresError": ZresError,
    "NotOwnerError": errors.NotOwnerError, "ResultLostError": errors.ResultLostError,
    "MemoryLimitError": errors.MemoryLimitError,
}


def settle(future: Future[Any], result: Any = None,
           exception: BaseException | None = None) -> None:
    """Resolve FUTURE, unless it was cancelled meanwhile."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except cf.InvalidStateError:
        pass  # cancelled meanwhile


def resolve(future: Future[Any], outcome: str, frames: list[Any], info: dict[str, Any]) -> None:
    """End FUTURE as its task did: OUTCOME, the result's or exception's FRAMES, and INFO
    (where it ran; a zres error's type and message)."""
    future.agent = info.get("agent")
    if type(info.get("peak_memory")) is int:  # (it ran in a process of its own)
        future.peak_memory = info["peak_memory"]
    if outcome == P.OK and future.quiet:
        settle(future)  # (its end was asked for, not its result)
    elif outcome == P.OK and info.get("ref") is not None:
        settle(future, Remote(info["ref"]))  # (fetched from where it is when asked for)
    elif outcome == P.OK:
        try:
            settle(future, loads(frames))
        except Exception as exc:
            settle(future, exception=errors.RemoteError(
                f"the result of {future.label} cannot be unpickled here: {exc!r}"))
    elif outcome == P.RAISED:
        settle(future, exception=loads_exception(frames))
    elif info.get("type") == "CancelledError":  # stopped, or its job or input was
        future._end_cancelled(_base.PENDING, _base.RUNNING)
    elif info.get("type") == "MemoryLimitError":
        settle(future, exception=errors.MemoryLimitError(
            info.get("message", "out of memory"), _int(info.get("limit")),
            _int(info.get("peak")), future.agent))
    else:
        error = _ERRORS.get(str(info.get("type")), ZresError)
        settle(future, exception=error(info.get("message", "task failed")))


def _int(value: Any) -> int | None:
    return value if type(value) is int else None
