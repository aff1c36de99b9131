"""What an agent tells its broker about its work: numbered reports, kept until acknowledged.

Everything that happens to a grant here (handed to a worker, started, finished, given
back) goes into the next report, sent once per loop turn, before any hand-off of that
turn reaches a worker: the broker always hears that a task may have started before it
can have. Reports are numbered per session; the broker acknowledges them cumulatively,
and the agent sends again those not acknowledged when it reconnects, so none is lost to
a broken connection, and none counts twice (the broker skips numbers it has seen).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..core import protocol as P


class Reports:
    """The report being gathered, and those sent but not acknowledged."""

    def __init__(self) -> None:
        self._seq = 0
        self._unacked: deque[tuple[int, list[Any], int]] = deque()   # seq, frames, bytes
        self._clear()

    def _clear(self) -> None:
        self._fields: dict[str, list[Any]] = {"held": [], "started": [], "results": [],
                                              "exits": [], "returned": []}
        self._frames: list[Any] = []

    # -- gathering (what the runner and the actors call: runner.Events) ---------------
    def held(self, task_id: int) -> None:
        """TASK_ID is handed to a worker process: it may start any moment."""
        self._fields["held"].append(task_id)

    def started(self, task_id: int) -> None:
        self._fields["started"].append(task_id)

    def result(self, task_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None:
        self._fields["results"].append([task_id, outcome, len(frames), info])
        self._frames.extend(frames)

    def exited(self, body: dict[str, Any]) -> None:
        """An actor's process ended (after the results it sent before)."""
        self._fields["exits"].append(body)

    def give_back(self, task_id: int) -> None:
        """TASK_ID was granted here and never started: the broker may grant it again."""
        self._fields["returned"].append(task_id)

    # -- sending ----------------------------------------------------------------------
    def take(self, session: int) -> list[Any] | None:
        """Return the next report as a message (None if nothing happened); keep it until
        it is acknowledged."""
        if not any(self._fields.values()):
            return None
        self._seq += 1
        body: dict[str, Any] = {"seq": self._seq, "session": session}
        body.update((name, value) for name, value in self._fields.items() if value)
        message = P.encode(P.REPORT, body, self._frames)
        size = sum(len(P.buffer(f)) for f in self._frames)
        self._unacked.append((self._seq, message, size))
        self._clear()
        return message

    def acked(self, seq: int) -> None:
        """The broker has every report up to SEQ."""
        while self._unacked and self._unacked[0][0] <= seq:
            self._unacked.popleft()

    def unacked(self) -> list[list[Any]]:
        """The reports sent but not acknowledged, oldest first, to send again."""
        return [message for _, message, _ in self._unacked]

    def pending_bytes(self) -> int:
        return sum(size for _, _, size in self._unacked)

    def reset(self) -> None:
        """Forget everything (a new session starts: the old one's news is void)."""
        self._seq = 0
        self._unacked.clear()
        self._clear()

