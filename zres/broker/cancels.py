"""Answers to clients' cancel requests, some of which wait on agents.

``Future.cancel()`` must say truly whether the task will never run. The broker knows it
at once for a task no agent holds (cancelled) and for one that has begun (not). A task
handed to a worker process that starts it on its own when room frees (a pipelined
grant) is cancelled only if that process has not begun it, which its agent finds out:
the answer waits for the agent's word (the task begins, or ends cancelled) and then
goes to the client in one reply.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..core import protocol as P
from ..core.tasks import Task
from .outbox import Send


@dataclass(slots=True)
class _Request:
    ident: bytes                    # the client that asked
    req: object                     # its request's number
    cancelled: list[int]            # local ids cancelled so far
    waiting: dict[int, int] = field(default_factory=dict)  # task id -> local id


class CancelAnswers:
    """The cancel requests still waiting for an agent's word, by task."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._serials = itertools.count(1)
        self._requests: dict[int, _Request] = {}
        self._by_task: dict[int, list[int]] = {}     # task id -> request serials

    def answer(self, ident: bytes, req: object, cancelled: list[int],
               asked: dict[int, int]) -> None:
        """Reply to IDENT's request REQ: CANCELLED (local ids) now, and those ASKED (task
        id -> local id) once their agents have said."""
        request = _Request(ident, req, cancelled, asked)
        if not asked:
            self._reply(request)
            return
        serial = next(self._serials)
        self._requests[serial] = request
        for task_id in asked:
            self._by_task.setdefault(task_id, []).append(serial)

    def settle(self, task: Task, cancelled: bool) -> None:
        """TASK began (not CANCELLED) or ended (CANCELLED if as cancelled)."""
        for serial in self._by_task.pop(task.id, ()):
            request = self._requests[serial]
            local = request.waiting.pop(task.id)
            if cancelled:
                request.cancelled.append(local)
            if not request.waiting:
                del self._requests[serial]
                self._reply(request)

    def _reply(self, request: _Request) -> None:
        self._send(request.ident, P.CANCEL_REPLY, {"req": request.req,
                                                   "cancelled": request.cancelled})
