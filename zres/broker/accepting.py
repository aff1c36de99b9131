"""Acknowledging what clients submitted (``accepted``), once it is written, with the ids
its tasks have here (what the client's futures show).

A client keeps what it sent until then, and sends it again to a restarted broker, which
takes each task once. The acknowledgement rides with the client's next results when they
come within ``ACCEPT_WITHIN``, as a short task's do: one message less each way, on its
path. Else it goes on its own then, or at once once a client has ``ACCEPT_AT_ONCE`` tasks
to hear of (it sends at most a window of tasks ahead of its acknowledgements).
"""

from __future__ import annotations

import time
from typing import Any

from ..core import protocol as P
from .clients import ClientRecord
from .outbox import Send
from .store import Store

ACCEPT_WITHIN = 0.005  # seconds an acknowledgement waits for results to ride with
ACCEPT_AT_ONCE = 1_000


class Acknowledgements:
    """Per client: what to acknowledge (up to its ``accepted`` local id), by when, and the
    ids to tell it, as runs of [first local id, first id, count] (a map's tasks: one run)."""

    def __init__(self, send: Send, store: Store | None) -> None:
        self._send = send
        self._store = store
        self._clients: dict[bytes, ClientRecord] = {}
        self._by: dict[bytes, float] = {}
        self._ids: dict[bytes, list[list[int]]] = {}
        self.wait = 3600.0  # seconds from the last ``send_due`` to the next one due

    def tell_id(self, ident: bytes, local: int, task_id: int) -> None:
        """Tell the client IDENT that its task LOCAL has TASK_ID here."""
        told = self._ids.setdefault(ident, [])
        if told:
            last = told[-1]
            if local == last[0] + last[2] and task_id == last[1] + last[2]:
                last[2] += 1
                return
        told.append([local, task_id, 1])

    def took(self, client: ClientRecord) -> None:
        """CLIENT's submits up to its ``accepted`` are taken: acknowledge them once
        written."""
        self._clients[client.ident] = client
        self._by.setdefault(client.ident, time.monotonic() + ACCEPT_WITHIN)

    def forget(self, ident: bytes) -> None:
        """The client IDENT is gone: what was to be told it is not."""
        self._clients.pop(ident, None)
        self._by.pop(ident, None)
        self._ids.pop(ident, None)

    def _written(self) -> bool:
        return self._store is None or self._store.error is None

    def send_due(self) -> None:
        """Send the acknowledgements due, or large, once written; set ``wait``."""
        if not self._by:  # (most turns)
            self.wait = 3600.0
            return
        self.wait = ACCEPT_WITHIN
        if not self._written():
            return  # kept by its clients until it is written: they send it again
        now = time.monotonic()
        for ident, by in list(self._by.items()):
            if by <= now or sum(run[2] for run in self._ids.get(ident, ())) >= ACCEPT_AT_ONCE:
                self._send(ident, P.ACCEPTED, self.fields(ident))
        # (at least a millisecond: the loop's poll waits whole ones, and a wait under one
        # would be none at all, the loop turning idly until the acknowledgement is due)
        self.wait = max(min(self._by.values(), default=now + 3600.0) - now, 0.001)

    def fields(self, ident: bytes) -> dict[str, Any]:
        """The fields that acknowledge IDENT's submits, for a message to it (none if
        nothing waits, or it is not written); forgotten once taken."""
        if ident not in self._by or not self._written():
            return {}
        del self._by[ident]
        return {"upto": self._clients.pop(ident).accepted, "ids": self._ids.pop(ident, [])}
