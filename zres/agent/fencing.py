"""What an agent does when its broker no longer counts its work: it stops all of it (or,
for a broker restarted on its state, keeps what runs, to offer it to the new one: see
``carry``), forgets the old session's news and registers as a new session; and how it
takes the broker's "I do not know you" (``unknown``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..logs import get_logger

log = get_logger("zres.agent")


class Fencing:
    """Mixed into the agent's daemon (``Agent``), whose parts it uses."""

    if TYPE_CHECKING:  # (the daemon's own, used here)
        name: str
        session: Any
        reports: Any
        runner: Any
        jobs: Any
        actors: Any
        pool: Any
        carry: Any
        data: Any
        exit_code: int
        _stopping: bool
        _deferred: Any

        def stop(self) -> None: ...

    def _fence(self, why: str, keep: bool = False) -> None:
        """The broker no longer counts our work: stop all of it (but KEEP what runs, for a
        broker restarted on its state: see carry), forget the old session's news, and
        register as a new session."""
        log.warning("agent_fenced", agent=self.name, why=why, work_kept=keep)
        if keep:
            self.carry.begin(self.session.id)
        else:
            self.actors.stop_all(why)
            self.runner.abandon(why)
            self.jobs.stop_all()
            self.pool.drop_pending()
            self.carry.clear()
            self.reports.reset()
            self.data.forget_all()  # (the objects went with the session's work)
        self._deferred.take()
        self.session.restart()

    def _on_unknown(self, msg: P.Message) -> None:
        if self._stopping:
            return  # told to stop (replaced): nothing more to learn
        if msg.body.get("replaced"):
            log.error("agent_replaced", agent=self.name,
                      why="another agent registered with the same name; stopping")
            self.exit_code = 1
            self.stop()
        elif msg.body.get("ended") or msg.body.get("refused"):
            if msg.body.get("refused"):
                log.error("agent_refused", agent=self.name, why=msg.body["refused"])
                self.exit_code = 1
                self.stop()
                return
            # (Not a session no broker has welcomed yet: it has nothing to stop, and the
            # broker says so of it only in answer to its first heartbeat, sent before its
            # registration arrived, with how the one before it ended. Fenced again, it
            # would begin yet another session, and the broker, welcoming this one first,
            # would lose what it had just granted it.)
            if msg.body.get("session") in (None, self.session.id) \
                    and (self.session.registered or self.session.epoch is not None):
                self._fence(str(msg.body.get("ended")), keep=self.carry.adopts(msg))
        elif self.session.registered:
            log.warning("broker_forgot_us")
            self.session.ask_again()
