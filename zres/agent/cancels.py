"""What the broker takes back from a node: cancels (work that must not start, or must stop)
and recalls (queued grants asked back to be granted elsewhere: ``handback``). Mixed into
the agent's daemon (``Agent``), whose parts it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import protocol as P


class TakingBack:
    """Mixed into the agent's daemon (``Agent``)."""

    if TYPE_CHECKING:  # (the daemon's own, used here)
        reports: Any
        runner: Any
        jobs: Any
        actors: Any
        _deferred: Any

        def _job_ended(self, task_id: int, outcome: str, frames: list[Any],
                       info: dict[str, Any]) -> None: ...

    def _on_cancel(self, msg: P.Message) -> None:
        """The broker cancels these: what has not begun never does; FORCE stops the rest."""
        for task_id in P.field(msg, "ids", list):
            if self._deferred.drop(task_id):
                self.reports.result(task_id, P.FAILED, [], {"type": "CancelledError",
                                                            "message": "cancelled"})
                continue
            self.runner.cancel(task_id, msg.body.get("force") is True)
            if task_id in self.jobs.jobs:
                self.jobs.cancel(task_id)
            elif task_id in self.runner.placements and not self.actors.placed(task_id):
                # A job not started yet (its start waits for the broker's ack): drop it.
                self._job_ended(task_id, P.FAILED, [], {"type": "CancelledError",
                                                        "message": "cancelled"})

    def _on_recall(self, msg: P.Message) -> None:
        """The broker asks these queued grants back: those not begun are given back (a
        report's returned), those begun run on."""
        ids = P.field(msg, "ids", list)
        for task_id in ids:
            if self._deferred.drop(task_id):  # (held back while the lease lapsed: not begun)
                self.reports.give_back(task_id)
        self.runner.recall(ids)
