"""What an agent tells its broker about its work: numbered reports, kept until acknowledged.

Everything that happens to a grant here (handed to a worker, started, finished, given
back) goes into the next report, sent once per loop turn. Reports are numbered per
session; the broker acknowledges them cumulatively, and the agent sends again those not
acknowledged when it reconnects, so none is lost to a broken connection, and none counts
twice (the broker skips numbers it has seen).

A hand-off (a queued grant to a worker, a command job started, an actor fed) waits until
the broker has acknowledged the report saying it is ``held``: the broker always knows that
a task may have started before it can have, whatever happens to the agent, its connection
or its messages in between. And it waits while the agent's lease has lapsed (an
acknowledgement that arrives after the broker may have given up on the agent starts
nothing), and goes on at the next turn past a turn's budget (200 jobs to start never keep
the loop from its other work). A direct grant (one that fits its slot now) waits for no
acknowledgement: the broker counted it held, and kept that, before it sent it; it is
handed over only while the lease holds (``running``), and reported held with the next
report that goes (its start, or its result: no message of its own, which would only
wake the broker while the task runs).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core import protocol as P
from ..logs import get_logger

log = get_logger("zres.agent")
_BUDGET = 0.05  # seconds of hand-offs in one turn of the agent's loop, at most


class Reports:
    """The report being gathered, and those sent but not acknowledged. Hand-offs run only
    while MAY_START() (the lease holds)."""

    def __init__(self, may_start: Callable[[], bool] = lambda: True) -> None:
        self._seq = 0
        self._unacked: deque[tuple[int, list[Any], int]] = deque()   # seq, frames, bytes
        self._gate = Gate(may_start)
        self._clear()

    @property
    def seq(self) -> int:
        """The number of the last report taken."""
        return self._seq

    def _clear(self) -> None:
        self._fields: dict[str, list[Any]] = {"held": [], "started": [], "results": [],
                                              "exits": [], "returned": [], "stored": [],
                                              "master": []}
        self._frames: list[Any] = []
        self._quiet = 0  # direct grants' held: news enough for no report of its own

    # -- gathering (what the runner and the actors call: runner.Events) ---------------
    def held(self, task_id: int) -> None:
        """TASK_ID is handed to a worker process: it may start any moment."""
        self._fields["held"].append(task_id)

    def fenced(self, task_id: int) -> None:
        """TASK_ID, a direct grant, is handed to a worker: held, said with the next report
        that goes (the broker counted it held before it sent it: nothing waits for it)."""
        self._fields["held"].append(task_id)
        self._quiet += 1

    def started(self, task_id: int) -> None:
        self._fields["started"].append(task_id)

    def master(self, task_id: int, address: str, port: int) -> None:
        """TASK_ID, rank 0 of a multi-node job, is its master: it listens at ADDRESS,
        PORT (the broker tells the other ranks)."""
        self._fields["master"].append([task_id, address, port])

    def result(self, task_id: int, outcome: str, frames: list[Any],
               info: dict[str, Any]) -> None:
        self._fields["results"].append([task_id, outcome, len(frames), info])
        self._frames.extend(frames)

    def exited(self, body: dict[str, Any]) -> None:
        """An actor's process ended (after the results it sent before)."""
        self._fields["exits"].append(body)

    def then(self, action: Callable[[], None]) -> None:
        """Run ACTION (a hand-off) once the broker has acknowledged this report."""
        self._gate.add(action)

    def after(self, action: Callable[[], None]) -> None:
        """Run ACTION (a message to a worker) after every hand-off waiting now: at once
        if none is (a cancel must not overtake the task it cancels)."""
        self._gate.after(action)

    def stored(self, object_id: int, size: int) -> None:
        """This agent now holds a copy of object OBJECT_ID (SIZE bytes): an input a worker
        fetched, or an upload (the broker counts it where that object is)."""
        self._fields["stored"].append([object_id, size])

    def give_back(self, task_id: int) -> None:
        """TASK_ID was granted here and never started: the broker may grant it again."""
        self._fields["returned"].append(task_id)

    # -- sending ----------------------------------------------------------------------
    def take(self, session: int, last: bool = False) -> list[Any] | None:
        """Return the next report as a message (None if nothing happened, or only direct
        grants were handed over, unless it is the LAST before a goodbye); keep it until it
        is acknowledged."""
        if sum(map(len, self._fields.values())) <= (0 if last else self._quiet):
            return None
        self._seq += 1
        body: dict[str, Any] = {"seq": self._seq, "session": session}
        body.update((name, value) for name, value in self._fields.items() if value)
        message = P.encode(P.REPORT, body, self._frames)
        size = sum(len(P.buffer(f)) for f in self._frames)
        self._unacked.append((self._seq, message, size))
        self._gate.seal(self._seq)
        self._clear()
        return message

    def acked(self, seq: int) -> None:
        """The broker has every report up to SEQ: what they announced may go ahead."""
        while self._unacked and self._unacked[0][0] <= seq:
            self._unacked.popleft()
        self._gate.open(seq)

    def go_on(self) -> None:
        """Run the acknowledged hand-offs left waiting (the lease had lapsed, or a turn's
        budget was spent)."""
        self._gate.run_ready()

    def unacked(self) -> list[list[Any]]:
        """The reports sent but not acknowledged, oldest first, to send again."""
        return [message for _, message, _ in self._unacked]

    def pending_bytes(self) -> int:
        return sum(size for _, _, size in self._unacked)

    def salvage(self) -> tuple[list[list[Any]], list[int], list[dict[str, Any]]]:
        """Take the results ([id, outcome, frames, info]), give-backs and actor processes'
        exits of every report not acknowledged and of the one being gathered, oldest
        first, and forget those reports: a broker restarted on its state hears of them
        when we register anew."""
        results: list[list[Any]] = []
        returned: list[int] = []
        exits: list[dict[str, Any]] = []
        messages = [P.decode(message) for message in self.unacked()]
        messages.append(P.Message(P.REPORT, self._fields, self._frames))
        for msg in messages:
            items = msg.body.get("results") or []
            for (task_id, outcome, _, info), frames in zip(
                    items, P.split_frames(msg.frames, [i[2] for i in items])):
                results.append([task_id, outcome, [bytes(P.buffer(f)) for f in frames], info])
            returned.extend(msg.body.get("returned") or [])
            exits.extend(msg.body.get("exits") or [])
        self._unacked.clear()
        self._clear()
        return results, returned, exits

    def reset(self) -> None:
        """Forget everything (a new session starts: the old one's news is void)."""
        self._seq = 0
        self._unacked.clear()
        self._gate.clear()
        self._clear()


class Gate:
    """Hand-offs waiting for the broker to acknowledge the report that announces them, and
    for MAY_START() (the agent's lease)."""

    def __init__(self, may_start: Callable[[], bool]) -> None:
        self._pending: list[list[Any]] = []    # [report seq (0: the next one), action]
        self._acked = 0
        self._may_start = may_start
        self._generation = 0  # bumps when cleared: actions run before it are the old's

    def add(self, action: Callable[[], None]) -> None:
        """Run ACTION once the broker has the report being gathered now."""
        self._pending.append([0, action])

    def after(self, action: Callable[[], None]) -> None:
        """Run ACTION right after the last action waiting now (at once if there is none)."""
        if not self._pending:
            _run(action)
        else:
            self._pending.append([self._pending[-1][0], action])

    def seal(self, seq: int) -> None:
        """The report being gathered went out as SEQ."""
        for entry in self._pending:
            if entry[0] == 0:
                entry[0] = seq

    def open(self, acked: int) -> None:
        """The broker has every report up to ACKED: run what they announced, in order."""
        self._acked = max(self._acked, acked)
        self.run_ready()

    def run_ready(self) -> None:
        """Run, in order, the acknowledged actions, while the lease holds and for at most
        a turn's budget (the rest at the next turn)."""
        start = time.monotonic()
        generation, ran = self._generation, 0
        try:
            while ran < len(self._pending) and 0 < self._pending[ran][0] <= self._acked:
                if not self._may_start() or time.monotonic() - start > _BUDGET:
                    return
                ran += 1
                _run(self._pending[ran - 1][1])
                if self._generation != generation:
                    return  # (an action ended the session: what is left went with it)
        finally:
            if self._generation == generation:
                del self._pending[:ran]

    def clear(self) -> None:
        self._pending.clear()
        self._acked = 0
        self._generation += 1


def _run(action: Callable[[], None]) -> None:
    """Run one hand-off; a failing one must not keep the others from happening."""
    try:
        action()
    except Exception:
        log.exception("hand_off_failed")
