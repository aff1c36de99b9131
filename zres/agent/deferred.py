"""Grants that arrived while the agent's lease had lapsed, held until it comes back.

While the lease has lapsed the broker may already count this agent lost and its grants
someone else's: they wait here, unstarted, and are taken in once the broker is heard
again (or dropped with the session). They count as held (HOLDING names them) and a
cancel reaches them here.
"""

from __future__ import annotations

from ..core import protocol as P


class DeferredGrants:
    """ASSIGN messages waiting for the lease, in arrival order."""

    def __init__(self) -> None:
        self._messages: list[P.Message] = []

    def add(self, msg: P.Message) -> None:
        self._messages.append(msg)

    def ids(self) -> list[int]:
        """The task ids of every grant waiting here."""
        return [item[0] for msg in self._messages for item in msg.body.get("tasks", [])]

    def take(self) -> list[P.Message]:
        """Every message waiting, oldest first; none is left here."""
        messages, self._messages = self._messages, []
        return messages

    def drop(self, task_id: int) -> bool:
        """Remove TASK_ID's grant (its item and its frames); whether it was here."""
        for msg in self._messages:
            items = msg.body.get("tasks", [])
            index = next((i for i, item in enumerate(items) if item[0] == task_id), None)
            if index is None:
                continue
            counts = [item[4] + sum(item[5]) for item in items]
            start = sum(counts[:index])
            del msg.frames[start:start + counts[index]]
            del items[index]
            return True
        return False
