"""Limits on what one message may hold, so that one peer cannot cost everyone else.

Every limit is generous by default and configurable on the broker (``[broker]``
``max_header_bytes`` and so on, or ``ZRES_BROKER__MAX_TASKS`` ...). A message over a limit
is refused with a reply naming the limit; nothing of it is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Limits:
    header_bytes: int = 16 << 20      # a message's control frame (msgpack)
    payload_bytes: int = 8 << 30      # a message's payload frames, together
    name_bytes: int = 1024            # a client's, agent's, task's, actor's or job's name
    resources: int = 256              # resource names in one request or one slot
    slots: int = 4096                 # slots one agent offers
    tasks: int = 100_000              # tasks in one submit
    deps: int = 1_000_000             # dependencies of one task
    object_bytes: int = 64 << 30      # a value put on an agent (a big call, scatter)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Limits:
        """The limits named ``max_<field>`` in SETTINGS (the rest default)."""
        given = {f.name: settings[f"max_{f.name}"] for f in fields(cls)
                 if settings.get(f"max_{f.name}") is not None}
        return cls(**given)


# Devices one slot may offer (the broker refuses more in a registration; an agent refuses
# to build more: ``--resources GPU=1e9`` would otherwise make a billion device ids).
MAX_DEVICES = 4096

# A task's priority: higher first within its owner's work (fair share orders owners). Bounded,
# so that no number means "before everything else" (issue 28: 10**9 meant exactly that).
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000


def priority_error(value: int) -> str | None:
    """Why VALUE is not a priority (None: it is one)."""
    if PRIORITY_MIN <= value <= PRIORITY_MAX:
        return None
    return (f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {value} "
            "(it orders one owner's tasks; fair share orders owners)")


class LimitExceeded(ValueError):
    """A message is over one of the limits; the text names it."""


def quote(value: object, limit: int = 200) -> str:
    """VALUE as text for a log line or an error message: its repr, cut to LIMIT
    characters (untrusted input is never logged whole)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_count(count: int, limit: int, what: str, setting: str) -> None:
    if count > limit:
        raise LimitExceeded(f"{what}: {count}, more than the broker's limit of {limit} "
                            f"({setting})")


def check_units(value: Any, limits: Limits, what: str) -> dict[str, int]:
    """A units map off the wire, within the limit on resource names."""
    units = check_units_map(value, what)
    check_count(len(units), limits.resources, f"{what}: resource names", "max_resources")
    long = next((n for n in units if len(n) > 128), None)
    if long is not None:
        raise ProtocolError(f"{what}: resource name {long[:40]!r}... is too long")
    return units


def check_name(value: Any, limits: Limits, what: str) -> str:
    """A name off the wire, within the limit on names."""
    name = str(value)
    if len(name.encode(errors="replace")) > limits.name_bytes:
        raise LimitExceeded(f"{what} is {len(name)} characters long, more than the broker's "
                            f"limit of {limits.name_bytes} bytes (max_name_bytes)")
    return name


def check_units_map(value: Any, what: str) -> dict[str, int]:
    """Validate a units map received off the wire."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()):
        raise ProtocolError(f"{what}: resources must map names to non-negative ints")
    return value
