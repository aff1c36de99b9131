"""zres: run Python functions where the resources they ask for are free.

    import zres
    future = zres.submit(train, data, resources={"GPU": 1})
    print(future.result())
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .agent.jobs import CommandResult
from .client.actors import ActorHandle, ActorMethod
from .client.annotations import annotate
from .client.client import Client, default_client
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
from .core.serialize import dumps
from .core.versions import ZRES_VERSION as __version__
from .local import LocalCluster

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
    return default_client().submit(fn, *args, **kwargs)


def map(fn: Callable[..., R], *iterables: Iterable[Any],  # noqa: A001
        **kwargs: Any) -> list[Future[R]]:
    """Map FN over ITERABLES on the default client, batched on the wire."""
    return default_client().map(fn, *iterables, **kwargs)


def scatter(data: Any) -> Any:
    """Put DATA on the cluster once, for many tasks to read; see Client.scatter."""
    return default_client().scatter(data)


def put(value: Any) -> Future[Any]:
    """Put VALUE on the cluster once (Ray's ``put``): a future to pass to tasks."""
    return default_client()._put(dumps(value), f"put-{type(value).__name__}")


def executor(resources: Any = None, **defaults: Any) -> Executor:
    """A concurrent.futures Executor on the default client; see Client.executor."""
    return default_client().executor(resources, **defaults)


def actor(cls: type, /, *args: Any, **kwargs: Any) -> ActorHandle:
    """Start an actor on the default client; see Client.actor."""
    return default_client().actor(cls, *args, **kwargs)


def get_actor(name: str, timeout: float = 10.0) -> ActorHandle:
    """Return a handle to the live actor called NAME, from any client."""
    return default_client().get_actor(name, timeout)


def kill(actor: ActorHandle, timeout: float = 10.0) -> None:
    """End ACTOR now and free its resources; later calls fail with ActorDiedError."""
    actor.client().kill(actor, timeout)


def placement_group(bundles: Any, strategy: str = "PACK", **kwargs: Any) -> PlacementGroup:
    """Reserve BUNDLES together on the default client; see Client.placement_group."""
    return default_client().placement_group(bundles, strategy, **kwargs)


def get_placement_group(name: str, timeout: float = 10.0) -> PlacementGroup:
    """The live placement group called NAME, from any client of its owner's key."""
    return default_client().get_placement_group(name, timeout)


def remove_placement_group(group: PlacementGroup, timeout: float = 10.0) -> None:
    """Free GROUP's bundles; what runs in them is stopped (as ``group.remove()``)."""
    group.client().remove_placement_group(group, timeout)


def submit_command(argv: Any, **kwargs: Any) -> Future[Any]:
    """Queue a shell command as a job on the default client; see Client.submit_command."""
    return default_client().submit_command(argv, **kwargs)
