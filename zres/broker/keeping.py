"""Python tasks kept across broker restarts: written to the state store, restored from it.

Each task a client submits (not a command job: jobs keep their own table; an actor's
construction and calls are, naming their actor: see ``actor_keeping``) is written with
its call, options, dependencies and owner (the name of the key that submitted it) when it
is accepted, again when an agent holds it and when it ends, and dropped once nobody holds
it. Results up to ``KEEP_RESULT`` bytes are written with the outcome; a larger one stays
on the agents holding it (where is written), and one the broker has neither is computed
again from its task (lineage) if a task or its client still needs it.

A restarted broker restores them:
- a task that had ended is ended again, with its outcome (and result, if kept);
- a queued or waiting task waits again, with its priority, retries and dependencies;
- a task an agent held (handed to a worker, so perhaps begun) waits for that agent to
  come back and say whether it runs, ran or never began there (``adoption``);
- a task whose input is gone fails, naming it;
- a put (a value a client uploads to an agent: it has no call) whose upload was under way
  ends once that agent has the value, and fails if the agent is not back in time;
- a task whose result was not kept runs again once something needs it (``need``);
- each owner's tasks wait for their client to say hello again (its ``ClientRecord`` is
  restored under its routing id, which a client keeps across reconnections): one not back
  within the reconnect window is gone, and its tasks are stopped as any gone client's;
- a task whose client had gone is restored only if it is detached (it runs on) or needed;
  one that was being stopped is not: its agent, offering it back, is told to stop it.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable
from typing import Any

import msgpack

from ..core import protocol as P
from ..core.tasks import Task, TaskState
from ..logs import get_logger
from .clients import ClientRegistry
from .graph import TaskGraph
from .store import Store

log = get_logger("zres.broker")
KEEP_RESULT = 64 * 1024   # results up to this many bytes are written; larger ones recomputed
BLOB_MIN = 256  # a call's first frame (its function) of this many bytes is kept once, shared
_pack = msgpack.Packer().pack  # (one packer, not one made per call as packb does)
ActorTask = Callable[[Task, list[int], str, Callable[[Task, list[int]], None]], None]
Put = Callable[[Task, str, int], None]


class TaskKeeper:
    """Writes the kept tasks' changes to STORE (None: nothing is kept); CLIENTS says who
    owns each and whether its client still holds it."""

    def __init__(self, store: Store | None, clients: ClientRegistry) -> None:
        self._store = store
        self._clients = clients
        # Restored tasks whose results were not kept, not run again yet: id -> inputs.
        self._unrun: dict[int, list[int]] = {}
        self._digests: dict[bytes, bytes] = {}  # shared function frames' digests
        # A restored task whose result is kept on agents (the broker's ``objects``).
        self.kept_on_agents: Callable[[Task], None] = lambda task: None
        self._graph: TaskGraph | None = None
        self._fail: Callable[[Task, str, str], None] = lambda task, error, why: None

    def new(self, task: Task, deps: list[int], put: tuple[str, int] | None = None) -> None:
        """TASK (waiting for DEPS, by id) is accepted from its client; PUT: it stands for
        a value its client uploads to that agent, of that many bytes (it has no call)."""
        if self._store is None:
            return
        task.kept = True
        record = _pack([task.client, task.owner, task.local_id, task.units, task.priority,
                        task.name, task.strict, task.kind, deps, task.creates, task.actor,
                        task.quiet, list(task.workers), task.allow_other_workers,
                        task.detached, task.call_in, task.recompute, task.retry_oom,
                        task.group, list(task.bundle) if task.bundle else None,
                        list(put) if put else None])
        frames = [P.buffer(f) for f in task.payload]
        blob = None
        if frames and len(frames[0]) >= BLOB_MIN:  # (a function: the same for many tasks)
            blob = (self._digest(frames[0]), frames[0])
            frames = frames[1:]
        state = self._state(task, task.outcome, task.info, False)
        self._store.new_task(task.id, record, _pack(frames), state, blob)

    def _digest(self, data: Any) -> bytes:
        """DATA's digest: worked out once for the bytes a submit's tasks share."""
        if not isinstance(data, bytes):
            return hashlib.blake2b(data, digest_size=16).digest()
        key = self._digests.get(data)
        if key is None:
            if len(self._digests) >= 4096:
                self._digests.clear()
            key = self._digests[data] = hashlib.blake2b(data, digest_size=16).digest()
        return key

    def changed(self, task: Task) -> None:
        """TASK's state changed (held, requeued, ended, released): write it again."""
        if self._store is not None and task.kept:
            held = task.state is TaskState.RUNNING and (task.held or task.begun)
            self._put(task, task.outcome, task.result, task.info, held)

    def ending(self, task: Task, outcome: str, frames: list[Any], info: dict[str, Any]) -> None:
        """Write TASK as its end with OUTCOME, FRAMES and INFO will, before that end is
        taken in (its client is told first: see ``early_results``)."""
        if self._store is not None and task.kept:
            self._put(task, outcome, frames, info, False)

    def _put(self, task: Task, outcome: str, frames: list[Any], info: dict[str, Any],
             held: bool) -> None:
        assert self._store is not None
        result = None
        if outcome == P.OK and not task.size \
                and sum(len(P.buffer(f)) for f in frames) <= KEEP_RESULT:
            result = _pack([P.buffer(f) for f in frames])
        self._store.put_task(task.id, self._state(task, outcome, info, held), result)

    def _state(self, task: Task, outcome: str, info: dict[str, Any], held: bool) -> bytes:
        client = self._clients.get(task.client)
        holds = client is not None and client.ids.get(task.local_id) == task.id
        # (and where its result is, if it is kept on agents: issue 29)
        return _pack([task.retries, task.agent if held else "", task.begun and held,
                      outcome, info, holds, task.size, list(task.held_at), task.lost])

    def need(self, task_id: int) -> None:
        """Something needs the result of TASK_ID: if it was not kept, run its task again
        (and the tasks of its inputs whose results were not kept either)."""
        if task_id not in self._unrun:
            return
        again, work = [], [task_id]
        while work:
            current = work.pop()
            deps = self._unrun.pop(current, None)
            if deps is not None:
                again.append((current, deps))
                work.extend(deps)
        for each, deps in sorted(again):
            task = self._graph.get(each) if self._graph is not None else None
            if task is not None:
                self.link(task, deps)

    def ended_unkept(self, task_id: int) -> bool:
        """Whether TASK_ID ended well before a restart with a result that was not kept
        (it runs again only if something needs that result)."""
        return task_id in self._unrun

    def link(self, task: Task, deps: list[int]) -> None:
        """TASK waits for DEPS, or fails if one is gone."""
        assert self._graph is not None
        lost = next((d for d in deps if self._graph.get(d) is None), None)
        if lost is None:
            self._graph.link(task, deps)
        else:
            self._fail(task, "ZresError", f"task {task.name} cannot run after the broker "
                       f"restarted: its input (task {lost}) was not kept")

    def payload(self, task: Task) -> list[Any]:
        """TASK's call, read from the store (a restored task holds none until granted)."""
        if self._store is None or not task.kept:
            return []
        raw, blob = self._store.payload(task.id)
        frames = list(msgpack.unpackb(raw)) if raw else []
        return frames if blob is None else [blob, *frames]

    def dropped(self, task: Task) -> None:
        if self._store is not None and task.kept:
            self._store.forget_task(task.id)

    def restore(self, graph: TaskGraph, fail: Callable[[Task, str, str], None],
                adopt: Callable[[Task, list[int], str], None], actor_task: ActorTask,
                wait: float, rejoin: Callable[[Task], None] = lambda task: None,
                put: Put = lambda task, agent, size: None) -> int:
        """Restore the kept tasks into GRAPH and their owners as clients that have WAIT
        seconds to say hello again; FAIL(task, error type, message) ends one that cannot
        go on; ADOPT(task, inputs, agent) waits for the agent that held one;
        ACTOR_TASK(task, inputs, agent that held it, link) puts back one that constructs
        or calls an actor; REJOIN(task) makes one placed in a bundle its group's again
        (removing the group ends it); PUT(task, agent, size) puts back one that stands for
        a value its client was uploading to that agent (it ends once the agent has it: it
        has no call to run). Return how many."""
        if self._store is None:
            return 0
        gc.disable()  # (many objects, none of them garbage: see adoption.restore)
        try:
            return self._restore(graph, fail, adopt, actor_task, wait, rejoin, put)
        finally:
            gc.enable()

    def _restore(self, graph: TaskGraph, fail: Callable[[Task, str, str], None],
                 adopt: Callable[[Task, list[int], str], None], actor_task: ActorTask,
                 wait: float, rejoin: Callable[[Task], None], restore_put: Put) -> int:
        assert self._store is not None
        rows = []
        for task_id, record, state, result in self._store.tasks():
            ident, owner, local, units, priority, name, strict, kind, deps, *of_actor = \
                msgpack.unpackb(record, strict_map_key=False)
            retries, held_on, _, outcome, info, holds, *where = msgpack.unpackb(
                state, strict_map_key=False)
            size, held_at, gone = where if where else (0, [], "")  # (kept by older ones)
            # (its payload, the call, is read when it is granted: see payload())
            task = Task(task_id, ident, local, units, priority, retries, name, strict, [],
                        [], kind=kind, holders=int(holds), owner=owner)
            task.kept = True
            # (records written before quiet tasks, or workers=, existed end sooner)
            task.creates, task.actor, *more = of_actor or ("", "")
            task.quiet = bool(more and more[0])
            if len(more) >= 3:
                task.workers, task.allow_other_workers = tuple(more[1]), bool(more[2])
            task.detached = len(more) >= 4 and bool(more[3])
            task.call_in = int(more[4]) if len(more) >= 5 else -1
            task.recompute = len(more) >= 6 and bool(more[5])
            task.retry_oom = len(more) >= 7 and bool(more[6])
            if len(more) >= 9:  # (placement groups: one it makes, or the bundle it runs in)
                task.group, task.bundle = more[7], tuple(more[8]) if more[8] else None
            put = more[9] if len(more) >= 10 and more[9] else None
            if outcome and (outcome != P.OK or result is not None or size):
                task.outcome, task.info = outcome, info
                task.result = msgpack.unpackb(result) if result is not None else []
                task.size, task.held_at, task.lost = size, list(held_at), gone
            rows.append((task, owner, deps, held_on,
                         outcome == P.OK and result is None and not size, put))
        # A task whose result was not kept is run again only once something needs it:
        # a waiting task, a new one, or its client (that has not seen it): see need().
        needed = {d for task, _, deps, _, lost, _ in rows if not (task.outcome or lost)
                  for d in deps}
        self._graph, self._fail = graph, fail
        for task, owner, deps, held_on, lost, put in rows:
            if holds_it := task.holders > 0:
                self._clients.restore(task.client, owner, wait).ids[task.local_id] = task.id
            if task.outcome:
                graph.add(task)
                graph.restored_as(task, TaskState.DONE if task.outcome == P.OK
                                  else TaskState.FAILED)
                if task.size:
                    self.kept_on_agents(task)  # (its agents offer it back, or it is lost)
                    if (task.retries > 0 or task.recompute) and not deps:
                        # (its call, to make it again if it is lost: as before the restart;
                        # one with inputs is not, whose inputs may be gone)
                        task.payload = self.payload(task)
                continue
            if not (holds_it or task.id in needed or task.creates or task.detached):
                # (an actor needs its construction; a detached task runs on for its owner)
                self._store.forget_task(task.id)  # nobody waits for it any more
                continue
            task.client_gone = task.detached and not holds_it
            graph.add(task)
            if task.bundle is not None:
                rejoin(task)
            if put is not None:  # (being uploaded: its agent says whether it has it)
                graph.restored_as(task, TaskState.RUNNING)
                restore_put(task, str(put[0]), int(put[1]))
                continue
            if lost:
                self._unrun[task.id] = deps
                continue
            for dep in deps:
                self.need(dep)
            if task.creates or task.actor:
                actor_task(task, deps, held_on, self.link)
            elif held_on and all(graph.get(d) is not None for d in deps):
                adopt(task, deps, held_on)
            else:
                self.link(task, deps)
        for task, *_ in rows:  # ended tasks that nothing holds any more
            if task.holders <= 0 and graph.tasks.get(task.id) is task \
                    and task.state in (TaskState.DONE, TaskState.FAILED):
                graph.drop(task)
                self._store.forget_task(task.id)
        self._store.commit()
        return len(rows)

