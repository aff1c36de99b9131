"""Turn a broker's status report, whose amounts are fixed-point units on the wire, into
what users read: amounts in their own units (4096 MiB comes back as 4294967296, not as
42949672960000)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .resources import UNIT, format_amount, units_to_float

# Task counts by state that a report shows even when none are in that state.
STATES = ("waiting", "queued", "running", "done", "failed")

# Where a status report holds amounts: each agent slot's total and free, and each waiting
# task, group, running task, actor and job's request.
_SLOT_AMOUNTS = ("total", "free")


def in_user_units(report: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of REPORT with every amount in user units (floats), REPORT untouched."""
    out = dict(report)
    out["agents"] = [{**agent, "slots": [{**slot, **{key: units_to_float(slot[key])
                                                      for key in _SLOT_AMOUNTS}}
                                         for slot in agent.get("slots", [])]}
                     for agent in report.get("agents", [])]
    for key in ("waiting", "groups", "running", "actors", "jobs"):
        if key in report:
            out[key] = [entry_in_user_units(entry) for entry in report[key]]
    if "owners" in report:  # (what each holds, and its quota: see zres.scheduler.owners)
        out["owners"] = [{**owner, "holds": units_to_float(owner["holds"]),
                          "quota": units_to_float(owner["quota"]) if owner["quota"] else None}
                         for owner in report["owners"]]
    return out


def entry_in_user_units(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ENTRY (a task, job or actor) with its request in user units."""
    units = entry.get("units")
    return {**entry, "units": units_to_float(units)} if isinstance(units, Mapping) \
        else dict(entry)


def format_user_amount(name: str, value: float) -> str:
    """Render an amount in user units for people: 2, 0.25, 4.295G."""
    return format_amount(name, round(value * UNIT))
