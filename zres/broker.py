"""The broker: one ROUTER socket, task and agent records, heartbeats.

A thin shell around ``Scheduler``: it decodes control frames (msgpack only; payload frames
pass through untouched), keeps the dependency graph and results, and sends the
scheduler's grants to agents in one batch per agent per loop turn.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import zmq

from . import protocol as P
from .broker_actors import ActorRouting, ActorState, check_actor_spec
from .errors import ProtocolError
from .jobs import JobRouting
from .resources import GPU, UNIT, format_units, token_devices
from .scheduler import Scheduler
from .tasks import FINISHED, Task, TaskState, set_state

log = structlog.get_logger("zres.broker")
_BATCH = 2000  # messages handled per loop turn before scheduling


@dataclass(slots=True)
class ClientRecord:
    ident: bytes
    name: str
    last_seen: float
    ids: dict[int, int] = field(default_factory=dict)  # local id -> task id
    actors: set[str] = field(default_factory=set)      # the actors it made


@dataclass(slots=True)
class AgentRecord:
    ident: bytes
    name: str
    host: str
    pid: int
    last_seen: float
    slots: list[int]                 # scheduler slot ids, in the agent's slot order
    gpus: list[list[str]]            # device ids per slot
    spec: list[Any]                  # the registration as received, to spot repeats


def _kind(frame: Any) -> int:
    """Hash a pickled function, reading at most 4 KiB of it (a closure can be large)."""
    view = memoryview(P.buffer(frame))
    if view.nbytes <= 4096:
        return hash(bytes(view))
    return hash((view.nbytes, bytes(view[:2048]), bytes(view[-2048:])))


class Broker:
    """Route messages between clients and agents; own task and agent records."""

    def __init__(self, listen: str, heartbeat_interval: float = 0.5,
                 heartbeat_timeout: float = 3.0, client_timeout: float = 30.0,
                 starvation_after: float = 5.0, context: zmq.Context | None = None,
                 prefetch: int = 32) -> None:
        self.ctx = context or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(listen)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.epoch = random.getrandbits(48)
        self.hb_interval = heartbeat_interval
        self.hb_timeout = heartbeat_timeout
        self.client_timeout = client_timeout
        # PREFETCH: short tasks a slot may hold queued beyond what runs there (0: none).
        self.sched = Scheduler(starvation_after, prefetch=max(0, prefetch))
        self.tasks: dict[int, Task] = {}
        self.clients: dict[bytes, ClientRecord] = {}
        self.agents: dict[bytes, AgentRecord] = {}
        self.slot_owner: dict[int, AgentRecord] = {}
        self._next_task = 0
        self._next_slot = 0
        self._dirty = False
        self._last_beat = 0.0
        self._stopping = False
        self._results: dict[bytes, tuple[list[Any], list[Any]]] = {}
        self.act = ActorRouting(self)
        self.jobs = JobRouting(self)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self._handlers = {
            P.HELLO: self._on_hello, P.SUBMIT: self._on_submit, P.RELEASE: self._on_release,
            P.CANCEL: self._on_cancel, P.STATUS: self._on_status, P.WHY: self._on_why,
            P.REGISTER: self._on_register, P.DONE: self._on_done,
            P.HEARTBEAT: self._on_heartbeat, P.BYE: self._on_bye,
            P.RESOURCES: self._on_resources, P.KILL: self.act.on_kill,
            P.LOOKUP: self.act.on_lookup, P.ACTOR_EXIT: self.act.on_exit,
            P.JOBS: self.jobs.on_jobs, P.JOB_CANCEL: self.jobs.on_cancel,
            P.LOGS: self.jobs.on_logs, P.LOGS_REPLY: self.jobs.on_logs_reply,
        }

    # -- loop -----------------------------------------------------------------------
    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until stop() or SIGINT/SIGTERM; call READY once signals are handled."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop())
        if ready is not None:
            ready()
        log.info("broker_started", address=self.address, epoch=self.epoch, pid=os.getpid())
        while not self._stopping:
            self.poll_once(time.monotonic(), timeout=self.hb_interval / 2)
        log.info("broker_stopped", address=self.address)
        self.sock.close(0)

    def stop(self) -> None:
        self._stopping = True

    def poll_once(self, now: float, timeout: float = 0.0) -> None:
        """Handle what has arrived, run the scheduler, send batches, check heartbeats."""
        if self.poller.poll(int(timeout * 1000)):
            for _ in range(_BATCH):
                try:
                    frames = P.recv(self.sock)
                except zmq.Again:
                    break
                self._dispatch(frames, time.monotonic())
        now = time.monotonic()
        if self._dirty:
            self._dirty = False
            try:
                self._assign(self.sched.schedule(now))
            except Exception:  # a bug must not take the broker down for everyone
                log.exception("scheduling_failed")
            # A reservation given up during the pass frees room the pass had already passed.
            self._dirty = self.sched.needs_pass()
        if now - self._last_beat >= self.hb_interval:
            self._last_beat = now
            try:
                self._heartbeats(now)
            except Exception:
                log.exception("heartbeat_failed")
        self.act.pump_all()
        self._flush_results()

    def _dispatch(self, frames: list[Any], now: float) -> None:
        ident = frames[0].bytes
        try:
            msg = P.decode(frames[1:])
            handler = self._handlers.get(msg.kind)
            if handler is None:
                raise ProtocolError(f"{msg.kind} is not a message for the broker")
            handler(ident, msg, now)
        except ProtocolError as exc:
            log.warning("bad_message", peer=ident.hex(), error=str(exc))
        except Exception:  # a bug must not take the broker down for everyone
            log.exception("message_failed", peer=ident.hex())

    def _send(self, ident: bytes, kind: str, body: dict[str, Any] | None = None,
              frames: list[Any] = ()) -> None:  # type: ignore[assignment]
        P.send(self.sock, [ident, *P.encode(kind, body, frames)])

    # -- clients --------------------------------------------------------------------
    def _client(self, ident: bytes, now: float) -> ClientRecord | None:
        client = self.clients.get(ident)
        if client is None:
            self._send(ident, P.UNKNOWN)
        else:
            client.last_seen = now
        return client

    def _on_hello(self, ident: bytes, msg: P.Message, now: float) -> None:
        name = str(msg.body.get("client", ident.hex()))
        new = ident not in self.clients
        if new:
            self.clients[ident] = ClientRecord(ident, name, now)
            log.info("client_joined", client=name)
        # "new" tells a client we had dropped (silent too long) that its tasks are gone.
        self._send(ident, P.WELCOME, {"epoch": self.epoch, "heartbeat": self.hb_interval,
                                      "new": new})

    def _on_bye(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self.clients.pop(ident, None)
        if client is not None:
            self._drop_client(client, "client_left")

    def _on_submit(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self._client(ident, now)
        if client is None:
            return
        items = P.field(msg, "tasks", list)
        if not all(isinstance(i, list) and len(i) in (8, 9) for i in items):
            raise ProtocolError("submit: each task must be an 8- or 9-item array")
        payloads = P.split_frames(msg.frames, [i[5] for i in items])
        for item, payload in zip(items, payloads):
            self._add_task(client, item, payload)

    def _add_task(self, client: ClientRecord, item: list[Any], payload: list[Any]) -> None:
        local, units, priority, retries, deps, _, name, strict, *rest = item
        extra = rest[0] if rest else {}
        if not (isinstance(local, int) and isinstance(priority, int)
                and isinstance(retries, int) and isinstance(deps, list) and payload
                and all(type(d) is int for d in deps) and isinstance(extra, dict)):
            raise ProtocolError("submit: malformed task")
        P.check_units(units, "submit")
        spec = check_actor_spec(extra["actor"]) if "actor" in extra else None
        call = extra.get("call")
        if call is not None and not isinstance(call, str):
            raise ProtocolError("submit: call must name an actor id")
        self._next_task += 1
        task = Task(self._next_task, client.ident, local, units, priority, max(retries, 0),
                    str(name), bool(strict), payload, [])
        # The pickled function (the same bytes for every task of a map, or of one module
        # function): tasks of a kind are expected to take alike, for pipelining.
        task.kind = _kind(payload[0])
        self.tasks[task.id] = task
        client.ids[local] = task.id
        if "job" in extra:
            self.jobs.add(task, extra["job"])
        if spec is not None and not self.act.add_actor(client, task, spec):
            return
        if call is not None and not self.act.add_call(client, task, call):
            return
        failed_dep: Task | None = None
        for dep_local in deps:
            dep = self.tasks.get(client.ids.get(dep_local, -1))
            if dep is None:
                self._fail(task, "ZresError", f"dependency {dep_local} is unknown to the broker "
                           "(released, or lost in a broker restart)")
                return
            task.deps.append(dep.id)
            dep.holders += 1
            if dep.state is TaskState.FAILED:
                failed_dep = dep
            elif dep.state is not TaskState.DONE:
                task.missing += 1
                dep.dependents.append(task.id)
        if failed_dep is not None:
            self._finish(task, failed_dep.outcome, failed_dep.result, failed_dep.info)
        elif task.missing == 0:
            self._make_ready(task)

    def _make_ready(self, task: Task) -> None:
        if task.actor:
            self.act.call_ready(task)
            return
        reason = self.sched.infeasible_reason(task.units)
        if reason is not None and task.strict:
            self._fail(task, "InfeasibleError", f"task {task.name} is infeasible: {reason}")
            return
        set_state(task, TaskState.QUEUED)
        self._enqueue(task)
        self._dirty = True
        if reason is not None:
            self._warn_infeasible(task, reason)

    def _enqueue(self, task: Task) -> None:
        # An actor's construction holds its slot for good, and a command job is a process
        # of its own, usually long: neither waits in a slot's queue.
        self.sched.enqueue(task.id, task.units, task.priority, time.monotonic(),
                           queueable=not task.creates and task.id not in self.jobs.active,
                           kind=task.kind)

    def _warn_infeasible(self, task: Task, reason: str) -> None:
        if task.warned == reason:
            return
        task.warned = reason
        log.warning("task_infeasible", task=task.name, id=task.id, reason=reason)
        self._send(task.client, P.WARN, {"id": task.local_id, "reason": reason})

    def _on_release(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self._client(ident, now)
        if client is None:
            return
        for local in P.field(msg, "ids", list):
            task_id = client.ids.pop(local, None)
            if task_id is not None and task_id in self.tasks:
                self._unhold(self.tasks[task_id])

    def _unhold(self, task: Task) -> None:
        task.holders -= 1
        if task.holders <= 0 and task.state in FINISHED:
            del self.tasks[task.id]
            for dep_id in task.deps:
                if dep_id in self.tasks:
                    self._unhold(self.tasks[dep_id])
            task.deps = []

    def _on_cancel(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self._client(ident, now)
        if client is None:
            return
        for local in P.field(msg, "ids", list):
            task = self.tasks.get(client.ids.get(local, -1))
            if task is not None and task.state not in FINISHED:
                self._cancel(task)

    def _cancel(self, task: Task) -> None:
        actor = self.act.actors.get(task.creates) if task.creates else None
        if actor is not None:
            self.act.kill(actor, "its construction was cancelled")
            return
        if task.actor:  # a call: failing it is enough (one running finishes unobserved)
            pass
        elif task.state is TaskState.QUEUED:
            self.sched.dequeue(task.id)
            self._dirty = True  # it may have held a reservation
        elif task.state is TaskState.RUNNING:
            # The worker cannot stop a running Python call; its resources come back when
            # it returns, and the result is dropped then.
            owner = self.slot_owner.get(self.sched.running[task.id].slot) \
                if task.id in self.sched.running else None
            if owner is not None:
                self._send(owner.ident, P.CANCEL, {"ids": [task.id]})
        self._fail(task, "CancelledError", f"task {task.name} was cancelled")

    def _drop_client(self, client: ClientRecord, event: str) -> None:
        log.info(event, client=client.name)
        self.act.drop_owned_by(client)
        for task_id in list(client.ids.values()):
            task = self.tasks.get(task_id)
            # A named actor and a detached job live on.
            if task is not None and task.state not in FINISHED \
                    and task.creates not in self.act.actors and not self.jobs.detached(task):
                self._cancel(task)
        for task_id in list(client.ids.values()):
            if task_id in self.tasks:
                self._unhold(self.tasks[task_id])
        client.ids.clear()

    # -- agents ---------------------------------------------------------------------
    def _on_register(self, ident: bytes, msg: P.Message, now: float) -> None:
        # Check every field before touching any state: a bad frame changes nothing.
        name = P.field(msg, "name", str)
        slots = P.field(msg, "slots", list)
        host, pid = msg.body.get("host", ""), msg.body.get("pid", 0)
        if not slots or not all(isinstance(s, dict) for s in slots):
            raise ProtocolError("register: slots must be a non-empty array of maps")
        if not isinstance(host, str) or type(pid) is not int:
            raise ProtocolError("register: host must be a string and pid an int")
        units = [P.check_units(s.get("units"), "register") for s in slots]
        gpus = [[str(g) for g in s.get("gpus", [])] for s in slots]
        memory = [_int_list(s.get("gpu_memory", []), "register") for s in slots]
        for slot_units, slot_gpus, slot_memory in zip(units, gpus, memory):
            usable = slot_units.get(GPU, 0)
            # GPU is how many devices may take work; gpus lists every device the agent has.
            if usable % UNIT or usable // UNIT > len(slot_gpus) or len(slot_gpus) > 4096 \
                    or len(slot_memory) not in (0, len(slot_gpus)):
                raise ProtocolError("register: GPU amount, device ids and device memory "
                                    "do not agree")
        spec = [units, gpus, memory]
        known = self.agents.get(ident)
        if known is not None and known.name == name and known.spec == spec:
            # A repeated registration (it crossed our welcome): keep what runs there.
            known.last_seen = now
            self._send(ident, P.WELCOME, {"epoch": self.epoch, "agent": name,
                                          "heartbeat": self.hb_interval, "kept": True})
            return
        replaced = False
        for record in list(self.agents.values()):
            if record.ident == ident:
                self._lose_agent(record, "agent re-registered", recheck=False)
                replaced = True
            elif record.name == name:
                # The newcomer wins (a restarted agent); the old one, if alive, is told to
                # stop rather than re-register and evict the newcomer in turn.
                self._send(record.ident, P.UNKNOWN, {"replaced": True})
                self._lose_agent(record, "replaced by a new agent of the same name",
                                 recheck=False)
                replaced = True
        slot_ids = []
        for slot_units, slot_gpus, slot_memory in zip(units, gpus, memory):
            self._next_slot += 1
            self.sched.add_slot(self._next_slot, name, slot_units, slot_memory,
                                devices=len(slot_gpus))
            slot_ids.append(self._next_slot)
        record = AgentRecord(ident, name, host, pid, now, slot_ids, gpus, spec)
        self.agents[ident] = record
        for slot_id in slot_ids:
            self.slot_owner[slot_id] = record
        log.info("agent_joined", agent=name, slots=[format_units(u) for u in units])
        self._send(ident, P.WELCOME, {"epoch": self.epoch, "agent": name,
                                      "heartbeat": self.hb_interval})
        self._dirty = True
        # With no agent, nothing was infeasible; the first one to join decides what is.
        if replaced or len(self.agents) == 1:
            self._recheck_feasibility()

    def _on_resources(self, ident: bytes, msg: P.Message, now: float) -> None:
        name = P.field(msg, "agent", str)
        changes = P.check_units(msg.body.get("units"), "resources")
        agent = next((a for a in self.agents.values() if a.name == name), None)
        if agent is None:
            known = ", ".join(sorted(a.name for a in self.agents.values())) or "none"
            self._send(ident, P.RESOURCES_REPLY,
                       {"error": f"no agent named {name!r} (agents: {known})",
                        "req": msg.body.get("req")})
            return
        new = [{n: a for n, a in {**self.sched.slots[s].total, **changes}.items() if a}
               for s in agent.slots]
        try:  # all slots or none
            for slot_id, units in zip(agent.slots, new):
                self.sched.check_capacity(slot_id, units)
        except ValueError as exc:
            self._send(ident, P.RESOURCES_REPLY, {"error": f"agent {name}: {exc}",
                                                  "req": msg.body.get("req")})
            return
        for slot_id, units in zip(agent.slots, new):
            self._started(self.sched.set_capacity(slot_id, units))
        log.info("agent_resources_changed", agent=name,
                 slots=[format_units(self.sched.slots[s].total) for s in agent.slots])
        self._send(agent.ident, P.RESOURCES,
                   {"slots": [self.sched.slots[s].total for s in agent.slots]})
        self._send(ident, P.RESOURCES_REPLY,
                   {"slots": [self.sched.slots[s].total for s in agent.slots],
                    "req": msg.body.get("req")})
        self._dirty = True
        self._recheck_feasibility()

    def _assign(self, grants: list[Any]) -> None:
        batches: dict[bytes, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
        for grant in grants:
            agent = self.slot_owner[grant.slot]
            actor = self.act.placements.get(grant.task)
            if actor is not None:
                self.act.place(actor, agent.ident, agent.name)
                items, frames = batches[agent.ident]
                frames.extend(actor.spawn)
                items.append([grant.task, agent.slots.index(grant.slot), grant.units,
                              grant.gpus, actor.spawn_counts[0], actor.spawn_counts[1],
                              {"actor": actor.id, "concurrency": actor.concurrency,
                               "taken": grant.taken}])
                continue
            task = self.tasks[grant.task]
            set_state(task, TaskState.RUNNING)
            task.agent = agent.name
            task.started_at = time.monotonic()
            slot_index = agent.slots.index(grant.slot)
            if task.id in self.jobs.active and grant.started:
                self.jobs.started(task, agent.name,
                                  [agent.gpus[slot_index][p] for p in grant.gpus]
                                  or list(token_devices(grant.units)))
            items, frames = batches[agent.ident]
            dep_counts = []
            frames.extend(task.payload)
            for dep_id in task.deps:
                result = self.tasks[dep_id].result
                dep_counts.append(len(result))
                frames.extend(result)
            item = [task.id, slot_index, grant.units, grant.gpus, len(task.payload), dep_counts]
            if not grant.started or grant.taken != grant.units:
                # The agent starts a queued grant when TAKEN fits its own free amounts.
                item.append({"queued": not grant.started, "taken": grant.taken})
            items.append(item)
        for ident, (items, frames) in batches.items():
            self._send(ident, P.ASSIGN, {"tasks": items}, frames)

    def _on_done(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self.agents.get(ident)
        if agent is None:
            self._send(ident, P.UNKNOWN)
            return
        agent.last_seen = now
        items = P.field(msg, "results", list)
        if not all(isinstance(i, list) and len(i) == 4 for i in items):
            raise ProtocolError("done: each result must be a 4-item array")
        for (task_id, outcome, _, info), frames in zip(
                items, P.split_frames(msg.frames, [i[2] for i in items])):
            info = info if isinstance(info, dict) else {}
            actor = self.act.placements.get(task_id)
            if actor is not None:
                if actor.agent == ident and actor.state is ActorState.STARTING:
                    self.act.started(actor, str(outcome), frames, info)
                continue
            actor = self.act.call_actor.pop(task_id, None)
            if actor is not None:
                actor.inflight.pop(task_id, None)
                task = self.tasks.get(task_id)
                if task is not None and task.state is TaskState.RUNNING:
                    self._finish(task, str(outcome), frames, {**info, "agent": agent.name})
                continue
            grant = self.sched.running.get(task_id)
            if grant is None or self.slot_owner.get(grant.slot) is not agent:
                continue  # stale: cancelled, or retried elsewhere after a loss
            started = grant.started
            self._started(self.sched.release(task_id))
            self._dirty = True
            task = self.tasks.get(task_id)
            if task is None or task.state is not TaskState.RUNNING:
                continue
            if started and outcome != P.FAILED:
                self.sched.finished(task.kind, now - task.started_at)
            if outcome == P.FAILED and info.get("type") == "WorkerLostError" and task.retries:
                self._retry(task, info.get("message", "worker lost"))
            else:
                info["agent"] = agent.name
                self._finish(task, str(outcome), frames, info)

    def _started(self, task_ids: list[int]) -> None:
        """Note queued grants that the scheduler (and so the agent) has just started."""
        now = time.monotonic()
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            if task is not None:
                task.started_at = now
            if task_id in self.jobs.active:
                task = self.tasks[task_id]
                grant = self.sched.running[task_id]
                self.jobs.started(task, task.agent, list(token_devices(grant.units)))

    def _retry(self, task: Task, why: str) -> None:
        task.retries -= 1
        log.info("task_retried", task=task.name, id=task.id, why=why, retries_left=task.retries)
        set_state(task, TaskState.QUEUED)
        self.jobs.requeued(task)
        self._enqueue(task)
        self._dirty = True

    def _lose_agent(self, agent: AgentRecord, why: str, recheck: bool = True) -> None:
        del self.agents[agent.ident]
        log.warning("agent_lost", agent=agent.name, why=why)
        for slot_id in agent.slots:
            del self.slot_owner[slot_id]
            for task_id in self.sched.queued(slot_id):  # never started: no retry spent
                task = self.tasks.get(task_id)
                if task is not None and task.state is TaskState.RUNNING:
                    set_state(task, TaskState.QUEUED)
                    self.jobs.requeued(task)
                    self._enqueue(task)
                    self._dirty = True
            for task_id in self.sched.remove_slot(slot_id):
                actor = self.act.placements.get(task_id)
                if actor is not None:
                    self.act.lost(actor, f"its agent {agent.name} was lost ({why})", None)
                    continue
                task = self.tasks.get(task_id)
                if task is None or task.state is not TaskState.RUNNING:
                    continue
                if task.retries:
                    self._retry(task, f"agent {agent.name} lost")
                else:
                    self._fail(task, "AgentLostError",
                               f"agent {agent.name} was lost ({why}) while running task "
                               f"{task.name}, and it had no retries left")
        if recheck:
            self._recheck_feasibility()

    def _recheck_feasibility(self) -> None:
        for task_id in list(self.sched.waiting):
            task = self.tasks.get(task_id)
            if task is None:
                continue  # an actor's restart: it waits for a fitting agent to join
            reason = self.sched.infeasible_reason(task.units)
            if reason is None:
                task.warned = ""
            elif task.strict:
                self.sched.dequeue(task.id)
                self._dirty = True
                self._fail(task, "InfeasibleError", f"task {task.name} is infeasible: {reason}")
            else:
                self._warn_infeasible(task, reason)

    # -- results --------------------------------------------------------------------
    def _fail(self, task: Task, error: str, message: str) -> None:
        self._finish(task, P.FAILED, [], {"type": error, "message": message})

    def _finish(self, task: Task, outcome: str, frames: list[Any], info: dict[str, Any]) -> None:
        """Record TASK's outcome, send it to its client, and pass a failure on to dependents.

        A worklist, not recursion: a failure at the head of a chain of 100,000 tasks fails
        them all without overflowing the stack.
        """
        work = [task]
        while work:
            current = work.pop()
            ready = self._record(current, outcome, frames, info)
            if outcome != P.OK:
                work.extend(ready)

    def _record(self, task: Task, outcome: str, frames: list[Any],
                info: dict[str, Any]) -> list[Task]:
        """Finish one task; return the waiting dependents a failure must also fail."""
        set_state(task, TaskState.DONE if outcome == P.OK else TaskState.FAILED)
        task.outcome, task.result, task.info, task.payload = outcome, frames, info, []
        self.jobs.finished(task, outcome, info)
        actor = self.act.actors.get(task.creates) if task.creates else None
        if actor is not None and outcome != P.OK and actor.state is ActorState.PENDING:
            # It never started (a failed argument, infeasible): calls fail the same way.
            actor.error = (outcome, frames, info)
            self.act.dead(actor, str(info.get("message", "its construction failed")))
        client = self.clients.get(task.client)
        if client is not None and client.ids.get(task.local_id) == task.id:
            items, out = self._results.setdefault(client.ident, ([], []))
            items.append([task.local_id, outcome, len(frames), info])
            out.extend(frames)
        failed: list[Task] = []
        for dependent_id in task.dependents:
            dependent = self.tasks.get(dependent_id)
            if dependent is None or dependent.state is not TaskState.WAITING:
                continue
            if outcome != P.OK:
                failed.append(dependent)
            else:
                dependent.missing -= 1
                if dependent.missing == 0:
                    self._make_ready(dependent)
        task.dependents = []
        # The dependencies' results are no longer needed by this task.
        for dep_id in task.deps:
            if dep_id in self.tasks:
                self._unhold(self.tasks[dep_id])
        task.deps = []
        if task.holders <= 0:
            self.tasks.pop(task.id, None)
        return failed

    def _flush_results(self) -> None:
        for ident, (items, frames) in self._results.items():
            self._send(ident, P.RESULTS, {"results": items}, frames)
        self._results.clear()

    # -- heartbeats, status -----------------------------------------------------------
    def _on_heartbeat(self, ident: bytes, msg: P.Message, now: float) -> None:
        peer = self.agents.get(ident) or self.clients.get(ident)
        if peer is None:
            self._send(ident, P.UNKNOWN)
        else:
            peer.last_seen = now

    def _heartbeats(self, now: float) -> None:
        for agent in list(self.agents.values()):
            if now - agent.last_seen > self.hb_timeout:
                self._lose_agent(agent, f"silent for {now - agent.last_seen:.1f}s")
        for client in list(self.clients.values()):
            if now - client.last_seen > self.client_timeout:
                del self.clients[client.ident]
                self._drop_client(client, "client_lost")
        beat = P.encode(P.HEARTBEAT, {"epoch": self.epoch})
        for ident in [*self.agents, *self.clients]:
            P.send(self.sock, [ident, *beat])

    def _on_why(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self._client(ident, now)
        if client is None:
            return
        local = P.field(msg, "id", int)
        task = self.tasks.get(client.ids.get(local, -1))
        self._send(ident, P.WHY_REPLY, {"id": local, "reason": self._why(task),
                                        "req": msg.body.get("req")})

    def _why(self, task: Task | None, count_ahead: bool = True) -> str:
        if task is None:
            return "unknown task (finished and released, or lost in a broker restart)"
        if task.state is TaskState.WAITING:
            names = [self.tasks[d].name for d in task.deps
                     if d in self.tasks and self.tasks[d].state not in FINISHED]
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                             else "")
            return f"waiting for {task.missing} of {len(task.deps)} dependencies: {shown}"
        if task.state is TaskState.QUEUED and task.actor:
            actor = self.act.actors.get(task.actor)
            state = actor.state.value if actor is not None else "dead"
            return f"queued for actor {task.actor[:8]} ({state}) behind the caller's earlier calls"
        if task.state is TaskState.QUEUED:
            return self.sched.why(task.id, count_ahead)
        if task.state is TaskState.RUNNING:
            grant = self.sched.running.get(task.id)
            if grant is not None and not grant.started:
                return self.sched.why(task.id)
            return f"running on {task.agent}"
        return task.state.value

    def _on_status(self, ident: bytes, msg: P.Message, now: float) -> None:
        # Like resources, answered to any peer: zres status uses a throw-away socket.
        self._send(ident, P.STATUS_REPLY, {**self.status(), "req": msg.body.get("req")})

    def status(self) -> dict[str, Any]:
        """Describe agents, task counts and every task that cannot run, as plain data."""
        agents = []
        for agent in sorted(self.agents.values(), key=lambda a: a.name):
            slots = [self.sched.slots[s] for s in agent.slots]
            agents.append({"name": agent.name, "host": agent.host, "pid": agent.pid,
                           "slots": [{"total": s.total, "free": s.free,
                                      "running": len(s.running), "gpus": g}
                                     for s, g in zip(slots, agent.gpus)]})
        counts: dict[str, int] = defaultdict(int)
        blocked: list[dict[str, Any]] = []
        for task in self.tasks.values():
            grant = self.sched.running.get(task.id)
            # A grant waiting in a slot's queue has not started: it counts as queued.
            counts["queued" if grant is not None and not grant.started
                   else task.state.value] += 1
            if task.state is TaskState.QUEUED:
                reason = self.sched.infeasible_reason(task.units)
                if len(blocked) < 200 or (reason is not None and len(blocked) < 1000):
                    blocked.append({"id": task.id, "name": task.name, "units": task.units,
                                    "reason": self._why(task, count_ahead=False)})
        return {"epoch": self.epoch, "address": self.address, "agents": agents,
                "clients": len(self.clients), "counts": dict(counts), "waiting": blocked,
                "actors": self.act.status()}


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ProtocolError(f"{what}: expected a list of non-negative ints")
    return value
