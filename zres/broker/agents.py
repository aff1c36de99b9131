"""The agents the broker knows: their registrations, slots and heartbeats.

Each agent offers one or more slots; each slot is a slot of the scheduler, added when the
agent registers and removed when it is lost. What happens to the work on a lost agent is
the dispatcher's business (``dispatch.Dispatcher.lose_agent``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import ProtocolError
from ..core.limits import MAX_DEVICES, Limits, check_count, check_name, check_units
from ..core.resources import GPU, UNIT, Units, format_units
from ..logs import get_logger
from ..scheduler.policy import Scheduler
from ..scheduler.table import NewSlot

if TYPE_CHECKING:
    from .store import Store

log = get_logger("zres.broker")
_ENDED_KEPT = 10_000  # routing ids of lost agents remembered, to tell them so
_BINDINGS_KEPT = 10_000  # agent names bound to keys, the newest kept


@dataclass(slots=True)
class Registration:
    """What a REGISTER message offers, checked."""

    name: str
    host: str
    pid: int
    units: list[Units]               # per slot
    gpus: list[list[str]]            # device ids per slot
    memory: list[list[int]]          # device memory per slot (units), or empty
    session: int                     # the agent's record here, kept across reconnections
    resume: bool                     # a reconnection of a live session
    sent_at: float | None            # when the agent sent it (its clock): its lease's start

    def spec(self) -> list[Any]:
        """What must match for a second registration to be a repeat of the first."""
        return [self.units, self.gpus, self.memory]


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
    session: int = 0
    seq: int = 0                     # the last of its reports taken in
    acked: int = 0                   # the last seq acknowledged to it
    # The last of its reports whose news is written in the state store (acknowledged only
    # up to here: an agent goes ahead on an ack, and what it did not keep is not lost).
    kept: int = 0
    echo: float | None = None        # t of its latest heartbeat, echoed: its lease
    fd: int = -1                     # the connection it last spoke over
    away: bool = False               # that connection closed: no new work till heard from
    draining: bool = False           # it is leaving: no new work
    # A resumption in progress: its number (the HOLDING answering it names it), and what
    # had been sent to the agent before its welcome. Only that can have been lost with the
    # old connection: what went after the welcome follows it on the new one.
    resumes: int = 0
    sent_before_resume: set[int] | None = None
    # Its data port (issue 29): where it serves the objects it holds, and its CURVE key
    # ("": none); and what its store held when it last said.
    data_address: str = ""
    data_key: str = ""
    store: dict[str, int] | None = None
    # Its memory, as its heartbeat says (issue 30): how limits are enforced there, what its
    # node has available, its reserve, whether it is low; and by id, the current and peak
    # bytes of what runs there in a process of its own (tasks, jobs, actors' placements).
    memory: dict[str, Any] | None = None
    tasks_memory: dict[int, tuple[int, int]] = field(default_factory=dict)
    # The key it registered with ("role:name", and its public key; "" without keys): its
    # session ends when that key is revoked.
    key: str = ""
    public: str = ""
    # The session its name had before this one (kept across the broker's restarts): an
    # agent that carries that session's work offers all of it (``adoption``).
    previous: int | None = None


def parse_registration(msg: P.Message, limits: Limits) -> Registration:
    """Check every field of a REGISTER before anything is touched: a bad frame changes
    nothing, one over a limit is refused."""
    name = check_name(P.field(msg, "name", str), limits, "register: the agent's name")
    slots = P.field(msg, "slots", list)
    check_count(len(slots), limits.slots, "register: slots", "max_slots")
    host, pid = msg.body.get("host", ""), msg.body.get("pid", 0)
    if not slots or not all(isinstance(s, dict) for s in slots):
        raise ProtocolError("register: slots must be a non-empty array of maps")
    if not isinstance(host, str) or type(pid) is not int:
        raise ProtocolError("register: host must be a string and pid an int")
    session, sent_at = msg.body.get("session", 0), msg.body.get("t")
    if type(session) is not int or not isinstance(sent_at, (float, type(None))):
        raise ProtocolError("register: session must be an int and t a float")
    units = [check_units(s.get("units"), limits, "register") for s in slots]
    gpus = [[str(g) for g in s.get("gpus", [])] for s in slots]
    memory = [_int_list(s.get("gpu_memory", []), "register") for s in slots]
    for slot_units, slot_gpus, slot_memory in zip(units, gpus, memory):
        usable = slot_units.get(GPU, 0)
        # GPU is how many devices may take work; gpus lists every device the agent has.
        if usable % UNIT or usable // UNIT > len(slot_gpus) or len(slot_gpus) > MAX_DEVICES \
                or len(slot_memory) not in (0, len(slot_gpus)):
            raise ProtocolError("register: GPU amount, device ids and device memory "
                                "do not agree")
    return Registration(name, host, pid, units, gpus, memory, session,
                        bool(msg.body.get("resume")), sent_at)


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ProtocolError(f"{what}: expected a list of non-negative ints")
    return value


class AgentRegistry:
    """Registered agents by routing id, and which agent owns each scheduler slot.

    Nothing done per message or per loop turn walks every agent (a broker has thousands):
    agents are also indexed by name, by connection, by when they were last heard (the
    silent ones first) and by whether they have reports to acknowledge; what is kept on
    disk (lost agents, name bindings) is handed to the store as the live mapping, written
    once per commit however many changed."""

    def __init__(self, sched: Scheduler, timeout: float,
                 ended: list[list[Any]] | dict[bytes, str] | None = None,
                 keep_ended: Callable[[OrderedDict[bytes, str]], None] = lambda ended: None,
                 bindings: dict[str, str] | None = None,
                 keep_bindings: Callable[[dict[str, str]], None] = lambda keys: None,
                 sessions: dict[str, int] | None = None,
                 keep_sessions: Callable[[dict[str, int]], None] = lambda s: None) -> None:
        self.sched = sched
        self.timeout = timeout
        self.by_ident: dict[bytes, AgentRecord] = {}
        self.by_name: dict[str, AgentRecord] = {}   # (names are one agent's at a time)
        # The same agents by session: an agent's heartbeats also come from a socket of
        # their own (its heartbeat thread), which names the session it beats for.
        self.by_session: dict[int, AgentRecord] = {}
        self.slot_owner: dict[int, AgentRecord] = {}
        # Routing ids by when they were last heard, the longest silent first (``alive``
        # moves one to the end): the silent are found without walking the others.
        self._by_seen: OrderedDict[bytes, AgentRecord] = OrderedDict()
        # Routing ids by the connection they were last heard over.
        self._by_fd: dict[int, dict[bytes, None]] = {}
        # Agents with reports taken in and not yet kept on disk (``took``, ``written``).
        self._unkept: dict[bytes, AgentRecord] = {}
        self.removed = 0  # agents removed so far: what may have made tasks infeasible
        # Lost agents' ids: why. Kept across the broker's restarts (KEEP_ENDED(mapping)
        # writes them): an agent declared lost before a restart must not have its work
        # taken back after it, for its resources went elsewhere. (Kept as a map; a list of
        # [id, why] pairs is what earlier versions kept.)
        pairs = ended.items() if isinstance(ended, dict) else ended or []
        self.ended: OrderedDict[bytes, str] = OrderedDict(
            (bytes(i), str(why)) for i, why in pairs)
        self._keep_ended = keep_ended
        self._next_slot = 0
        # With keys: each agent name's key ("role:name"), bound by its first registration,
        # and kept across the broker's restarts (KEEP_BINDINGS writes them): a restarted
        # broker must not let another key take a name first.
        self.name_keys: dict[str, str] = dict(bindings or {})
        self._keep_bindings = keep_bindings
        # Each agent name's session, kept across the broker's restarts (KEEP_SESSIONS
        # writes them, with the grants made to it): a restarted broker tells an agent that
        # carries its old session's work from one that began anew.
        self.sessions: dict[str, int] = {str(n): s for n, s in (
            sessions.items() if isinstance(sessions, dict) else ()) if type(s) is int}
        self._keep_sessions = keep_sessions

    @classmethod
    def kept(cls, sched: Scheduler, timeout: float, store: Store | None) -> AgentRegistry:
        """An AgentRegistry whose lost agents, name bindings and sessions STORE keeps
        across the broker's restarts (None: nothing is kept)."""
        if store is None:
            return cls(sched, timeout)
        return cls(sched, timeout, ended=store.meta("ended_agents"),
                   keep_ended=lambda ended: store.set_meta("ended_agents", ended),
                   bindings=store.meta("agent_keys"),
                   keep_bindings=lambda keys: store.set_meta("agent_keys", keys),
                   sessions=store.meta("agent_sessions"),
                   keep_sessions=lambda sessions: store.set_meta("agent_sessions", sessions))

    def __len__(self) -> int:
        return len(self.by_ident)

    def bind(self, name: str, key: str) -> None:
        """Bind the agent name NAME to KEY ("role:name"), for good (the names registered
        longest ago are forgotten past ``_BINDINGS_KEPT``: names like host-pid come and
        go; a node's own key needs none, see ``AgentLink``)."""
        changed = self.name_keys.pop(name, None) != key
        self.name_keys[name] = key  # (last: registered most recently)
        while len(self.name_keys) > _BINDINGS_KEPT:
            del self.name_keys[next(iter(self.name_keys))]
        if changed:
            self._keep_bindings(self.name_keys)  # (written at the next commit)

    def get(self, ident: bytes) -> AgentRecord | None:
        return self.by_ident.get(ident)

    def named(self, name: str) -> AgentRecord | None:
        return self.by_name.get(name)

    def seen(self, ident: bytes, now: float) -> AgentRecord | None:
        """Return the agent IDENT and note it is alive, or None if it is unknown."""
        agent = self.by_ident.get(ident)
        if agent is not None:
            self.alive(agent, now)
        return agent

    def alive(self, agent: AgentRecord, now: float) -> None:
        """AGENT was heard from at NOW (its connection, or its heartbeat thread's)."""
        agent.last_seen = now
        self._by_seen.move_to_end(agent.ident)

    def took(self, agent: AgentRecord, seq: int) -> None:
        """AGENT's report SEQ is taken in: acknowledged once the store has it."""
        agent.seq = seq
        self._unkept[agent.ident] = agent

    def is_repeat(self, ident: bytes, reg: Registration) -> bool:
        """Whether REG repeats IDENT's registration (it crossed our welcome)."""
        known = self.by_ident.get(ident)
        return known is not None and known.session == reg.session and known.name == reg.name

    def heard(self, agent: AgentRecord, fd: int) -> bool:
        """AGENT spoke over connection FD; return whether it was away (it is back)."""
        if agent.fd != fd:
            self._unlink_fd(agent)
            agent.fd = fd
            if fd >= 0:
                self._by_fd.setdefault(fd, {})[agent.ident] = None
        if not agent.away:
            return False
        agent.away = False
        return True

    def disconnected(self, fd: int) -> list[AgentRecord]:
        """Connection FD closed: the agents last heard over it are away (if one has since
        reconnected over a reused descriptor, its next message brings it back)."""
        idents = self._by_fd.pop(fd, {})
        away = [a for a in map(self.by_ident.get, idents)
                if a is not None and a.fd == fd and not a.away]
        for agent in away:
            agent.away = True
        return away

    def accepts_work(self, agent: AgentRecord) -> bool:
        return not (agent.away or agent.draining)

    def displaced_by(self, ident: bytes, name: str) -> list[AgentRecord]:
        """The records a registration of NAME from IDENT replaces: IDENT's own, and any
        other agent's of the same name."""
        own, named = self.by_ident.get(ident), self.by_name.get(name)
        return [r for r in (own, named if named is not own else None) if r is not None]

    def add(self, ident: bytes, reg: Registration, now: float) -> AgentRecord:
        """Record the agent and give each of its slots to the scheduler."""
        new = []
        for slot_units, slot_gpus, slot_memory in zip(reg.units, reg.gpus, reg.memory):
            self._next_slot += 1
            new.append(NewSlot(self._next_slot, reg.name, slot_units, slot_memory,
                               len(slot_gpus)))
        self.sched.add_slots(new)
        slot_ids = [slot.id for slot in new]
        record = AgentRecord(ident, reg.name, reg.host, reg.pid, now, slot_ids, reg.gpus,
                             reg.spec(), reg.session, echo=reg.sent_at,
                             previous=self.sessions.pop(reg.name, None))
        self.sessions[reg.name] = reg.session  # (last: registered most recently)
        while len(self.sessions) > _BINDINGS_KEPT:
            del self.sessions[next(iter(self.sessions))]
        self._keep_sessions(self.sessions)
        if self.ended.pop(ident, None) is not None:
            self._keep_ended(self.ended)
        self.by_ident[ident] = record
        self.by_name[record.name] = record
        self.by_session[record.session] = record
        self._by_seen[ident] = record
        for slot_id in slot_ids:
            self.slot_owner[slot_id] = record
        log.info("agent_joined", agent=reg.name, slots=[format_units(u) for u in reg.units])
        return record

    def remove(self, agent: AgentRecord, why: str) -> None:
        """Forget AGENT, remembering WHY for its late messages (its scheduler slots are
        removed by whoever handles its work)."""
        del self.by_ident[agent.ident]
        if self.by_name.get(agent.name) is agent:
            del self.by_name[agent.name]
        if self.by_session.get(agent.session) is agent:
            del self.by_session[agent.session]
        del self._by_seen[agent.ident]
        self._unkept.pop(agent.ident, None)
        self._unlink_fd(agent)
        for slot_id in agent.slots:
            del self.slot_owner[slot_id]
        self.removed += 1
        if self.sessions.get(agent.name) == agent.session:  # (its work went with it)
            del self.sessions[agent.name]
            self._keep_sessions(self.sessions)
        self.ended[agent.ident] = why
        while len(self.ended) > _ENDED_KEPT:
            self.ended.popitem(last=False)
        self._keep_ended(self.ended)

    def _unlink_fd(self, agent: AgentRecord) -> None:
        idents = self._by_fd.get(agent.fd)
        if idents is not None:
            idents.pop(agent.ident, None)
            if not idents:
                del self._by_fd[agent.fd]

    def forgive(self, gap: float) -> None:
        """The broker itself did not listen for GAP seconds (stopped, or stalled): nobody
        is to be found silent for that."""
        for agent in self.by_ident.values():
            agent.last_seen += gap

    def silent(self, now: float) -> list[AgentRecord]:
        """The agents not heard from for longer than the heartbeat timeout (those heard
        from since are not looked at). (Right after a stall is forgiven, an agent heard
        since may wait behind some forgiven into the future: it is found once they are
        heard again, within an interval.)"""
        found = []
        for agent in self._by_seen.values():
            if now - agent.last_seen <= self.timeout:
                break
            found.append(agent)
        return found

    def set_capacity(self, agent: AgentRecord, changes: Units) -> None:
        """Set the amounts named in CHANGES on every slot of AGENT (0 removes a name);
        raise ValueError, changing nothing, if any slot refuses."""
        new = [{n: a for n, a in {**self.sched.slots[s].total, **changes}.items() if a}
               for s in agent.slots]
        for slot_id, units in zip(agent.slots, new):  # all slots or none
            self.sched.check_capacity(slot_id, units)
        for slot_id, units in zip(agent.slots, new):
            self.sched.set_capacity(slot_id, units)
        log.info("agent_resources_changed", agent=agent.name,
                 slots=[format_units(u) for u in self.capacity(agent)])

    def capacity(self, agent: AgentRecord) -> list[Units]:
        """AGENT's total amounts per slot."""
        return [self.sched.slots[s].total for s in agent.slots]

    def written(self) -> None:
        """The state store has everything taken in so far: it may all be acknowledged."""
        for agent in self._unkept.values():
            agent.kept = agent.seq
        self._unkept.clear()
