"""What an agent tells its broker, and the hand-offs that wait for the broker's ack."""

from __future__ import annotations

from zres.agent.deferred import DeferredGrants
from zres.agent.reports import Reports
from zres.core import protocol as P


def test_a_failing_hand_off_does_not_keep_the_others_from_happening():
    reports = Reports()
    done: list[str] = []

    def broken() -> None:
        raise ValueError("a job that cannot start")

    reports.held(1)
    reports.then(broken)
    reports.then(lambda: done.append("second"))
    message = reports.take(7)
    assert message is not None
    reports.acked(P.decode(message).body["seq"])
    assert done == ["second"], "one failed hand-off lost every hand-off after it"


def test_a_message_after_the_waiting_hand_offs_goes_once_they_have():
    reports = Reports()
    done: list[str] = []
    reports.after(lambda: done.append("at once"))  # nothing waits: it goes now
    assert done == ["at once"]
    reports.held(1)
    reports.then(lambda: done.append("grant"))
    reports.after(lambda: done.append("cancel"))
    assert done == ["at once"], "the cancel overtook the grant it cancels"
    reports.acked(P.decode(reports.take(7)).body["seq"])  # type: ignore[arg-type]
    assert done == ["at once", "grant", "cancel"]


def _assign(items: list[tuple[int, list[bytes]]]) -> P.Message:
    tasks = [[task, 0, {}, [], len(frames), [], {}] for task, frames in items]
    return P.Message(P.ASSIGN, {"tasks": tasks}, [f for _, frames in items for f in frames])


def test_a_deferred_grant_can_be_cancelled_and_the_rest_keep_their_frames():
    deferred = DeferredGrants()
    deferred.add(_assign([(1, [b"a1", b"a2"]), (2, [b"b1"]), (3, [b"c1", b"c2"])]))
    deferred.add(_assign([(4, [b"d1"])]))
    assert deferred.ids() == [1, 2, 3, 4]
    assert deferred.drop(2) and not deferred.drop(2)
    first, second = deferred.take()
    assert [t[0] for t in first.body["tasks"]] == [1, 3]
    assert first.frames == [b"a1", b"a2", b"c1", b"c2"]
    assert second.frames == [b"d1"] and deferred.ids() == []


def test_a_direct_grants_held_goes_with_the_next_report_not_one_of_its_own():
    """The broker counted it held before it sent it: a report for that alone would only
    wake the broker while the task runs. It goes with the next news (its start)."""
    reports = Reports()
    reports.fenced(1)
    assert reports.take(7) is None, "a report sent for a direct grant's held alone"
    reports.started(1)
    message = reports.take(7)
    assert message is not None
    body = P.decode(message).body
    assert body["held"] == [1] and body["started"] == [1]
    reports.held(2)  # (a queued grant: its hand-off waits for this report's ack)
    assert P.decode(reports.take(7)).body["held"] == [2]  # type: ignore[arg-type]
