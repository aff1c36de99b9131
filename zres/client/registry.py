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

from ..core.context import task_token, token_owner

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
    inside a task, one that acts for the task's owner (made by this task, or by an
    earlier task of the same owner in this worker process: never another owner's)."""
    token = task_token()
    with _lock:
        # (one refused since, say a client of a task that had ended when the broker
        # restarted, is no one's default: a new one is made)
        _open[:] = [c for c in _open if not c._io.dead or not c._io.refused]
        for client in reversed(_open):
            if client._token == token:
                return client
        owner = token_owner(token)
        for client in reversed(_open):
            if owner is not None and token_owner(client._token) == owner:
                # Its hello, should the broker restart, names a task that runs: this one.
                client._token = client._io.token = token
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
