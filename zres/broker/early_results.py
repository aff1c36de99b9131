"""A short task's result told to its client first, before the broker takes in the rest
of its end.

A result a worker process sent straight here (``agent_link.on_direct_done``) that the
broker finds current is told to its client at once: the task's row, as its end will
write it, is committed first (one journal record), then its client's RESULTS goes. Only
then does the broker take in the rest of the end: the grant freed, the census, the
dependents, the row written again. That rest was most of the broker's time on a short
task's way back, and its client no longer waits for it.

Told first is only what the rest could not end otherwise: an ok or raised end of a
plain task (no job, no actor's) whose client holds it, not being cancelled or stopped,
its result inline (none kept on an agent). The news that it began, due in the same turn,
is not sent after it. A broker that dies once it has told, before its turn's commit,
comes back with the task ended (its row was committed first): nothing its client was
told is taken back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.tasks import Task
from .accepting import Acknowledgements
from .clients import ClientRegistry
from .keeping import TaskKeeper

Send = Callable[..., None]


class EarlyResults:
    """Results told first (see above): SEND sends, COMMIT commits the state (False: it
    could not, so nothing is told first)."""

    def __init__(self, send: Send, clients: ClientRegistry, keeper: TaskKeeper,
                 acks: Acknowledgements, commit: Callable[[], bool]) -> None:
        self._send = send
        self._clients = clients
        self._keeper = keeper
        self._acks = acks
        self._commit = commit
        # This turn's, by task id: their clients and local ids (neither their end nor the
        # news that they began, batched before or after, is told again)
        self.told: dict[int, tuple[bytes, int]] = {}

    def tell(self, task: Task, outcome: str, frames: list[Any], info: dict[str, Any]) -> None:
        """Tell TASK's client its end (OUTCOME, FRAMES and INFO, as its end will record
        them) now, if it is one told first."""
        client = self._clients.get(task.client)
        if client is None or client.ids.get(task.local_id) != task.id or task.size \
                or outcome not in (P.OK, P.RAISED) or task.cancelling or task.stopping \
                or "stored" in info:
            return
        self._keeper.ending(task, outcome, frames, info)
        if not self._commit():
            return  # (its end is taken in as before, and told once written)
        out = [] if task.quiet and outcome == P.OK else frames
        self._send(client.ident, P.RESULTS, {
            "results": [[task.local_id, outcome, len(out), info]],
            **self._acks.fields(client.ident)}, out)  # (written: the commit above)
        self.told[task.id] = (client.ident, task.local_id)
