"""How long each kind of task takes lately: pipelining queues only short kinds, and a
reservation's backfill estimates when tasks end."""

from __future__ import annotations

from collections.abc import Hashable

# Pipelining queues only tasks whose kind ran shorter than this, on average, lately.
SHORT_TASK = 0.01
_WEIGHT = 0.5          # of the newest run in the moving average
_MAX_KINDS = 10_000    # kinds remembered; past this the averages start afresh


class Durations:
    """A moving average of run time per kind (the caller's label, e.g. the function)."""

    def __init__(self) -> None:
        self._average: dict[Hashable, float] = {}

    def finished(self, kind: Hashable, seconds: float) -> None:
        """Note that a task of KIND ran SECONDS, from start to its result."""
        average = self._average.get(kind)
        if average is None and len(self._average) >= _MAX_KINDS:
            self._average.clear()
        self._average[kind] = seconds if average is None else (
            average + _WEIGHT * (seconds - average))

    def short(self, kind: Hashable | None) -> bool:
        """Whether tasks of KIND are expected to be short (no kind: yes; a kind not seen
        lately: no, until its runs say so)."""
        return kind is None or self._average.get(kind, SHORT_TASK) < SHORT_TASK

    def expected(self, kind: Hashable | None) -> float | None:
        """How long a task of KIND is expected to run (None: no kind, or never seen)."""
        return None if kind is None else self._average.get(kind)
