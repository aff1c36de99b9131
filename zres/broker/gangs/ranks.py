"""Multi-node command jobs: one job, its command run once on each of N distinct agents,
started together once all N fit, ended together.

A job submitted with ``nodes: N`` (``zres submit --nodes N``) waits in the scheduler as a
gang of N bundles of its resources, STRICT_SPREAD: all reserved at once or none. Each
bundle's grant is one *rank*'s, with an id of its own: rank k runs on its agent as a job
whose grant is that id (its log, its reports, a cancel name it), with its job's id,
``ZRES_NODE_RANK``/``NODE_RANK`` k, ``ZRES_NNODES``/``NNODES``/``WORLD_SIZE`` N and its
master's address in its environment. Rank 0 goes first, marked ``master``: its agent picks
the address other agents reach it at and a free port there, puts them in rank 0's
environment and reports them (``master`` in its report); the other ranks go out then,
with ``ZRES_MASTER_ADDR``/``MASTER_ADDR`` and ``ZRES_MASTER_PORT``/``MASTER_PORT`` set.

A rank that fails (a non-zero exit, cannot start) or is lost with its agent stops the
others (their process groups, as a forced cancel does); the job ends once every rank's
processes are gone, failing with the first failure, naming its rank (and exit code).
Cancelling stops every rank. Only then are the gang's resources given back, all of them.
A job whose rank was lost with its agent is run again whole if it has retries left.

A restarted broker takes a running job back rank by rank, as each rank's agent offers it
(``restore``, ``adopt``); a rank its agent no longer has, or whose agent is not back in
time, is lost. One restored while its ranks were being started (rank 0 sent, the others
not yet) cannot be started whole: what runs of it is stopped, and it is run again (a
retry) or fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...core import protocol as P
from ...core.resources import token_devices
from ...core.tasks import FINISHED, Task, TaskState
from ...logs import get_logger
from ...scheduler.policy import Scheduler
from ...scheduler.records import Grant
from ..agents import AgentRecord, AgentRegistry
from ..graph import TaskGraph
from ..jobs import JobTable
from ..outbox import Send
from .rank_keeping import RankKeeping
from .records import AGENT, EXIT, GPUS, STATE, Gang, Outcome

log = get_logger("zres.broker")

def rank_env(rank: int, nodes: int, master: list[Any] | None = None) -> dict[str, str]:
    """The environment rank RANK of a job on NODES agents gets (MASTER: [addr, port])."""
    env = {"ZRES_NODE_RANK": str(rank), "ZRES_NNODES": str(nodes), "NODE_RANK": str(rank),
           "NNODES": str(nodes), "WORLD_SIZE": str(nodes),  # (and torchrun's own names:
           "PET_NODE_RANK": str(rank), "PET_NNODES": str(nodes)}  # it reads PET_<option>)
    if master:
        env.update(ZRES_MASTER_ADDR=str(master[0]), ZRES_MASTER_PORT=str(master[1]),
                   MASTER_ADDR=str(master[0]), MASTER_PORT=str(master[1]),
                   PET_MASTER_ADDR=str(master[0]), PET_MASTER_PORT=str(master[1]))
    return env


class RankTable(RankKeeping):
    """The multi-node jobs being placed or running, and their ranks.

    ASSIGN(agent ident, item) adds an assign item for an agent, FLUSH() sends them (with
    the ack an agent needs to start a job); TOKEN(subject) is a job's task token;
    ON_STARTED(task) tells its client it began."""

    def __init__(self, send: Send, graph: TaskGraph, sched: Scheduler,
                 agents: AgentRegistry, jobs: JobTable, new_id: Callable[[], int],
                 assign: Callable[[bytes, list[Any]], None], flush: Callable[[], None],
                 token: Callable[[str], str] = lambda subject: "",
                 on_started: Callable[[Task], None] = lambda task: None) -> None:
        self._send = send
        self._graph = graph
        self._sched = sched
        self._agents = agents
        self._jobs = jobs
        self._new_id = new_id
        self._assign, self._flush = assign, flush
        self._token = token
        self._on_started = on_started
        self.gangs: dict[int, Gang] = {}               # by job id
        self.of_rank: dict[int, tuple[Gang, int]] = {}

    def is_gang(self, task: Task) -> bool:
        """Whether TASK is a multi-node job."""
        job = self._jobs.active.get(task.id)
        return job is not None and job.nodes > 1

    def is_rank(self, grant_id: int) -> bool:
        return grant_id in self.of_rank

    # -- placed and started -----------------------------------------------------------------
    def queue(self, task: Task) -> str | None:
        """TASK, a multi-node job, is ready: queue its gang (new rank ids); return why no
        agents could ever hold it (None: they could)."""
        job = self._jobs.active[task.id]
        if task.state is not TaskState.QUEUED:
            self._graph.set_state(task, TaskState.QUEUED)
        if not task.units:
            self._graph.fail(task, "ValueError", f"job {task.id} runs on {job.nodes} agents: "
                             "it must ask for some resource on each (resources=, -r)")
            return None
        gang = self.gangs[task.id] = Gang(job, task, [self._new_id() for _ in range(job.nodes)])
        for rank, grant_id in enumerate(gang.ids):
            self.of_rank[grant_id] = (gang, rank)
        job.ranks = [[grant_id, "", "queued", None, []] for grant_id in gang.ids]
        job.master = []
        self._sched.add_gang(task.id, [dict(task.units)] * job.nodes, "STRICT_SPREAD",
                             gang.ids, task.priority, task.owner)
        return self._sched.gang_infeasible(task.id)

    def placed(self, grant: Grant) -> None:
        """A rank's bundle is reserved (all of a gang's come in one pass): once all are,
        the job starts: rank 0 first."""
        gang, rank = self.of_rank[grant.task]
        agent = self._agents.slot_owner[grant.slot]
        slot_index = agent.slots.index(grant.slot)
        gang.grants[rank] = grant
        gang.job.ranks[rank][AGENT:] = [agent.name, "placed", None, [
            agent.gpus[slot_index][p] for p in grant.gpus] or list(token_devices(grant.units))]
        if len(gang.grants) < len(gang.ids):
            return
        task = gang.task
        self._graph.set_state(task, TaskState.RUNNING)
        task.agent = gang.job.agent = gang.job.ranks[0][AGENT]
        task.started_at = time.monotonic()
        task.attempt += 1
        task.held = task.begun = False
        log.info("job_placed", job=task.id, agents=[r[AGENT] for r in gang.job.ranks])
        self._send_rank(gang, 0)

    def _send_rank(self, gang: Gang, rank: int) -> None:
        """Send rank RANK to its agent (rank 0: the master, which says its address)."""
        task, job, grant = gang.task, gang.job, gang.grants[rank]
        agent = self._agents.slot_owner[grant.slot]
        spec = job.for_agent(self._token(f"t{task.id}:{task.owner}"))
        spec.update(env={**spec["env"], **rank_env(rank, job.nodes, job.master or None)},
                    job_id=job.id, rank=rank, master=rank == 0)
        opts = {"priority": task.priority, "attempt": task.attempt, "job": spec,
                "taken": grant.taken}
        self._assign(agent.ident, [gang.ids[rank], agent.slots.index(grant.slot),
                                   grant.units, grant.gpus, 0, [], opts])
        gang.sent.add(rank)
        job.ranks[rank][STATE] = "sent"

    def report(self, agent: AgentRecord, body: dict[str, Any], payloads: list[list[Any]]
               ) -> tuple[dict[str, Any], list[list[Any]]]:
        """Take in what AGENT's report says of ranks; return the rest of it."""
        if not self.of_rank:
            return body, payloads
        body = dict(body)
        for field_ in ("held", "started", "returned"):
            ids = body.get(field_)
            if isinstance(ids, list) and any(i in self.of_rank for i in ids):
                body[field_] = [i for i in ids if i not in self.of_rank]
                for grant_id in [i for i in ids if i in self.of_rank]:
                    getattr(self, f"_{field_}")(agent, grant_id)
        for entry in body.get("master") or ():
            if isinstance(entry, list) and len(entry) == 3 and entry[0] in self.of_rank:
                self._master(agent, *entry)
        results = body.get("results")
        if isinstance(results, list) and any(isinstance(r, list) and r and r[0] in self.of_rank
                                             for r in results):
            kept, kept_payloads = [], []
            for item, frames in zip(results, payloads):
                if isinstance(item, list) and item and item[0] in self.of_rank:
                    info = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
                    self._ended(agent, item[0], str(item[1]), frames, info)
                else:
                    kept.append(item)
                    kept_payloads.append(frames)
            body["results"], payloads = kept, kept_payloads
        return body, payloads

    def _mine(self, agent: AgentRecord, grant_id: int) -> tuple[Gang, int] | None:
        """The rank GRANT_ID if AGENT holds its grant (else a stale report)."""
        gang, rank = self.of_rank[grant_id]
        grant = gang.grants.get(rank)
        if grant is None or self._agents.slot_owner.get(grant.slot) is not agent \
                or rank in gang.ended:
            return None
        return gang, rank

    def _held(self, agent: AgentRecord, grant_id: int) -> None:
        found = self._mine(agent, grant_id)
        if found is None:
            return
        gang, rank = found
        gang.job.ranks[rank][STATE] = "held"
        gang.task.held = True
        if gang.stopping or gang.failing:  # (stopped while the report was on its way)
            self._send(agent.ident, P.CANCEL, {"ids": [grant_id], "force": True})

    def _master(self, agent: AgentRecord, grant_id: int, address: Any, port: Any) -> None:
        """Rank 0's agent says where its master listens: the other ranks go out."""
        found = self._mine(agent, grant_id)
        if found is None or found[1] != 0 or not isinstance(address, str) \
                or type(port) is not int or found[0].job.master:
            return
        gang = found[0]
        gang.job.master = [address, port]
        if not (gang.stopping or gang.failing):
            for rank in range(1, len(gang.ids)):
                self._send_rank(gang, rank)
            self._flush()
        self._jobs.keep(gang.job)

    def _started(self, agent: AgentRecord, grant_id: int) -> None:
        found = self._mine(agent, grant_id)
        if found is None:
            return
        gang, rank = found
        job, task = gang.job, gang.task
        job.ranks[rank][STATE] = "running"
        if not task.begun:
            task.held = task.begun = True
            task.started_at = time.monotonic()
            self._on_started(task)
            self._jobs.started(task, job.ranks[0][AGENT], job.ranks[0][GPUS])
        else:
            self._jobs.keep(job)

    def _returned(self, agent: AgentRecord, grant_id: int) -> None:
        """A rank came back unstarted (its agent is leaving): the job cannot start whole."""
        if self._mine(agent, grant_id) is not None:
            self._rank_over(grant_id, (P.FAILED, [], {
                "type": "AgentLostError", "message": f"agent {agent.name} gave it back "
                "(it is leaving) before it started"}), lost=True)

    def _ended(self, agent: AgentRecord, grant_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None:
        if self._mine(agent, grant_id) is not None:
            self._rank_over(grant_id, (outcome, frames, {**info, "agent": agent.name}))

    def lost(self, grant_id: int, why: str) -> None:
        """Rank GRANT_ID's agent was lost (WHY): the job's other ranks are stopped."""
        gang, rank = self.of_rank[grant_id]
        if rank not in gang.ended:
            gang.grants.pop(rank, None)  # (gone with its slot)
            self._rank_over(grant_id, (P.FAILED, [], {
                "type": "AgentLostError", "message": f"rank {rank} of job {gang.job.id} was "
                f"lost: {why}"}), lost=True)

    def _rank_over(self, grant_id: int, outcome: Outcome, lost: bool = False) -> None:
        """Rank GRANT_ID ended with OUTCOME: a failure stops the others; the job ends once
        every rank has."""
        gang, rank = self.of_rank[grant_id]
        gang.ended[rank] = outcome
        code = outcome[2].get("exit_code")
        gang.job.ranks[rank][STATE:EXIT + 1] = [
            "lost" if lost else "done" if outcome[0] == P.OK else
            "cancelled" if outcome[2].get("type") == "CancelledError" else "failed",
            code if isinstance(code, int) else None]
        if outcome[0] != P.OK and gang.failing is None and not gang.stopping:
            gang.failing, gang.lost = (rank, outcome), lost
            log.warning("job_rank_failed", job=gang.job.id, rank=rank, lost=lost,
                        exit_code=gang.job.ranks[rank][EXIT])
            self._stop(gang)
        self._jobs.keep(gang.job)
        if len(gang.ended) == len(gang.ids):
            self._finish(gang)

    def _stop(self, gang: Gang) -> None:
        """Stop the ranks of GANG that have not ended (those never sent end at once)."""
        for rank, grant_id in enumerate(gang.ids):
            if rank in gang.ended:
                continue
            if rank in gang.away:
                continue  # (restored: stopped when its agent offers it, or lost)
            grant = gang.grants.get(rank)
            agent = self._agents.slot_owner.get(grant.slot) if grant is not None else None
            if rank in gang.sent and agent is not None:
                self._send(agent.ident, P.CANCEL, {"ids": [grant_id], "force": True})
            else:
                gang.ended[rank] = (P.FAILED, [], {"type": "CancelledError",
                                                   "message": "never started"})
                gang.job.ranks[rank][STATE] = "cancelled"

    # -- ended --------------------------------------------------------------------------------
    def _finish(self, gang: Gang) -> None:
        """Every rank of GANG has ended: its resources come back, the job ends (or runs
        again whole, a rank lost with retries left)."""
        task, job = gang.task, gang.job
        self._forget(gang)
        if task.state in FINISHED:
            return
        if gang.stopping:
            self._graph.fail(task, "CancelledError", f"job {job.id} was cancelled")
        elif gang.failing is not None and gang.lost and task.retries:
            task.retries -= 1
            log.info("job_retried", job=job.id, retries_left=task.retries,
                     why=gang.failing[1][2].get("message"))
            self._graph.set_state(task, TaskState.QUEUED)
            task.held = task.begun = False
            self._jobs.requeued(task)
            self.queue(task)
        elif gang.failing is not None:
            rank, (outcome, frames, info) = gang.failing
            self._graph.finish(task, outcome, frames, {**info, "rank": rank})
        else:  # (rank 0's result, or any rank's: one ended before a restart has none;
            # by rank, not by when each ended: the first with a result, rank 0's if it has)
            outcome, frames, info = max((gang.ended[r] for r in sorted(gang.ended)),
                                        key=lambda o: bool(o[1]))
            self._graph.finish(task, outcome, frames,
                               {**info, "agents": [r[AGENT] for r in job.ranks]})

    def _forget(self, gang: Gang) -> None:
        self.gangs.pop(gang.job.id, None)
        for grant_id in gang.ids:
            self.of_rank.pop(grant_id, None)
        if self._sched.gang(gang.job.id) is not None:
            self._sched.remove_gang(gang.job.id, now=time.monotonic())
        else:  # (taken back after a restart: its ranks' grants are plain ones)
            for grant_id in gang.ids:
                self._sched.release(grant_id, time.monotonic())

    def cancel(self, task: Task, force: bool) -> bool:
        """Cancel multi-node job TASK: one not started ends now, one started is stopped
        (FORCE; it ends cancelled once every rank is gone); False: it goes on."""
        gang = self.gangs.get(task.id)
        if gang is None:
            return False
        if task.state is TaskState.QUEUED:
            self._forget(gang)
            self._graph.fail(task, "CancelledError", f"job {task.id} was cancelled")
            return True
        if not force:
            return False
        gang.stopping = True
        self._stop(gang)
        if len(gang.ended) == len(gang.ids):
            self._finish(gang)
        return True

    def forget(self, task: Task) -> None:
        """TASK (a multi-node job) will not be placed (it failed before)."""
        gang = self.gangs.get(task.id)
        if gang is not None:
            self._forget(gang)

    def resend(self, agent: AgentRecord, holding: set[int], sent: set[int]) -> None:
        """Ranks sent to AGENT before it resumed its session that it does not hold (lost
        with its old connection) go again."""
        again = False
        for grant_id in sorted(sent - holding):
            found = self._mine(agent, grant_id) if grant_id in self.of_rank else None
            if found is not None and found[0].job.ranks[found[1]][STATE] == "sent":
                self._send_rank(*found)
                again = True
        if again:
            self._flush()

    def dropping(self, grant_id: int) -> bool:
        """Whether the rank GRANT_ID, still held by its agent, is to be stopped there."""
        found = self.of_rank.get(grant_id)
        return found is None or found[0].stopping or found[0].failing is not None
