"""Gangs: bundles of resources on several slots, reserved together, and the tasks placed
inside their bundles.

A gang waits in the queue like a task (its lane of its own, ordered by fair share and
priority, held by its owner's quota for what all its bundles ask), and is placed all at
once or not at all (``gang_fit``). Each placed bundle is a grant of its own on its slot,
charged to the gang's owner from placement until the gang lets it go: a *reservation*
that no process holds (a placement group's), or the grant a multi-node job's rank runs on.

A task placed in a bundle (``Inside``) draws on that bundle alone: the bundle is a slot
of its own for it (``Bundle.space``: the bundle's amounts and its devices), on the agent
holding the bundle, with the devices it took there. Such a task waits while its gang is not
placed, and for room in its bundle, never for the cluster; it is not charged (its gang
holds what it uses) and never queued on a slot (pipelining). A slot holding a bundle
takes no queued grants either: its agent would start them in the bundle's room, which it
sees free.

When a gang lets go of its bundles (removed, or one lost with its agent), what runs inside
them keeps what it took, as a grant of its own on the slot, until it ends: the bundle's
resources come back but those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.resources import GPU, GPU_MEMORY, UNIT, Units, fits, format_units
from . import gang_fit
from .devices import devices_at, pick_devices, taken_by
from .records import Grant, Inside, Slot, add_to
from .reservations import Fence, soonest_slot
from .table import SlotTable


@dataclass(slots=True, eq=False)
class Gang:
    """A gang: its BUNDLES, placed by STRATEGY, as grants of ids IDS."""

    id: int
    bundles: list[Units]
    strategy: str
    ids: list[int]
    total: Units                               # what its bundles ask, summed
    # Once placed (all together): each bundle, or None once lost with its agent.
    placed: list[Bundle | None] | None = None
    reserved: dict[int, Units] = field(default_factory=dict)  # starving: slot -> amounts
    owner: str = ""                            # whose it is (fair share, quotas)
    priority: int = 0
    blocked: bool = False                      # it did not fit, unfenced, when last tried

    def __repr__(self) -> str:
        return f"<gang {self.id}>"


@dataclass(slots=True, eq=False)
class Bundle:
    """Bundle INDEX of GANG, held by GRANT on its slot; SPACE is what tasks inside draw on."""

    gang: Gang
    index: int
    grant: Grant
    space: Slot
    tasks: set[int] = field(default_factory=set)   # the tasks running inside


def check(bundles: list[Units], strategy: str, ids: list[int]) -> None:
    """Raise ValueError naming what is wrong with a gang of BUNDLES."""
    if strategy not in gang_fit.STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(gang_fit.STRATEGIES)}, "
                         f"not {strategy!r}")
    if not bundles or len(ids) != len(bundles):
        raise ValueError("a gang needs at least one bundle, and an id for each")
    empty = next((i for i, b in enumerate(bundles) if not b), None)
    if empty is not None:
        raise ValueError(f"bundle {empty} asks for nothing")


def inside_refusal(bundle: Units, units: Units) -> str | None:
    """Why a task asking UNITS can never run inside a bundle asking BUNDLE (None: it can)."""
    gpu, memory = bundle.get(GPU, 0), bundle.get(GPU_MEMORY, 0)
    count = gpu // UNIT if gpu >= UNIT else int(bool(gpu))
    per = [memory // count] * count if count else []
    shares = [UNIT] * count if gpu >= UNIT else [gpu] * count
    space = Slot(0, "", dict(bundle), dict(bundle), shares, per, list(per), count)
    if fits(space.total, units) and pick_devices(space, units) is not None:
        return None
    return f"it asks {format_units(units)}, more than the bundle's {format_units(bundle)}"


class GangBook:
    """Every gang the scheduler knows, the placed bundles, and the tasks inside them."""

    def __init__(self, table: SlotTable, running: dict[int, Grant]) -> None:
        self.table = table
        self.running = running                   # the scheduler's grants, by task
        self.gangs: dict[int, Gang] = {}
        self.bundles: dict[int, Bundle] = {}     # placed bundles, by their grant's id
        self._never: dict[tuple[object, ...], str | None] = {}
        self._never_epoch = -1

    def add(self, gang_id: int, bundles: list[Units], strategy: str, ids: list[int]) -> Gang:
        check(bundles, strategy, ids)
        gang = self.gangs.get(gang_id)
        if gang is not None and gang.placed is not None:
            raise ValueError(f"gang {gang_id} is placed already")
        gang = self.gangs[gang_id] = Gang(gang_id, [dict(b) for b in bundles], strategy,
                                          list(ids), gang_fit.total_of(bundles))
        return gang

    # -- placing ---------------------------------------------------------------------
    def place(self, gang: Gang, fences: dict[int, Fence], owner: str, priority: int,
              seq: int, now: float) -> list[Grant] | None:
        """Place every bundle of GANG now (their resources taken), or none (None)."""
        made = gang_fit.place(gang.bundles, gang.strategy, self.table, fences, owner,
                              gang.ids, gang.id)
        if made is None:
            return None
        gang.placed = [None] * len(gang.bundles)
        for index, slot, grant in sorted(made, key=lambda m: m[0]):
            grant.priority, grant.seq, grant.since = priority, seq, now
            self._hold(slot, gang, index, grant)
        return [bundle.grant for bundle in gang.placed if bundle is not None]

    def adopt(self, gang: Gang, index: int, slot: Slot, grant: Grant) -> None:
        """Bundle INDEX of GANG holds GRANT on SLOT (taken already: a restarted broker
        takes a placed gang back, bundle by bundle, as its agents come back)."""
        if gang.placed is None:
            gang.placed = [None] * len(gang.bundles)
        self._hold(slot, gang, index, grant)

    def _hold(self, slot: Slot, gang: Gang, index: int, grant: Grant) -> None:
        slot.running.add(grant.task)
        slot.bundles += 1
        self.table.queue_room.discard(slot.id)  # (its agent would start them in the bundle)
        space = Slot(grant.task, slot.agent, dict(grant.taken), dict(grant.taken),
                     list(grant.shares), list(grant.memory), list(grant.memory),
                     len(grant.gpus))
        assert gang.placed is not None
        gang.placed[index] = self.bundles[grant.task] = Bundle(gang, index, grant, space)

    def inside(self, task_id: int, units: Units, where: Inside, priority: int, seq: int,
               now: float, owner: str, at: list[int] | None = None) -> Grant | None:
        """Grant TASK_ID (asking UNITS) room in its bundle WHERE, if it fits there now (AT:
        on those GPU positions of its slot, as it ran before a broker restart)."""
        gang = self.gangs.get(where.gang)
        bundle = gang.placed[where.index] if gang is not None and gang.placed else None
        if bundle is None or not fits(bundle.space.free, units):
            return None
        space = bundle.space
        if at is None:
            devices = pick_devices(space, units)
        elif all(p in bundle.grant.gpus for p in at):
            devices = devices_at(space, units, [bundle.grant.gpus.index(p) for p in at])
        else:
            devices = None
        if devices is None:
            return None
        local, shares, memory = devices
        taken = taken_by(units, shares, memory)
        _use(space, taken, local, shares, memory, -1)
        grant = Grant(task_id, bundle.grant.slot, units, [bundle.grant.gpus[p] for p in local],
                      taken, shares, memory, priority=priority, seq=seq, short=False,
                      since=now, owner=owner, within=bundle.grant.task)
        bundle.tasks.add(task_id)
        self.running[task_id] = grant
        return grant

    def release_inside(self, grant: Grant) -> None:
        """GRANT, inside a bundle, has ended: its room there is free again."""
        bundle = self.bundles.get(grant.within)
        if bundle is None:
            return
        bundle.tasks.discard(grant.task)
        local = [bundle.grant.gpus.index(p) for p in grant.gpus]
        _use(bundle.space, grant.taken, local, grant.shares, grant.memory, 1)

    # -- letting go --------------------------------------------------------------------
    def on_slot(self, slot_id: int) -> list[int]:
        """The tasks running inside the bundles held on SLOT_ID."""
        return sorted(t for b in self.bundles.values() if b.grant.slot == slot_id
                      for t in b.tasks)

    def slot_gone(self, slot_id: int) -> list[int]:
        """SLOT_ID is gone with what it held: forget its bundles; return their gangs."""
        hit = []
        for grant_id, bundle in list(self.bundles.items()):
            if bundle.grant.slot == slot_id:
                del self.bundles[grant_id]
                assert bundle.gang.placed is not None
                bundle.gang.placed[bundle.index] = None
                hit.append(bundle.gang.id)
        return sorted(set(hit))

    def unplace(self, gang: Gang) -> tuple[list[Grant], list[Grant]]:
        """GANG lets go of its bundles: return their grants (given back to their slots)
        and those of the tasks running inside them, which keep what they took, as grants
        of their own on those slots now."""
        released, kept = [], []
        for bundle in gang.placed or ():
            if bundle is None:
                continue
            slot = self.table.slots[bundle.grant.slot]
            del self.bundles[bundle.grant.task]
            self.table.give(slot, bundle.grant)
            slot.running.discard(bundle.grant.task)
            slot.bundles -= 1
            if not slot.bundles and self.table.prefetch and len(slot.queue) < self.table.prefetch:
                self.table.queue_room.add(slot.id)
                self.table.queue_freed.add(slot.id)
            self.running.pop(bundle.grant.task, None)
            released.append(bundle.grant)
            for task_id in sorted(bundle.tasks):
                grant = self.running[task_id]
                grant.within = 0
                self.table.take(slot, grant)
                slot.running.add(task_id)
                kept.append(grant)
        gang.placed = None
        return released, kept

    # -- reservations and feasibility ----------------------------------------------------
    def reserve(self, gang: Gang, fences: dict[int, Fence]) -> dict[int, Units] | None:
        """Where GANG, starving, will fit soonest: a slot per bundle (STRICT_PACK: one
        slot for them all), on distinct agents for STRICT_SPREAD; None if a bundle has
        no open slot that could ever hold it and is not reserved already."""
        table = self.table
        chosen: dict[int, Units] = {}
        wanted = [gang.total] if gang.strategy == "STRICT_PACK" else \
            [gang.bundles[i] for i in gang_fit.by_size(gang.bundles, table.capacity)]
        agents: set[str] = set()
        for units in wanted:
            ids = table.fitting(_key(units), units) - set(chosen)
            if gang.strategy == "STRICT_SPREAD":
                ids = {i for i in ids if table.slots[i].agent not in agents}
            # (not behind another gang's bundle, when it can: a bundle's end is unknown)
            slot = soonest_slot(units, {i for i in ids if not table.slots[i].bundles},
                                table, fences) or soonest_slot(units, ids, table, fences)
            if slot is None:
                return None
            chosen[slot.id] = units
            agents.add(slot.agent)
        return chosen

    def never(self, gang: Gang) -> str | None:
        """Why no agents could ever hold GANG (None: they could), cached till they change."""
        if self._never_epoch != self.table.epoch:
            self._never.clear()
            self._never_epoch = self.table.epoch
        key = (gang.strategy, *(_key(b) for b in gang.bundles))
        if key not in self._never:
            self._never[key] = gang_fit.never(gang.bundles, gang.strategy,
                                              list(self.table.slots.values()))
        return self._never[key]


def _key(units: Units) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(units.items()))


def _use(space: Slot, taken: Units, local: list[int], shares: list[int], memory: list[int],
         sign: int) -> None:
    """Take (SIGN -1) or give back (1) TAKEN, on devices LOCAL, in a bundle's SPACE."""
    add_to(space.free, taken, sign)
    for pos, share, mem in zip(local, shares, memory):
        space.gpu_free[pos] += sign * share
        space.gpu_mem_free[pos] += sign * mem


__all__ = ["Bundle", "Gang", "GangBook", "Inside", "check", "inside_refusal"]
