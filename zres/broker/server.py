"""The broker: one ROUTER socket, the loop, and the routing of each message to its part.

A thin shell: it decodes control frames (msgpack only; payload frames pass through
untouched) and hands each message to the part that owns what it is about: the task graph
(``graph``), clients (``clients``), agents (``agents``), the dispatcher that moves tasks
to agents and back (``dispatch``), actors (``actors``), command jobs (``jobs``), and the
explainer (``status``). The placement policy is the pure ``zres.scheduler``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from ..core import net
from ..core import protocol as P
from ..core.limits import Limits
from ..core.report import in_user_units
from ..core.wakeup import wake_on_signals
from ..logs import get_logger
from ..scheduler.owners import DEFAULT_HALF_LIFE, Quotas
from ..scheduler.policy import Scheduler
from .actor_keeping import ActorKeeper
from .actors import ActorRouting
from .adoption import Adoption
from .agent_link import AgentLink
from .agents import AgentRegistry
from .auth import Gate
from .backlog import Backlog
from .beats import Heartbeats
from .cancels import CancelAnswers
from .client_link import ClientLink
from .clients import ClientRegistry
from .collector import Collector
from .dispatch import Dispatcher
from .gangs.groups import GroupTable
from .gangs.keeping import GroupKeeper
from .graph import TaskGraph
from .identity import Identities
from .intake import Handler, Intake
from .jobs import PUBLIC_FIELDS, JobTable
from .keeping import TaskKeeper
from .metrics import BrokerMetrics, Snapshots
from .objects import ObjectDirectory, data_secret
from .orphans import Orphans
from .output import OutputRouter
from .relay import Relay, listen_beside
from .spinning import SpinningPoller
from .status import Explainer
from .store import Store

log = get_logger("zres.broker")
_BATCH = 2000          # messages handled per loop turn before scheduling, at most
_TURN_BUDGET = 0.03    # seconds of message handling per loop turn, at most
_BACKLOG_BUDGET = 0.02  # ... and of work left from earlier turns (large submits)


class Broker(Intake):
    """Route messages between clients and agents; own the parts that keep the records."""

    def __init__(self, listen: str, heartbeat_interval: float = 0.5,
                 heartbeat_timeout: float = 3.0, client_timeout: float = 30.0,
                 starvation_after: float = 5.0, context: zmq.Context | None = None,
                 prefetch: int = 32, limits: Limits | None = None,
                 store: Store | None = None, keys: str | None = None,
                 half_life: float = DEFAULT_HALF_LIFE, quotas: Quotas | None = None,
                 client_grace: float = 5.0, relay: str | None = None,
                 spin: float | None = None) -> None:
        self.ctx = context or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        # KEYS: the cluster's keys directory: only their holders get in (None: anyone).
        self.gate = Gate(self.ctx, keys)
        self.gate.secure(self.sock)
        self._keys_read = self.gate.refresh()  # (a new number: a key may have been revoked)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting peer keeps its id
        # Closed connections, as soon as the transport knows: an agent whose connection
        # closed gets no new work until it is heard from again.
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.address = net.bind(self.sock, listen)
        self.epoch = random.getrandbits(48)   # this life of the broker
        # STORE keeps the state a restart must not lose (None: nothing is kept). The
        # cluster's identity outlives the broker's lives with it: job logs are kept apart
        # per cluster, and job ids never repeat on one.
        self.store = store
        self.cluster_id = store.cluster_id() if store else f"{self.epoch:012x}"
        self.dashboard_url: str | None = None  # where its HTTP server is, if it has one
        self.limits = limits or Limits()
        self.hb_interval = heartbeat_interval
        # Agents start nothing once the broker may have given up on them: their lease ends
        # before the broker would declare them lost, with two heartbeats to spare.
        self.lease = max(heartbeat_timeout - 2 * heartbeat_interval, heartbeat_timeout / 2)
        self._last_beat = 0.0
        self._last_turn = time.monotonic()
        self._judged = 0  # agents removed when feasibility was last judged (``settle``)
        self._fd = -1                       # the connection of the message being handled
        self._stopping = False
        self._collector = Collector()
        # PREFETCH: short tasks a slot may hold queued beyond what runs there (0: none).
        # Owners are served by fair share (their use halves every HALF_LIFE seconds), each
        # within its QUOTAS (see ``scheduler.owners``).
        self.quotas = quotas or Quotas()
        self.sched = Scheduler(starvation_after, prefetch=max(0, prefetch),
                               half_life=half_life, quotas=self.quotas)
        # Work taken across turns (a large submit), each client's in order.
        self.backlog = Backlog()
        # CLIENT_GRACE: how long a client whose connection closed has to come back before
        # its work is stopped (CLIENT_TIMEOUT: one silent, its connection open).
        self.clients = ClientRegistry(client_timeout, self._client_gone, client_grace)
        self.keeper = TaskKeeper(store, self.clients)
        # (lost agents, name bindings and sessions are kept across restarts)
        self.agents = AgentRegistry.kept(self.sched, heartbeat_timeout, store)
        # The parts name each other's methods through lambdas where each needs one made
        # after it: objects that refer to each other, modules that do not.
        self.graph = TaskGraph(on_ready=lambda task: self.dispatch.make_ready(task),
                               on_recorded=lambda task: self.client_link.recorded(task),
                               reserve_ids=store.reserve_ids if store else None,
                               first_id=(store.meta("id_ceiling", 0) if store else 0) + 1,
                               on_dropped=self._dropped)
        # Where results kept on agents are: their tokens use a secret kept with the state.
        self.objects = ObjectDirectory(self._send, self.agents, data_secret(store), self.graph.get,
                                       self.graph.finish, self.graph.fail,
                                       self.limits.object_bytes)
        self.graph.refer = self.objects.ref
        # Transfers for peers that cannot reach a holder (RELAY: where; "off": none).
        where = listen_beside(self.address, relay)
        self.relay = Relay(where, keys, self.objects.secret) if where else None
        self.objects.relay = (self.relay.address, self.relay.key) if self.relay else None
        self.actors = ActorRouting(self._send, self.graph, self.sched,
                                   release=lambda task_id: self.dispatch.release(task_id),
                                   changed=lambda actor: self.actor_keeper.changed(actor),
                                   load=self.keeper.payload, sender=self.acting,
                                   inside=lambda bundle: self.groups.inside(bundle),
                                   waits=lambda task: self.dispatch.lineage.waits_again(task))
        self.groups = GroupTable(self._send, self.graph, self.sched, self.agents,
                                 self.graph.new_id, sender=self.acting,
                                 end=lambda *a: self.dispatch.end_in_group(*a),
                                 changed=lambda group: self.gang_keeper.changed(group))
        self.gang_keeper = GroupKeeper(store, self.groups, self.sched)
        self.actor_keeper = ActorKeeper(store, self.actors, self.graph, self.sched, self._send)
        self.explain = Explainer(self.graph, self.sched, self.agents, self.actors)
        self.jobs = JobTable(self._send, self.graph, self.clients, self.agents,
                             self.explain.brief, self.sched.infeasible_reason,
                             cancel=lambda task: self.dispatch.drop(task), store=store,
                             sender=self.acting)
        self.cancels = CancelAnswers(self._send)
        self.client_link = ClientLink(
            self._send, self.clients, self.graph, lambda: self.dispatch, self.actors,
            self.jobs, self.cancels, self.explain, self.keeper, store, self.limits, self.acting,
            {"epoch": self.epoch, "cluster": self.cluster_id, "keeps": store is not None,
             "heartbeat": self.hb_interval, "limits": {
                 "header_bytes": self.limits.header_bytes,
                 "payload_bytes": self.limits.payload_bytes, "tasks": self.limits.tasks},
             **self.objects.relay_field()},
            conn=lambda: self.ids.conn, quotas=self.quotas, later=self.backlog.next,
            refuse=self._refused, objects=self.objects, groups=self.groups,
            commit=lambda: self.store is None or self._commit())
        self.orphans = Orphans(self._send, self.graph, lambda: self.dispatch, self.actors,
                               self.jobs, self.keeper, self.client_link.forget,
                               later=self.backlog.next, groups=self.groups)
        self.dispatch = Dispatcher(self._send, self.graph, self.sched, self.agents,
                                   self.actors, self.jobs, self.cancels,
                                   on_started=self.client_link.started,
                                   on_changed=self.keeper.changed, load=self.keeper.payload,
                                   token=self.gate.token, objects=self.objects,
                                   groups=self.groups, on_lost=getattr(self.relay, "forget", None),
                                   tell_first=self.client_link.early.tell)
        self.ids = Identities(self.gate, self.clients, self.graph, self.jobs, self.actors)
        # Jobs running when a previous broker of this cluster went: their agents offer
        # them back; those not back within the grace period are lost.
        # Clients the broker had when it went have as long to come back as a client waits
        # for its broker (its default reconnect window).
        reconnect = max(client_timeout, 300.0)
        self.adoption = Adoption(self.graph, self.sched, self.jobs,
                                 grace=max(60.0, 10 * heartbeat_timeout),
                                 clients=self.clients, reconnect=reconnect,
                                 actors=self.actor_keeper, objects=self.objects,
                                 gangs=(self.gang_keeper, self.dispatch.ranks, self.groups))
        self.keeper.kept_on_agents = self.objects.restored
        if store is not None:
            self.adoption.restore(store)
            self.actor_keeper.restore()  # (before the tasks that construct and call them)
            self.keeper.restore(self.graph, self.graph.fail, self.adoption.wait_for,
                                self.actor_keeper.task, reconnect, self.groups.rejoin,
                                self.objects.putting)
        self.link = AgentLink(self._send, self.agents, self.dispatch, self.limits,
                              welcome=lambda: {
                                  "epoch": self.epoch, "cluster": self.cluster_id,
                                  "heartbeat": self.hb_interval, "adopts": store is not None,
                                  "lease": self.lease, "starve": self.sched.starvation_after,
                                  "data_secret": self.objects.secret,
                                  **self.objects.relay_field()},
                              fd=lambda: self._fd, key=lambda: self.ids.conn, keys=self.gate.names,
                              adopt=lambda *a: self.adoption.offered(*a),
                              relay=self.relay.route if self.relay else None, peer=self.peer)
        self.beats = Heartbeats(self._send, self._send_raw, self.agents, self.clients,
                                self.link, self.dispatch, self.epoch, heartbeat_interval)
        # What the HTTP thread serves (zres.broker.http): a snapshot made on demand, and
        # counters the loop bumps; neither can change anything here.
        self.snapshots = Snapshots()
        self.metrics = BrokerMetrics(self.snapshots.get, journal=store is not None)
        self._traffic = self.metrics.traffic
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self._monitor, zmq.POLLIN)
        if self.gate.zap is not None:
            self.poller.register(self.gate.zap, zmq.POLLIN)
        self.poller.register(self.snapshots.wake, zmq.POLLIN)  # (seen below: ``wanted``)
        self.waiting = SpinningPoller(self.poller, spin, self._traffic)  # (None: default)
        self._handlers: dict[str, Handler] = {
            P.HELLO: self.client_link.on_hello, P.SUBMIT: self.client_link.on_submit,
            P.RELEASE: self.client_link.on_release, P.CANCEL: self.client_link.on_cancel,
            P.WHY: self.client_link.on_why, P.RESUME: self.client_link.on_resume,
            P.LOCATE: self.client_link.on_locate, P.PLACE: self.client_link.on_place,
            P.TASK_CANCEL: self.orphans.on_task_cancel, P.STATUS: self._on_status,
            P.DIRECT_DONE: self.link.on_direct_done,
            P.REGISTER: self.link.on_register, P.REPORT: self.link.on_report,
            P.HOLDING: self.link.on_holding, P.DRAIN: self.link.on_drain,
            P.HEARTBEAT: self.beats.on_heartbeat, P.BYE: self._on_bye,
            P.RESOURCES: self.link.on_resources, P.KILL: self.actors.on_kill,
            P.LOOKUP: self.actors.on_lookup, P.GROUP: self.groups.on_group,
            P.JOBS: self.jobs.on_jobs, P.JOB_CANCEL: self.jobs.on_cancel,
            P.LOGS: self.jobs.on_logs, P.LOGS_REPLY: self.jobs.on_logs_reply,
            P.OUTPUT: OutputRouter(self._send, self.agents, self.graph, self.clients).on_output,
        }

    # -- loop -----------------------------------------------------------------------
    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until stop() or SIGINT/SIGTERM; call READY once signals are handled."""
        for sig in (signal.SIGINT, signal.SIGTERM):  # (heard at once: see wakeup)
            signal.signal(sig, lambda *_: self.stop())
        wake_on_signals(self.poller)
        if ready is not None:
            ready()
        self._collector.start(time.monotonic())
        log.info("broker_started", address=self.address, epoch=self.epoch, pid=os.getpid())
        while not self._stopping:
            self.poll_once(time.monotonic(), timeout=self.hb_interval / 2)
        log.info("broker_stopped", address=self.address)
        self.close()

    def close(self) -> None:
        """Close the state store and the sockets: the monitor first (a socket given the same
        descriptor later would find its monitor's address still taken, and hear nothing)."""
        if self.store is not None:
            self.store.close()
        self.sock.disable_monitor()
        self._monitor.close(0)
        self.sock.close(0)
        self.gate.close()
        self.snapshots.close()
        if self.relay is not None:
            self.relay.close()

    def stop(self) -> None:
        self._stopping = True

    def poll_once(self, now: float, timeout: float = 0.0) -> None:
        """Handle what has arrived (a bounded time), schedule, send batches, check heartbeats."""
        start = time.monotonic()
        # (Not run for that long, stopped or stalled: peers were not silent, we were deaf.)
        self.beats.stalled(start - self._last_turn)
        events = dict(self.waiting.poll(int(min(timeout, self.client_link.acks.wait) * 1000)))
        busy_from = time.monotonic()  # (a turn's length leaves out its wait for messages)
        self._traffic.awake()
        if self.gate.zap is not None and self.gate.zap in events:
            self.gate.serve()
        if self._monitor in events:
            self._on_connection_events()
        if self.snapshots.wake in events:
            self.snapshots.drain()
        if self.sock not in events:
            self.beats.drained_at = busy_from  # (nothing waited when the poll returned)
        else:
            for _ in range(_BATCH):
                try:
                    frames = P.recv(self.sock)
                except zmq.Again:  # (not expected: the poll, or waiting(), said one waits)
                    break
                self._traffic.messages_in += 1
                self._traffic.bytes_in += sum(map(len, frames))
                now = time.monotonic()
                self._dispatch(frames, now)
                if not P.waiting(self.sock):  # (asked: ending on zmq.Again costs more)
                    self.beats.drained_at = time.monotonic()
                    break
                if now - busy_from > _TURN_BUDGET:
                    break  # the rest next turn, after heartbeats and scheduling
        if self.link.to_ack:  # (hand-offs wait for these: not behind large submits' work)
            self._keep()
        self.backlog.run(_BACKLOG_BUDGET)  # (what large submits left: see backlog)
        now = time.monotonic()
        self.beats.stalled(now - start)  # (one message held us that long?)
        self.settle()
        if self.sched.needs_pass():
            try:
                began = time.perf_counter()
                grants = self.sched.schedule(now)
                self.metrics.scheduling.observe(time.perf_counter() - began)
                self.dispatch.assign(grants)
            except Exception:  # a bug must not take the broker down for everyone
                log.exception("scheduling_failed")
        self._keep()  # (the turn's messages and grants, in one commit; then the grants go)
        self.beats.answer()
        if now - self._last_beat >= self.hb_interval:
            self._last_beat = now
            try:
                read = self.gate.refresh()  # (a key removed is refused within a heartbeat)
                if read != self._keys_read:
                    self._keys_read = read
                    self.ids.revoke(self._send, self.agents, lambda agent, why:
                                    self.dispatch.lose_agent(agent, why, recheck=False))
                self.beats.tick(now)
                self.settle()
                self.adoption.expire(now)
                for agent, gone in self.objects.expire(now, self.adoption.grace):
                    self.dispatch.lineage.lost(gone, f"agent {agent} (it did not come back "
                                               "after the broker restarted)")
                if self.store is not None and self.store.fold() \
                        and self._collector.tick(now, len(self.graph.tasks)):
                    self.store.collect_blobs()  # (fold: the journal's records into the db)
            except Exception:
                log.exception("heartbeat_failed")
        self.jobs.answer_waits(now)  # (those whose jobs ended this turn, or whose time is up)
        self.actors.pump_all()
        self.client_link.acks.send_due()  # (written above)
        self.client_link.flush()
        self.link.flush_acks()
        self.objects.flush()
        if self.snapshots.wanted:
            try:
                self.snapshots.publish(self.dashboard())
            except Exception:  # a bug must not take the broker down: its readers time out
                self.snapshots.wanted = False
                log.exception("snapshot_failed")
        self._last_turn = self.snapshots.last_turn = time.monotonic()
        self._traffic.turned(self._last_turn - busy_from)

    def settle(self) -> None:
        """Ask back grants queued behind work that turned long (``recalls``); judge every
        queued task's feasibility again if agents were lost since it was last judged: once
        a turn, however many went (each judging walks every queued task)."""
        self.dispatch.recalls.tick(time.monotonic())
        if self.agents.removed != self._judged:
            self._judged = self.agents.removed
            self.dispatch.recheck_feasibility()

    def _keep(self) -> None:
        """Commit what the turn changed, then send the grants made, clients their results
        and acknowledge the agents' reports that wait for it. Before any grant or ack goes
        out (in assigns, heartbeats, acks): an agent starts a direct grant the moment it
        arrives, and a job once the broker has kept that it may, and drops a result once
        it is kept. (Grants and results first: a task and a client wait on them.)"""
        if self.store is None or self._commit():
            self.agents.written()
            self.dispatch.send_assigns()  # (a failed commit: they wait for the next one)
        self.client_link.flush()
        self.link.flush_acks()

    def _commit(self) -> bool:
        """Commit the state store, timing the commits that write something."""
        assert self.store is not None and self.metrics.commit is not None
        began, dirty = time.perf_counter(), self.store.dirty()
        try:
            return self.store.commit()
        finally:
            if dirty:
                self.metrics.commit.observe(time.perf_counter() - began)

    def _on_connection_events(self) -> None:
        while self._monitor.poll(0):
            fd = net.monitor_event(self._monitor)[1]
            self.clients.disconnected(fd)
            for agent in self.agents.disconnected(fd):
                log.info("agent_away", agent=agent.name)
                self.dispatch.set_accepting(agent)

    def _dropped(self, task: Any) -> None:
        """Nobody holds TASK any more: forget it in the state store, free its copies."""
        self.keeper.dropped(task)
        self.objects.dropped(task)

    def _client_gone(self, client: Any, event: str) -> None:
        """A client left or was dropped: its backlog goes, what it left stops (``orphans``)."""
        self.backlog.drop(client.ident)
        self.orphans.client_gone(client, event)

    def acting(self) -> tuple[str, str]:
        """The role and owner the message handled acts as ("" without keys): ``identity``."""
        return self.ids.acting

    def _send(self, ident: bytes, kind: str, body: dict[str, Any] | None = None,
              frames: Sequence[Any] = (), hold: bool = True) -> None:
        client = self.clients.get(ident) if hold else None
        if client is not None and client.away:
            # Its connection closed, or another key's took its routing id: kept for it
            # until it is back (what it printed is not: output is never sent again).
            if kind != P.OUTPUT:
                client.held.append((kind, body, frames))
            return
        agent = self.agents.by_ident.get(ident)
        if agent is not None:
            # Everything an agent is told names its session (a reply about another names
            # that one): news for an ended session must never reach the session after it.
            body = {"session": agent.session, **(body or {})}
        self._send_raw(ident, P.encode(kind, body, frames))

    def _send_raw(self, ident: bytes, frames: list[Any]) -> None:
        """Send the encoded message FRAMES to IDENT as it is, counted."""
        self._traffic.messages_out += 1
        self._traffic.bytes_out += len(ident) + sum(map(len, frames))
        P.send(self.sock, [ident, *frames])

    def _on_bye(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self.agents.get(ident)
        if agent is not None:  # (TOLD: after its last report, which the broker has)
            self.dispatch.lose_agent(agent, "it shut down", recheck=False, left=True,
                                     told=msg.body.get("seq") == agent.seq)
        else:
            self.clients.leave(ident)

    def _on_status(self, ident: bytes, msg: P.Message, now: float) -> None:
        # Like resources, answered to any peer: zres status uses a throw-away socket.
        self._send(ident, P.STATUS_REPLY, {**self.status(), "req": msg.body.get("req")})

    def status(self) -> dict[str, Any]:
        """Describe agents, task counts and every task that cannot run, as plain data."""
        return {**self.explain.report(self.address, self.epoch, len(self.clients)),
                "cluster": self.cluster_id, "dashboard": self.dashboard_url,
                "placement_groups": self.groups.describe(), "job_waits": self.jobs.waits.held,
                "loop": self._traffic.describe(),
                "state": self.store.describe() if self.store is not None else None,
                "relay": self.relay.status() if self.relay is not None else None}

    def dashboard(self) -> dict[str, Any]:
        """Describe the cluster for the dashboard and metrics (its HTTP port asks no key: no
        job's command line, which may hold a token, nor its error, nor the state's place)."""
        jobs = [{k: v for k, v in job.items() if k in PUBLIC_FIELDS}
                for job in self.jobs.listing()]
        return in_user_units({**self.status(), "state": None, "jobs": jobs,
                              "jobs_total": self.jobs.count(), "time": time.time(),
                              "finished": dict(self.graph.finished)})
