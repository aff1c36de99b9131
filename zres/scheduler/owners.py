"""Fair share between owners: what each holds, its decaying use, and its quota.

An owner is the name of the key that submitted the work ("" without keys, or for the
default client key). A pass serves owners in the order of their *charge*, lowest first,
and each owner's tasks by priority, then submission order (``order``).

- **Weight.** A grant weighs its dominant share: the largest fraction of the cluster's
  capacity it asks for of any one resource (Dominant Resource Fairness's measure, Slurm's
  ``MAX_TRES`` billing). On a cluster of 64 CPUs and 8 GPUs a task asking ``CPU=4 GPU=1``
  weighs max(4/64, 1/8) = 0.125, and one asking ``CPU=1`` 1/64. The capacity is the one at
  its grant (agents joining later do not re-weigh it). A request is counted as asked.
- **Use.** An owner's use U is what it has held, in weight-seconds, decaying with a
  half-life H (``[broker] fairshare_half_life``): dU/dt = W - U/tau, tau = H / ln 2, W the
  weight it holds now. Computed exactly whenever W changes, so it costs O(1) per grant.
  An owner that has held W for long has U = tau * W; one that stops halves its U every H.
- **Charge.** C = U + tau * W: its recent use, plus what it holds now at the same scale.
  The second term moves an owner back in the order with every grant it gets, so owners
  that start together share a pass's free room instead of the first taking it all (Slurm
  recomputes its order every few minutes and lets one burst go to one user).
- **Quotas** cap what an owner holds at once, per resource (``[quotas] alice = "GPU=4"``):
  its tasks, actors and jobs together, counted from grant to release. Its task that would
  go over waits, and others' work passes it.

Owners' records are O(owners) in all; every decision touches one of them, O(1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.resources import Units
from .records import add_to

DEFAULT_HALF_LIFE = 4 * 3600.0  # seconds: a day's work is mostly forgotten by the next


@dataclass(slots=True)
class Quotas:
    """What owners may hold at once (HOLD) and have waiting (QUEUED), by owner name; the
    DEFAULT_ ones apply to every owner not named (None: no cap)."""

    hold: dict[str, Units] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    default_hold: Units | None = None
    default_queued: int | None = None

    def hold_of(self, owner: str) -> Units | None:
        return self.hold.get(owner, self.default_hold)

    def queued_of(self, owner: str) -> int | None:
        return self.queued.get(owner, self.default_queued)


@dataclass(slots=True)
class Account:
    """One owner's holdings and use."""

    held: Units = field(default_factory=dict)  # what its grants asked for, summed
    weight: float = 0.0          # the weights of its grants, summed (W)
    grants: int = 0              # grants it holds (started, or queued on a slot)
    usage: float = 0.0           # U, as of AT
    at: float = 0.0


def weight_of(units: Mapping[str, int], capacity: Mapping[str, int]) -> float:
    """The dominant share of UNITS in a cluster of CAPACITY (0 for what it offers none of)."""
    weight = 0.0
    for name, amount in units.items():
        total = capacity.get(name)
        if total and amount > weight * total:
            weight = amount / total
    return weight


class Owners:
    """Every owner's account, and the quotas; the order of owners in a pass."""

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE,
                 quotas: Quotas | None = None) -> None:
        if not (0 < half_life < math.inf):
            raise ValueError(f"the fair-share half-life must be a positive number of "
                             f"seconds, got {half_life!r}")
        self.half_life = half_life
        self.tau = half_life / math.log(2)
        self.quotas = quotas or Quotas()
        self.accounts: dict[str, Account] = {}

    def _account(self, owner: str) -> Account:
        account = self.accounts.get(owner)
        if account is None:
            account = self.accounts[owner] = Account()
        return account

    def _advance(self, account: Account, now: float) -> None:
        """Bring ACCOUNT's use up to NOW (W was constant since)."""
        elapsed = now - account.at
        if elapsed > 0:
            kept = math.exp(-elapsed / self.tau)
            account.usage = account.usage * kept + account.weight * self.tau * (1 - kept)
            account.at = now

    def usage(self, owner: str, now: float) -> float:
        """OWNER's use U at NOW, in weight-seconds."""
        account = self.accounts.get(owner)
        if account is None:
            return 0.0
        self._advance(account, now)
        return account.usage

    def charge(self, owner: str, now: float) -> float:
        """OWNER's place in the order at NOW: lower goes first."""
        account = self.accounts.get(owner)
        if account is None:
            return 0.0
        self._advance(account, now)
        return account.usage + self.tau * account.weight

    def take(self, owner: str, units: Units, weight: float, now: float) -> None:
        """OWNER's work was granted UNITS, weighing WEIGHT, at NOW."""
        account = self.accounts.get(owner) or self._account(owner)
        if now > account.at:
            self._advance(account, now)
        add_to(account.held, units)
        account.weight += weight
        account.grants += 1

    def give(self, owner: str, units: Units, weight: float, now: float) -> None:
        """OWNER's grant of UNITS, weighing WEIGHT, ended at NOW."""
        account = self.accounts.get(owner) or self._account(owner)
        if now > account.at:
            self._advance(account, now)
        add_to(account.held, units, -1)
        account.grants -= 1
        # (sums of floats drift: nothing held is exactly nothing)
        account.weight = account.weight - weight if account.grants else 0.0

    @property
    def capped(self) -> bool:
        """Whether any owner has a quota on what it holds."""
        return bool(self.quotas.hold or self.quotas.default_hold)

    def over_quota(self, owner: str, units: Units) -> Units | None:
        """OWNER's quota if UNITS more would take it over (None: within it, or none)."""
        quota = self.quotas.hold_of(owner)
        if not quota:
            return None
        held = self.accounts[owner].held if owner in self.accounts else {}
        if any(units.get(name, 0) and held.get(name, 0) + units[name] > cap
               for name, cap in quota.items()):
            return quota
        return None

    def held(self, owner: str) -> Units:
        account = self.accounts.get(owner)
        return dict(account.held) if account is not None else {}

    def describe(self, now: float, waiting: Mapping[str, int] | None = None
                 ) -> list[dict[str, Any]]:
        """Each owner with work held, waiting (WAITING: its tasks waiting, by owner) or
        recent use, or a quota: what it holds (amounts, grants, and its dominant share
        now: ``weight``), its use U (weight-seconds), its share of all owners' recent use,
        its charge, and its quotas. In the order a pass serves them. O(owners)."""
        waiting = waiting or {}
        names = (set(self.accounts) | set(self.quotas.hold) | set(self.quotas.queued)
                 | set(waiting))
        uses = {name: self.usage(name, now) for name in names}
        total = sum(uses.values())
        out = []
        for name in names:
            account = self.accounts.get(name, Account())
            if not (account.grants or uses[name] >= 1e-9 or waiting.get(name)
                    or name in self.quotas.hold or name in self.quotas.queued):
                continue  # (an owner whose use has decayed away, and nothing else)
            out.append({"owner": name, "holds": dict(account.held), "grants": account.grants,
                        "weight": round(account.weight, 6), "usage": round(uses[name], 3),
                        "share": round(uses[name] / total, 4) if total else 0.0,
                        "charge": round(self.charge(name, now), 3),
                        "waiting": waiting.get(name, 0), "quota": self.quotas.hold_of(name),
                        "queued_quota": self.quotas.queued_of(name)})
        return sorted(out, key=lambda o: (o["charge"], o["owner"]))
