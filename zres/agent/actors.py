"""The agent's side of actors: one process each, fed calls, reaped when it dies.

An actor holds its slot's resources from construction until its process ends. Each
construction and call is reported held before it is handed to the process (the broker
counts it as possibly started from then on), and the process logs each start: when it
dies, the calls it had not started run on the next instance, uncharged.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.resources import MEMORY
from ..logs import get_logger
from .grants import Events
from .memory.monitor import Monitor, memory_error
from .workers import ActorProcess, Worker, WorkerPool, exit_cause, kill

log = get_logger("zres.agent")


class ActorSupervisor:
    """The actor processes of one agent.

    EVENTS takes what the broker must hear; FREE(placement) gives an ended actor's
    resources back; EXITED(body) reports a process that died (after earlier results).
    MEMORY watches each process (limited to the MEMORY its actor asked for).
    """

    def __init__(self, pool: WorkerPool, events: Events, free: Callable[[int], object],
                 exited: Callable[[dict[str, Any]], None],
                 memory: Monitor | None = None) -> None:
        self._pool = pool
        self._memory = memory or Monitor(None, False, 0)
        self._events = events
        self._free = free
        self._exited = exited
        self._runs = itertools.count(1)
        self.by_id: dict[str, Worker] = {}

    def workers(self) -> list[Worker]:
        return list(self.by_id.values())

    def start(self, spec: dict[str, Any], slot: int, devices: tuple[str, ...],
              item: list[Any], frames: list[Any]) -> None:
        """Start a process of its own for an actor; it constructs the instance first."""
        if not isinstance(spec.get("actor"), str):
            raise ProtocolError("assign: malformed actor")
        actor_id = spec["actor"]
        old = self.by_id.pop(actor_id, None)
        if old is not None:  # a restart placed here before we saw the old one end
            kill(old.proc)
            self._pool.forget(old)
        concurrency = max(1, int(spec.get("concurrency", 1)))
        worker = self._pool.start(slot, devices, concurrency, actor=True)
        run = next(self._runs)
        context = {**item[3], "create": True, "run": run}
        # (its calls' context: the construction's, without its inputs)
        worker.actor = ActorProcess(actor_id, item[0], concurrency,
                                    {k: v for k, v in item[3].items() if k != "refs"},
                                    int(spec.get("priority", 0)), time.monotonic())
        memory = item[3]["resources"].get(MEMORY)  # (bytes: a limit, if it asked for one)
        self._memory.watch(item[0], worker.proc.pid, int(memory) if memory else None)
        worker.actor.sent[item[0]] = run
        self._events.held(item[0])
        construct = [item[0], item[1], item[2], context]
        self._events.then(functools.partial(self._deliver, worker, construct, frames))
        self.by_id[actor_id] = worker
        log.info("actor_starting", actor=actor_id, pid=worker.proc.pid,
                 gpus=",".join(devices) or "-")

    def call(self, msg: P.Message) -> None:
        """Pass CALL's method calls to their actors' processes, in the order sent."""
        items = P.field(msg, "calls", list)
        groups = P.split_frames(msg.frames, [i[2] + sum(max(c, 0) for c in i[3])
                                             for i in items])
        for (call_id, actor_id, nframes, dep_counts, *extra), frames in zip(items, groups):
            worker = self.by_id.get(actor_id)
            if worker is None or worker.actor is None:
                continue  # it ended; the broker requeues or fails the call
            run = next(self._runs)
            worker.actor.sent[call_id] = run
            self._events.held(call_id)
            context = {**worker.actor.context, "run": run}
            if extra and isinstance(extra[0], dict):  # inputs sent as references (its
                context["refs"] = extra[0].get("refs") or {}  # process reads them), its
                context["payload"] = extra[0].get("payload", -1)  # call among them
                dep_counts = [max(count, 0) for count in dep_counts]
            item = [call_id, nframes, dep_counts, context]
            self._events.then(functools.partial(self._deliver, worker, item, frames))

    def _deliver(self, worker: Worker, item: list[Any], frames: list[Any]) -> None:
        """Hand ITEM to WORKER's actor (the broker has heard that it is held)."""
        if worker.actor is not None:
            worker.actor.delivered.add(item[0])
        self._pool.send(worker, item, frames)

    def done(self, worker: Worker, started: list[int], items: list[Any],
             results: list[list[Any]]) -> None:
        """WORKER's actor STARTED some calls and finished ITEMS (its construction, or
        calls)."""
        actor = worker.actor
        assert actor is not None
        for call_id in started:
            if call_id in actor.sent:
                actor.begun.add(call_id)
                self._events.started(call_id)
        for item, result in zip(items, results):
            actor.sent.pop(item[0], None)
            actor.begun.discard(item[0])
            actor.delivered.discard(item[0])
            if item[0] == actor.placement and item[1] != P.OK:
                # __init__ raised: the instance never existed; the broker fails its calls.
                log.warning("actor_init_failed", actor=actor.id)
                self.by_id.pop(actor.id, None)
                self._memory.forget(actor.placement)
                self._pool.forget(worker)
                kill(worker.proc)
                self._free(actor.placement)
            self._events.result(item[0], item[1], result, item[3])

    def kill(self, actor_ids: list[Any]) -> None:
        """End the actors ACTOR_IDS now, as the broker asks."""
        for actor_id in actor_ids:
            worker = self.by_id.pop(str(actor_id), None)
            if worker is not None:
                log.info("actor_killed", actor=actor_id, pid=worker.proc.pid)
                kill(worker.proc)
                self._pool.forget(worker)
                if worker.actor is not None:
                    self._memory.forget(worker.actor.placement)
                self._free(worker.actor.placement if worker.actor else -1)

    def stop_all(self, why: str) -> None:
        """Stop every actor process (the broker no longer counts them)."""
        for worker in self.by_id.values():
            log.warning("actor_stopped", pid=worker.proc.pid, why=why)
            kill(worker.proc)
            self._pool.forget(worker)
            if worker.actor is not None:
                self._memory.forget(worker.actor.placement)
        self.by_id.clear()

    def carry_over(self) -> list[int]:
        """The broker restarted on its state: keep every actor process, but take back
        what was never passed to one (its hand-off waited for the old broker). Return
        those constructions and calls: they never began here."""
        returned: list[int] = []
        for worker in list(self.by_id.values()):
            actor = worker.actor
            assert actor is not None
            if actor.placement in actor.sent and actor.placement not in actor.delivered:
                log.info("actor_stopped", actor=actor.id, pid=worker.proc.pid,
                         why="its construction never reached it before the broker went")
                self.kill([actor.id])
                returned.append(actor.placement)
                continue
            for call_id in [c for c in actor.sent if c not in actor.delivered]:
                del actor.sent[call_id]
                returned.append(call_id)
        return returned

    def offer(self, slot_of: Callable[[int], tuple[int, tuple[str, ...]] | None]
              ) -> list[list[Any]]:
        """The actors running here, for a restarted broker: [actor id, placement, slot,
        [GPU positions], [calls in hand]]; SLOT_OF(placement) gives (slot, its devices)."""
        offer = []
        for worker in self.by_id.values():
            actor = worker.actor
            where = slot_of(actor.placement) if actor is not None else None
            if actor is None or where is None:
                continue
            slot, gpus = where
            offer.append([actor.id, actor.placement, slot,
                          [gpus.index(d) for d in worker.gpus if d in gpus],
                          [c for c in actor.sent if c != actor.placement]])
        return offer

    def placed(self, placement: int) -> bool:
        """Whether PLACEMENT is one of the actors' here."""
        return any(w.actor is not None and w.actor.placement == placement
                   for w in self.by_id.values())

    def holding(self) -> list[int]:
        """The placements and calls the actor processes hold."""
        return [task for w in self.by_id.values() if w.actor for task in w.actor.sent]

    def reap(self) -> None:
        """Tell the broker of each actor process that has died, with the calls it started."""
        for worker in list(self.by_id.values()):
            code = worker.proc.poll()
            if code is None or worker.actor is None:
                continue
            actor = worker.actor
            unit = self._memory.forget(actor.placement)
            body: dict[str, Any] = {"cause": exit_cause(code)}
            if unit is not None and unit.killed:  # (the broker fails its calls so)
                error = memory_error(unit, "its process", str(actor.context.get("agent")))
                body = {"cause": error["message"], "error": error["type"],
                        "exceeded": unit.killed == "limit"}  # (past its own limit)
            log.warning("actor_process_died", actor=actor.id, pid=worker.proc.pid,
                        cause=body["cause"])
            started = self._pool.started_by(worker)
            self._exited({"actor": actor.id, "placement": actor.placement, **body,
                          "running": [t for t, run in actor.sent.items()
                                      if run in started or t in actor.begun]})
            del self.by_id[actor.id]
            self._pool.forget(worker)
            self._free(actor.placement)
