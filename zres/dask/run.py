"""Run a planned Dask graph on a zres client, as ``get`` (waits, follows every task) or
``compute`` (returns the outputs' futures).

Every step is submitted at once, in batches (the client's I/O thread sends up to 1,000 tasks
a message): one round trip per batch, none per task. The broker keeps each step's result
while a step that reads it has not finished. ``get`` hears each step end (not its result:
an intermediate is submitted *quiet*, and only its dependents read it) and releases a
result as soon as the last step that reads it has ended; so does ``compute``, for the
futures it returns. A failed step fails the compute with its own exception, which names its
key; what has not begun is cancelled (by ``compute``: what no output still pending needs).
"""

from __future__ import annotations

import io
import pickle
import queue
import threading
import types
from collections.abc import Mapping
from typing import Any

import cloudpickle

from ..client.annotations import current_annotations
from ..client.futures import Future
from .annotations import Options, options
from .plan import Plan, Step, pack, run_node

_GET_KEYWORDS = frozenset({"resources", "priority", "retries", "callbacks"})
WHERE_KEYWORDS = ("workers", "allow_other_workers")  # (Dask's: the agents, by name)
_RAN, _ENDED = "ran", "ended"


def general_options(keywords: Mapping[str, Any]) -> Options:
    """The options every task of a compute gets (under its own): KEYWORDS of get/compute
    over ``zres.annotate`` over ``dask.annotate`` around the compute."""
    import dask

    unknown = set(keywords) - _GET_KEYWORDS
    if unknown:
        raise TypeError(f"zres's Dask scheduler got unknown keywords: {sorted(unknown)}; it "
                        f"takes {', '.join(sorted(_GET_KEYWORDS | set(WHERE_KEYWORDS)))}")
    layers = [dask.get_annotations(), current_annotations(), keywords]
    result = Options()
    for layer, where in zip(layers, ("dask.annotate", "zres.annotate", "the compute's keywords")):
        result = options(layer, where).over(result)
    return result


class NodePickler(cloudpickle.Pickler):
    """Pickles graph nodes, each function once per compute: a graph's thousands of tasks
    share a few functions, and pickling one by value (defined in ``__main__``) costs
    far more than the rest of its task."""

    def __init__(self, file: io.BytesIO, functions: dict[Any, Any]) -> None:
        super().__init__(file, protocol=5)
        self._functions = functions

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.FunctionType:
            found = self._functions.get(obj)
            if found is None:
                found = self._functions[obj] = (pickle.loads,
                                                (cloudpickle.dumps(obj, protocol=5),))
            return found
        return super().reducer_override(obj)


def allowed_failures() -> int:
    """How many times a task lost while it runs (its worker process or agent died) runs
    again when no ``retries`` annotation says: Dask's ``distributed.scheduler.allowed-failures``
    (3 unless configured), as Dask distributed reschedules it before it fails the task
    with ``KilledWorker``."""
    import dask

    value = dask.config.get("distributed.scheduler.allowed-failures", 3)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"dask config distributed.scheduler.allowed-failures must be a whole "
                         f"number of 0 or more, got {value!r}")
    return value


class Submitter:
    """Submits steps on CLIENT: each a call of ``run_node`` with its inputs' futures; WHERE:
    ``workers=`` and ``allow_other_workers=`` for every step, as ``submit`` takes them."""

    def __init__(self, client: Any, where: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self._where = dict(where or {})
        self._function = client._pickler.function(run_node, [], {})
        self._opts: dict[Options, dict[str, Any]] = {}  # (tasks asking alike check once)
        self._lost_runs_again = allowed_failures()
        self._functions: dict[Any, Any] = {}

    def submit(self, step: Step, inputs: list[Future], quiet: bool) -> Future:
        client = self.client
        opts = self._opts.get(step.options)
        if opts is None:
            given = step.options
            # (recompute: Dask's tasks are pure by contract, and Dask distributed makes a
            # lost intermediate again; its users have no recompute= to pass. Nor retries=:
            # a task lost running runs again as Dask's allowed-failures says, unless its
            # annotation says how many times)
            retries = self._lost_runs_again if given.retries is None else given.retries
            opts = self._opts[given] = client._options(
                dict(given.resources), retries, given.priority or 0, None, None,
                recompute=True, **self._where)
        buf = io.BytesIO()
        NodePickler(buf, self._functions).dump(step.node)
        deps: list[Any] = []
        frames = client._pickler.call(self._function, (buf.getvalue(), step.inputs, *inputs),
                                      {}, deps, {})
        return client._make_future(run_node, step.name, frames, deps, opts,
                                   {"quiet": True} if quiet else None)

    def submit_all(self, plan: Plan, quiet: bool) -> dict[Any, Future]:
        """Submit every step of PLAN; return each step's future. QUIET: the steps that are
        no output of the compute are submitted quiet."""
        futures: dict[Any, Future] = {}
        outputs = set(plan.outputs.values())
        try:
            for count, step in enumerate(plan.steps, 1):
                futures[step.key] = self.submit(
                    step, [futures[s] for s in step.sources], quiet and step.key not in outputs)
                if count % 1000 == 0:
                    self.client._io.wake()  # the first batch goes while the rest is pickled
        except BaseException:
            self.client._forget(list(futures.values()), cancel=True)
            raise
        self.client._io.wake()
        return futures


def compute(client: Any, plan: Plan, where: Mapping[str, Any] | None = None
            ) -> dict[Any, Future]:
    """Submit PLAN; return the future of each requested key (see ``_Computed``)."""
    futures = Submitter(client, where).submit_all(plan, quiet=True)  # (outputs never quiet)
    _Computed(client, plan, futures).follow()
    return {key: futures[source] for key, source in plan.outputs.items()}


class _Computed:
    """One ``compute`` whose outputs' futures the caller holds: each step's result is let
    go of once the steps reading it have ended, and once no output still pending needs a
    step (an output failed or was cancelled), what has not begun of it is cancelled, as
    ``get`` does on a failure: a cancelled compute leaves nothing queued behind it."""

    def __init__(self, client: Any, plan: Plan, futures: dict[Any, Future]) -> None:
        self.client = client
        self.futures = dict(futures)     # step key -> future, while something may read it
        self.sources = {step.key: step.sources for step in plan.steps}
        self.key_of = {future._local: key for key, future in futures.items()}
        self.left = dict(plan.readers)   # step key -> its readers not ended yet
        self.outputs = set(plan.outputs.values())
        self.open = set(self.outputs)    # outputs not ended yet
        # (re-entrant: cancelling ends futures, and their callbacks come back here)
        self.lock = threading.RLock()

    def follow(self) -> None:
        for future in list(self.futures.values()):
            future.add_done_callback(self._ended)

    def _ended(self, future: Any) -> None:  # (a done-callback: given a cf.Future)
        with self.lock:
            key = self.key_of.pop(future._local, None)
            if key is None:
                return
            done = []
            for source in set(self.sources[key]):
                self.left[source] -= 1
                if self.left[source] == 0 and source not in self.outputs:
                    done.append(self.futures.pop(source))
            unwanted = []
            if key in self.outputs:
                self.open.discard(key)
                # (an output that finished needed only steps that have finished too)
                if not self.open or future.status in ("cancelled", "error"):  # (no fetch)
                    wanted = self._needed()
                    unwanted = [self.futures.pop(k) for k in list(self.futures)
                                if k not in wanted and k not in self.outputs]
                if not self.open:  # (hold nothing more: the outputs' callbacks hold us)
                    self.futures.clear()
        # (a step whose readers all ended has begun, unless they failed or were cancelled:
        # then nothing wants it either)
        self.client._forget(done + unwanted, cancel=True)

    def _needed(self) -> set[Any]:
        """The steps the outputs still pending read, directly or not, and those outputs."""
        needed: set[Any] = set()
        work = list(self.open)
        while work:
            key = work.pop()
            if key not in needed:
                needed.add(key)
                work.extend(self.sources[key])
        return needed


def get(client: Any, plan: Plan, keys: Any, callbacks: Any = None,
        where: Mapping[str, Any] | None = None) -> Any:
    """Compute PLAN; return the values of KEYS in their nesting, as Dask's schedulers do."""
    from dask.callbacks import local_callbacks, unpack_callbacks

    with local_callbacks(callbacks) as active:
        start, start_state, pretask, posttask, finish = unpack_callbacks(active)
        run = _FollowedRun(client, plan, where)
        for call in start:
            call(plan.graph)
        for call in start_state:
            call(plan.graph, run.state)
        failed = True
        try:
            run.submit()
            values = run.follow(pretask, posttask)
            failed = False
        finally:
            for call in finish:
                call(plan.graph, run.state, failed)
    return pack(keys, values)


class _FollowedRun:
    """One ``get``: its steps' futures, and Dask's callback state (ready, running, ...)."""

    def __init__(self, client: Any, plan: Plan, where: Mapping[str, Any] | None) -> None:
        self.client = client
        self.plan = plan
        self.where = where
        self.outputs = set(plan.outputs.values())
        self.events: queue.SimpleQueue[tuple[str, Future]] = queue.SimpleQueue()
        self.futures: dict[Any, Future] = {}
        self.step_of: dict[int, Step] = {}
        self.left = dict(plan.readers)   # step key -> its readers not ended yet
        dependents: dict[Any, set[Any]] = {s.key: set() for s in plan.steps}
        for step in plan.steps:
            for source in step.sources:
                dependents[source].add(step.key)
        self.state: dict[str, Any] = {
            "waiting": {s.key: set(s.sources) for s in plan.steps if s.sources},
            "ready": {s.key for s in plan.steps if not s.sources},
            "running": set(), "finished": set(), "cache": {}, "dependents": dependents,
            "dependencies": {s.key: set(s.sources) for s in plan.steps}}

    def submit(self) -> None:
        self.futures = Submitter(self.client, self.where).submit_all(self.plan, quiet=True)
        for step in self.plan.steps:
            future = self.futures[step.key]
            self.step_of[future._local] = step
            future._on_running = self._ran
            future.add_done_callback(self._ended)

    def _ran(self, future: Future) -> None:
        self.events.put((_RAN, future))

    def _ended(self, future: Any) -> None:  # (a done-callback: given a cf.Future)
        self.events.put((_ENDED, future))

    def follow(self, pretask: list[Any], posttask: list[Any]) -> dict[Any, Any]:
        """Wait for every output; on the first failure cancel what has not begun and raise."""
        state = self.state
        values: dict[Any, Any] = {}
        left = len(self.outputs)
        try:
            while left:
                what, future = self.events.get()
                step = self.step_of[future._local]
                if what == _RAN:
                    self._began(step, pretask)
                    continue
                if future.cancelled():
                    raise _cancelled(step)
                error = future.exception()
                if error is not None:
                    raise error
                self._began(step, pretask)  # (it may have begun and ended between looks)
                value = future.result()
                if step.key in self.outputs:
                    values[step.key] = value
                    left -= 1
                state["running"].discard(step.key)
                state["finished"].add(step.key)
                for call in posttask:
                    call(step.key, value, self.plan.graph, state, future.agent)
                self._release_inputs(step)
        except BaseException:
            self._let_go(cancel=True)
            raise
        self._let_go()
        return {key: values[source] for key, source in self.plan.outputs.items()}

    def _let_go(self, cancel: bool = False) -> None:
        """Release every result still held now: not when the futures are dropped (an
        exception's frames hold them, and so does a future's callback of this run)."""
        self.client._forget(self.futures.values(), cancel=cancel)
        self.futures.clear()
        while True:  # (events not read: each holds its future, and the futures hold us)
            try:
                self.events.get_nowait()
            except queue.Empty:
                break

    def _began(self, step: Step, pretask: list[Any]) -> None:
        state = self.state
        if step.key in state["ready"]:
            state["ready"].discard(step.key)
            state["running"].add(step.key)
            for call in pretask:
                call(step.key, self.plan.graph, state)

    def _release_inputs(self, step: Step) -> None:
        """STEP ended: its readers may be ready; its inputs, read by nothing else, freed."""
        state = self.state
        for source in set(step.sources):
            self.left[source] -= 1
            if self.left[source] == 0 and source not in self.outputs:
                # Let go of it now, not when the future is dropped: an event of its own
                # still queued (its end, heard after its readers') holds it, and the
                # futures' callbacks hold the queue: a cycle only the collector ends.
                self.client._forget([self.futures.pop(source)])
        for reader in state["dependents"][step.key]:
            missing = state["waiting"].get(reader)
            if missing is not None:
                missing.discard(step.key)
                if not missing:
                    del state["waiting"][reader]
                    state["ready"].add(reader)


def _cancelled(step: Step) -> BaseException:
    from concurrent.futures import CancelledError

    return CancelledError(f"the Dask task {step.key!r} was cancelled")
