"""``Client``: submits work to a broker; its I/O thread (``io``) resolves the futures.

User threads pickle the call and hand the message to the I/O thread, which alone touches
the socket. The newest open client is the default for ``zres.submit`` and friends.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from .. import config
from ..core import protocol as P
from ..core.address import wait_for_answer
from ..core.context import task_token
from ..core.errors import ZresError
from ..core.keys import refusal
from ..core.limits import priority_error
from ..core.relaying import mode_of
from ..core.report import in_user_units  # (what users read)
from ..core.resources import mapping_to_units, task_request, units_to_float
from ..core.serialize import CallPickler
from . import html, registry
from .actor_methods import ActorMethods
from .annotations import current_annotations
from .cancelling import CancelMethods
from .connect import find_broker
from .dask_methods import DaskMethods
from .executor import Executor
from .fetching import Fetcher
from .futures import Future, R, gather
from .groups import GroupMethods, PlacementGroup, placement_option
from .io import IOThread
from .job_methods import JobMethods
from .putting import PutMethods
from .shipping import ModuleType, Shipping

_INFEASIBLE_MODES = ("warn", "error")
CALL_INLINE = 1 << 20  # bytes of a call that travel with it; a bigger one is put first
_ROLES = ("admin", "client")  # the keys a client connects with: the first found


class Client(Shipping, ActorMethods, DaskMethods, JobMethods, CancelMethods, GroupMethods,
             PutMethods):
    """A connection to a zres cluster, with Dask's conventions: ``submit`` and ``map``
    return futures, and take ``resources``, ``priority``, ``retries``, ``key`` and
    ``infeasible`` themselves. ``executor()`` gives a standard concurrent.futures
    Executor on the same connection; ``get`` and ``compute`` run Dask graphs.

    The broker is ADDRESS if given, else ``$ZRES_BROKER``, else ``broker`` in the config
    file's ``[client]`` section (``zres.toml``), else one answering at
    tcp://127.0.0.1:7070; with none of these, a private cluster (a broker and one agent
    offering this machine, a ``LocalCluster``) starts for this client, which says so in
    one line and stops it on ``close()``. Nothing else can join a private cluster, so a
    task no agent there can run fails at once with InfeasibleError.

    INFEASIBLE ("warn" or "error") is what a task nobody can run gets by default: a
    warning while it waits for an agent that could, or that error at once ("error" on a
    private cluster, else "warn"). MODULES are shipped by value (see ``ship``).
    FORWARD_OUTPUT: print what its tasks and actor calls print here, each line prefixed
    ``(TASK AGENT)`` (default: ``[client] forward_output``).

    When the client goes (``close()``, Ctrl-C, its process killed, or silent past the
    broker's timeout) its tasks are stopped as ``cancel(force=True)`` stops them, and its
    unnamed actors end; a program that simply reaches its end first waits for what it
    submitted. DETACH: its tasks (and jobs) run on after it goes instead, as
    ``submit(..., detached=True)`` does for one task; ``zres status`` lists them with
    their owner, and ``zres cancel --task ID`` (or ``cancel_task``) stops one.
    RELAY: True fetches and puts every value through the broker's relay (a client that
    reaches no agent), False never (default: ``$ZRES_RELAY``, else only for agents it
    cannot reach).
    """

    def __init__(self, address: str | None = None, *, name: str | None = None,
                 infeasible: str | None = None, connect_timeout: float = 30.0,
                 broker_timeout: float | None = None, keys: str | None = None,
                 modules: Iterable[ModuleType] = (),
                 forward_output: bool | None = None, detach: bool = False,
                 relay: bool | str | None = None) -> None:
        self.ship(*modules)  # (refuses what is not a module before anything starts)
        if not isinstance(detach, bool):
            raise TypeError(f"detach must be True or False, not {type(detach).__name__}")
        self.detach = detach
        if infeasible is not None:
            _check_infeasible(infeasible)
        settings = config.load("client", {"broker": address, "broker_timeout": broker_timeout,
                                          "forward_output": forward_output})
        address, self.cluster = find_broker(settings["broker"], keys)
        self.infeasible = infeasible or ("error" if self.cluster is not None else "warn")
        self.address = address
        self.name = name or f"client-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._ids = itertools.count(1)
        self._futures_lock = threading.RLock()  # (its futures' conditions: see futures)
        # (results kept on agents, fetched when asked for; RELAY: see relaying.mode_of)
        self._fetcher = Fetcher(self, mode_of(relay))
        self._pickler = CallPickler(Future)
        # KEYS: the cluster's keys directory (else found as core.keys.find says).
        key = config.find_key(keys, _ROLES, address)
        # Made inside a task (or a command job): it acts for that task's owner, not for
        # whoever holds the key found on the agent's host.
        self._token = task_token()
        self._io = IOThread(self.name, address, settings["broker_timeout"], key,
                            settings["forward_output"], self._token)
        self._closed = False
        self._exited = False  # closed at the interpreter's exit
        try:
            wait_for_answer(address, self._io.connected.wait, connect_timeout)
            if key is None and self._io.refused == refusal(None):
                # A broker starting on this machine makes this user's keys before it
                # listens: looked for before they were there, they are there now.
                key = config.find_key(keys, _ROLES, address)
                if key is not None:
                    self._io.stop()
                    self._io = IOThread(self.name, address, settings["broker_timeout"], key,
                                        settings["forward_output"], self._token)
                    wait_for_answer(address, self._io.connected.wait, connect_timeout)
        except ZresError:
            self.close()
            raise
        if self._io.refused is not None:
            self.close()
            raise ZresError(f"the broker at {address} refused this client: {self._io.refused}")
        registry.add(self)

    # -- submitting ---------------------------------------------------------------------
    def submit(self, fn: Callable[..., R], /, *args: Any,
               resources: Mapping[str, Any] | None = None, retries: int | None = None,
               priority: int | None = None, infeasible: str | None = None,
               key: str | None = None, workers: str | Iterable[str] | None = None,
               allow_other_workers: bool = False, pure: bool | None = None,
               detached: bool | None = None, recompute: bool = False,
               retry_oom: bool = False, placement: tuple[Any, int] | None = None,
               **kwargs: Any) -> Future[R]:
        """Run FN(*ARGS, **KWARGS) on an agent whose free resources cover RESOURCES.

        KEY names the task in status and errors (default: the function's name and id).
        WORKERS (an agent's name, or several) places it only on those agents, as Dask's
        ``workers=`` does; with ALLOW_OTHER_WORKERS it prefers them, and runs anywhere
        when none of them has room. PURE is taken for Dask's sake and changes nothing:
        every submit runs its task (zres never merges calls that look alike into one), as
        Dask's pure=False does. DETACHED: it runs on after this client goes (default: the
        client's ``detach``). RECOMPUTE: if its result (over 64 KiB, kept on its agent) is
        lost with that agent while still needed, it runs again even with no retries left
        (its body may then run more than once; see README's *Data*). RETRY_OOM: stopped for
        its memory (``MemoryLimitError``), it spends a retry and runs again, if it has one
        (by default it fails: it would most likely fail again; see README's *Limits*).
        PLACEMENT: (a placement group, a bundle index): it runs in that bundle, drawing on
        it alone (RESOURCES, or the whole bundle). (For a function taking one of these
        keywords itself, use ``executor()``.)
        """
        _check_callable(fn, "submit")
        return self._submit(fn, args, kwargs, resources, retries, priority, infeasible, key,
                            workers, allow_other_workers, detached, recompute, retry_oom,
                            placement)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                resources: Mapping[str, Any] | None = None, retries: int | None = None,
                priority: int | None = None, infeasible: str | None = None,
                key: str | None = None, workers: str | Iterable[str] | None = None,
                allow_other_workers: bool = False, detached: bool | None = None,
                recompute: bool = False, retry_oom: bool = False,
                placement: Any = None) -> Future:
        opts = self._options(resources, retries, priority, infeasible, key, workers,
                             allow_other_workers, detached, recompute, retry_oom, placement)
        deps: list[Any] = []
        index: dict[int, int] = {}
        fn_frame = self._pickler.function(fn, deps, index)
        frames = self._pickler.call(fn_frame, args, kwargs, deps, index,
                                    getattr(fn, "__name__", repr(fn)))
        future = self._make_future(fn, key, frames, deps, opts)
        self._io.send_submit_now()
        return future

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any],
            resources: Mapping[str, Any] | None = None, retries: int | None = None,
            priority: int | None = None, infeasible: str | None = None,
            key: str | None = None, workers: str | Iterable[str] | None = None,
            allow_other_workers: bool = False, pure: bool | None = None,
            detached: bool | None = None, recompute: bool = False, retry_oom: bool = False,
            placement: tuple[Any, int] | None = None, **kwargs: Any) -> list[Future[R]]:
        """Submit FN over zipped ITERABLES in one batch; return the futures (as Dask does).

        KWARGS go to every call; WORKERS, ALLOW_OTHER_WORKERS, PURE, DETACHED, RECOMPUTE,
        RETRY_OOM and PLACEMENT as for ``submit``. (``executor().map`` is the standard's: an
        iterator of results, with ``timeout``.)
        """
        _check_callable(fn, "map")
        return self._map(fn, iterables, kwargs, resources, retries, priority, infeasible, key,
                         workers, allow_other_workers, detached, recompute, retry_oom,
                         placement)

    def _map(self, fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...],
             kwargs: dict[str, Any], resources: Mapping[str, Any] | None = None,
             retries: int | None = None, priority: int | None = None,
             infeasible: str | None = None, key: str | None = None,
             workers: str | Iterable[str] | None = None,
             allow_other_workers: bool = False, detached: bool | None = None,
             recompute: bool = False, retry_oom: bool = False,
             placement: Any = None) -> list[Future]:
        opts = self._options(resources, retries, priority, infeasible, key, workers,
                             allow_other_workers, detached, recompute, retry_oom, placement)
        fn_deps: list[Any] = []
        fn_index: dict[int, int] = {}
        fn_frame = self._pickler.function(fn, fn_deps, fn_index)
        what = getattr(fn, "__name__", repr(fn))
        # All or nothing: every call is pickled before any is submitted, so an item that
        # cannot be leaves no task of the map running for nobody.
        calls = self._pickler.calls(fn_frame, iterables, kwargs, fn_deps, fn_index, what,
                                    self._own)
        calls.reverse()  # (popped in order: each call's frames go with its message)
        futures: list[Future] = []
        try:
            while calls:
                frames, deps = calls.pop()
                futures.append(self._make_future(fn, key, frames, deps, opts))
                if len(futures) % 256 == 0:
                    self._io.wake()  # the first tasks start while the rest are queued
        except BaseException:  # (a put failed, the client closed): none of them runs
            self.cancel(futures, force=True)
            raise
        self._io.wake()
        return futures

    def executor(self, resources: Mapping[str, Any] | None = None,
                 **defaults: Any) -> Executor:
        """Return a ``concurrent.futures.Executor`` whose calls run on this cluster, each
        asking for RESOURCES, with DEFAULTS (priority, retries, infeasible). It keeps the
        standard contract exactly (see ``zres.client.executor``); shutting it down leaves
        this client open."""
        return Executor(self, resources, **defaults)

    def _options(self, resources: Mapping[str, Any] | None, retries: int | None = None,
                 priority: int | None = None, infeasible: str | None = None,
                 key: str | None = None, workers: str | Iterable[str] | None = None,
                 allow_other_workers: bool = False,
                 detached: bool | None = None, recompute: bool = False,
                 retry_oom: bool = False, placement: Any = None) -> dict[str, Any]:
        self._check_open()
        for label, flag in (("detached", detached), ("recompute", recompute),
                            ("retry_oom", retry_oom)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"{label} must be True or False, not {type(flag).__name__}")
        ann = current_annotations()
        resources = ann.get("resources") if resources is None else resources
        where_in, resources = (None, resources) if placement is None else \
            placement_option(placement, resources)
        retries = ann.get("retries", 0) if retries is None else retries
        priority = ann.get("priority", 0) if priority is None else priority
        infeasible = ann.get("infeasible", self.infeasible) if infeasible is None else infeasible
        for label, value in (("retries", retries), ("priority", priority)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{label} must be an int, not {type(value).__name__}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if (wrong := priority_error(priority)) is not None:
            raise ValueError(wrong)
        _check_infeasible(infeasible)
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        return {"units": task_request(resources), "retries": retries, "priority": priority,
                "strict": infeasible == "error",
                "where": _where(workers, allow_other_workers),
                "detached": self.detach if detached is None else detached,
                "recompute": recompute, "retry_oom": retry_oom, "placement": where_in}

    def _make_future(self, fn: Any, name: str | None, frames: list[Any],
                     deps: list[Future], opts: dict[str, Any],
                     extra: dict[str, Any] | None = None) -> Future:
        self._own(deps)
        if sum(memoryview(f).nbytes for f in frames) > CALL_INLINE:
            # Too big to travel through the broker (nor be kept in its state): put on an
            # agent first, and read from there by its worker as one of its inputs.
            deps = [*deps, self._put(frames, f"{name or getattr(fn, '__name__', fn)} call")]
            extra = {**(extra or {}), "payload": len(deps) - 1}
            frames = []
        local = next(self._ids)
        label = name or f"{getattr(fn, '__name__', fn)}-{local}"
        future: Future[Any] = Future(self, local, label, deps)
        if extra and extra.get("quiet"):
            future.quiet = True
        item = [local, opts["units"], opts["priority"], opts["retries"],
                [d._local for d in deps], len(frames), label, opts["strict"]]
        if opts.get("where"):
            extra = {**(extra or {}), **opts["where"]}
        if opts.get("detached"):
            future.detached = True
            extra = {**(extra or {}), "detached": True}
        for flag in ("recompute", "retry_oom"):
            if opts.get(flag):
                extra = {**(extra or {}), flag: True}
        if opts.get("placement"):
            extra = {**(extra or {}), "placement": opts["placement"]}
        if extra:
            item.append(extra)
        with self._io.lock:  # against close() and a broker loss failing what is pending
            self._check_open()
            self._io.pending[local] = future
            self._io.outbox.append((P.SUBMIT, item, frames))
        return future

    def _own(self, deps: list[Future]) -> list[Future]:
        """DEPS, refused unless every one is this client's."""
        for dep in deps:
            if dep.client is not self:
                raise ValueError(f"{dep!r} belongs to another client; pass its result instead")
        return deps

    def _check_open(self) -> None:
        if self._closed:
            raise ZresError("this client is closed")
        if self._io.dead:
            if self._io.refused is not None:
                raise ZresError(f"the broker at {self.address} refused this client: "
                                f"{self._io.refused}")
            raise ZresError("this client's connection thread has stopped; make a new Client")

    # -- other requests -------------------------------------------------------------------
    def _fetch(self, futures: list[Future[Any]], timeout: float | None = None) -> None:
        """Fetch the results of FUTURES kept on agents (see ``fetching``)."""
        self._fetcher.fetch(futures, timeout)

    def gather(self, futures: Any, timeout: float | None = None) -> Any:
        """Return the results of FUTURES, keeping their list/tuple/set/dict structure (an
        iterator of futures: a list); see ``zres.gather``."""
        return gather(futures, timeout)

    def why(self, future: Future | PlacementGroup, timeout: float = 10.0) -> str:
        """Ask the broker why FUTURE's task is not running yet (a placement group: why
        its bundles are not all reserved yet)."""
        group = isinstance(future, PlacementGroup)
        task = future.ready() if isinstance(future, PlacementGroup) else future
        # (finished, error or cancelled; where, what memory it used. A group reserved once
        # may be waiting again, a bundle lost: the broker says.)
        if task.done() and not (group and task.status == "finished"):
            return task._ended_words()
        return str(self._io.request(P.WHY, {"id": task._local}, timeout)["reason"])

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """Return the broker's view, as ``zres status --json``: amounts in user units."""
        return in_user_units(self._io.request(P.STATUS, {}, timeout))

    def set_resources(self, agent: str, resources: Mapping[str, Any],
                      timeout: float = 10.0) -> list[dict[str, float]]:
        """Change AGENT's capacity while it runs: names given are set, 0 removes one.

        Waiting tasks that now fit start at once; lowering below what is in use lets
        running tasks finish and starts no new ones there until they fit.
        """
        reply = self._io.request(P.RESOURCES, {"agent": agent,
                                               "units": mapping_to_units(resources)}, timeout)
        if "error" in reply:
            raise ZresError(reply["error"])
        return [units_to_float(units) for units in reply["slots"]]

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnect; tasks still pending fail (as Dask's close cancels them), and the
        broker stops them, but those detached, which run on; stop the private cluster if
        this client started one."""
        with self._io.lock:
            if self._closed:
                return
            self._closed = True
        registry.remove(self)
        self._io.stop()
        self._fetcher.close()
        self._io.lose_all("the client was closed before the task finished", ZresError,
                          detached="the client was closed; the task is detached and runs "
                          "on (zres status lists it, zres cancel --task stops it)")
        if self.cluster is not None:
            self.cluster.close()

    def _at_exit(self) -> None:
        """The program ends and never closed this client. As a ThreadPoolExecutor's work
        does, what it submitted finishes first (but what is detached, or infeasible: no
        agent could run it), unless the program ended by Ctrl-C; then it closes."""
        try:
            if not isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
                cf.wait([f for f in list(self._io.pending.values())
                         if not f.detached and not f.infeasible])
        finally:
            self._exited = True
            self.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zres.Client {self.address}{' closed' if self._closed else ''}>"

    def _repr_html_(self) -> str:
        if self._closed:
            return html.cluster("zres.Client (closed)", self.address, None, "closed")
        try:
            return html.cluster("zres.Client", self.address, self.status(timeout=2.0))
        except ZresError as exc:
            return html.cluster("zres.Client", self.address, None, str(exc))


def _check_callable(fn: Any, call: str) -> None:
    """Refuse at once what no agent could call (as Dask's submit does), not on an agent."""
    if not callable(fn):
        raise TypeError(f"{call}() takes the function to run first, not {type(fn).__name__} "
                        f"{fn!r:.60}")


def _check_infeasible(mode: str) -> None:
    if mode not in _INFEASIBLE_MODES:
        raise ValueError(f"infeasible must be 'warn' or 'error', not {mode!r}")


def default_client() -> Client:
    """Return the newest open client, starting one (and maybe a local cluster) if none."""
    return cast(Client, registry.default())


registry.set_factory(Client)


def _where(workers: str | Iterable[str] | None, allow_other_workers: bool
           ) -> dict[str, Any] | None:
    """A submit's workers= and allow_other_workers=, checked, as the wire carries them."""
    if not isinstance(allow_other_workers, bool):
        raise TypeError("allow_other_workers must be True or False, not "
                        f"{type(allow_other_workers).__name__}")
    if workers is None:
        if allow_other_workers:
            raise ValueError("allow_other_workers=True needs workers= (the agents to prefer)")
        return None
    names = [workers] if isinstance(workers, str) else list(workers)
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise TypeError(f"workers must name agents (a str, or an iterable of str), got {bad!r}")
    if not names or not all(names):
        raise ValueError(f"workers must name at least one agent, got {names!r}")
    return {"workers": names, **({"allow_other_workers": True} if allow_other_workers else {})}
