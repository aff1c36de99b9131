"""Who each message acts as, and whether it may do what it asks.

With keys, every message comes stamped with its connection's key (``auth``). What it
acts as:
- a client session's message acts as that session: its owner and powers, fixed by its
  hello; only the key that said hello with that routing id may speak for it;
- a hello (or a one-off request, ``zres jobs`` say) with a valid *task token* acts as the
  task's owner with a client's powers, whatever key the connection has (an agent's, an
  admin's): a client made inside a task, or a command run by a job;
- anything else acts as its connection's key.
A request about one job or actor (cancel, logs, kill) is then allowed to its owner and to
admin keys only; an actor's calls are checked where they are queued (``actors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.tasks import FINISHED
from ..logs import get_logger
from .actors import ActorRouting
from .auth import OWNED, Forbidden, Gate
from .clients import ClientRegistry
from .graph import TaskGraph
from .jobs import JobTable

log = get_logger("zres.broker")


class Identities:
    """The acting identity of the message handled (``acting``: role and owner name), and
    the checks it must pass."""

    def __init__(self, gate: Gate, clients: ClientRegistry, graph: TaskGraph,
                 jobs: JobTable, actors: ActorRouting) -> None:
        self._gate = gate
        self._clients = clients
        self._graph = graph
        self._jobs = jobs
        self._actors = actors
        self.acting: tuple[str, str] = ("", "")     # role, owner ("" and "" without keys)
        self.conn: tuple[str, str, str] = ("", "", "")  # the connection's role, name, key

    def check(self, frame: Any, ident: bytes, msg: P.Message) -> None:
        """Find who MSG (whose first frame is FRAME, from routing id IDENT) acts as, and
        raise Forbidden unless it may send it."""
        role, name, public = self.conn = self._gate.sender(frame)
        self.acting = ("", "")
        if role and not self._gate.current(public):
            raise Forbidden(f"its key {role}:{name} was revoked (it is no longer in the "
                            "broker's keys directory)")
        self.acting = self._acting(ident, role, name, public, msg)
        self.may(*self.acting, msg)

    def _acting(self, ident: bytes, role: str, name: str, public: str,
                msg: P.Message) -> tuple[str, str]:
        client = self._clients.get(ident)
        if client is not None and client.public:  # a session, bound to its key
            if client.public != public:
                log.warning("routing_id_taken", client=client.name, owner=client.owner,
                            key=f"{role}:{name}")
                # What goes to that routing id now reaches this other connection: nothing
                # more does until the session's own key is heard again.
                client.away = True
                raise Forbidden("this routing id is another key's client session: use a "
                                "socket of your own (a routing id of its own)")
            if msg.kind != P.HELLO:
                return client.role, client.owner
        acting = (role, name)
        token = msg.body.get("token")
        if token and msg.kind in _CLIENT_KINDS:  # ("": none)
            acting = ("client", self.token_owner(token))
        if client is not None and not client.public and client.owner != acting[1]:
            # Restored from a previous life's state: only its owner may take it back.
            raise Forbidden(f"this routing id is that of a client of {client.owner or 'no key'}"
                            f" (restored after the broker restarted), not of {acting[1]}")
        return acting

    def token_owner(self, token: Any) -> str:
        """The owner of the task (or actor) TOKEN was given to, while it runs (lives);
        raise Forbidden if it is not one of this broker's, or has ended."""
        subject = self._gate.subject(token)
        if subject is None:
            raise Forbidden("its task token is not one this broker gave (a client made in a "
                            "task of another cluster?)")
        of, _, owner = subject[1:].partition(":")  # (the owner, named for the client's sake)
        if subject[0] == "a":
            actor = self._actors.actors.get(of)
            if actor is None:
                raise Forbidden(f"the actor it was made in ({of[:8]}) has ended")
            return actor.key
        task_id = int(of)
        job = self._jobs.active.get(task_id) or self._jobs.adopting.get(task_id)
        if job is not None:
            return job.owner
        task = self._graph.get(task_id)
        if task is None or task.state in FINISHED:
            raise Forbidden(f"the task it was made in (task {task_id}) has ended")
        return task.owner

    def may(self, role: str, name: str, msg: P.Message) -> None:
        """Raise Forbidden unless ROLE:NAME may send MSG."""
        why = self._gate.refuses(role, msg.kind)
        if why is None and msg.kind in OWNED and role != "admin":
            owned = self._owned(msg)
            if owned is not None and owned[1] != name:
                what, owner = owned
                who = f"only {owner} or an admin key" if owner else "only an admin key"
                why = (f"{what} belongs to {owner or 'no key'}: {who} may "
                       f"{OWNED[msg.kind]} it")
        if why is not None:
            log.warning("message_forbidden", key=f"{role}:{name}", kind=msg.kind)
            raise Forbidden(why)

    def _owned(self, msg: P.Message) -> tuple[str, str] | None:
        """What MSG is about, and its owner (None: no such job or actor)."""
        if msg.kind == P.KILL:
            actor = self._actors.actors.get(str(msg.body.get("actor")))
            return (actor.label(), actor.key) if actor is not None else None
        if msg.kind == P.TASK_CANCEL:
            task_id = msg.body.get("task")
            task = self._graph.get(task_id) if type(task_id) is int else None
            job = self._jobs.get(task_id) if type(task_id) is int else None
            if task is not None:
                return f"task {task_id} ({task.name})", task.owner
            return (f"task {task_id} ({job.name})", job.owner) if job is not None else None
        job_id = msg.body.get("job")
        job = self._jobs.get(job_id) if type(job_id) is int else None
        return (f"job {job_id}", job.owner) if job is not None else None

    def revoke(self, send: Any, agents: Any, lose: Callable[[Any, str], None]) -> None:
        """End the sessions of keys no longer in the keys directory: clients are dropped
        (their work as if they had left), AGENTS lost (LOSE); each is told why (SEND)."""
        for client in self._clients.all():
            if client.public and not self._gate.current(client.public):
                why = f"its key {client.key} was revoked (removed from the broker's keys)"
                send(client.ident, P.REFUSED, {"kind": P.HELLO, "error": why}, hold=False)
                self._clients.leave(client.ident, "client_revoked")
        for agent in list(agents.by_ident.values()):
            if agent.public and not self._gate.current(agent.public):
                why = f"its key {agent.key} was revoked (removed from the broker's keys)"
                send(agent.ident, P.UNKNOWN, {"refused": why})
                lose(agent, why)

    def sees_all(self, owner: str) -> bool:
        """Whether the message handled may see OWNER's private details (command lines):
        its owner's and admin keys' messages may (and, without keys, everyone's)."""
        return self.acting[0] == "admin" or self.acting[1] == owner


_CLIENT_KINDS = frozenset({P.HELLO, P.SUBMIT, P.RELEASE, P.CANCEL, P.WHY, P.RESUME,
                           P.STATUS, P.KILL, P.LOOKUP, P.JOBS, P.JOB_CANCEL, P.LOGS,
                           P.TASK_CANCEL, P.LOCATE, P.PLACE, P.GROUP})
