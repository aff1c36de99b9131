"""The broker's side of actors: records, per-caller call queues, placement, death, restarts.

An actor's construction is an ordinary task as far as waiting goes (dependencies, then the
scheduler), but its grant is not released when ``__init__`` returns: the actor holds those
resources until it ends. Its method calls are tasks that skip the scheduler: they queue
per caller (one client connection) in the order made, and go to the actor's agent as soon
as the actor is up and every earlier call from that caller has been sent. The agent keeps
the process fed with at most ``concurrency`` calls, so when the process dies it can say
exactly which calls had started; the others run on the next instance.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import quote
from ..core.resources import format_units
from ..core.tasks import FINISHED, Task, TaskState
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from .actor_records import ActorRecord, ActorState, set_actor_state
from .graph import TaskGraph
from .outbox import Batches, Send

log = get_logger("zres.broker")
_DEAD_KEPT = 10_000  # dead actors remembered, so late calls get the real cause


class ActorRouting:
    """The broker's actor records and what happens to them.

    Constructions and calls are tasks of GRAPH; placements wait in SCHED; RELEASE(id)
    gives a placement's grant back to the scheduler when the actor ends or is lost;
    CHANGED(actor) writes an actor whose state changed; LOAD(task) reads the call of a
    task restored without it; SENDER() says who the message handled acts as (role, owner);
    WAITS(call) says whether a call about to go waits for an input lost since it was ready
    (being made again), or has failed with it (lost for good): lineage's ``waits_again``.
    """

    def __init__(self, send: Send, graph: TaskGraph, sched: Scheduler,
                 release: Callable[[int], None],
                 changed: Callable[[ActorRecord], None] = lambda actor: None,
                 load: Callable[[Task], list[Any]] = lambda task: [],
                 sender: Callable[[], tuple[str, str]] = lambda: ("", ""),
                 inside: Callable[[tuple[str, int]], Any] = lambda bundle: None,
                 waits: Callable[[Task], bool] = lambda task: False) -> None:
        self._send = send
        self._waits = waits
        self._inside = inside  # where an actor placed in a bundle waits (None: its group ended)
        self._sender = sender
        self._graph = graph
        self._sched = sched
        self._release = release
        self._changed = changed
        self._load = load
        self.actors: dict[str, ActorRecord] = {}
        self.dead_actors: OrderedDict[str, ActorRecord] = OrderedDict()
        self.actor_names: dict[str, str] = {}
        self.placements: dict[int, ActorRecord] = {}   # scheduler id -> the actor it places
        self.call_actor: dict[int, ActorRecord] = {}   # call sent to an agent -> its actor
        self._to_pump: dict[str, None] = {}
        self._calls = Batches(send, P.CALL, "calls")

    # -- creation and calls ---------------------------------------------------------------
    def check_new_ids(self, actor_ids: list[str], client: bytes) -> None:
        """Raise ProtocolError if any of ACTOR_IDS is in use by an actor another client
        made, or given twice (one CLIENT made: see ``sent_again``)."""
        seen: set[str] = set()
        for actor_id in actor_ids:
            if actor_id in seen or ((actor_id in self.actors or actor_id in self.dead_actors)
                                    and not self.sent_again(actor_id, client)):
                raise ProtocolError(f"submit: actor id {quote(actor_id, 40)} is already in use")
            seen.add(actor_id)

    def sent_again(self, actor_id: str, client: bytes) -> bool:
        """Whether ACTOR_ID names an actor CLIENT made: its construction, sent again after a
        broker restart (the client had not heard it kept), is that actor, not a new one.
        (A client makes its actors' ids at random, and its routing id is its own.)"""
        actor = self.actors.get(actor_id) or self.dead_actors.get(actor_id)
        return actor is not None and actor.owner == client

    def add_actor(self, task: Task, spec: dict[str, Any], owner: str) -> bool:
        """Make the actor TASK constructs for OWNER; False when it cannot exist (TASK
        failed)."""
        name = spec.get("name", "")
        if name in self.actor_names and spec.get("get_if_exists") is True:
            # Ray's get_if_exists: the live actor of that name is the answer (its client
            # asks for it by name next), decided here, so two racing clients get one actor.
            self._graph.fail(task, "ValueError", f"an actor named {name!r} already exists")
            return False
        actor = ActorRecord(spec["id"], name, spec.get("cls", "?"),
                            list(spec.get("methods", [])), task.client, task.units,
                            task.priority, spec.get("restarts", 0), spec.get("concurrency", 1),
                            task.id, key=owner, shared=spec.get("shared", False))
        task.creates = actor.id
        actor.placement, actor.bundle = task.id, task.bundle
        self.actors[actor.id] = actor
        self.placements[task.id] = actor
        if actor.name:
            other = self.actors.get(self.actor_names.get(actor.name, ""))
            if other is not None:
                self.dead(actor, f"an actor named {actor.name!r} already exists",
                                 error_type="ValueError")
                return False
            self.actor_names[actor.name] = actor.id
        self._changed(actor)
        log.info("actor_created", actor=actor.label(), id=actor.id,
                 resources=format_units(actor.units))
        return True

    def add_call(self, task: Task, actor_id: str, role: str = "") -> bool:
        """Queue TASK, a method call (by a key of ROLE), behind the caller's earlier calls;
        False if it failed (the actor is gone, or it is another owner's and not shared)."""
        task.actor = actor_id
        task.units = {}
        actor = self.actors.get(actor_id)
        if actor is not None and not self.may_call(actor, role, task.owner):
            self._graph.fail(task, "NotOwnerError", self.not_shared(actor, "call"))
            return False
        if actor is None:
            dead = self.dead_actors.get(actor_id)
            if dead is not None:
                self.fail_call(dead, task)
            else:
                self._graph.fail(task, "ActorDiedError",
                                 f"unknown actor {actor_id}: it ended long ago, or was made "
                                 "on a broker that has since restarted")
            return False
        actor.queues.setdefault(task.client, deque()).append(task.id)
        return True

    @staticmethod
    def may_call(actor: ActorRecord, role: str, owner: str) -> bool:
        """Whether OWNER's key (of ROLE) may call ACTOR's methods."""
        return actor.shared or role == "admin" or owner == actor.key

    @staticmethod
    def not_shared(actor: ActorRecord, verb: str) -> str:
        """Why ACTOR's methods may not be VERBed by another owner."""
        who = f"only {actor.key} or an admin key" if actor.key else "only an admin key"
        return (f"{actor.label()} belongs to {actor.key or 'no key'}: {who} may {verb} it "
                "(it was not made with shared=True)")

    def fail_call(self, actor: ActorRecord, task: Task, message: str = "") -> None:
        if actor.error is not None and not message:
            self._graph.finish(task, *actor.error)
        else:
            self._graph.fail(task, "ActorDiedError",
                             message or f"{actor.label()} is dead: {actor.cause}")

    def call_ready(self, task: Task) -> None:
        self._graph.set_state(task, TaskState.QUEUED)
        self._to_pump[task.actor] = None

    def wake(self, actor: ActorRecord) -> None:
        """Send ACTOR's calls that may go, at the end of this loop turn."""
        self._to_pump[actor.id] = None

    def pump_all(self) -> None:
        """Send every call that may go now, per caller in the order made; flush batches."""
        pumps, self._to_pump = self._to_pump, {}
        for actor_id in pumps:
            actor = self.actors.get(actor_id)
            if actor is not None and actor.state is ActorState.ALIVE:
                self.pump(actor)
        self._calls.flush()

    def pump(self, actor: ActorRecord) -> None:
        for caller, queue in list(actor.queues.items()):
            while queue:
                task = self._graph.get(queue[0])
                if task is None or task.state in FINISHED:
                    queue.popleft()
                    continue
                if task.state is not TaskState.QUEUED:
                    break  # waits for its arguments; later calls from this caller wait too
                if task.deps and self._waits(task):  # (sent again after a restart, say)
                    continue  # (it waits now, or failed: seen so above)
                queue.popleft()
                self._graph.set_state(task, TaskState.RUNNING)
                task.agent = actor.agent_name
                task.held = task.begun = False
                actor.inflight[task.id] = None
                self.call_actor[task.id] = actor
                if not task.payload:  # restored: its call stayed on disk till now
                    task.payload = self._load(task)
                counts, inputs, refs = self._graph.inputs(task)
                item = [task.id, actor.id, len(task.payload), counts]
                if refs:  # (inputs kept on agents: its process reads or fetches them, and
                    # its call, if it was put on an agent)
                    item.append({"refs": refs, "payload": task.call_in})
                self._calls.add(actor.agent, item, [*task.payload, *inputs])
            if not queue:
                del actor.queues[caller]

    # -- placement and what the agent reports ---------------------------------------------
    def place(self, actor: ActorRecord, agent_ident: bytes, agent_name: str) -> None:
        """Note ACTOR's placement and, the first time, keep its construction frames."""
        task = self._graph.get(actor.ready_task)
        if actor.starts == 0 and task is not None:
            if not task.payload:  # restored: its call stayed on disk till now
                task.payload = self._load(task)
            counts, inputs, refs = self._graph.inputs(task)
            actor.spawn = [*task.payload, *inputs]
            actor.spawn_counts = (len(task.payload), counts)
            actor.spawn_refs, actor.spawn_call_in = refs, task.call_in
        if task is not None and task.state is TaskState.QUEUED:
            self._graph.set_state(task, TaskState.RUNNING)
            task.agent = agent_name
        set_actor_state(actor, ActorState.STARTING)
        actor.starts += 1
        actor.agent, actor.agent_name = agent_ident, agent_name
        self._changed(actor)

    def started(self, actor: ActorRecord, outcome: str, frames: list[Any],
                info: dict[str, Any]) -> None:
        """The construction ended: OUTCOME ok means the actor is up."""
        task = self._graph.get(actor.ready_task)
        if outcome == P.OK:
            set_actor_state(actor, ActorState.ALIVE)
            self._changed(actor)
            log.info("actor_started", actor=actor.label(), agent=actor.agent_name,
                     start=actor.starts)
            if task is not None and task.state is TaskState.RUNNING:
                self._graph.finish(task, P.OK, frames, {**info, "agent": actor.agent_name})
            self._to_pump[actor.id] = None
            return
        # __init__ raised (the agent ends the process): every call fails with that error.
        self._release(actor.placement)
        actor.error = (outcome, frames, info)
        message = str(info.get("message", "")) or "its __init__ raised"
        self.dead(actor, f"its __init__ failed: {message}" if outcome != P.RAISED
                         else "its __init__ raised an exception")

    def exited(self, agent: bytes, actor_id: str, placement: int, cause: str,
               running: list[int], error: str = "", exceeded: bool = False) -> None:
        """AGENT says the process of ACTOR_ID's PLACEMENT ended, having started RUNNING;
        ERROR "MemoryLimitError": it was killed for its memory (CAUSE says how), and the
        calls it had begun fail so. EXCEEDED: past its own limit; while it was constructed,
        it is not restarted (its __init__ would go past it again: as a task stopped for
        its memory spends no retry, and else ``restarts=-1`` would try for ever)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.placement != placement or actor.agent != agent:
            return  # stale: killed meanwhile
        self._release(actor.placement)
        if error == "MemoryLimitError" and exceeded and actor.state is ActorState.STARTING:
            self.dead(actor, f"{cause} while it was constructed; not restarted", error)
        elif error == "MemoryLimitError":
            self.lost(actor, cause, set(running), error)
        else:
            self.lost(actor, f"its process {cause}", set(running))

    def lost(self, actor: ActorRecord, cause: str, started: set[int] | None,
             error: str = "ActorDiedError") -> None:
        """ACTOR's process or agent is gone (its grant already released): restart or end it.

        STARTED names the calls the process had begun (from its start log); when the agent
        itself was lost nobody knows, and every call it had taken in (held) counts as
        possibly begun, while calls it never had run on the next instance.
        """
        self.placements.pop(actor.placement, None)
        inflight = list(actor.inflight)
        actor.inflight.clear()
        if started is None:
            started = {c for c in inflight
                       if (t := self._graph.get(c)) is not None and t.held}
        restart = actor.restarts != 0
        again: list[Task] = []
        for call_id in inflight:
            self.call_actor.pop(call_id, None)
            task = self._graph.get(call_id)
            if task is None or task.state is not TaskState.RUNNING:
                continue
            if call_id not in started:
                again.append(task)
            elif restart and task.retries:
                task.retries -= 1
                again.append(task)
            else:
                self._graph.fail(task, error,
                                 f"{actor.label()} died while running {task.name}: {cause}")
        for task in reversed(again):  # back at the front, in the order they were made
            self._graph.set_state(task, TaskState.QUEUED)
            actor.queues.setdefault(task.client, deque()).appendleft(task.id)
        where = self.inside_of(actor)
        if not restart or (actor.bundle and where is None):
            self.dead(actor, f"{cause}; no restarts left" if not restart
                      else f"{cause}; its placement group has ended")
            return
        if actor.restarts > 0:
            actor.restarts -= 1
        log.warning("actor_restarting", actor=actor.label(), cause=cause,
                    restarts_left=actor.restarts)
        set_actor_state(actor, ActorState.RESTARTING)
        actor.placement = self._graph.new_id()
        actor.agent, actor.agent_name = b"", ""
        self.placements[actor.placement] = actor
        self._sched.enqueue(actor.placement, actor.units, actor.priority, time.monotonic(),
                            queueable=False, owner=actor.key, where=where)
        self._changed(actor)

    def inside_of(self, actor: ActorRecord) -> Any:
        """Where ACTOR, placed in a bundle, waits in the scheduler (None: not in one, or
        its placement group has ended)."""
        return self._inside(actor.bundle) if actor.bundle else None

    def call_on(self, agent: bytes, task_id: Any) -> Task | None:
        """The call TASK_ID if it was sent to an actor on AGENT."""
        actor = self.call_actor.get(task_id)
        return self._graph.get(task_id) if actor is not None and actor.agent == agent else None

    def held_on(self, agent: bytes) -> set[int]:
        """The placements and calls of the actors on AGENT."""
        out: set[int] = set()
        for actor in self.actors.values():
            if actor.agent == agent:
                out.add(actor.placement)
                out.update(actor.inflight)
        return out

    def resend_unheld(self, agent: bytes, holding: set[int], sent: set[int]) -> None:
        """Calls SENT to AGENT that it never took in (lost with a connection) go again."""
        for actor in self.actors.values():
            if actor.agent != agent:
                continue
            lost = [c for c in actor.inflight if c in sent and c not in holding
                    and (t := self._graph.get(c)) is not None and not t.held]
            for call_id in reversed(lost):  # back at the front, in the order they were made
                del actor.inflight[call_id]
                self.call_actor.pop(call_id, None)
                task = self._graph.tasks[call_id]
                self._graph.set_state(task, TaskState.QUEUED)
                actor.queues.setdefault(task.client, deque()).appendleft(call_id)
            if lost:
                self._to_pump[actor.id] = None

    # -- ending -----------------------------------------------------------------------------
    def kill(self, actor: ActorRecord, why: str) -> None:
        """End ACTOR now: stop its process, free its resources, fail what it has not done."""
        if actor.state in (ActorState.STARTING, ActorState.ALIVE):  # (adopting: when offered)
            self._send(actor.agent, P.KILL_ACTOR, {"ids": [actor.id]})
            self._release(actor.placement)
        self.dead(actor, why)

    def dead(self, actor: ActorRecord, cause: str, error_type: str = "ActorDiedError") -> None:
        """Mark ACTOR dead for CAUSE and fail its construction and every call not done."""
        set_actor_state(actor, ActorState.DEAD)
        actor.cause = cause
        log.warning("actor_died", actor=actor.label(), cause=cause)
        self._sched.dequeue(actor.placement)
        self.placements.pop(actor.placement, None)
        ready = self._graph.get(actor.ready_task)
        if ready is not None and ready.state not in FINISHED:
            if actor.error is not None:
                self._graph.finish(ready, *actor.error)
            else:
                self._graph.fail(ready, error_type, f"{actor.label()}: {cause}")
        for call_id in list(actor.inflight):
            self.call_actor.pop(call_id, None)
            task = self._graph.get(call_id)
            if task is not None and task.state not in FINISHED:
                self.fail_call(actor, task, f"{actor.label()} died while running "
                                             f"{task.name}: {cause}")
        actor.inflight.clear()
        queues, actor.queues = actor.queues, {}
        for queue in queues.values():
            for call_id in queue:
                task = self._graph.get(call_id)
                if task is not None and task.state not in FINISHED:
                    self.fail_call(actor, task)
        if actor.name and self.actor_names.get(actor.name) == actor.id:
            del self.actor_names[actor.name]
        del self.actors[actor.id]
        actor.spawn = []
        self._changed(actor)
        self.dead_actors[actor.id] = actor
        while len(self.dead_actors) > _DEAD_KEPT:
            self.dead_actors.popitem(last=False)

    def drop_owned_by(self, client: bytes, name: str) -> None:
        """End the unnamed actors the client CLIENT (called NAME) made; named ones live
        until killed."""
        for actor in [a for a in self.actors.values() if a.owner == client and not a.name]:
            self.kill(actor, f"its owner, client {name}, disconnected")

    # -- requests -----------------------------------------------------------------------------
    def on_kill(self, ident: bytes, msg: P.Message, now: float) -> None:
        actor = self.actors.get(P.field(msg, "actor", str))
        if actor is not None:
            self.kill(actor, "killed by zres.kill")
        self._send(ident, P.KILL_REPLY, {"req": msg.body.get("req")})

    def on_lookup(self, ident: bytes, msg: P.Message, now: float) -> None:
        name = P.field(msg, "name", str)
        actor = self.actors.get(self.actor_names.get(name, ""))
        body: dict[str, Any] = {"req": msg.body.get("req")}
        if actor is not None and not self.may_call(actor, *self._sender()):
            # It exists: said so (its name is taken), without what would let others call it.
            body["private"] = {"owner": actor.key, "cls": actor.cls}
        elif actor is not None:
            body["actor"] = {"id": actor.id, "name": actor.name, "cls": actor.cls,
                             "methods": actor.methods, "shared": actor.shared}
        self._send(ident, P.LOOKUP_REPLY, body)
