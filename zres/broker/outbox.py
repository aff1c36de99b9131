"""Sending to peers: the one function every broker part sends with, and per-peer batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Send(Protocol):
    """Send one message of KIND to the peer with routing id IDENT."""

    def __call__(self, ident: bytes, kind: str, body: dict[str, Any] | None = None,
                 frames: Sequence[Any] = ()) -> None: ...


class Batches:
    """Items gathered per peer and sent as one message each: ``{KEY: [items]}`` with the
    items' payload frames after it, in item order."""

    def __init__(self, send: Send, kind: str, key: str) -> None:
        self._send = send
        self._kind = kind
        self._key = key
        self._pending: dict[bytes, tuple[list[Any], list[Any]]] = {}

    def add(self, ident: bytes, item: Any, frames: Sequence[Any] = ()) -> None:
        items, out = self._pending.setdefault(ident, ([], []))
        items.append(item)
        out.extend(frames)

    def drop(self, ident: bytes) -> None:
        """Forget what is gathered for IDENT (it was made for a session that has ended)."""
        self._pending.pop(ident, None)

    def peers(self) -> list[bytes]:
        return list(self._pending)

    def keys_of(self, ident: bytes) -> set[Any]:
        """The first fields of the items waiting for IDENT (its tasks' local ids)."""
        pending = self._pending.get(ident)
        return {item[0] for item in pending[0]} if pending is not None else set()

    def discard(self, ident: bytes, drop: set[Any]) -> None:
        """Forget IDENT's waiting items that are in DROP (items without frames only)."""
        pending = self._pending.get(ident)
        if pending is not None:
            pending[0][:] = [item for item in pending[0] if item not in drop]
            if not pending[0]:
                del self._pending[ident]

    def flush(self, extra: Callable[[bytes], dict[str, Any]] | None = None) -> None:
        """Send every peer's batch, with EXTRA(ident)'s fields in its body."""
        if not self._pending:
            return  # (most calls: several batches are flushed every loop turn)
        pending, self._pending = self._pending, {}
        for ident, (items, frames) in pending.items():
            body = {self._key: items, **(extra(ident) if extra is not None else {})}
            self._send(ident, self._kind, body, frames)
