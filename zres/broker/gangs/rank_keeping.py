"""Multi-node jobs taken back by a restarted broker (mixed into ``RankTable``): each rank
that was sent waits for its agent to offer it; one its agent no longer has, or whose agent
is not back in time, is lost, and the job's other ranks are stopped (see ``ranks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core import protocol as P
from ...core.tasks import Task
from ...logs import get_logger
from .records import AGENT, EXIT, ID, STATE, Gang, Outcome

if TYPE_CHECKING:
    from ...scheduler.policy import Scheduler
    from ..agents import AgentRecord
    from ..job_records import JobRecord

log = get_logger("zres.broker")


class RankKeeping:
    """Mixed into the ``RankTable``, whose records it changes."""

    if TYPE_CHECKING:  # (the table's own, used here)
        gangs: dict[int, Gang]
        of_rank: dict[int, tuple[Gang, int]]
        _sched: Scheduler
        _send: Any

        def _finish(self, gang: Gang) -> None: ...
        def _rank_over(self, grant_id: int, outcome: Outcome, lost: bool = False) -> None: ...
        def lost(self, grant_id: int, why: str) -> None: ...

    def restore(self, job: JobRecord, task: Task) -> None:
        """JOB (multi-node, its task TASK) ran when the broker went: each rank that was
        sent waits for its agent to offer it back."""
        gang = self.gangs[job.id] = Gang(job, task, [r[ID] for r in job.ranks])
        for rank, entry in enumerate(job.ranks):
            self.of_rank[entry[ID]] = (gang, rank)
            if entry[STATE] in ("sent", "held", "running"):
                gang.sent.add(rank)
                gang.away.add(rank)
            elif entry[STATE] in ("done", "failed", "cancelled", "lost"):
                gang.ended[rank] = (P.OK if entry[STATE] == "done" else P.FAILED, [], {
                    "exit_code": entry[EXIT], "type": "ZresError", "message":
                    f"rank {rank} of job {job.id} ended ({entry[STATE]}, exit code "
                    f"{entry[EXIT]}) before the broker restarted"})
                if entry[STATE] != "done" and gang.failing is None:
                    gang.failing, gang.lost = (rank, gang.ended[rank]), entry[STATE] == "lost"
            else:  # (never sent: it cannot be started with the others any more)
                gang.ended[rank] = (P.FAILED, [], {"type": "CancelledError",
                                                   "message": "never started"})
                entry[STATE] = "cancelled"
                if gang.failing is None:
                    gang.failing, gang.lost = (rank, (P.FAILED, [], {
                        "type": "AgentLostError", "message": f"the broker restarted while "
                        f"job {job.id}'s ranks were being started"})), True
        if not gang.away:
            self._finish(gang)

    def adopt(self, agent: AgentRecord, grant_id: int, slot_id: int,
              positions: list[int]) -> bool:
        """AGENT offers rank GRANT_ID back (on SLOT_ID, GPU POSITIONS); False: it is not
        ours to run there (its agent stops it)."""
        gang, rank = self.of_rank[grant_id]
        task = gang.task
        if rank not in gang.away or gang.job.ranks[rank][AGENT] != agent.name \
                or not self._sched.adopt(grant_id, slot_id, dict(task.units), positions,
                                         task.priority, task.owner):
            return False
        gang.away.discard(rank)
        gang.grants[rank] = self._sched.running[grant_id]
        log.info("job_rank_adopted", job=gang.job.id, rank=rank, agent=agent.name)
        if gang.stopping or gang.failing:
            self._send(agent.ident, P.CANCEL, {"ids": [grant_id], "force": True})
        return True

    def ended_away(self, agent: AgentRecord, grant_id: int, outcome: str,
                   frames: list[Any], info: dict[str, Any]) -> bool:
        """Rank GRANT_ID ended on AGENT while the broker was away; False if not ours."""
        gang, rank = self.of_rank[grant_id]
        if rank not in gang.away or gang.job.ranks[rank][AGENT] != agent.name:
            return False
        gang.away.discard(rank)
        self._rank_over(grant_id, (outcome, frames, {**info, "agent": agent.name}))
        return True

    def settle(self, agent: AgentRecord, why: str) -> None:
        """AGENT's offer is read: the ranks it did not offer are lost (WHY)."""
        for gang in list(self.gangs.values()):
            for rank in sorted(gang.away):
                if gang.job.ranks[rank][AGENT] == agent.name:
                    gang.away.discard(rank)
                    self.lost(gang.ids[rank], why)

    def expire(self, grace: float) -> None:
        """The ranks whose agents were not back within GRACE seconds are lost."""
        for gang in list(self.gangs.values()):
            for rank in sorted(gang.away):
                gang.away.discard(rank)
                self.lost(gang.ids[rank], f"the broker restarted while it ran, and agent "
                          f"{gang.job.ranks[rank][AGENT]} did not come back within "
                          f"{grace:g}s")
