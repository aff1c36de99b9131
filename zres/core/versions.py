"""What a peer runs (zres, Python, cloudpickle) and whether two peers can work together.

The broker compares every client's hello and every agent's registration with its own: zres
must be the same version on every side (the wire protocol), and Python's major.minor and
cloudpickle's version the same too, since pickles made by clients are read by the agents'
workers and theirs by clients. Comparing each peer with the broker, one fixed reference,
makes every client and agent pair agree without the broker unpickling anything.
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import ProtocolError

# The one place the version is written: pyproject.toml reads it from here.
ZRES_VERSION = "0.1.0"

FIELDS = ("zres", "python", "cloudpickle")


def mine() -> dict[str, str]:
    """Return what this process runs, as sent in a hello or a registration."""
    import cloudpickle  # (here: a process that states no versions starts without it)
    return {"zres": ZRES_VERSION, "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "cloudpickle": str(cloudpickle.__version__)}


def describe(versions: dict[str, Any]) -> str:
    """Say VERSIONS as 'zres 0.1.0 / Python 3.11 / cloudpickle 3.1.2'."""
    return " / ".join(f"{name} {versions.get(key, '?')}" for key, name in
                      zip(FIELDS, ("zres", "Python", "cloudpickle")))


def mismatch(theirs: Any, ours: dict[str, str]) -> str | None:
    """Say which of THEIRS (a peer's stated versions) differ from OURS; None if none do.

    A peer that states nothing (a raw tool speaking the protocol) is not compared; one
    that states something malformed is a mismatch.
    """
    if theirs is None:
        return None
    if not isinstance(theirs, dict):
        return "versions"
    differ = [key for key in FIELDS if str(theirs.get(key)) != ours[key]]
    return ", ".join(differ) if differ else None


def refuse_mismatch(theirs: Any, who: str) -> None:
    """Raise ProtocolError naming both sides' versions unless THEIRS, what a WHO (client,
    agent) says it runs, can work with this process (the broker)."""
    ours = mine()
    differ = mismatch(theirs, ours)
    if differ is not None:
        said = describe(theirs) if isinstance(theirs, dict) else "unknown versions"
        raise ProtocolError(
            f"this {who} runs {said}, the broker runs {describe(ours)} ({differ} differ): "
            "clients, agents and their broker must run the same zres version, Python "
            "major.minor and cloudpickle version")
