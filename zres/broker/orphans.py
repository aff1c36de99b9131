"""Work whose client is gone: stopped, unless detached; and stopping a task by its id.

A client is gone when it says goodbye (``close()``, the end of its program), when its
connection closes and it does not come back within ``client_grace`` seconds (5: a Ctrl-C'd
or killed process; a client that merely reconnects, after a network blip or a broker
restart, is back within a fraction of a second), or when it is silent past
``client_timeout`` (30: a stopped process, a cut network). Its unfinished tasks are then
stopped as a forced cancel stops them: what has not begun never runs, what runs is stopped
where it runs (an exception raised in its call, its worker process killed if it has not
ended two seconds later, a job's process group terminated), and its resources come back
once its agent says it is gone; meanwhile it is listed as running, its client gone. Its
unnamed actors end (``ActorRouting.drop_owned_by``), and so do its unnamed placement
groups (``gangs``). What it detached (``detached=True``, ``Client(detach=True)``,
detached jobs), and the tasks that work waits for, run on, listed with its owner and
``client gone``, and named actors live on, until their owner (or an admin) stops them
by id: ``task_cancel``, a one-off request (``zres cancel --task ID``).

A client restored after a broker restart has the reconnect window to come back; its tasks
run on meanwhile, and are stopped when it expires as any gone client's are. A task that
was being stopped when the broker went is not kept as its client's: its agent, offering
it back, is told to stop it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.limits import quote
from ..core.tasks import FINISHED, Task, TaskState, state_word
from ..logs import get_logger
from .actors import ActorRouting
from .clients import ClientRecord
from .dispatch import CancelOutcome, Dispatcher
from .graph import TaskGraph
from .jobs import JobTable
from .keeping import TaskKeeper
from .outbox import Send

log = get_logger("zres.broker")
_CHUNK = 5000  # a gone client's tasks stopped and let go of in one go


class Orphans:
    """What becomes of a gone client's work, and stopping one task by id."""

    def __init__(self, send: Send, graph: TaskGraph, dispatch: Callable[[], Dispatcher],
                 actors: ActorRouting, jobs: JobTable, keeper: TaskKeeper,
                 forget: Callable[[bytes], None],
                 later: Callable[[bytes, Callable[[], None]], None] | None = None,
                 groups: Any = None) -> None:
        self._send = send
        self._graph = graph
        self._dispatch = dispatch  # (made after this)
        self._actors = actors
        self._jobs = jobs
        self._keeper = keeper
        self._forget = forget  # what the client link keeps for a client, dropped
        # LATER(ident, work): go on at the loop's next round (see ``backlog``): a client
        # leaving a million tasks holds nobody up.
        self._later = later
        self._groups = groups  # placement groups: its unnamed ones go with it (``gangs``)

    def client_gone(self, client: ClientRecord, event: str) -> None:
        """CLIENT is gone (EVENT says how): stop what it leaves behind, but what it
        detached, which runs on, marked as its client gone."""
        self._forget(client.ident)
        self._actors.drop_owned_by(client.ident, client.name)
        if self._groups is not None:
            self._groups.drop_owned_by(client.ident, client.name)
        tasks = [t for t in map(self._graph.get, client.ids.values()) if t is not None]
        client.ids.clear()  # (nothing is told to it any more, nor kept as its)
        for task in tasks:
            if task.state not in FINISHED:
                self._graph.census.client_gone(task)
        for task in self._inputs_of_detached(tasks):
            task.detached = True  # (what detached work needs runs on with it)
        log.info(event, client=quote(client.name), tasks=len(tasks),
                 detached=sum(1 for t in tasks if t.detached and t.state not in FINISHED))
        self._let_go(client.ident, tasks)

    def _let_go(self, ident: bytes, tasks: list[Task]) -> None:
        """Stop and let go of TASKS of the gone client IDENT: a chunk now, the rest at the
        loop's next rounds."""
        chunk, rest = tasks[:_CHUNK], tasks[_CHUNK:]
        for task in chunk:
            self._stop(task)
        for task in chunk:
            self._graph.unhold(task)
            if self._graph.get(task.id) is task:  # (written: a restart keeps none of it
                self._keeper.changed(task)        # as this client's)
        if rest:
            if self._later is None:
                self._let_go(ident, rest)
            else:
                self._later(ident, lambda: self._let_go(ident, rest))

    def _inputs_of_detached(self, tasks: list[Task]) -> list[Task]:
        """The unfinished tasks the unfinished detached ones among TASKS wait for, also
        through others (a task's ``deps`` are held while it waits)."""
        found: dict[int, Task] = {}
        work = [t for t in tasks if t.detached and t.state not in FINISHED]
        while work:
            for dep_id in work.pop().deps:
                dep = self._graph.get(dep_id)
                if dep is not None and dep.state not in FINISHED and dep_id not in found:
                    found[dep_id] = dep
                    work.append(dep)
        return list(found.values())

    def _stop(self, task: Task) -> bool:
        """Stop TASK, whose client is gone, as a forced cancel does, unless it is detached
        or a named actor's construction (the actor lives until killed); return whether."""
        if task.state in FINISHED or task.stopping or task.detached \
                or self._jobs.detached(task) or task.creates in self._actors.actors:
            return False
        dispatch = self._dispatch()
        if task.held and task.state is TaskState.WAITING:
            # Restored after a restart, and its agent not back yet: ended now; should its
            # agent offer it, it is stopped there as work the broker does not have.
            dispatch.drop(task)
        else:
            dispatch.cancel(task, force=True)
        return True

    def on_task_cancel(self, ident: bytes, msg: P.Message, now: float) -> None:
        """Stop a task by its id wherever it is, as a forced cancel does: a one-off request
        (``zres cancel --task``), its owner's or an admin's (``identity`` checks)."""
        task_id = P.field(msg, "task", int)
        task = self._graph.get(task_id)
        body: dict[str, Any] = {"req": msg.body.get("req")}
        job = self._jobs.adopting.get(task_id)
        if job is not None:
            body["error"] = (f"task {task_id} waits for agent {job.agent or job.held_on} to "
                             "come back after the broker restarted; cancel it once it has")
        elif task is None:
            body["error"] = (f"no task {task_id} (it ended and nobody holds its result any "
                             "more, or there never was one)")
        elif task.state in FINISHED:
            body["error"] = f"task {task_id} ({task.name}) has already ended: {state_word(task)}"
        elif task.held and task.state is TaskState.WAITING:  # restored: its agent not back
            self._dispatch().drop(task)  # (stopped there as unknown work, if it offers it)
        elif not task.stopping and self._dispatch().cancel(task, force=True) \
                is CancelOutcome.GOES_ON:
            body["error"] = (f"task {task_id} ({task.name}) is a call its actor is running: "
                             "a call cannot be stopped alone (kill the actor)"
                             if task.actor else f"task {task_id} ({task.name}) cannot be "
                             "stopped now")
        if "error" not in body and task is not None:
            body.update(name=task.name,
                        state="stopping" if task.state is TaskState.RUNNING else "cancelled")
        self._send(ident, P.TASK_CANCEL_REPLY, body)
