"""An actor as the broker keeps it: its record, its states and their transitions, and the
spec a client sends to make one."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ProtocolError
from ..core.resources import Units


class ActorState(enum.Enum):
    PENDING = "pending"          # construction waits for dependencies or resources
    STARTING = "starting"        # placed; __init__ is running
    ALIVE = "alive"
    RESTARTING = "restarting"    # its process or agent was lost; waiting to be placed again
    ADOPTING = "adopting"        # the broker restarted: its agent has not offered it back yet
    DEAD = "dead"


_ALLOWED = {
    ActorState.PENDING: {ActorState.STARTING, ActorState.DEAD},
    ActorState.STARTING: {ActorState.ALIVE, ActorState.RESTARTING, ActorState.DEAD},
    ActorState.ALIVE: {ActorState.RESTARTING, ActorState.DEAD},
    ActorState.RESTARTING: {ActorState.STARTING, ActorState.DEAD},
    ActorState.ADOPTING: {ActorState.RESTARTING, ActorState.DEAD},  # (or taken back as it was)
    ActorState.DEAD: set(),
}


@dataclass(slots=True)
class ActorRecord:
    id: str
    name: str                    # "" when unnamed; a named actor outlives its creator
    cls: str
    methods: list[str]
    owner: bytes                 # the creating client
    units: Units
    priority: int
    restarts: int                # restarts left; -1 for no limit
    concurrency: int
    ready_task: int              # the construction task (the future of handle.ready())
    state: ActorState = ActorState.PENDING
    placement: int = 0           # the scheduler id of the current placement
    agent: bytes = b""           # where it is placed
    agent_name: str = ""
    spawn: list[Any] = field(default_factory=list)   # construction frames, kept for restarts
    spawn_counts: tuple[int, list[int]] = (0, [])
    spawn_refs: dict[int, Any] = field(default_factory=dict)  # its inputs kept on agents
    spawn_call_in: int = -1      # the input its construction's call was put in (-1: none)
    queues: dict[bytes, deque[int]] = field(default_factory=dict)  # caller -> call ids
    inflight: dict[int, None] = field(default_factory=dict)        # sent, in send order
    cause: str = ""              # why it died
    error: tuple[str, Sequence[Any], dict[str, Any]] | None = None  # __init__'s exception
    starts: int = 0
    key: str = ""                # its owner: the name of its creator's key ("": no keys)
    shared: bool = False         # any key may call it, not only its owner's and admins'
    bundle: tuple[str, int] | None = None  # the placement group bundle it runs in

    def label(self) -> str:
        return f"actor {self.cls}({self.name or self.id[:8]})"


def set_actor_state(actor: ActorRecord, new: ActorState) -> None:
    """Move ACTOR to NEW, refusing any transition the table does not allow."""
    if new not in _ALLOWED[actor.state]:
        raise RuntimeError(f"{actor.label()}: {actor.state.value} -> {new.value}")
    actor.state = new


def check_actor_spec(spec: Any, name_bytes: int = 1024) -> dict[str, Any]:
    """Validate an actor spec off the wire (names up to NAME_BYTES long)."""
    if not isinstance(spec, dict):
        raise ProtocolError("submit: actor spec must be a map")
    texts = [spec.get("id"), spec.get("name"), spec.get("cls"), *spec.get("methods", [])[:1]]
    if any(isinstance(t, str) and len(t) > name_bytes for t in texts) \
            or len(spec.get("methods", [])) > 100_000:
        raise ProtocolError("submit: an actor's id, name, class or methods are too long")
    ok = (isinstance(spec.get("id"), str) and spec["id"]
          and isinstance(spec.get("name", ""), str) and isinstance(spec.get("cls", ""), str)
          and isinstance(spec.get("methods", []), list)
          and all(isinstance(m, str) for m in spec.get("methods", []))
          and type(spec.get("restarts", 0)) is int and spec.get("restarts", 0) >= -1
          and type(spec.get("concurrency", 1)) is int and spec.get("concurrency", 1) >= 1
          and isinstance(spec.get("get_if_exists", False), bool)
          and isinstance(spec.get("shared", False), bool))
    if not ok:
        raise ProtocolError("submit: malformed actor spec")
    return spec
