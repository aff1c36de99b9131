"""The open clients, newest last: the newest is the default for ``zres.submit`` and friends.

Actor handles made inside tasks find their client here without importing the client
module (which imports them): ``zres.client.client`` tells this module how to start a
default client.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from ..core.context import task_token

_open: list[Any] = []
_lock = threading.Lock()
_start: Callable[[], Any] | None = None
_hooked = False  # _at_exit is registered (at the first client: after the user's own hooks)


def set_factory(start: Callable[[], Any]) -> None:
    """Use START() to make a client when one is needed and none is open."""
    global _start
    _start = start


def add(client: Any) -> None:
    global _hooked
    with _lock:
        _open.append(client)
        if not _hooked:
            _hooked = True
            atexit.register(_at_exit)


def remove(client: Any) -> None:
    with _lock:
        if client in _open:
            _open.remove(client)


def default() -> Any:
    """Return the newest open client made where this runs, starting one if none is open:
    inside a task, one made for that task (it acts for the task's owner; a client left
    open by an earlier task of this worker process, perhaps another owner's, is not it)."""
    token = task_token()
    with _lock:
        for client in reversed(_open):
            if getattr(client, "_token", "") == token:
                return client
    assert _start is not None, "zres.client.client sets the factory when it is imported"
    return _start()


def _at_exit() -> None:
    """The program ends: each client still open finishes what it must and closes
    (``Client._at_exit``), newest first. Ctrl-C stops the waiting, not the closing."""
    with _lock:
        clients = list(reversed(_open))
    for client in clients:
        try:
            client._at_exit()
        except KeyboardInterrupt:
            client.close()
