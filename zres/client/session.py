"""The client's session with its broker, as the I/O thread keeps it: the broker's welcome
(which broker it is, its limits, its relay) and, when a broker restarted on its state
welcomes us, picking up where we were: what we still wait for, what we hold, and the
submits it had not kept, sent again in order (``unacked``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import BrokerLostError
from ..logs import get_logger

log = get_logger("zres.client")
_RESUME_IDS = 10_000  # task ids per resume message (within the broker's header limit)


class RequestLost(BrokerLostError):
    """A request the broker restarted before answering (it is back): the asker may ask
    again (a put does: ``putting``)."""


class BrokerSession:
    """Mixed into the client's I/O thread (see ``io``)."""

    if TYPE_CHECKING:  # (the I/O thread's own, used here)
        import threading

        from ..core.limits import Limits
        outbox: deque[tuple[str, Any, Any]]
        unacked: deque[tuple[str, Any, Any]]
        pending: dict[int, Any]
        held: set[int]
        requests: dict[int, Any]
        lock: threading.Lock
        keeps: bool
        epoch: int | None
        cluster: str | None
        relay: tuple[str, str] | None
        limits: Limits
        hb_interval: float
        connected: threading.Event
        _welcomed: bool

        def _send(self, kind: str, body: dict[str, Any], frames: list[Any] = ...) -> None: ...

        def _sent_again(self) -> None: ...

        def wake(self) -> None: ...

        def lose_all(self, why: str, error: type[Any] = ...,
                     detached: str | None = None) -> list[int]: ...

    def _on_welcome(self, msg: P.Message) -> None:
        epoch = msg.body.get("epoch")
        self.hb_interval = float(msg.body.get("heartbeat", 0.5))
        cluster, keeps = msg.body.get("cluster"), msg.body.get("keeps") is True
        if self.epoch is not None and epoch != self.epoch:
            if keeps and cluster == self.cluster:
                self._resume(msg.body.get("resumed") is True)
            else:
                self.lose_all("the broker restarted without its state (a new cluster), "
                              "and so without the task")
        elif self.epoch is not None and msg.body.get("new"):
            self.lose_all("the broker had taken this client for gone (its connection "
                          "closed, or it was silent, too long) and stopped its tasks",
                          detached="the broker had taken this client for gone; the task "
                          "is detached and runs on (zres status lists it)")
        self.epoch, self.cluster, self.keeps = epoch, cluster, keeps
        relay = msg.body.get("relay")  # (the broker's relay: its endpoint, key)
        self.relay = (str(relay[0]), str(relay[1])) if isinstance(relay, list) \
            and len(relay) == 2 else None
        self._welcomed = True
        self._sent_again()
        self.wake()  # send what waited for this welcome
        if not keeps:
            self.unacked.clear()
        given = msg.body.get("limits")
        if isinstance(given, dict):
            known = {f: v for f, v in given.items()
                     if f in ("header_bytes", "payload_bytes", "tasks") and type(v) is int}
            self.limits = dataclasses.replace(self.limits, **known)
        self.connected.set()

    def _resume(self, restored: bool) -> None:
        """The broker restarted on its state: say which kept tasks we still wait for (it
        tells again how those that ended ended), then send again what it had not kept."""
        unkept = {item[0] for _, item, _ in self.unacked}
        with self.lock:  # (against submits queued meanwhile: never sent, so never kept)
            queued = {item[0] for kind, item, _ in list(self.outbox) if kind == P.SUBMIT}
            waiting = [i for i in self.pending if i not in unkept and i not in queued]
            # (copied in one call: a future dropped on another thread may let go meanwhile)
            holds = [*self.pending, *self.held.copy()]
        if waiting and not restored:
            log.warning("broker_restarted_without_client", tasks=len(waiting))
        for start in range(0, len(waiting), _RESUME_IDS):
            self._send(P.RESUME, {"ids": waiting[start:start + _RESUME_IDS]})
        # Then all we hold: the broker lets go of the rest it restored as ours.
        for start in range(0, len(holds) or 1, _RESUME_IDS):  # (one message if none)
            self._send(P.RESUME, {"ids": [], "holds": holds[start:start + _RESUME_IDS],
                                  "last": start + _RESUME_IDS >= len(holds)})
        self.outbox.extendleft(reversed(self.unacked))
        # Those let go of meanwhile: let go again, after they are sent again (the broker
        # that heard the release had not kept them).
        self.outbox.extend((P.RELEASE, i, ()) for i in unkept if i not in self.pending)
        self.unacked.clear()
        requests, self.requests = self.requests, {}
        for reply in requests.values():  # the broker that had them is gone
            reply.set_exception(RequestLost("the broker restarted before it answered"))
        log.info("client_resumed", waiting=len(waiting), sent_again=len(unkept))
