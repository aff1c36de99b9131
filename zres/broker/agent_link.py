"""The broker's side of the agent link: registrations and sessions, reports, and the
connection state of each agent.

An agent keeps one connection (one routing id) and one *session* for its life: a pause or
a reconnection resumes the session. Its reports are numbered; the broker takes each in
once and acknowledges them (``seq``). A message from a session the broker has ended (the
agent was declared lost) is answered ``unknown{ended}``: the agent stops that session's
work and registers anew.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core import versions
from ..core.errors import ProtocolError
from ..core.limits import Limits
from ..logs import get_logger
from .agents import AgentRecord, AgentRegistry, parse_registration
from .auth import Forbidden
from .dispatch import Dispatcher
from .outbox import Send

log = get_logger("zres.broker")
_BIG_REPORT = 1 << 20  # a report carrying this many bytes is acknowledged at once


class AgentLink:
    """Handle what agents send. WELCOME() gives the fields every welcome carries; FD()
    the connection the message being handled came over; ADOPT(agent, registration,
    frames) takes back the jobs a new session offers, returning those to stop."""

    def __init__(self, send: Send, agents: AgentRegistry, dispatch: Dispatcher,
                 limits: Limits, welcome: Callable[[], dict[str, Any]],
                 fd: Callable[[], int],
                 adopt: Callable[[AgentRecord, dict[str, Any], list[Any]], list[int]],
                 key: Callable[[], tuple[str, str, str]] = lambda: ("", "", ""),
                 keys: Callable[[], frozenset[str]] = frozenset,
                 relay: Callable[[str, Any, str], None] | None = None,
                 peer: Callable[[], str] = lambda: "") -> None:
        self._send = send
        # The key that sent the message handled: role, name, public key ("": none); and
        # every key in the broker's keys directory ("role:name").
        self._key = key
        self._keys = keys
        self._adopt = adopt
        self._agents = agents
        self._dispatch = dispatch
        self._limits = limits
        self._welcome = welcome
        self._fd = fd
        # The broker's relay, told where each agent's data port is (the register's data,
        # and the IP address its connection comes from: PEER()).
        self._relay, self._peer = relay, peer
        self.to_ack: set[bytes] = set()    # agents whose big reports need an ack now
        self._life: tuple[int, float] | None = None  # this broker's epoch, heartbeat

    def flush_acks(self) -> None:
        """Acknowledge the reports that need it now (unless an assign carried it), those
        the state store has (``AgentRegistry.written``): the rest wait for a later
        commit, and are acknowledged by the heartbeats' answers."""
        for ident in self.to_ack:
            agent = self._agents.get(ident)
            if agent is not None and agent.acked < agent.kept:
                agent.acked = agent.kept
                self._send(ident, P.ACK, {"ack": agent.kept})
        self.to_ack.clear()

    def on_register(self, ident: bytes, msg: P.Message, now: float) -> None:
        reg = parse_registration(msg, self._limits)
        versions.refuse_mismatch(msg.body.get("versions"), "agent")
        role, key_name, public = self._key()
        key = f"{role}:{key_name}" if role else ""
        if key:
            self._bind(reg.name, key)
        welcome = {**self._welcome(), "agent": reg.name, "session": reg.session}
        known = self._agents.get(ident)
        if reg.resume:
            if known is None or known.session != reg.session:
                # A restarted broker that keeps its state takes back the jobs of a session
                # it never knew (never one it ended: their resources went elsewhere).
                self._send(ident, P.UNKNOWN, {
                    "ended": self._agents.ended.get(ident, "this broker does not know it"),
                    "session": reg.session, "cluster": welcome["cluster"],
                    "adopts": welcome["adopts"] and ident not in self._agents.ended})
                return
            self.agent(ident, now)
            known.resumes += 1
            known.sent_before_resume = self._dispatch.sent_to(known)
            self._send(ident, P.WELCOME, {**welcome, "resumed": known.resumes,
                                          "ack": known.kept})
            return
        if self._agents.is_repeat(ident, reg):
            # A repeated registration (it crossed our welcome): keep what runs there.
            self.agent(ident, now)
            self._send(ident, P.WELCOME, {**welcome, "ack": self._agents.by_ident[ident].kept})
            return
        displaced = self._agents.displaced_by(ident, reg.name)
        for record in displaced:
            if record.ident == ident:
                # A new session from the same agent: it has stopped the old one's work.
                self._dispatch.lose_agent(record, "it began a new session", recheck=False)
            else:
                # The newcomer wins (a restarted agent); the old one, if alive, is told to
                # stop rather than re-register and evict the newcomer in turn.
                self._send(record.ident, P.UNKNOWN, {"replaced": True})
                self._dispatch.lose_agent(record, "replaced by a new agent of the same name",
                                         recheck=False)
        record = self._agents.add(ident, reg, now)
        record.key, record.public = key, public
        self._agents.heard(record, self._fd())
        data = msg.body.get("data")
        if isinstance(data, dict) and isinstance(data.get("address"), str) \
                and isinstance(data.get("key", ""), str) and len(data["address"]) < 256:
            record.data_address, record.data_key = data["address"], data.get("key", "")
            if self._relay is not None:
                self._relay(reg.name, data, self._peer())
        # What it holds from before (a broker restarted on its state restored where results
        # were): what it no longer has is lost there.
        self._dispatch.objects_offered(record, msg.body.get("objects", []))
        # Jobs it kept running while a previous broker of this cluster went: taken back
        # before anything else can be granted their resources, or stopped.
        stop = self._adopt(record, msg.body, msg.frames)
        self._send(ident, P.WELCOME, welcome)
        if stop:
            self._send(ident, P.CANCEL, {"ids": stop})
        # With no agent, nothing was infeasible; the first one to join decides what is.
        # (What the records it displaced offered is judged once the turn's messages are
        # handled, with every other agent lost meanwhile: ``Broker.settle``.)
        if len(self._agents) == 1:
            self._dispatch.recheck_feasibility()

    def _bind(self, name: str, key: str) -> None:
        """Bind the agent name NAME to KEY, or raise Forbidden if it is another's: the
        node's own key's (agent-NAME), if there is one, else the key it was first bound to
        (unless that key was revoked since)."""
        keys = self._keys()
        bound = self._agents.name_keys.get(name)
        own = f"agent:{name}"
        owner = own if own in keys else bound if bound in keys else None
        if owner is not None and owner != key:
            raise Forbidden(f"agent name {name!r} belongs to another key ({owner}); key "
                            f"{key} may not take it over")
        self._agents.bind(name, key)

    def agent(self, ident: bytes, now: float, quiet: bool = False,
              session: Any = None) -> AgentRecord | None:
        """The agent IDENT, noted alive (and back, if it was away); None, having told the
        sender so (unless QUIET; about its SESSION), if it is not a registered agent."""
        agent = self._agents.seen(ident, now)
        if agent is None:
            if not quiet:
                self._send(ident, P.UNKNOWN, self.unknown_body(ident, session))
        elif self._agents.heard(agent, self._fd()):
            log.info("agent_back", agent=agent.name)
            self._dispatch.set_accepting(agent)
        return agent

    def beat(self, agent: AgentRecord, body: dict[str, Any]) -> None:
        """What AGENT's heartbeat says of it: what its object store holds, and its memory
        (how limits are enforced there, what its node has available, and the memory of
        each thing of its that runs in a process of its own: see zres.agent.memory)."""
        store = body.get("store")
        if isinstance(store, dict):
            agent.store = {k: v for k, v in store.items()
                           if isinstance(k, str) and type(v) is int}
        memory = body.get("memory")
        if isinstance(memory, dict):
            tasks = memory.get("tasks")
            agent.memory = {k: v for k, v in memory.items() if k != "tasks"
                            and isinstance(k, str) and isinstance(v, (str, int, bool))}
            agent.tasks_memory = {t[0]: (t[1], t[2]) for t in tasks if isinstance(t, list)
                                  and len(t) == 3 and all(type(v) is int for v in t)} \
                if isinstance(tasks, list) else {}

    def on_side_beat(self, ident: bytes, msg: P.Message, now: float) -> bool:
        """A heartbeat from an agent's heartbeat thread (a socket of its own, IDENT, not
        the agent's): the agent is alive, and hears its lease's echo at once, whatever its
        loop is busy with. False if MSG names no session of a registered agent, or comes
        with another key than that agent's."""
        agent = self._agents.by_session.get(msg.body.get("session"))  # type: ignore[arg-type]
        if agent is None or agent.ident == ident:
            return False
        role, name, _ = self._key()
        if agent.key != (f"{role}:{name}" if role else ""):
            return False
        self._agents.alive(agent, now)
        sent = msg.body.get("t")
        if isinstance(sent, float):
            agent.echo = sent
        self._send(ident, P.HEARTBEAT, {"epoch": self._welcome()["epoch"], "echo": sent,
                                        "session": agent.session})
        return True

    def unknown_body(self, ident: bytes, session: Any = None) -> dict[str, Any]:
        """What to tell IDENT, which is not a registered agent, of its SESSION: the
        session named, so an agent that has begun a new one does not stop that too."""
        why = self._agents.ended.get(ident)
        if why is None:
            return {}
        return {"ended": why, "session": session} if type(session) is int else {"ended": why}

    def _session_agent(self, ident: bytes, msg: P.Message,
                       now: float) -> AgentRecord | None:
        """The agent IDENT if MSG is of its current session (else None, sender told)."""
        agent = self.agent(ident, now, session=msg.body.get("session"))
        if agent is not None and msg.body.get("session") != agent.session:
            self._send(ident, P.UNKNOWN, {"ended": "that session is over",
                                          "session": msg.body.get("session")})
            return None
        return agent

    def on_report(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self._session_agent(ident, msg, now)
        if agent is None:
            return
        seq = P.field(msg, "seq", int)
        if seq != agent.seq + 1:
            # At or below: sent again after a reconnection, taken in already. Above: one
            # before it was lost with a connection; the agent sends every report not
            # acknowledged, in order, once its resumption is welcomed.
            return
        results = msg.body.get("results", [])
        if not isinstance(results, list) or not all(
                isinstance(i, list) and len(i) == 4 for i in results):
            raise ProtocolError("report: each result must be a 4-item array")
        payloads = P.split_frames(msg.frames, [i[2] for i in results])
        self._agents.took(agent, seq)
        if msg.body.get("held"):  # (of its direct grants: no news, see dispatch)
            msg.body["held"] = self._dispatch.heard(agent, msg.body["held"])
        self._dispatch.report(agent, msg.body, payloads, now)
        if msg.body.get("held") or sum(len(P.buffer(f)) for f in msg.frames) >= _BIG_REPORT:
            # Its hand-offs wait for this (held: a queued grant, a job, an actor's call),
            # or it keeps what it sent until acknowledged (big): acknowledged once the
            # state is kept (a job it may now start is recorded as held there), by the
            # commit that ends this turn's messages: one for all the agents' reports (a
            # commit each took a fifth of the loop's time at 1,000 agents).
            self.to_ack.add(ident)

    def on_direct_done(self, ident: bytes, msg: P.Message, now: float) -> None:
        """Results a worker process sent straight here (on a socket of its own, with its
        agent's key), besides its agent's copy: taken for the grants they name if those
        are current (the agent's session, this broker's epoch, the task's attempt), else
        dropped (the agent's copy says what became of them, as before)."""
        agent = self._agents.by_session.get(msg.body.get("session"))  # type: ignore[arg-type]
        role, name, _ = self._key()
        if self._life is None:  # (fixed for the broker's life: not a welcome made a task)
            welcome = self._welcome()
            self._life = (welcome["epoch"], welcome["heartbeat"])
        epoch, heartbeat = self._life
        if agent is None or agent.key != (f"{role}:{name}" if role else "") \
                or msg.body.get("epoch") != epoch:
            return
        if now - agent.last_seen > 2 * heartbeat:
            # Its agent has not been heard for two heartbeats (stopped, hung?): taken, the
            # result would free a slot there, and grants the agent may never start would
            # follow; its agent's copy says the same, once it is heard again.
            return
        results = P.field(msg, "results", list)
        if not all(isinstance(i, list) and len(i) == 5 and type(i[2]) is int and i[2] >= 0
                   for i in results) or sum(i[2] for i in results) != len(msg.frames):
            raise ProtocolError("direct_done: each result must be [id, outcome, nframes, "
                                "info, attempt], their frames all there")
        self._dispatch.direct_results(agent, results, P.split_frames(msg.frames, [
            i[2] for i in results]), msg.body.get("started"), now)

    def on_holding(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self._session_agent(ident, msg, now)
        if agent is None or agent.sent_before_resume is None \
                or msg.body.get("resumed") != agent.resumes:
            return  # the answer to an earlier resumption: the latest one's comes later
        tasks = P.field(msg, "tasks", list)
        sent, agent.sent_before_resume = agent.sent_before_resume, None
        self._dispatch.reconcile(agent, {t for t in tasks if type(t) is int}, sent)

    def on_drain(self, ident: bytes, msg: P.Message, now: float) -> None:
        agent = self._session_agent(ident, msg, now)
        if agent is not None:
            agent.draining = True
            log.info("agent_draining", agent=agent.name)
            self._dispatch.set_accepting(agent)

    def on_resources(self, ident: bytes, msg: P.Message, now: float) -> None:
        """Change an agent's capacity (an admin's request), and tell the agent."""
        name = P.field(msg, "agent", str)
        changes = P.check_units(msg.body.get("units"), "resources")
        reply: dict[str, Any] = {"req": msg.body.get("req")}
        agent = self._agents.named(name)
        if agent is None:
            known = ", ".join(sorted(a.name for a in self._agents.by_ident.values())) or "none"
            self._send(ident, P.RESOURCES_REPLY,
                       {**reply, "error": f"no agent named {name!r} (agents: {known})"})
            return
        try:
            self._agents.set_capacity(agent, changes)
        except ValueError as exc:
            self._send(ident, P.RESOURCES_REPLY, {**reply, "error": f"agent {name}: {exc}"})
            return
        self._send(agent.ident, P.RESOURCES, {"slots": self._agents.capacity(agent)})
        self._send(ident, P.RESOURCES_REPLY, {**reply, "slots": self._agents.capacity(agent)})
        self._dispatch.capacity_changed()
