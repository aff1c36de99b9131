"""What an agent holds for the broker: a grant from its arrival until its task ends,
and the state of each slot (what runs there, what waits for room); and the ``Events``
the broker must hear of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.resources import Units
from .slots import SlotSpec
from .workers import Worker


class Events(Protocol):
    """Where the runner's news for the broker goes (the agent's next report)."""

    def held(self, task_id: int) -> None: ...

    def fenced(self, task_id: int) -> None: ...

    def started(self, task_id: int) -> None: ...

    def result(self, task_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None: ...

    def give_back(self, task_id: int) -> None: ...

    def then(self, action: Callable[[], None]) -> None: ...

    def after(self, action: Callable[[], None]) -> None: ...


@dataclass(slots=True, eq=False)
class Grant:
    """A grant this agent holds, from its arrival until its task ends here."""

    task: int
    slot: int
    taken: Units
    devices: tuple[str, ...]
    item: list[Any]              # the RUN item: [task id, nframes, dep counts, context]
    frames: list[Any]
    key: tuple[int, int]         # (-priority, seq): the broker's order
    since: float                 # when it arrived, for starvation
    direct: bool                 # fits now by the broker's accounting (and is counted
                                 # held there already: it goes to a worker at once)
    run: int = 0                 # its run number, once handed to a worker process
    worker: Worker | None = None
    sent: bool = False           # passed to its worker (a queued one: once the broker
                                 # heard it held)
    running: bool = False        # its resources are counted in use
    begun: bool = False          # its worker said it started (its start log is a ring)
    began_at: float = 0.0        # when it began running here (the newest go first when
                                 # the node runs low on memory)


@dataclass(slots=True)
class SlotState:
    """What runs on one slot, and the grants waiting for room there."""

    spec: SlotSpec
    used: dict[str, int] = field(default_factory=dict)
    waiting: list[Grant] = field(default_factory=list)        # not handed over, in order
    delegated: dict[int, Grant] = field(default_factory=dict)  # handed to the delegate
    delegated_taken: dict[str, int] = field(default_factory=dict)
    delegate: Worker | None = None
    cancelling: set[int] = field(default_factory=set)  # delegated, cancel sent, not answered
    stopping: dict[int, float] = field(default_factory=dict)  # forced: task -> kill time
    stop_errors: dict[int, dict[str, Any]] = field(default_factory=dict)  # ... failed so
    runners: dict[int, int] = field(default_factory=dict)  # id(worker) -> grants running
    placements: int = 0          # actors and jobs running here, outside the pool

    def fits(self, taken: Units) -> bool:
        """Whether TAKEN fits beside what runs and what the delegate may start."""
        return all(self.spec.units.get(n, 0) - self.used.get(n, 0)
                   - self.delegated_taken.get(n, 0) >= a for n, a in taken.items())


def add_units(into: dict[str, int], amounts: Units, sign: int = 1) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, 0) + sign * amount
