"""``ActorHandle``: the caller's side of an actor; ``handle.method(...)`` returns a Future.

A handle is small and picklable: pass it to tasks and to other actors, and it makes its
calls there through that process's default client. Calls made through one client run on
the actor in the order they were made.
"""

from __future__ import annotations

from typing import Any

from . import registry
from .futures import Future


class ActorHandle:
    """A reference to an actor; attribute access gives its methods."""

    def __init__(self, actor_id: str, cls: str, methods: list[str], name: str = "",
                 client: Any = None, ready: Future | None = None) -> None:
        self._zres_id = actor_id
        self._zres_cls = cls
        self._zres_methods = frozenset(methods)
        self._zres_name = name
        self._zres_client = client
        self._zres_ready = ready

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("__") or method.startswith("_zres_"):
            raise AttributeError(method)
        if method not in self._zres_methods:
            raise AttributeError(f"actor {self._zres_cls} has no method {method!r}")
        return ActorMethod(self, method)

    def ready(self) -> Future:
        """Return a future that resolves once the instance is up (or fails as it did)."""
        if self._zres_ready is not None and not self._zres_ready.client._closed:
            return self._zres_ready
        return ActorMethod(self, "__zres_ready__")()

    def client(self) -> Any:
        """The client this handle's calls go through (this process's default if unbound)."""
        if self._zres_client is None or self._zres_client._closed:
            self._zres_client = registry.default()
        return self._zres_client

    def __reduce__(self) -> Any:
        return (ActorHandle, (self._zres_id, self._zres_cls, sorted(self._zres_methods),
                              self._zres_name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._zres_id == self._zres_id

    def __hash__(self) -> int:
        return hash(self._zres_id)

    def __repr__(self) -> str:
        name = f" name={self._zres_name!r}" if self._zres_name else ""
        return f"<zres.ActorHandle {self._zres_cls} id={self._zres_id[:8]}{name}>"

    def _repr_html_(self) -> str:
        from .html import actor
        client = self._zres_client
        status, error = None, None
        if client is not None and not client._closed:  # (none made just to draw it)
            try:
                found = [a for a in client.status(timeout=2.0).get("actors", [])
                         if a.get("id") == self._zres_id]
                status = found[0] if found else None
                error = None if found else "not live: it ended, or was killed"
            except Exception as exc:  # the broker is away: said, not raised
                error = f"the broker did not answer: {exc}"
        return actor(self._zres_cls, self._zres_id, self._zres_name,
                     sorted(self._zres_methods), status, error)


class ActorMethod:
    """One method of an actor: call it to queue a call; ``options`` for retries or a key."""

    def __init__(self, handle: ActorHandle, method: str, retries: int = 0,
                 key: str | None = None) -> None:
        self.handle = handle
        self.method = method
        self.retries = retries
        self.key = key

    def options(self, *, retries: int | None = None, key: str | None = None) -> ActorMethod:
        """Return this method with RETRIES (re-run on a restarted actor if its process
        dies while the call runs) or KEY (the call's name in status and errors)."""
        return ActorMethod(self.handle, self.method,
                           self.retries if retries is None else retries,
                           self.key if key is None else key)

    def __call__(self, *args: Any, **kwargs: Any) -> Future:
        return self.handle.client()._call(self.handle, self.method, args, kwargs,
                                          self.retries, self.key)

    def __repr__(self) -> str:
        return f"<zres.ActorMethod {self.handle._zres_cls}.{self.method}>"
