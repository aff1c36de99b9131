"""Turn a broker's status report, whose amounts are fixed-point units on the wire, into
what users read: amounts in their own units (4096 MiB comes back as 4294967296, not as
42949672960000)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .resources import UNIT, format_amount, format_units, units_to_float

# The states of a task, in the words every view uses (status, --json, the dashboard,
# /metrics, client.status(), notebook cards, a future's repr), in their order; a report
# shows their counts even when none are in that state.
STATES = ("waiting", "queued", "running", "finished", "error", "cancelled")
MEANINGS = {"waiting": "waiting for dependencies", "queued": "queued for resources",
            "running": "running", "finished": "finished with a result",
            "error": "ended in an error", "cancelled": "cancelled"}

# Where a status report holds amounts: each agent slot's total and free, and each waiting
# task, group, running task, actor and job's request.
_SLOT_AMOUNTS = ("total", "free")


def in_user_units(report: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of REPORT with every amount in user units (floats), REPORT untouched,
    and as people read it (``format_amount``: a slot's ``shown``, an entry's ``request``),
    so that every view shows the same text."""
    out = dict(report)
    out["agents"] = [{**agent, "slots": [_slot(slot) for slot in agent.get("slots", [])]}
                     for agent in report.get("agents", [])]
    for key in ("waiting", "groups", "running", "actors", "jobs"):
        if key in report:
            out[key] = [entry_in_user_units(entry) for entry in report[key]]
    if "placement_groups" in report:  # (each bundle's request, and where it is)
        out["placement_groups"] = [
            {**group, "bundles": [entry_in_user_units(b) for b in group["bundles"]]}
            for group in report["placement_groups"]]
    if "owners" in report:  # (what each holds, and its quota: see zres.scheduler.owners)
        out["owners"] = [{**owner, "holds": units_to_float(owner["holds"]),
                          "quota": units_to_float(owner["quota"]) if owner["quota"] else None}
                         for owner in report["owners"]]
    return out


def _slot(slot: Mapping[str, Any]) -> dict[str, Any]:
    total, free = slot["total"], slot["free"]
    return {**slot, **{key: units_to_float(slot[key]) for key in _SLOT_AMOUNTS},
            "shown": {"total": {n: format_amount(n, u) for n, u in total.items()},
                      "free": {n: format_amount(n, free.get(n, 0)) for n in total}}}


def entry_in_user_units(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ENTRY (a task, job or actor) with its request in user units, and
    as people read it (``request``)."""
    units = entry.get("units")
    if not isinstance(units, Mapping):
        return dict(entry)
    return {"request": format_units(units), **entry, "units": units_to_float(units)}


def format_user_amount(name: str, value: float) -> str:
    """Render an amount in user units for people: 2, 0.25, 4.295G."""
    return format_amount(name, round(value * UNIT))
