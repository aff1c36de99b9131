"""What the broker hears from clients and tells them: hellos, submits, releases, cancels,
and their tasks' news (running, results).

A broker that keeps its state acknowledges submitted tasks (``accepted``) only once they
are written (see ``accepting``). A client that comes back to a restarted broker of its
cluster says which of its tasks it still waits for (``resume``): those that ended are
told again, those the broker no longer has fail, saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core import versions
from ..core.errors import ProtocolError
from ..core.limits import LimitExceeded, Limits, check_name
from ..core.tasks import FINISHED, Task, TaskState
from ..logs import get_logger
from ..scheduler.owners import Quotas
from .accepting import Acknowledgements
from .actor_records import ActorState
from .actors import ActorRouting
from .cancels import CancelAnswers
from .clients import ClientRecord, ClientRegistry
from .dispatch import CancelOutcome, Dispatcher
from .early_results import EarlyResults
from .graph import TaskGraph
from .jobs import JobTable
from .keeping import TaskKeeper
from .lineage import gone_why
from .outbox import Batches
from .status import Explainer
from .store import StateUnwritable, Store
from .submit import SubmitReader

log = get_logger("zres.broker")
Send = Callable[..., None]
Refuse = Callable[[bytes, P.Message, Exception, list[int]], None]
# A submit's tasks taken in one go (a few ms of work); the rest of a larger one (a map's
# 1,000 a message) is taken across turns, for a bounded time each.
CHUNK = 250


class ClientLink:
    """The broker's side of its clients' conversation."""

    def __init__(self, send: Send, clients: ClientRegistry, graph: TaskGraph,
                 dispatch: Callable[[], Dispatcher], actors: ActorRouting, jobs: JobTable,
                 cancels: CancelAnswers, explain: Explainer, keeper: TaskKeeper,
                 store: Store | None, limits: Limits,
                 acting: Callable[[], tuple[str, str]], welcome: dict[str, Any],
                 conn: Callable[[], tuple[str, str, str]] = lambda: ("", "", ""),
                 quotas: Quotas | None = None,
                 later: Callable[[bytes, Callable[[], None]], None] | None = None,
                 refuse: Refuse | None = None, objects: Any = None,
                 groups: Any = None, commit: Callable[[], bool] = lambda: True) -> None:
        self._send = send
        self.clients = clients
        self._graph = graph
        self._dispatch = dispatch   # (made after this)
        self._actors = actors
        self._jobs = jobs
        self._cancels = cancels
        self._explain = explain
        self._keeper = keeper
        self._store = store
        self._limits = limits
        self._welcome = welcome
        # Who the message handled acts as (role, owner), and its connection's key (role,
        # name, public key): see ``identity`` ("" without keys).
        self._acting = acting
        self._conn = conn
        self._quotas = quotas or Quotas()  # (how many tasks each owner may have waiting)
        self._running = Batches(send, P.RUNNING, "ids")
        self._results = Batches(send, P.RESULTS, "results")
        self.acks = Acknowledgements(send, store)
        self.early = EarlyResults(send, clients, keeper, self.acks, commit)  # (told first)
        # Puts placed this turn: told where to upload once written (see ``flush``).
        self._placed: list[tuple[bytes, dict[str, Any]]] = []
        # LATER(ident, work): go on with a client's large submit at the loop's next round,
        # before what it sent after (see ``backlog``); REFUSE(ident, msg, error, ids): fail
        # the tasks of it that were not taken (LATER None: every submit in one go).
        self._later = later
        self._refuse = refuse
        # Results kept on agents (the broker's ``objects``), and references to them.
        self._objects = objects
        self._groups = groups  # placement groups (``gangs.groups``), None in some tests
        self._refer: Callable[[Task], Any] = lambda task: graph.refer(task)

    def client(self, ident: bytes, now: float) -> ClientRecord | None:
        client = self.clients.seen(ident, now)
        if client is None or client.restored:
            # (A client restored from a previous life says hello first: what it sent
            # before it knew of the restart, it sends again after, in order.)
            self._send(ident, P.UNKNOWN)
            return None
        return client

    def on_hello(self, ident: bytes, msg: P.Message, now: float) -> None:
        name = check_name(msg.body.get("client", ident[:16].hex()), self._limits,
                          "hello: the client's name")
        versions.refuse_mismatch(msg.body.get("versions"), "client")
        how = self.clients.hello(ident, name, now)
        client = self.clients.get(ident)
        assert client is not None
        client.role, client.owner = self._acting()
        role, key_name, client.public = self._conn()
        client.key = f"{role}:{key_name}" if role else ""
        client.output = msg.body.get("output", True) is not False
        # "new" tells a client we had dropped (silent too long) that its tasks are gone;
        # "resumed", one that comes back to a restarted broker, that they are here.
        self._send(ident, P.WELCOME, {**self._welcome, "new": how == "new",
                                      "resumed": how == "resumed"})

    def on_resume(self, ident: bytes, msg: P.Message, now: float) -> None:
        """The client waits for these tasks (after a broker restart): tell again how those
        that ended ended; fail those this broker does not have."""
        client = self.client(ident, now)
        if client is None:
            return
        for local in P.field(msg, "ids", list):
            if type(local) is not int:
                raise ProtocolError("resume: ids must be task ids")
            task_id = client.ids.get(local)
            task = self._graph.get(task_id) if task_id is not None else None
            if task is not None and task.quiet and self._keeper.ended_unkept(task.id):
                self._results.add(ident, [local, P.OK, 0, {}], [])  # (its end, not its result)
                continue
            if task_id is not None:
                self._keeper.need(task_id)  # its result was not kept: it runs again
            if task_id is None:
                self._results.add(ident, [local, P.FAILED, 0, {
                    "type": "BrokerLostError", "message": "the broker restarted and "
                    "did not keep it"}],
                    [])
            elif task is not None and task.state in FINISHED:
                # (None: a job that waits for its agent to offer it back)
                self._tell(ident, task)
        holds = msg.body.get("holds")
        if holds is not None:
            self._resume_holds(client, holds, msg.body.get("last") is True)

    def _resume_holds(self, client: ClientRecord, holds: Any, last: bool) -> None:
        """CLIENT holds HOLDS (local ids) of its tasks; once LAST, let go of the rest: it
        let go of them before the restart, and this broker had not written that."""
        if type(holds) is not list or any(type(local) is not int for local in holds):
            raise ProtocolError("resume: holds must be task ids")
        if client.holds is None:
            client.holds = set()
        client.holds.update(holds)
        if not last:
            return
        kept, client.holds = client.holds, None
        for local in [local for local in client.ids if local not in kept]:
            self._let_go(client, local)

    def forget(self, ident: bytes) -> None:
        """The client IDENT is gone: what was to be told it is not."""
        self.acks.forget(ident)

    def on_submit(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self.client(ident, now)
        if client is None:
            return
        payload = sum(len(f) for f in msg.frames)
        if payload > self._limits.payload_bytes:
            raise LimitExceeded(f"a submit's payload of {payload} bytes is larger than the "
                                f"broker's limit of {self._limits.payload_bytes} "
                                "(max_payload_bytes)")
        reader = SubmitReader(msg, self._limits)
        # (the owner's queued quota, for the whole submit: refused whole, to it alone)
        self._check_queued(client.owner, reader.new_for(client.ids))
        self._take(client, msg, reader)

    def _take(self, client: ClientRecord, msg: P.Message, reader: SubmitReader) -> None:
        """Take the next chunk of READER's tasks (all of them, with no backlog), and leave
        the rest for the loop's next round: a submit of 100,000 tasks holds nobody up."""
        submissions = reader.take(CHUNK if self._later is not None else 1 << 62)
        if self._store is not None and self._store.error is not None:
            raise StateUnwritable(f"the broker cannot keep new work: writing its state in "
                                  f"{self._store.directory} fails ({self._store.error})")
        # Refused before anything of the chunk is recorded: a refusal fails every task of
        # it (and of what was left of the submit).
        self._actors.check_new_ids([s.actor["id"] for s in submissions if s.actor],
                                   client.ident)
        for sub in submissions:
            client.accepted = max(client.accepted, sub.local)
            if sub.local in client.ids:
                self.acks.tell_id(client.ident, sub.local, client.ids[sub.local])  # (again)
                known = self._graph.get(client.ids[sub.local])
                if known is not None and known.state in FINISHED:
                    self._tell(client.ident, known)  # (perhaps told before it was back)
            if sub.local in client.ids or (
                    sub.actor and self._actors.sent_again(sub.actor["id"], client.ident)) or (
                    sub.group and self._groups.sent_again(sub.group["id"], client.ident)):
                # Sent again after a restart, and kept before it: taken once (an actor's
                # construction even if its client has let go of it since: the actor lives).
                continue
            task = Task(self._graph.new_id(), client.ident, sub.local, sub.units,
                        sub.priority, sub.retries, sub.name, sub.strict, sub.payload, (),
                        kind=sub.kind, owner=client.owner)
            task.quiet, task.numbered = sub.quiet, sub.numbered
            task.workers, task.allow_other_workers = sub.workers, sub.allow_other_workers
            task.call_in = sub.call_in
            task.detached = sub.detached or bool(sub.job and sub.job["detached"])
            task.recompute, task.retry_oom = sub.recompute, sub.retry_oom
            if sub.job is not None and task.detached:
                sub.job["detached"] = True
            self._graph.add(task)
            client.ids[sub.local] = task.id
            self.acks.tell_id(client.ident, sub.local, task.id)
            if sub.placement is not None and (refused := self._groups.check_placement(
                    task, sub.placement, client.role)) is not None:
                self._graph.fail(task, "ValueError", refused)
                continue
            if sub.job is not None:
                self._jobs.add(task, sub.job)
            if sub.actor is not None and not self._actors.add_actor(task, sub.actor,
                                                                     client.owner):
                continue
            if sub.call is not None and not self._actors.add_call(task, sub.call,
                                                                   client.role):
                continue
            if sub.group is not None and not self._groups.add(task, sub.group):
                continue
            deps = [client.ids.get(local, -1) for local in sub.deps]
            for dep in deps:
                self._keeper.need(dep)
            unknown = next((local for local, dep in zip(sub.deps, deps)
                            if self._graph.get(dep) is None), None)
            if unknown is not None:
                self._graph.fail(task, "ZresError", f"dependency {unknown} is unknown to "
                                 "the broker (released, or not kept in a broker restart)")
                continue
            if sub.job is None:  # (jobs keep their own table)
                self._keeper.new(task, deps)
            self._graph.link(task, deps)
        self.acks.took(client)
        if not reader.done() and self._later is not None:
            self._later(client.ident, lambda: self._go_on(client, msg, reader))

    def _go_on(self, client: ClientRecord, msg: P.Message, reader: SubmitReader) -> None:
        """Take the next chunk of a large submit of CLIENT's (if it is still here)."""
        if self.clients.get(client.ident) is not client:
            return  # it left (or was dropped): what it had not handed over goes with it
        start = reader.at
        try:
            self._take(client, msg, reader)
        except (ProtocolError, LimitExceeded, StateUnwritable) as exc:
            assert self._refuse is not None
            self._refuse(client.ident, msg, exc, reader.left(start))

    def _check_queued(self, owner: str, adding: int) -> None:
        """Refuse ADDING more tasks of OWNER if they take it over its queued quota (its
        tasks waiting for dependencies or resources): that owner's submit alone fails."""
        cap = self._quotas.queued_of(owner)
        have = self._graph.census.waiting_of(owner)
        if cap is not None and adding and have + adding > cap:
            named = owner if owner in self._quotas.queued else "default"
            raise LimitExceeded(
                f"over the queued quota of owner {owner or '(the default key)'}: "
                f"{cap} tasks waiting at once ([quotas.queued] {named}); it has {have} "
                f"waiting and this submit adds {adding}")

    def on_release(self, ident: bytes, msg: P.Message, now: float) -> None:
        # Heard from a restored client before its hello too: letting go of a task needs no
        # order with what it sends again, and a client that has its results (told at once
        # by a restarted broker) may let go before it notices the restart.
        client = self.clients.seen(ident, now)
        if client is None:
            self._send(ident, P.UNKNOWN)
            return
        for local in P.field(msg, "ids", list):
            self._let_go(client, local)

    def _let_go(self, client: ClientRecord, local: int) -> None:
        task = self._graph.get(client.ids.pop(local, -1))
        if task is not None:
            self._graph.unhold(task)
            if self._graph.get(task.id) is task:  # still held: its client lets go
                self._keeper.changed(task)

    def on_cancel(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self.client(ident, now)
        if client is None:
            return
        force = msg.body.get("force") is True
        cancelled: list[int] = []
        asked: dict[int, int] = {}
        for local in P.field(msg, "ids", list):
            task = self._graph.get(client.ids.get(local, -1))
            if task is None or task.state in FINISHED or task.stopping:
                continue
            outcome = self._dispatch().cancel(task, force)
            if outcome is CancelOutcome.CANCELLED:
                cancelled.append(local)
            elif outcome is CancelOutcome.ASKED:
                asked[task.id] = local
        if "req" in msg.body:
            self._cancels.answer(ident, msg.body["req"], cancelled, asked)

    def on_why(self, ident: bytes, msg: P.Message, now: float) -> None:
        client = self.client(ident, now)
        if client is None:
            return
        local = P.field(msg, "id", int)
        task = self._graph.get(client.ids.get(local, -1))
        self._send(ident, P.WHY_REPLY, {"id": local, "reason": self._explain.why(task),
                                        "req": msg.body.get("req")})

    # -- news of their tasks ---------------------------------------------------------
    def started(self, task: Task) -> None:
        """TASK began on an agent: its client hears it (batched), so its future runs."""
        client = self.clients.get(task.client)
        if client is not None and client.ids.get(task.local_id) == task.id \
                and task.id not in self.early.told:
            self._running.add(client.ident, task.local_id)

    def recorded(self, task: Task) -> None:
        """TASK has its outcome: update its job and actor, and send it to its client."""
        if task.cancelling:
            self._cancels.settle(task, task.info.get("type") == "CancelledError")
        self._jobs.finished(task, task.outcome, task.info)
        self._keeper.changed(task)
        actor = self._actors.actors.get(task.creates) if task.creates else None
        if actor is not None and task.outcome != P.OK and actor.state is ActorState.PENDING:
            # It never started (a failed argument, infeasible): calls fail the same way.
            actor.error = (task.outcome, task.result, task.info)
            self._actors.dead(actor, str(task.info.get("message", "its construction failed")))
        client = self.clients.get(task.client)
        if client is not None and client.ids.get(task.local_id) == task.id \
                and task.id not in self.early.told:
            self._tell(client.ident, task)

    def _tell(self, ident: bytes, task: Task) -> None:
        """Send TASK's outcome to its client: the result's frames, unless it is quiet and
        succeeded (an error's frames always go: they say what went wrong), or, for one
        kept on agents, a reference the client fetches it with."""
        frames = [] if task.quiet and task.outcome == P.OK else task.result
        info = task.info
        if task.size and not task.quiet:
            info = {**info, "ref": self._refer(task), "size": task.size}
        self._results.add(ident, [task.local_id, task.outcome, len(frames), info], frames)

    def on_place(self, ident: bytes, msg: P.Message, now: float) -> None:
        """A client puts a value on an agent (a call too big to travel inline, scatter):
        the broker makes it a task of the client's (LOCAL) that ends once its agent says it
        has it whole, and says where to upload it (the client's data goes straight there,
        never through the broker)."""
        client = self.client(ident, now)
        if client is None:
            return
        size, local = P.field(msg, "size", int), P.field(msg, "local", int)
        body: dict[str, Any] = {"req": msg.body.get("req")}
        if size <= 0 or size > self._limits.object_bytes:
            body["error"] = (f"a value of {size} bytes is larger than the broker's limit of "
                             f"{self._limits.object_bytes} (max_object_bytes)" if size > 0
                             else "a value to put has no bytes")
        elif local in client.ids:
            body["error"] = f"task {local} of this client's exists already"
        if "error" in body:
            self._send(ident, P.PLACE_REPLY, body)
            return
        task = Task(self._graph.new_id(), client.ident, local, {}, 0, 0, f"put-{local}",
                    False, [], (), owner=client.owner)
        self._graph.add(task)
        client.ids[local] = task.id
        self._graph.set_state(task, TaskState.QUEUED)
        self._graph.set_state(task, TaskState.RUNNING)  # (uploading)
        holder = self._objects.place(task, size)
        if holder is None:
            self._graph.fail(task, "ZresError", "no agent with a data port is connected")
            # (one may be: agents join, and come back to a restarted broker: it asks again)
            body.update(error="no agent with a data port is connected to keep it", wait=True)
        else:
            self._keeper.new(task, [], put=(holder.agent, size))
            body.update(id=task.id, token=self._objects.put_token(task, size),
                        at=[holder.agent, holder.address, holder.key])
            # (once written: a broker killed before would not know the task the value
            # went up for, and its agent would free it as nobody's)
            self._placed.append((ident, body))
            return
        self._send(ident, P.PLACE_REPLY, body)

    def on_locate(self, ident: bytes, msg: P.Message, now: float) -> None:
        """Where the results of these tasks of the client's are now (a holder it fetched
        from is gone): a reference, ``pending`` (it runs again), or why it is lost."""
        client = self.client(ident, now)
        if client is None:
            return
        refs: dict[int, Any] = {}
        lost: dict[int, str] = {}
        pending: list[int] = []
        for local in P.field(msg, "ids", list)[:10_000]:
            task = self._graph.get(client.ids.get(local, -1))
            if task is None:
                lost[local] = "the broker no longer has it (released, or lost in a restart)"
            elif why := gone_why(task, task.id):  # (lost for good, or made again and failed)
                lost[local] = why
            elif task.state is TaskState.DONE and task.size:
                ref = self._refer(task)
                if ref is None:
                    pending.append(local)  # (its holder is away: it may come back)
                else:
                    refs[local] = ref
            else:
                pending.append(local)
        self._send(ident, P.LOCATE_REPLY, {"req": msg.body.get("req"), "refs": refs,
                                           "lost": lost, "pending": pending})

    def flush(self) -> None:
        """Send the turn's results, then the news of what began. A task that began and
        ended within the turn is told its result alone (it says both): its client waits
        for the result, and a message less is a hop less on a short task's way."""
        if self._placed and (self._store is None or self._store.error is None):
            for ident, body in self._placed:
                self._send(ident, P.PLACE_REPLY, body)
            self._placed.clear()
        for ident, local in self.early.told.values():  # (their ends were taken in with
            self._running.discard(ident, {local})      # the message that told)
        self.early.told.clear()
        for ident in self._running.peers():
            self._running.discard(ident, self._results.keys_of(ident))
        self._results.flush(self.acks.fields)  # (acknowledgements ride with results)
        self._running.flush()
