"""The actor face of ``zres.Client``: start actors, find them, kill them, call them."""

from __future__ import annotations

import inspect
import pickle
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import NotOwnerError
from .actors import ActorHandle
from .annotations import current_annotations
from .futures import Future
from .groups import placement_option


class ActorMethods:
    """Mixed into ``Client``: actors, whose construction and calls are tasks."""

    if TYPE_CHECKING:  # (the client's own, used here)
        _io: Any
        _pickler: Any

        def _options(self, resources: Mapping[str, Any] | None, retries: int | None = None,
                     priority: int | None = None, infeasible: str | None = None,
                     key: str | None = None) -> dict[str, Any]: ...

        def _make_future(self, fn: Any, name: str | None, frames: list[Any],
                         deps: list[Future[Any]], opts: dict[str, Any],
                         extra: dict[str, Any] | None = None) -> Future[Any]: ...

    def actor(self, cls: type, /, *args: Any, resources: Mapping[str, Any] | None = None,
              max_concurrency: int = 1, restarts: int = 0, name: str | None = None,
              priority: int | None = None, infeasible: str | None = None,
              get_if_exists: bool = False, shared: bool = False,
              detached: bool | None = None, placement: tuple[Any, int] | None = None,
              **kwargs: Any) -> ActorHandle:
        """Start CLS(*ARGS, **KWARGS) on an agent with RESOURCES free; return its handle.

        The actor holds RESOURCES until it ends, and no CPU unless RESOURCES names CPU.
        Its methods run in its own process, calls from one client in the order made, up to
        MAX_CONCURRENCY at once (threads; coroutine methods on its event loop). If its
        process or agent dies it is started again, up to RESTARTS times (-1: no limit). A
        NAMEd actor can be found with ``get_actor`` and
        outlives this client (it is detached: DETACHED=True says so, and is refused for an
        unnamed one); an unnamed one ends when this client goes, detached or not.
        Only its owner (the key that made it) and admin keys may call it, unless SHARED:
        then every key of the cluster may (a model server for a whole lab, say).

        GET_IF_EXISTS (with NAME, as Ray's): return the live actor called NAME if there is
        one (made by anyone, with whatever arguments, and that this key may call), else
        make this one; the broker decides, so clients racing to make it get one actor.
        Without it, a NAME in use is a ValueError. PLACEMENT: (a placement group, a bundle
        index): it lives in that bundle, holding RESOURCES of it (default: all of it).
        """
        if not inspect.isclass(cls):
            raise TypeError(f"actor() needs a class, not {type(cls).__name__}")
        for label, value, low in (("max_concurrency", max_concurrency, 1),
                                  ("restarts", restarts, -1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{label} must be an int >= {low}, got {value!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if get_if_exists and name is None:
            raise ValueError("get_if_exists needs the actor's name (name=...)")
        if detached and name is None:
            raise ValueError("an unnamed actor ends with its client: name it (name=...) to "
                             "keep it after this client goes, and find it with get_actor")
        if not isinstance(shared, bool):
            raise TypeError(f"shared must be a bool, not {type(shared).__name__}")
        # An actor holds what it asks for, and no CPU unless it asks: an idle actor must not
        # keep a CPU from tasks (Ray's hold none while alive either). One that computes
        # says so: resources={"CPU": 1}.
        asked = current_annotations().get("resources") if resources is None else resources
        where_in = None
        if placement is not None:
            where_in, asked = placement_option(placement, asked, cpu=0)
        opts = self._options({"CPU": 0, **(asked or {})}, 0, priority, infeasible, None)
        if where_in is not None:
            opts["placement"] = where_in
        actor_id = uuid.uuid4().hex
        methods = sorted(m for m in dir(cls)
                         if not m.startswith("__") and callable(getattr(cls, m, None)))
        deps: list[Any] = []
        index: dict[int, int] = {}
        frames = self._pickler.call(self._pickler.function(cls, deps, index), args, kwargs,
                                    deps, index)
        spec = {"id": actor_id, "name": name or "", "cls": cls.__qualname__,
                "methods": methods, "restarts": restarts, "concurrency": max_concurrency}
        if get_if_exists:
            spec["get_if_exists"] = True
        if shared:
            spec["shared"] = True
        ready = self._make_future(cls, f"{cls.__qualname__}.__init__-{name or actor_id[:8]}",
                                  frames, deps, opts, {"actor": spec})
        self._io.wake()
        if name is not None:
            # Sent after the construction, so the broker answers with the name's owner.
            found = self._io.request(P.LOOKUP, {"name": name}, 30.0)
            owner = found.get("actor") or {}
            if owner.get("id", actor_id) != actor_id or "private" in found:
                if get_if_exists and owner:
                    return ActorHandle(owner["id"], owner["cls"], owner["methods"],
                                       owner["name"], self)
                if get_if_exists:
                    raise ValueError(f"an actor named {name!r} exists, but it belongs to "
                                     f"{found['private'].get('owner')} and is not shared")
                raise ValueError(f"an actor named {name!r} already exists")
        return ActorHandle(actor_id, cls.__qualname__, methods, name or "", self, ready)

    def get_actor(self, name: str, timeout: float = 10.0) -> ActorHandle:
        """Return a handle to the live actor called NAME; ValueError if there is none,
        NotOwnerError if it is another owner's and not shared."""
        reply = self._io.request(P.LOOKUP, {"name": name}, timeout)
        found = reply.get("actor")
        if not found and isinstance(reply.get("private"), dict):
            hidden = reply["private"]
            raise NotOwnerError(
                f"actor {hidden.get('cls', '?')}({name}) exists but belongs to "
                f"{hidden.get('owner') or 'another key'} and is not shared: only its owner "
                "or an admin key may use it (the owner makes it with shared=True for others)")
        if not found:
            raise ValueError(f"no live actor named {name!r}")
        return ActorHandle(found["id"], found["cls"], found["methods"], found["name"], self)

    def kill(self, actor: ActorHandle, timeout: float = 10.0) -> None:
        """End ACTOR now: its resources are free when this returns; later calls fail
        with ActorDiedError."""
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"kill() needs an ActorHandle, not {type(actor).__name__}")
        self._io.request(P.KILL, {"actor": actor._zres_id}, timeout)

    def _call(self, actor: ActorHandle, method: str, args: tuple[Any, ...],
              kwargs: dict[str, Any], retries: int, key: str | None) -> Future:
        opts = self._options({}, retries, 0, "warn", key)
        deps: list[Any] = []
        frames = self._pickler.call(pickle.dumps(method, protocol=5), args, kwargs, deps, {})
        label = key or f"{actor._zres_cls}.{method}"
        future = self._make_future(label, key, frames, deps, opts, {"call": actor._zres_id})
        future.actor_call = True
        self._io.send_submit_now()
        return future
