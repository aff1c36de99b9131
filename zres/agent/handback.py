"""What a node's runner hands back: grants that never started, to a broker the agent is
leaving (or one restarted on its state), or that the broker asks back (``recall``), and
what runs, offered to a restarted broker. Mixed into ``running.TaskRunner``, whose books it
changes."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from .grants import Events, Grant, SlotState

if TYPE_CHECKING:
    from .workers import WorkerPool


class HandingBack:
    """Mixed into the ``TaskRunner``."""

    if TYPE_CHECKING:  # (the runner's own, used here)
        slots: list[SlotState]
        grants: dict[int, Grant]
        draining: bool
        _pool: WorkerPool
        _events: Events
        _giving_back: set[int]

        def _undelegate(self, state: SlotState, task_id: int) -> Grant | None: ...
        def _unrun(self, grant: Grant) -> None: ...
        def _end_delegation_if_done(self, slot: int) -> None: ...

    def settling(self) -> bool:
        """Whether grants asked back from workers have not been answered yet."""
        # (one its worker began as it was asked, or whose worker died, is answered: it
        # runs, or it was dealt with as the death's; it is no longer delegated)
        self._giving_back &= {t for state in self.slots for t in state.delegated}
        return bool(self._giving_back)

    def recall(self, ids: list[int]) -> None:
        """Give back those of IDS (queued grants the broker asks back) that have not begun:
        at once those waiting here or whose hand-off has not gone, delegated ones once their
        worker has dropped them. One its worker begins before that runs on, reported
        started; one begun, starting at once (a direct grant) or not held here is left."""
        for task_id in ids:
            grant = self.grants.get(task_id)
            if grant is None or grant.direct:
                continue
            state = self.slots[grant.slot]
            if any(g is grant for g in state.waiting):
                state.waiting.remove(grant)
                del self.grants[task_id]
                self._events.give_back(task_id)
                continue
            if task_id not in state.delegated or task_id in state.cancelling \
                    or task_id in self._giving_back:
                continue  # it runs (or starts now), or its worker is asked already
            worker = grant.worker
            if worker is not None and worker.ready and worker.proc.returncode is None \
                    and grant.sent:  # (its worker drops it unless it has begun it)
                self._events.after(
                    functools.partial(self._pool.tell, worker, P.CANCEL, {"ids": [task_id]}))
                self._giving_back.add(task_id)
            elif not grant.sent or (worker is not None and not worker.ready
                                    and worker.proc.returncode is None):
                # Its hand-off waits for the broker's ack (it never goes now), or its
                # process has not started: it cannot have begun. (One whose process died
                # is the reaping's: asked again, it is found waiting.)
                self._undelegate(state, task_id)
                del self.grants[task_id]
                if worker is not None:
                    worker.backlog = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
                self._events.give_back(task_id)
                self._end_delegation_if_done(grant.slot)

    def offer(self) -> list[list[Any]]:
        """The tasks running here, for a restarted broker: [id, slot, GPU positions,
        taken]."""
        return [[g.task, g.slot, [self.slots[g.slot].spec.gpus.index(d) for d in g.devices
                                  if d in self.slots[g.slot].spec.gpus], g.taken]
                for g in self.grants.values()]

    def give_back_unstarted(self, restart: bool = False) -> None:
        """Give the broker back every grant that has not started, the agent leaving (or
        RESTART: its broker restarted on its state, and what runs runs on): those waiting
        at once, delegated ones once their worker has dropped them."""
        self.draining = self.draining or not restart
        for state in self.slots:
            for grant in state.waiting:
                self.grants.pop(grant.task, None)
                self._events.give_back(grant.task)
            state.waiting.clear()
        for task_id, grant in list(self.grants.items()):
            state = self.slots[grant.slot]
            void = restart and not grant.sent  # its hand-off waited for the old broker
            if task_id not in state.delegated and not void:
                continue  # it runs, or starts at once: it goes on (offered to a restart)
            worker = grant.worker
            if not void and worker is not None and worker.ready \
                    and worker.proc.returncode is None:
                tell = functools.partial(self._pool.tell, worker, P.CANCEL, {"ids": [task_id]})
                if restart:  # the hand-offs that wait are void: nothing to wait behind
                    tell()
                else:
                    self._events.after(tell)
                self._giving_back.add(task_id)
            else:  # not sent yet: it never will be
                self._undelegate(state, task_id)
                self._unrun(grant)
                del self.grants[task_id]
                if worker is not None:
                    worker.backlog = [(i, f) for i, f in worker.backlog if i[0][0] != task_id]
                self._events.give_back(task_id)
