"""The broker's side of command jobs: the job table, and the jobs/cancel/logs requests.

A job is a task (its id is the task's id) with a record that outlives the task: who ran
it, where, on which GPUs, when, and its exit code, so ``zres jobs --all`` can show
finished jobs and ``zres logs`` can find the agent that holds a job's log (for its
``job_log_retention`` after the job ended: told the job's end, the agent says whether that
is why a log is gone). It remembers the last ``_FINISHED_KEPT`` finished jobs.

Every job records its owner (the key name that submitted it, detached or not). Its command
line, working directory and environment (which may hold a token) are shown only to that
owner and admin keys; others see its name, owner, state, resources and agent. What
``zres wait`` has reported is its owner's: nobody else's wait changes it.

Why a job ended is in ``reason`` (``job_records``): its own words for its owner and admin
keys, words that quote nothing of it for everyone else.

A ``jobs`` request for some jobs may wait for their ends (``wait``: ``job_waits``), so
``zres wait`` is answered as they end rather than looking again and again.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..core.resources import Units
from ..core.tasks import FINISHED, Task, TaskState
from .agents import AgentRegistry
from .clients import ClientRegistry
from .graph import TaskGraph
from .job_envs import JobEnvs
from .job_records import FAILED_STATES, PUBLIC_FIELDS, STORED, JobRecord, ended_reason
from .job_waits import MAX_WAIT, PENDING, JobWaits, Wait
from .outbox import Send
from .store import Store

_LOG_ANSWER_WITHIN = 5.0  # seconds an agent has to send a log asked of it, at most
_FINISHED_KEPT = 10_000  # finished jobs remembered for `zres jobs --all` and `zres logs`
class JobTable:
    """The job table, and the requests about jobs.

    It reads tasks from GRAPH and agents from AGENTS, maps a client's task ids through
    CLIENTS, explains a waiting job with WHY and INFEASIBLE, and stops one with CANCEL;
    SENDER() says who the request handled acts as (role, owner).
    """

    def __init__(self, send: Send, graph: TaskGraph, clients: ClientRegistry,
                 agents: AgentRegistry, why: Callable[[Task], str],
                 infeasible: Callable[[Units], str | None],
                 cancel: Callable[[Task], None], store: Store | None = None,
                 sender: Callable[[], tuple[str, str]] = lambda: ("", "")) -> None:
        self._send = send
        self._sender = sender
        self._graph = graph
        self._clients = clients
        self._agents = agents
        self._why = why
        self._infeasible = infeasible
        self._cancel = cancel
        self._store = store
        self.envs = JobEnvs(store)
        self.active: dict[int, JobRecord] = {}
        # Running when the broker restarted: back once its agent offers it (adoption).
        self.adopting: dict[int, JobRecord] = {}
        self.done: OrderedDict[int, JobRecord] = OrderedDict()
        self._tokens = itertools.count(1)
        # Logs asked of agents, by token: the asker, its req, the job, whether it had
        # finished, the agent asked and when (see _unanswered_logs).
        self._log_requests: dict[int, tuple[bytes, Any, int, bool, str, float]] = {}
        self.waits = JobWaits(self._answer_wait)  # (requests waiting for jobs to end)
        self._removed = 0  # (agents removed when the waits were last looked at)

    def get(self, job_id: int) -> JobRecord | None:
        return self.active.get(job_id) or self.adopting.get(job_id) or self.done.get(job_id)

    def add(self, task: Task, spec: dict[str, Any]) -> None:
        """Make TASK a command job described by SPEC (checked by ``check_job_spec``)."""
        job = self.active[task.id] = JobRecord(
            task.id, task.name, spec["argv"], dict(task.units), spec["detached"], time.time(),
            {"argv": spec["argv"], "env": spec["env"], "cwd": spec["cwd"]},
            priority=task.priority, strict=task.strict, retries=task.retries,
            nodes=spec.get("nodes", 1))
        job.owner = task.owner
        job.export, job.export_key = self.envs.take(spec["export"])
        job.exported = len(job.export)
        client = self._clients.get(task.client)
        if client is not None:  # (a detached job's too: see JobRecord.client)
            job.client, job.local = client.ident, task.local_id
        self._keep(job)

    def keep(self, job: JobRecord) -> None:
        """Write JOB to the state store at the end of this loop turn."""
        self._keep(job)

    def _keep(self, job: JobRecord) -> None:
        """Write JOB to the state store at the end of this loop turn."""
        if self._store is not None:
            self._store.put_job(job.record())

    def _ended(self, job: JobRecord) -> None:
        """JOB will not run again: it lets go of its exported environment (and the waits
        on it are looked at again at the end of the turn, its end recorded by then)."""
        job.finished, job.held_on = time.time(), ""
        self.waits.ended(job.id)
        if job.export_key:
            self.envs.release(job.export_key)
        job.export, job.export_key = {}, ""

    def restore(self, records: list[dict[str, Any]]) -> list[JobRecord]:
        """Take back the jobs a previous life of this broker kept; return those to queue
        again. One that was running waits for its agent to offer it back (``adopting``);
        a queued one of a client it does not know (kept by an older version) has nobody
        to report to."""
        again: list[JobRecord] = []
        names = {f.name for f in STORED}
        envs = self._store.envs() if self._store is not None else {}
        for record in records:
            try:
                job = JobRecord(**{k: v for k, v in record.items() if k != "export"})
            except TypeError:  # kept by another version: the fields both know
                job = JobRecord(**{k: v for k, v in record.items() if k in names})
            if job.export_key and job.finished is None:
                job.export = self.envs.restored(job.export_key, envs) or {}
            if job.state == "queued" and not job.detached and not job.client:
                self.not_adopted(job, "the broker restarted, and the client that "
                                 "submitted it was gone with it", "cancelled")
            elif job.state == "running" or (job.state == "queued" and (job.held_on or any(
                    rank[2] in ("sent", "held", "running") for rank in job.ranks))):
                self.adopting[job.id] = job  # it runs, or may: its agent says which
            elif job.state == "queued":
                self.active[job.id] = job
                again.append(job)
            else:
                self.done[job.id] = job
        self.envs.drop_unused(envs)
        return again

    def held_only(self, job: JobRecord) -> bool:
        """Whether JOB (adopting) was held by its agent but never reported started."""
        return job.state == "queued"

    def adopted(self, job: JobRecord, agent: str) -> None:
        """JOB, running (or starting) on AGENT when the broker restarted, is running again
        as its task."""
        self.adopting.pop(job.id, None)
        self.active[job.id] = job
        if job.state != "running":
            job.state, job.agent, job.started = "running", agent, time.time()
            self._keep(job)

    def requeue_adopting(self, job: JobRecord) -> None:
        """JOB was held by its agent and never started: it is queued again."""
        self.adopting.pop(job.id, None)
        job.held_on = ""
        self.active[job.id] = job
        self._keep(job)

    def not_adopted(self, job: JobRecord, why: str, state: str = "lost") -> None:
        self.adopting.pop(job.id, None)
        job.state, job.error, job.reason = state, why, why  # (the broker's words)
        self._ended(job)
        self.done[job.id] = job
        self._keep(job)

    def detached(self, task: Task) -> bool:
        job = self.active.get(task.id)
        return job is not None and job.detached

    def held(self, task: Task, agent: str) -> None:
        """TASK's agent may start it from now: kept before the agent is told it may."""
        job = self.active.get(task.id)
        if job is not None:
            job.held_on = agent
            self._keep(job)

    def started(self, task: Task, agent: str, gpus: list[str]) -> None:
        job = self.active.get(task.id)
        if job is not None:
            job.state, job.agent, job.gpus, job.started = "running", agent, gpus, time.time()
            self._keep(job)

    def requeued(self, task: Task) -> None:
        job = self.active.get(task.id)
        if job is not None:
            job.state, job.agent, job.gpus, job.started = "queued", "", [], None
            job.held_on, job.retries = "", task.retries  # (one may have been spent)
            self._keep(job)

    def finished(self, task: Task, outcome: str, info: dict[str, Any]) -> None:
        job = self.active.pop(task.id, None)
        if job is None:
            return
        self._ended(job)
        # The agent that tried it, also when it could not start it (never "started").
        job.agent = job.agent or str(info.get("agent") or "")
        if job.client:  # told again should its client come back to a restarted broker
            job.ended = [outcome, info, [bytes(P.buffer(f)) for f in task.result]]
        code, peak = info.get("exit_code"), info.get("peak_memory")
        job.exit_code = code if isinstance(code, int) else None
        job.peak_memory = peak if type(peak) is int else None
        if outcome == P.OK:
            job.state = "done"
        elif outcome == P.RAISED:
            job.state = "failed"
            job.error = str(info.get("error", ""))
        else:
            job.state = FAILED_STATES.get(str(info.get("type")), "failed")
            job.error = str(info.get("message", ""))
        job.reason = ended_reason(outcome, job.state, code, job.error)
        if info.get("type") == "MemoryLimitError":  # (its agent's words: nothing of its own)
            job.error = job.reason = f"out of memory: {job.error}"
        rank = info.get("rank")
        if type(rank) is int:  # (a multi-node job: the rank that failed first)
            job.reason = f"rank {rank} on {info.get('agent')}: {job.reason or job.state}"
            job.error = job.error or job.reason
        self.done[job.id] = job
        self._keep(job)
        while len(self.done) > _FINISHED_KEPT:
            forgotten, _ = self.done.popitem(last=False)
            if self._store is not None:
                self._store.forget_job(forgotten)

    def _shown(self, job: JobRecord, role: str, owner: str) -> dict[str, Any]:
        """JOB described for a key of ROLE acting as OWNER: its command line, directory,
        environment and error only for its owner and admin keys."""
        entry = self._describe(job)
        if role == "admin" or owner == job.owner:
            if job.finished is not None and job.error:
                entry["reason"] = job.error  # (its own words: the command it could not run)
            return entry
        return {k: v for k, v in entry.items() if k in PUBLIC_FIELDS}

    def _describe(self, job: JobRecord) -> dict[str, Any]:
        entry = job.as_dict()
        if job.id in self.adopting:
            entry["reason"] = (f"the broker restarted: waiting for agent "
                               f"{job.agent or job.held_on} to say whether it still runs it")
        task = self._graph.get(job.id)
        if task is not None and task.state in (TaskState.WAITING, TaskState.QUEUED):
            # Judged now, not when it was queued: an agent may have joined or left since.
            infeasible = self._infeasible(task.units)
            entry["reason"] = reason = infeasible or self._why(task)
            # (a multi-node job's gang may be infeasible as a whole: its why says so)
            never = bool(infeasible) or reason.startswith("infeasible")
            entry["state"] = "infeasible" if never else "queued"
        elif task is not None and job.state == "queued":  # granted into a slot's queue
            entry["reason"] = self._why(task)
        return entry

    def listing(self, limit: int = 100) -> list[dict[str, Any]]:
        """Describe the LIMIT newest jobs, finished ones among them (saying why each that
        waits waits costs a scheduler question: a few, not thousands)."""
        # Ids grow with time: the newest of each table are at its end (a finished job's
        # place is when it finished). O(LIMIT), however many jobs wait.
        newest = [job for table in (self.done, self.active, self.adopting)
                  for job in itertools.islice(reversed(table.values()), limit)]
        return [self._describe(j) for j in sorted(newest, key=lambda j: -j.id)[:limit]]

    def count(self) -> int:
        """How many jobs the table holds, finished ones included."""
        return len(self.done) + len(self.active) + len(self.adopting)

    # -- requests ---------------------------------------------------------------------------
    def on_jobs(self, ident: bytes, msg: P.Message, now: float) -> None:
        """List jobs: active ones, finished ones too with ``all`` (or the asker's own that
        its waits have not reported yet with ``unreported``), or exactly ``jobs``.
        ``reported`` marks the asker's own jobs whose end a wait has reported; ``wait``
        (seconds, with ``jobs``) holds the answer until none of them is left to end, or for
        that long (``job_waits``)."""
        body: dict[str, Any] = {"req": msg.body.get("req")}
        role, owner = self._sender()
        reported = msg.body.get("reported")
        for job_id in reported if isinstance(reported, list) else []:
            job = self.done.get(job_id) if type(job_id) is int else None
            if job is not None and job.owner == owner:  # (what another's waits saw: theirs)
                job.reported = True
                self._keep(job)
        wanted = msg.body.get("jobs")
        wait = msg.body.get("wait")
        if isinstance(wanted, list):
            body["jobs"] = records = self._records(wanted, role, owner)
            if isinstance(wait, (int, float)) and wait > 0 and "ids" not in msg.body:
                held = Wait(ident, body["req"], wanted, role, owner,
                            now + min(float(wait), MAX_WAIT))
                if any(r["state"] in PENDING for r in records) and self.waits.hold(held):
                    return  # (answered as they end, or at its time: ``job_waits``)
        else:
            jobs = [*self.active.values(), *self.adopting.values()]
            if msg.body.get("all"):
                jobs = list(self.done.values()) + jobs
            elif msg.body.get("unreported"):
                jobs = [j for j in [*self.done.values(), *jobs]
                        if j.owner == owner and not j.reported]
            body["jobs"] = [self._shown(j, role, owner)
                            for j in sorted(jobs, key=lambda j: j.id)]
        local = msg.body.get("ids")
        client = self._clients.get(ident)
        if isinstance(local, list) and client is not None:
            # The submitter learns its job ids (its jobs accepted) only once they are kept.
            if self._store is not None and not self._store.commit():
                body["error"] = (f"the broker could not keep its state in "
                                 f"{self._store.directory}: {self._store.error}; the jobs "
                                 "were not accepted")
                for task_id in [client.ids.get(i) for i in local]:  # never run unkept
                    task = self._graph.get(task_id) if type(task_id) is int else None
                    if task is not None and task.id in self.active:
                        self._cancel(task)
            else:
                body["ids"] = [client.ids.get(i) for i in local]
        self._send(ident, P.JOBS_REPLY, body)

    def _records(self, wanted: list[Any], role: str, owner: str) -> list[dict[str, Any]]:
        """The jobs of ids WANTED, as a key of ROLE acting as OWNER sees them."""
        records = []
        for job_id in wanted:
            job = self.get(job_id) if type(job_id) is int else None
            records.append(self._shown(job, role, owner) if job is not None
                           else {"id": job_id, "state": "unknown"})
        return records

    def answer_waits(self, now: float) -> None:
        """Answer the held waits whose jobs have ended, or whose time is up (all looked at
        again when an agent was lost: a queued job may be infeasible now)."""
        if self._agents.removed != self._removed:
            self._removed = self._agents.removed
            self.waits.recheck()
            self._unanswered_logs(lambda agent, sent: self._agents.named(agent) is None)
        if self._log_requests:
            self._unanswered_logs(lambda agent, sent: now - sent > _LOG_ANSWER_WITHIN)
        self.waits.answer(now)

    def _unanswered_logs(self, gone: Callable[[str, float], bool]) -> None:
        """Answer the log requests forwarded to an agent that GONE(agent, when asked) says
        will not answer (lost, or silent): a ``zres logs`` waited its whole timeout, then
        said no broker answered (the broker was there; the agent had died)."""
        for token, (client, req, job_id, finished, agent, sent) in list(
                self._log_requests.items()):
            if gone(agent, sent):
                del self._log_requests[token]
                self._send(client, P.LOGS_REPLY, {
                    "req": req, "finished": finished, "away": True,
                    "error": f"job {job_id}'s log is on agent {agent}, which did not answer "
                             "(it was lost, or is away)"})

    def _answer_wait(self, wait: Wait, now: bool) -> bool:
        """Answer WAIT with its jobs as they are, unless one is still to end and not NOW;
        return whether it still waits."""
        records = self._records(wait.jobs, wait.role, wait.owner)
        if not now and any(r["state"] in PENDING for r in records):
            return True
        self._send(wait.ident, P.JOBS_REPLY, {"req": wait.req, "jobs": records,
                                              "waited": True})
        return False

    def on_cancel(self, ident: bytes, msg: P.Message, now: float) -> None:
        job_id = P.field(msg, "job", int)
        body: dict[str, Any] = {"req": msg.body.get("req")}
        task = self._graph.get(job_id)
        job = self.get(job_id)
        if job is None:
            body["error"] = f"no job {job_id}"
        elif job_id in self.adopting:
            body["error"] = (f"job {job_id} waits for agent {job.agent or job.held_on} to "
                             "come back after the broker restarted; cancel it once it has")
        elif task is None or task.state in FINISHED or job_id not in self.active:
            body["error"] = f"job {job_id} has already finished ({job.state})"
        else:
            self._cancel(task)
        self._send(ident, P.JOB_CANCEL_REPLY, body)

    def on_logs(self, ident: bytes, msg: P.Message, now: float) -> None:
        """Fetch part of a job's log from the agent that ran it."""
        job_id, offset = P.field(msg, "job", int), P.field(msg, "offset", int)
        req = msg.body.get("req")
        job = self.get(job_id)
        if job is None:
            self._send(ident, P.LOGS_REPLY, {"req": req, "error": f"no job {job_id}"})
            return
        finished = job.finished is not None
        # A multi-node job's log is its ranks': each on its agent, under its grant's id.
        rank: Any = msg.body.get("rank")
        agent_name, log_id = job.agent, job_id
        if job.nodes > 1 and type(rank) is not int:
            self._send(ident, P.LOGS_REPLY, {"req": req, "nodes": job.nodes, "data": b"",
                                             "finished": finished, "state": job.state})
            return
        if job.nodes > 1 and not 0 <= rank < len(job.ranks):
            self._send(ident, P.LOGS_REPLY, {"req": req, "error": f"job {job_id} has "
                                             f"{job.nodes} ranks: there is no rank {rank}"})
            return
        if job.nodes > 1:
            log_id, agent_name = job.ranks[rank][0], job.ranks[rank][1]
        agent = self._agents.named(agent_name)
        if finished and job.started is None:  # (its owner's or an admin's: they may know)
            self._send(ident, P.LOGS_REPLY, {
                "req": req, "finished": True, "state": job.state,
                "error": f"job {job_id} has no log: it never started ({job.state}"
                         f"{': ' if job.error or job.reason else ''}"
                         f"{job.error or job.reason})"})
        elif not agent_name:
            entry = self._describe(job)
            self._send(ident, P.LOGS_REPLY, {"req": req, "data": b"", "finished": finished,
                                               "state": entry["state"],
                                               "reason": entry.get("reason", "")})
        elif agent is None:
            self._send(ident, P.LOGS_REPLY, {
                "req": req, "finished": finished, "away": True,
                "error": f"job {job_id}'s log is on agent {agent_name}, which is not connected"})
        else:
            token = next(self._tokens)
            # "finished" as of now: a job that had finished has its whole log on disk.
            self._log_requests[token] = (ident, req, job_id, finished, agent_name, now)
            body = {"token": token, "job": log_id, "offset": offset}
            if job.finished is not None:  # (the agent says whether its retention explains
                body["ended"] = job.finished  # a log that is gone)
            self._send(agent.ident, P.LOGS, body)

    def on_logs_reply(self, ident: bytes, msg: P.Message, now: float) -> None:
        request = self._log_requests.pop(msg.body.get("token", -1), None)
        if request is None:
            return
        client, req, job_id, finished, _, _ = request
        job = self.get(job_id)
        body = {"req": req, "finished": finished,
                "state": self._describe(job)["state"] if job is not None else "unknown"}
        if "error" in msg.body:
            body["error"] = str(msg.body["error"])
        else:
            data = msg.body.get("data", b"")
            body["data"] = data if isinstance(data, bytes) else b""
        self._send(client, P.LOGS_REPLY, body)
