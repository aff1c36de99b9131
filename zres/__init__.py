"""zres: run Python functions where the resources they ask for are free.

    import zres
    future = zres.submit(train, data, resources={"GPU": 1})
    print(future.result())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .core.versions import ZRES_VERSION as __version__

if TYPE_CHECKING:
    from .agent.jobs import CommandResult
    from .client.actors import ActorHandle, ActorMethod
    from .client.annotations import annotate
    from .client.client import Client
    from .client.client import default_client as default_client
    from .client.executor import Executor
    from .client.futures import (
        ALL_COMPLETED,
        FIRST_COMPLETED,
        FIRST_EXCEPTION,
        Future,
        as_completed,
        gather,
        wait,
    )
    from .client.groups import PlacementGroup
    from .client.io import InfeasibleWarning
    from .client.progress import progress
    from .core.context import TaskContext, get_task_context
    from .core.errors import (
        ActorDiedError,
        AgentLostError,
        BrokerLostError,
        CommandFailed,
        InfeasibleError,
        MemoryLimitError,
        NotOwnerError,
        ProtocolError,
        RemoteError,
        ResourceSpecError,
        ResultLostError,
        WorkerLostError,
        ZresError,
    )
    from .core.serialize import dumps as dumps
    from .local import LocalCluster

# Where each public name lives. They are imported on first use: a broker, an agent, a worker
# process or a `zres` command needs few of them, and importing every one (the client, its
# futures, actors, LocalCluster) would cost each of those processes about a third of its
# start-up (~70 ms).
_WHERE = {
    "CommandResult": "agent.jobs",
    **dict.fromkeys(("ActorHandle", "ActorMethod"), "client.actors"),
    "annotate": "client.annotations",
    **dict.fromkeys(("Client", "default_client"), "client.client"),
    "Executor": "client.executor",
    **dict.fromkeys(("ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "Future",
                     "as_completed", "gather", "wait"), "client.futures"),
    "PlacementGroup": "client.groups",
    "InfeasibleWarning": "client.io",
    "progress": "client.progress",
    **dict.fromkeys(("TaskContext", "get_task_context"), "core.context"),
    **dict.fromkeys(("ActorDiedError", "AgentLostError", "BrokerLostError", "CommandFailed",
                     "InfeasibleError", "MemoryLimitError", "NotOwnerError", "ProtocolError",
                     "RemoteError", "ResourceSpecError", "ResultLostError", "WorkerLostError",
                     "ZresError"), "core.errors"),
    "dumps": "core.serialize",
    "LocalCluster": "local",
}


def __getattr__(name: str) -> Any:
    """Import public NAME from its module the first time it is asked for."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value  # (asked once: the next lookup finds it here)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


def _default_client() -> Client:
    from .client.client import default_client
    return default_client()


R = TypeVar("R")  # what a submitted function returns

__all__ = [
    "__version__",
    "ActorDiedError", "ActorHandle", "ActorMethod", "actor", "get_actor", "kill",
    "CommandFailed", "CommandResult", "submit_command",
    "ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "AgentLostError", "BrokerLostError",
    "Client", "Executor", "executor", "Future", "InfeasibleError", "InfeasibleWarning",
    "LocalCluster", "MemoryLimitError", "NotOwnerError", "PlacementGroup", "placement_group",
    "get_placement_group", "remove_placement_group", "ProtocolError", "RemoteError",
    "ResourceSpecError", "ResultLostError", "TaskContext", "WorkerLostError", "ZresError",
    "annotate", "as_completed", "gather", "get_task_context", "map", "progress", "put",
    "scatter", "submit", "wait",
]


def submit(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
    """Submit FN on the default client (the newest open one, started if none)."""
    return _default_client().submit(fn, *args, **kwargs)


def map(fn: Callable[..., R], *iterables: Iterable[Any],  # noqa: A001
        **kwargs: Any) -> list[Future[R]]:
    """Map FN over ITERABLES on the default client, batched on the wire."""
    return _default_client().map(fn, *iterables, **kwargs)


def scatter(data: Any) -> Any:
    """Put DATA on the cluster once, for many tasks to read; see Client.scatter."""
    return _default_client().scatter(data)


def put(value: Any) -> Future[Any]:
    """Put VALUE on the cluster once (Ray's ``put``): a future to pass to tasks."""
    from .core.serialize import dumps as dumps
    return _default_client()._put(dumps(value), f"put-{type(value).__name__}")


def executor(resources: Any = None, **defaults: Any) -> Executor:
    """A concurrent.futures Executor on the default client; see Client.executor."""
    return _default_client().executor(resources, **defaults)


def actor(cls: type, /, *args: Any, **kwargs: Any) -> ActorHandle:
    """Start an actor on the default client; see Client.actor."""
    return _default_client().actor(cls, *args, **kwargs)


def get_actor(name: str, timeout: float = 10.0) -> ActorHandle:
    """Return a handle to the live actor called NAME, from any client."""
    return _default_client().get_actor(name, timeout)


def kill(actor: ActorHandle, timeout: float = 10.0) -> None:
    """End ACTOR now and free its resources; later calls fail with ActorDiedError."""
    actor.client().kill(actor, timeout)


def placement_group(bundles: Any, strategy: str = "PACK", **kwargs: Any) -> PlacementGroup:
    """Reserve BUNDLES together on the default client; see Client.placement_group."""
    return _default_client().placement_group(bundles, strategy, **kwargs)


def get_placement_group(name: str, timeout: float = 10.0) -> PlacementGroup:
    """The live placement group called NAME, from any client of its owner's key."""
    return _default_client().get_placement_group(name, timeout)


def remove_placement_group(group: PlacementGroup, timeout: float = 10.0) -> None:
    """Free GROUP's bundles; what runs in them is stopped (as ``group.remove()``)."""
    group.client().remove_placement_group(group, timeout)


def submit_command(argv: Any, **kwargs: Any) -> Future[Any]:
    """Queue a shell command as a job on the default client; see Client.submit_command."""
    return _default_client().submit_command(argv, **kwargs)
