"""Actors kept across broker restarts: written to the state store, restored, taken back.

An actor's record (its class, options, restarts left, where it is placed, and the frames
that construct it) is written whenever its state changes; its construction and its
method calls are Python tasks, kept as the others are (``keeping``), each naming its
actor.

A restarted broker restores every actor that had not died:
- one waiting to be placed (pending, or restarting after a loss) waits again;
- one placed on an agent is *adopting*: that agent keeps its actor processes running
  when a broker of its cluster that keeps its state goes away, and offers them with its
  next session, with the calls each process has in hand. The actor is taken back on the
  same slot and devices, as it was: the calls in hand run on, and how calls ended while
  the broker was away comes with the offer (``Adoption``); the calls sent to it that never
  reached its process go again, first, uncharged. One whose construction its agent gives
  back (it waited for the broker that went), or that an agent carrying the very session
  it was sent to does not offer (sent as the broker went, it never arrived), never began:
  it is placed again, no restart spent (the broker keeps where it placed an actor before
  it sends it); one whose construction ended, or was known to be up, began, whatever
  its agent offers. An actor its agent no longer has, or whose agent is not back within
  the grace period, is lost as if that agent had died: it restarts if it may (its calls
  that may have begun spend a retry), else it is dead; one
  whose process its agent saw end meanwhile (its offer's ``exits``, with the calls the
  process had begun) is lost as if that were heard now: the calls it never began run on
  the next instance, uncharged;
- its calls not sent yet queue again per caller, in the order they were made.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack

from ..core import protocol as P
from ..core.tasks import FINISHED, Task, TaskState
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from .actor_records import ActorRecord, ActorState
from .actors import ActorRouting
from .agents import AgentRecord
from .graph import TaskGraph
from .store import Store

log = get_logger("zres.broker")
_pack = msgpack.Packer().pack


class ActorKeeper:
    """Write ROUTING's actors to STORE (None: nothing is kept) and take them back after
    a restart; SEND tells an agent to stop an actor this broker does not take back."""

    def __init__(self, store: Store | None, routing: ActorRouting, graph: TaskGraph,
                 sched: Scheduler, send: Callable[..., None]) -> None:
        self._store = store
        self._routing = routing
        self._graph = graph
        self._sched = sched
        self._send = send
        self.adopting: dict[str, ActorRecord] = {}   # restored, placed: their agents' word
        # Taken back by the registration read now, with the calls their processes have.
        self._settling: list[tuple[ActorRecord, set[int]]] = []
        # Ended while the broker was away, as that registration says: [actor, cause, calls
        # begun, error], lost once the calls that ended meanwhile are in (``settle``).
        self._exited: list[tuple[ActorRecord, str, set[int], str]] = []
        # Offered by that registration and not taken back (no room), or whose construction
        # it says ended: they began there.
        self._began: set[str] = set()

    def changed(self, actor: ActorRecord) -> None:
        """ACTOR's state changed: write it again (drop it once dead)."""
        if self._store is None:
            return
        if actor.state is ActorState.DEAD:
            self._store.forget_actor(actor.id)
            return
        state = actor.state if actor.state is not ActorState.ADOPTING else ActorState.ALIVE
        record = _pack([actor.name, actor.cls, actor.methods, actor.owner, actor.units,
                        actor.priority, actor.restarts, actor.concurrency, actor.ready_task,
                        state.value, actor.placement, actor.agent_name,
                        list(actor.spawn_counts), actor.starts, actor.key, actor.shared,
                        list(actor.bundle) if actor.bundle else None])
        self._store.put_actor(actor.id, record, _pack([P.buffer(f) for f in actor.spawn]))

    # -- restoring ---------------------------------------------------------------------------
    def restore(self) -> int:
        """Take back the actors kept in the store (before their tasks: see ``task``)."""
        if self._store is None:
            return 0
        rows = self._store.actors()
        for actor_id, record, spawn in rows:
            (name, cls, methods, owner, units, priority, restarts, concurrency, ready,
             state, placement, agent_name, counts, starts, key, *shared) = msgpack.unpackb(
                record, strict_map_key=False)  # (records of older versions lack shared)
            actor = ActorRecord(actor_id, name, cls, methods, owner, units, priority,
                                restarts, concurrency, ready, placement=placement,
                                starts=starts, key=key, shared=bool(shared and shared[0]))
            if len(shared) > 1 and shared[1]:  # (the placement group bundle it runs in)
                actor.bundle = (shared[1][0], shared[1][1])
            actor.spawn = list(msgpack.unpackb(spawn)) if spawn else []
            actor.spawn_counts = (counts[0], list(counts[1]))
            self._routing.actors[actor_id] = actor
            self._routing.placements[placement] = actor
            if name:
                self._routing.actor_names[name] = actor_id
            if state in (ActorState.STARTING.value, ActorState.ALIVE.value) and agent_name:
                actor.state, actor.agent_name = ActorState.ADOPTING, agent_name
                self.adopting[actor_id] = actor
            elif state == ActorState.RESTARTING.value:
                actor.state = ActorState.RESTARTING
                self._sched.enqueue(placement, actor.units, actor.priority, time.monotonic(),
                                    queueable=False, owner=actor.key,
                                    where=self._routing.inside_of(actor))
            # (a pending one waits for its construction task: restored with the tasks)
        if rows:
            log.info("actors_restored", actors=len(rows), adopting=len(self.adopting))
        return len(rows)

    def task(self, task: Task, deps: list[int], held_on: str,
             link: Callable[[Task, list[int]], None]) -> None:
        """TASK, restored and not ended, constructs or calls an actor (its inputs DEPS;
        HELD_ON the agent that held it): put it back where it was; LINK(task, deps) makes
        one wait for its inputs."""
        actor = self._routing.actors.get(task.creates or task.actor)
        if actor is None:
            self._graph.fail(task, "ActorDiedError", f"task {task.name} was for an actor "
                             "that had ended when the broker restarted")
        elif task.creates:
            task.creates = actor.id
            if actor.state is ActorState.PENDING:
                link(task, deps)  # it is placed once it is ready, as a new actor is
            else:
                self._in_hand(task, deps, actor)  # placed once: its __init__ runs or ran
        else:
            task.actor = actor.id
            if held_on and actor.state is ActorState.ADOPTING and held_on == actor.agent_name:
                self._in_hand(task, deps, actor)
                task.held = True
                actor.inflight[task.id] = None
            else:  # queued behind the caller's earlier calls (restored in id order)
                actor.queues.setdefault(task.client, deque()).append(task.id)
                link(task, deps)

    def _in_hand(self, task: Task, deps: list[int], actor: ActorRecord) -> None:
        """TASK was sent to ACTOR's agent: it runs there, holding its inputs."""
        for dep in deps:
            if (held := self._graph.get(dep)) is not None:
                held.holders += 1
                task.deps = [*task.deps, dep]
        self._graph.set_state(task, TaskState.QUEUED)
        self._graph.set_state(task, TaskState.RUNNING)
        task.agent = actor.agent_name

    # -- taking back ------------------------------------------------------------------------
    def offered(self, agent: AgentRecord, entries: Any) -> None:
        """AGENT's new session offers the actors it runs ([actor id, placement, slot
        index, [GPU positions], [calls in hand]]): take back those that are ours there;
        tell it to stop the others."""
        stop: list[str] = []
        for entry in entries if isinstance(entries, list) else []:
            if not _well_formed(entry, len(agent.slots)):
                if isinstance(entry, list) and entry and isinstance(entry[0], str):
                    self._began.add(entry[0])  # (offered, if garbled: it may run there)
                continue
            actor_id, placement, index, positions, calls = entry
            actor = self.adopting.get(actor_id)
            if actor is None or actor.agent_name != agent.name or actor.placement != placement \
                    or not self._sched.adopt(placement, agent.slots[index], dict(actor.units),
                                             positions, actor.priority, actor.key,
                                             self._routing.inside_of(actor)):
                log.warning("actor_not_adopted", actor=actor_id, agent=agent.name)
                stop.append(actor_id)
                self._began.add(actor_id)  # (it began there: lost, never placed as new)
                continue
            del self.adopting[actor_id]
            ready = self._graph.get(actor.ready_task)
            # (its __init__ ran on, or ended meanwhile: that result comes with the offer)
            constructing = ready is not None and ready.state not in FINISHED
            actor.state = ActorState.STARTING if constructing else ActorState.ALIVE
            actor.agent = agent.ident
            in_hand = {c for c in calls if type(c) is int}
            for call_id in actor.inflight:  # (each runs on, or ended: see ended())
                self._routing.call_actor[call_id] = actor
            self._settling.append((actor, in_hand))
            log.info("actor_adopted", actor=actor.label(), agent=agent.name,
                     calls=len(in_hand))
        if stop:
            self._send(agent.ident, P.KILL_ACTOR, {"ids": stop})

    def exited_away(self, agent: AgentRecord, exits: Any) -> None:
        """AGENT's new session says which of its actor processes ended while the broker was
        away (EXITS: [{actor, placement, cause, running: [calls begun], error?}]): their
        calls that ended meanwhile are taken in (``ended``), then they are lost (``settle``)
        as when a report says so, not as actors their agent no longer has."""
        for exit_ in exits if isinstance(exits, list) else []:
            actor = self.adopting.get(str(exit_.get("actor"))) \
                if isinstance(exit_, dict) else None
            if actor is None or actor.agent_name != agent.name \
                    or actor.placement != exit_.get("placement"):
                continue
            del self.adopting[actor.id]
            for call_id in actor.inflight:  # (each ended, or never began: see ended())
                self._routing.call_actor[call_id] = actor
            running = {c for c in exit_.get("running") or () if type(c) is int}
            self._exited.append((actor, str(exit_.get("cause")), running,
                                 str(exit_.get("error", ""))))

    def ended(self, agent: AgentRecord, task_id: int, outcome: str, frames: list[Any],
              info: dict[str, Any]) -> None:
        """TASK_ID, if a construction or call of an actor taken back from AGENT, ended
        while the broker was away."""
        actor = self._routing.placements.get(task_id)
        if actor is not None and self.adopting.get(actor.id) is actor \
                and actor.agent_name == agent.name:
            # Constructed meanwhile, and its process not offered: its __init__ raised (its
            # agent ended it), or it is gone since. It began: never placed as new.
            self._began.add(actor.id)
            if outcome != P.OK:  # (it dies of that error, as without the restart)
                del self.adopting[actor.id]
                actor.agent = agent.ident
                self._routing.started(actor, outcome, frames, info)
            return
        if actor is not None and actor.agent == agent.ident:
            if actor.state is ActorState.STARTING:
                self._routing.started(actor, outcome, frames, info)
            return
        actor = self._routing.call_actor.pop(task_id, None)
        if actor is None:
            return
        actor.inflight.pop(task_id, None)
        task = self._graph.get(task_id)
        if task is not None and task.state is TaskState.RUNNING:
            self._graph.finish(task, outcome, frames, {**info, "agent": agent.name})

    def settle(self, agent: AgentRecord) -> None:
        """AGENT's offer is read: the calls its actors never had go again, first and
        uncharged; its actors it did not offer are lost."""
        settling, self._settling = self._settling, []
        self._began.clear()
        for actor, in_hand in settling:
            never = [c for c in actor.inflight if c not in in_hand]
            for call_id in reversed(never):  # back at the front, in the order made
                del actor.inflight[call_id]
                del self._routing.call_actor[call_id]
                task = self._graph.tasks[call_id]
                task.held = False
                self._graph.set_state(task, TaskState.QUEUED)
                actor.queues.setdefault(task.client, deque()).appendleft(call_id)
            if actor.state is not ActorState.DEAD:
                self.changed(actor)
                self._routing.wake(actor)
        exited, self._exited = self._exited, []
        for actor, cause, running, error in exited:
            if error == "MemoryLimitError":
                self._routing.lost(actor, cause, running, error)
            else:
                self._routing.lost(actor, f"its process {cause}", running)
        for actor in [a for a in self.adopting.values() if a.agent_name == agent.name]:
            self._lose(actor, f"the broker restarted while it ran on agent {agent.name}, "
                       "and that agent no longer had it when it came back")

    def given_back(self, agent: AgentRecord, returned: set[int], whole: bool) -> None:
        """AGENT gives back (RETURNED) the constructions of its adopting actors that never
        reached their process, and, carrying the WHOLE session the broker last knew it
        by, offers every actor it may have begun (a construction sent as the broker went
        never arrived): each not begun is placed again, as a restart that costs none."""
        for actor in [a for a in self.adopting.values() if a.agent_name == agent.name
                      and (a.placement in returned or whole and self._unbegun(a))]:
            del self.adopting[actor.id]
            if actor.restarts >= 0:
                actor.restarts += 1  # (spent again by lost: it was never begun)
            self._routing.lost(actor, f"its construction never reached agent {agent.name} "
                               "before the broker restarted", set())

    def _unbegun(self, actor: ActorRecord) -> bool:
        """Whether ACTOR, adopting and not offered by an agent carrying the whole session,
        never began: its construction not ended (one that ended, or one the broker knew
        was up, began, whatever became of its process since), nor said to."""
        ready = self._graph.get(actor.ready_task)
        return ready is not None and ready.state not in FINISHED \
            and actor.id not in self._began

    def expire(self, grace: float) -> None:
        """The actors whose agents were not back within GRACE seconds are lost."""
        for actor in list(self.adopting.values()):
            self._lose(actor, f"the broker restarted while it ran on agent "
                       f"{actor.agent_name}, and that agent did not come back within "
                       f"{grace:g}s")

    def _lose(self, actor: ActorRecord, why: str) -> None:
        del self.adopting[actor.id]
        self._routing.lost(actor, why, None)


def _well_formed(entry: Any, slots: int) -> bool:
    """Whether an offered actor reads [id, placement, slot index, [positions], [calls]]."""
    return (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str)
            and type(entry[1]) is int and type(entry[2]) is int and 0 <= entry[2] < slots
            and isinstance(entry[3], list) and all(type(p) is int for p in entry[3])
            and isinstance(entry[4], list))
