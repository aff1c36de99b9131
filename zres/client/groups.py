"""Placement groups on the client: ``PlacementGroup`` handles, and the ``Client`` methods
that make, find and remove them; ``placement=(pg, index)`` read for submit and actor."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import ZresError
from ..core.resources import format_units, mapping_to_units, units_to_float
from . import registry
from .futures import Future

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementGroup:
    """Bundles of resources on one or more agents, reserved together (all or none) for
    the tasks and actors placed in them: ``submit(f, placement=(pg, 0))``."""

    def __init__(self, group_id: str, bundles: list[dict[str, int]], strategy: str,
                 name: str = "", client: Any = None, ready: Future | None = None) -> None:
        self.id = group_id
        self.bundle_units = bundles           # each bundle's amounts, in units
        self.strategy = strategy
        self.name = name
        self._client = client
        self._ready = ready

    @property
    def bundles(self) -> list[dict[str, float]]:
        """Each bundle's amounts, as people write them (GPUs, bytes)."""
        return [units_to_float(b) for b in self.bundle_units]

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_units)

    def client(self) -> Any:
        """The client its requests go through (this process's default if unbound)."""
        if self._client is None or self._client._closed:
            self._client = registry.default()
        return self._client

    def ready(self) -> Future:
        """A future that resolves (to None) once every bundle is reserved; it fails if the
        group cannot be (removed, failed, infeasible with ``infeasible="error"``)."""
        if self._ready is None:
            raise ZresError(f"{self!r} was found by name: its ready() belongs to the client "
                            "that made it (client.status()['placement_groups'] says its state)")
        return self._ready

    def remove(self, timeout: float = 10.0) -> None:
        """Free its bundles: what waits in them fails, what runs in them is stopped."""
        self.client().remove_placement_group(self, timeout)

    def __reduce__(self) -> Any:
        return (PlacementGroup, (self.id, self.bundle_units, self.strategy, self.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        name = f" name={self.name!r}" if self.name else ""
        return (f"<zres.PlacementGroup {self.id[:8]}{name} {self.strategy} "
                f"[{', '.join(format_units(b) for b in self.bundle_units)}]>")


def placement_option(placement: Any, resources: Mapping[str, Any] | None, cpu: int = 1
                     ) -> tuple[list[Any], Mapping[str, Any] | None]:
    """PLACEMENT ((pg, index)) as the wire carries it, and the resources asked: those
    given (with CPU of them unless they name CPU), else the whole bundle. ValueError
    naming what is wrong, or a request larger than the bundle (naming both)."""
    if not (isinstance(placement, tuple) and len(placement) == 2
            and isinstance(placement[0], PlacementGroup) and type(placement[1]) is int):
        raise TypeError(f"placement must be (placement group, bundle index), got "
                        f"{placement!r}")
    group, index = placement
    if not 0 <= index < group.bundle_count:
        raise ValueError(f"{group!r} has {group.bundle_count} bundles: there is no bundle "
                         f"{index}")
    bundle = group.bundle_units[index]
    if resources is None:  # (the whole bundle, and no CPU it does not hold)
        return [group.id, index], {"CPU": 0, **units_to_float(bundle)}
    asked = mapping_to_units({"CPU": cpu, **resources})
    over = {n: a for n, a in asked.items() if a > bundle.get(n, 0)}
    if over:
        raise ValueError(f"it asks {format_units(asked)}, more than bundle {index} of "
                         f"{group!r} has ({format_units(bundle)})")
    return [group.id, index], resources


class GroupMethods:
    """Mixed into ``Client``: placement groups, whose construction is a task."""

    if TYPE_CHECKING:  # (the client's own, used here)
        _io: Any

        def _options(self, resources: Mapping[str, Any] | None, retries: int | None = None,
                     priority: int | None = None, infeasible: str | None = None,
                     key: str | None = None, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

        def _make_future(self, fn: Any, name: str | None, frames: list[Any],
                         deps: list[Future[Any]], opts: dict[str, Any],
                         extra: dict[str, Any] | None = None) -> Future[Any]: ...

    def placement_group(self, bundles: Sequence[Mapping[str, Any]], strategy: str = "PACK",
                        name: str | None = None, restarts: int = 0,
                        detached: bool | None = None, priority: int | None = None,
                        infeasible: str | None = None) -> PlacementGroup:
        """Reserve BUNDLES (each a resource request on one agent) together, all or none,
        placed by STRATEGY: PACK (as few agents as possible), SPREAD (as many as
        possible), STRICT_PACK (one agent), STRICT_SPREAD (an agent per bundle).

        Returns at once; ``pg.ready()`` resolves once every bundle is reserved. Work
        placed in bundle k (``submit(f, placement=(pg, k))``, ``actor(C, placement=...)``)
        draws on that bundle alone. A NAMEd (or DETACHED) group outlives this client;
        an unnamed one is removed when it goes. If an agent holding a bundle is lost,
        the group is reserved again as a whole, up to RESTARTS times (-1: always), else
        it fails."""
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not "
                             f"{strategy!r}")
        if isinstance(bundles, Mapping) or not bundles:
            raise ValueError("bundles must be a non-empty list of resource requests")
        units = [mapping_to_units(dict(b)) for b in bundles]
        empty = next((i for i, b in enumerate(units) if not b), None)
        if empty is not None:
            raise ValueError(f"bundle {empty} asks for nothing")
        if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < -1:
            raise ValueError(f"restarts must be an int >= -1, got {restarts!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        opts = self._options({"CPU": 0}, 0, priority, infeasible, None)
        group_id = uuid.uuid4().hex
        spec = {"id": group_id, "name": name or "", "bundles": units, "strategy": strategy,
                "restarts": restarts, "detached": bool(detached or name)}
        label = f"placement-group-{name or group_id[:8]}"
        ready = self._make_future(label, label, [], [], opts, {"group": spec, "quiet": True})
        self._io.wake()
        return PlacementGroup(group_id, units, strategy, name or "", self, ready)

    def get_placement_group(self, name: str, timeout: float = 10.0) -> PlacementGroup:
        """The live placement group called NAME (of this key); ValueError if none."""
        reply = self._io.request(P.GROUP, {"op": "lookup", "name": name}, timeout)
        if "error" in reply:
            raise ValueError(reply["error"])
        found = reply.get("group")
        if not found:
            raise ValueError(f"no live placement group named {name!r}")
        return PlacementGroup(found["id"], found["bundles"], found["strategy"], found["name"],
                              self)

    def remove_placement_group(self, group: PlacementGroup, timeout: float = 10.0) -> None:
        """Free GROUP's bundles: what waits in them fails, what runs in them is stopped."""
        if not isinstance(group, PlacementGroup):
            raise TypeError(f"remove needs a PlacementGroup, not {type(group).__name__}")
        reply = self._io.request(P.GROUP, {"op": "remove", "id": group.id}, timeout)
        if "error" in reply:
            raise ZresError(reply["error"])
