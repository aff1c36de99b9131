"""Exceptions a zres user can catch."""

from __future__ import annotations


class ZresError(Exception):
    """Base class of every error zres raises on its own account."""


class ResourceSpecError(ZresError, ValueError):
    """A resource spec or request is malformed (bad name, amount or syntax)."""


class AgentLostError(ZresError):
    """The agent running a task went silent or died and no retries were left."""


class WorkerLostError(ZresError):
    """The worker process running a task exited before the task finished."""


class BrokerLostError(ZresError):
    """The broker restarted or stayed unreachable, losing the task."""


class ResultLostError(ZresError):
    """A result kept on an agent was lost with it, and its task may not run again (its
    retries were spent, or retries=0: its body runs at most once); the message names the
    agent."""


class ActorDiedError(ZresError):
    """An actor ended (killed, its process or agent lost, its owner gone) before the call ran
    or while it ran; the message names the cause."""


class CommandFailed(ZresError):
    """A command job exited non-zero (or could not start): its exit code and log's tail."""

    def __init__(self, message: str, exit_code: int | None = None, log: str = "",
                 tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.log = log
        self.tail = tail

    def __reduce__(self) -> tuple[type, tuple[str, int | None, str, str]]:
        return (type(self), (str(self), self.exit_code, self.log, self.tail))


class MemoryLimitError(ZresError):
    """A task, an actor's call or a command job was stopped for its memory: it went past
    the MEMORY it asked for (its limit), or its node ran out (``node out of memory ...``).
    The message names the limit, the peak and the agent; so do ``limit`` and ``peak``
    (bytes; None where they are not known) and ``agent``."""

    def __init__(self, message: str, limit: int | None = None, peak: int | None = None,
                 agent: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.peak = peak
        self.agent = agent

    def __reduce__(self) -> tuple[type, tuple[str, int | None, int | None, str | None]]:
        return (type(self), (str(self), self.limit, self.peak, self.agent))


class NotOwnerError(ZresError, PermissionError):
    """The work asked about belongs to another owner's key (and is not shared): only that
    key or an admin key may call, cancel, kill or read it; the message names the owner."""


class InfeasibleError(ZresError):
    """No agent in the cluster could ever satisfy the task's resource request."""


class ProtocolError(ZresError):
    """A frame on the wire is malformed, of an unknown kind, or of another version."""


class RemoteError(ZresError):
    """A task raised an exception that could not be rebuilt in the client."""


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised in a worker."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\nRemote traceback:\n" + self.tb
