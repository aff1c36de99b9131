"""Where a gang's bundles go: every one of them at once, as its strategy says, or none.

A gang (a placement group, a multi-node job) asks for several *bundles* of resources, each
on one slot, held together. Nothing is taken until every bundle fits at once; then all
are, in one decision. So two gangs never each hold half of what both need and wait for
each other. The strategies are Ray's:

- ``PACK``: as few agents as possible: all on one agent when one has room, else the
  largest bundles first, each beside those placed already when it fits there;
- ``SPREAD``: as many agents as possible: each bundle on an agent holding none of the
  gang's yet when one fits, else beside them;
- ``STRICT_PACK``: all on one agent, or wait;
- ``STRICT_SPREAD``: each bundle on an agent of its own, or wait.

Bundles are placed largest first (their dominant share of the cluster), each on the best
fitting slot (``fit``: fewest kinds unused, least left over), inside the fences of
reservations like any task. A *trial* takes each bundle's resources as it goes and, when
one does not fit, gives them all back: the table is as it was, its record of the slots
that gained room included (else a gang that cannot start would make every loop turn run
a pass for nothing).

A gang that no registered agents could ever hold, were they all idle, is infeasible: the
same placement tried on idle copies of every slot says so, and which rule it breaks.
Cost: a decision looks at a few candidate slots per bundle (the index's: see ``fit``), a
STRICT_PACK at a few agents; never at every slot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence

from ..core.resources import Units, format_units
from .devices import could_ever_fit, infeasible, taken_by
from .fit import best_slot
from .owners import weight_of
from .records import Grant, Slot, Workers, add_to
from .reservations import Fence
from .table import NewSlot, SlotTable

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_AGENTS_TRIED = 8  # agents tried whole for a STRICT_PACK (and a PACK's first try)

Made = list[tuple[int, Slot, Grant]]  # (bundle index, its slot, its grant)


def total_of(bundles: Iterable[Units]) -> Units:
    """What BUNDLES ask for, summed."""
    total: Units = {}
    for units in bundles:
        add_to(total, units)
    return total


def by_size(bundles: Sequence[Units], capacity: Units) -> list[int]:
    """The bundles' indices, largest first (dominant share of CAPACITY), then by index."""
    return sorted(range(len(bundles)), key=lambda i: (-weight_of(bundles[i], capacity), i))


class Trial:
    """Bundles placed one by one on TABLE, their resources taken as they go (grant ids
    IDS, of gang GANG, for OWNER); ``undo`` gives them all back."""

    def __init__(self, table: SlotTable, ids: Sequence[int], gang: int,
                 fences: dict[int, Fence], owner: str) -> None:
        self.table = table
        self.made: Made = []
        self._ids, self._gang, self._fences, self._owner = ids, gang, fences, owner
        self._gained = set(table.gained)

    def agents(self) -> frozenset[str]:
        """The agents holding a bundle of the trial so far."""
        return frozenset(slot.agent for _, slot, _ in self.made)

    def put(self, index: int, units: Units, slots: Iterable[Slot]) -> bool:
        """Place bundle INDEX (asking UNITS) on the best of SLOTS that fits it now."""
        found, _ = best_slot(units, slots, self._fences, None, owner=self._owner)
        if found is None:
            return False
        slot, (gpus, shares, memory) = found
        grant = Grant(self._ids[index], slot.id, units, gpus, taken_by(units, shares, memory),
                      shares, memory, short=False, owner=self._owner,
                      bundle=(self._gang, index))
        self.table.take(slot, grant)
        self.made.append((index, slot, grant))
        return True

    def undo(self) -> None:
        """Give back everything taken, as if nothing had been tried."""
        for _, slot, grant in reversed(self.made):
            self.table.give(slot, grant)
            if slot.id not in self._gained:
                self.table.gained.discard(slot.id)
        self.made.clear()


def place(bundles: Sequence[Units], strategy: str, table: SlotTable, fences: dict[int, Fence],
          owner: str, ids: Sequence[int], gang: int) -> Made | None:
    """Place every one of BUNDLES by STRATEGY on TABLE's slots now, taking their
    resources; or none of them (None). IDS: the bundles' grant ids, of gang GANG, whose
    grants OWNER holds; FENCES: the reservations in force in this pass."""
    if not _enough_room(bundles, strategy, table):
        return None  # (the index says so at once: no trial walks the slots)
    trial = Trial(table, ids, gang, fences, owner)
    order = by_size(bundles, table.capacity)
    if strategy in ("PACK", "STRICT_PACK"):
        if _one_agent(trial, bundles, order):
            return trial.made
        if strategy == "STRICT_PACK":
            return None
    for index in order:
        units = bundles[index]
        used = trial.agents()
        if strategy == "PACK":
            done = (bool(used) and trial.put(index, units, table.named(Workers(used)))) \
                or trial.put(index, units, table.candidates(units))
        elif strategy == "SPREAD":
            done = trial.put(index, units, _elsewhere(table, units, used)) \
                or trial.put(index, units, table.candidates(units))
        else:  # STRICT_SPREAD
            done = trial.put(index, units, _elsewhere(table, units, used))
        if not done:
            trial.undo()
            return None
    return trial.made


def _enough_room(bundles: Sequence[Units], strategy: str, table: SlotTable) -> bool:
    """Whether enough slots have room for the bundles, as far as the index says (an upper
    bound: fences, devices and queued grants are the trial's to check): STRICT_SPREAD
    needs a slot per bundle, STRICT_PACK one with room for their total, the others one
    for each bundle."""
    if strategy == "STRICT_PACK":
        return _with_room(table, total_of(bundles)) > 0
    counts: dict[tuple[tuple[str, int], ...], int] = {}
    for units in bundles:
        key = tuple(sorted(units.items()))
        counts[key] = counts.get(key, 0) + 1
    need = 1 if strategy != "STRICT_SPREAD" else None
    return all(_with_room(table, dict(key)) >= (need or count)
               for key, count in counts.items())


def _with_room(table: SlotTable, units: Units) -> int:
    """How many slots have room for each of UNITS' amounts, at most (its scarcest)."""
    return min(table.index.with_room(name, amount) for name, amount in units.items())


def _elsewhere(table: SlotTable, units: Units, used: frozenset[str]) -> Iterator[Slot]:
    """The candidate slots for UNITS on agents not in USED."""
    return (slot for slot in table.candidates(units) if slot.agent not in used)


def _one_agent(trial: Trial, bundles: Sequence[Units], order: list[int]) -> bool:
    """Place every bundle on one agent: tried on the first few agents with a slot that
    has room for the scarcest of their total (least room first: packing tight)."""
    table, tried = trial.table, set()
    for slot in table.candidates(total_of(bundles)):
        if slot.agent in tried or not slot.open:
            continue
        tried.add(slot.agent)
        mine = table.named(Workers(frozenset((slot.agent,))))
        if all(trial.put(index, bundles[index], mine) for index in order):
            return True
        trial.undo()  # (the index is as it was: the walk goes on where it stood)
        if len(tried) >= _AGENTS_TRIED:
            break
    return False


def never(bundles: Sequence[Units], strategy: str, slots: Collection[Slot]) -> str | None:
    """Say why SLOTS could never hold every one of BUNDLES at once by STRATEGY, were they
    all idle; None if they could (or if no slot has joined yet: that is waiting)."""
    if not slots:
        return None
    for index, units in enumerate(bundles):
        reason = infeasible(slots, units)
        if reason is not None:
            return f"its bundle {index} ({format_units(units)}) can never be placed: {reason}"
    idle = SlotTable()
    idle.add(NewSlot(s.id, s.agent, s.total, s.gpu_mem_total, len(s.gpu_free)) for s in slots)
    if place(bundles, strategy, idle, {}, "", range(len(bundles)), 0) is not None:
        return None
    count, total = len(bundles), format_units(total_of(bundles))
    if strategy == "STRICT_PACK":
        return (f"no agent could ever hold its {count} bundles together ({total} in all; "
                "STRICT_PACK puts them on one agent)")
    if strategy == "STRICT_SPREAD":
        agents = len({s.agent for s in slots if any(could_ever_fit(s, b) for b in bundles)})
        return (f"its {count} bundles need {count} distinct agents (STRICT_SPREAD), and "
                f"only {agents} could ever hold one")
    return f"the agents could never hold its {count} bundles at once ({total} in all)"
