"""A status costs the same at a million tasks as at ten (issue 28): the broker stepped in
this thread, a client and an agent played by hand; the status, the dashboard's snapshot
and the job list are built without walking every task the broker holds."""

from __future__ import annotations

import sqlite3

import pytest

from tests.broker.test_agent_link import Peer, report
from tests.broker.test_keeping import hello, register
from zres.broker.server import Broker
from zres.broker.store import Store
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(60)


class Unwalkable(dict):
    """The graph's tasks, which a status may look up by id but never walk."""

    def _walked(self, *_: object) -> None:
        raise AssertionError("the status walked every task the broker holds")

    __iter__ = values = items = keys = _walked  # type: ignore[assignment]


def test_status_counts_and_groups_without_walking_every_task():
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        register(agent, session=1)  # one slot: foo=1, CPU=1
        items = [[i, {"foo": UNIT}, 0, 0, [], 2, f"q{i}", False] for i in range(1, 301)]
        items += [[i, {"foo": UNIT}, 0, 0, [1], 2, f"d{i}", False] for i in range(301, 351)]
        items += [[351, {"bar": UNIT}, 0, 0, [], 2, "never", False]]
        client.send(P.SUBMIT, {"tasks": items}, [b"f", b"a"] * len(items))
        [(granted, *_)] = agent.take(P.ASSIGN).body["tasks"]
        report(agent, 1, 1, held=[granted], started=[granted])
        agent.sync()
        broker.graph.tasks = Unwalkable(broker.graph.tasks)
        status = broker.status()
        assert status["counts"] == {"waiting": 50, "queued": 300, "running": 1}
        assert [t["name"] for t in status["running"]] == ["q1"]
        groups = {(g["request"], g["reason"].split(";")[0]): (g["count"], g["names"])
                  for g in status["groups"]}
        assert groups[("foo=1", "waiting for dependencies")] == (50, ["d301", "d302", "d303"])
        count, names = groups[("foo=1", "needs foo=1")]
        assert count == 299 and len(names) == 3 and all(n[0] == "q" for n in names)
        assert [g["count"] for g in status["groups"] if g["infeasible"]] == [1]
        assert len(status["waiting"]) == 200 and status["waiting"][0]["name"] == "q2"
        broker.dashboard()  # (its snapshot: the status, and the newest jobs)
        # ... and the counts follow the tasks as they run and end.
        report(agent, 2, 1, [b"r"], results=[[granted, P.OK, 1, {}]])
        agent.sync()
        status = broker.status()
        assert status["counts"] == {"queued": 349, "running": 1, "finished": 1}
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def test_the_tasks_of_a_submit_share_their_function_and_request(tmp_path):
    """A million queued tasks must not hold a million copies of a map's function, nor of
    its resource request (issue 28: a third of a queued task's memory was its function),
    and the state store keeps the function once too."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)))
    client, _ = hello(broker)
    try:
        function = b"f" * 1000  # (as a pickled function: the same bytes for every task)
        items = [[i, {"foo": UNIT}, 0, 0, [], 2, f"t{i}", False] for i in range(1, 101)]
        frames = [part for i in range(1, 101) for part in (function, b"args%d" % i)]
        client.send(P.SUBMIT, {"tasks": items}, frames)
        client.take(P.ACCEPTED)
        tasks = [broker.graph.tasks[i] for i in broker.sched.waiting]
        assert len(tasks) == 100
        assert len({id(t.payload[0]) for t in tasks}) == 1, "each task holds its own function"
        assert len({id(t.units) for t in tasks}) == 1, "each task holds its own request"
        waiting = list(broker.sched.waiting.values())
        assert len({id(w.units) for w in waiting}) == 1, "the queue copies each request"
        rows = sqlite3.connect(broker.store.path).execute("SELECT count(*) FROM blobs")
        assert rows.fetchone()[0] == 1, "the store keeps the function once per task"
        # ... and gives each task its whole call back.
        assert broker.keeper.payload(tasks[7]) == [function, b"args8"]
    finally:
        client.close()
        broker.close()


def test_a_queued_task_holds_little_of_its_own(tmp_path):
    """A queued task holds no record of what only some tasks have (where it ran, its
    result kept on agents, ...), and the tasks of a map named "{function}-{local}" by
    default share that name's head (issue 28: at most 1 KB of the broker per queued
    task); every name reads as its client gave it, in status and after a restart."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)))
    client, _ = hello(broker)
    try:
        names = [f"noop-{i}" for i in range(1, 99)] + ["noop-7", "custom"]
        items = [[i, {"foo": UNIT}, 0, 0, [], 1, name, False]
                 for i, name in enumerate(names, 1)]
        client.send(P.SUBMIT, {"tasks": items}, [b"args%d" % i for i in range(1, 101)])
        client.take(P.ACCEPTED)
        tasks = sorted((broker.graph.tasks[i] for i in broker.sched.waiting),
                       key=lambda t: t.local_id)
        assert [t.name for t in tasks] == names
        assert len({id(t.label) for t in tasks[:98]}) == 1, "each task holds its own name"
        assert all(t.more is None for t in tasks), "a queued task holds a record of more"
        assert sorted(w["name"] for w in broker.status()["waiting"]) == sorted(names)
    finally:
        client.close()
        broker.close()
    restarted = Broker("tcp://127.0.0.1:0", prefetch=0, store=Store(str(tmp_path)))
    try:
        assert sorted(t.name for t in restarted.graph.tasks.values()) == sorted(names)
    finally:
        restarted.close()


def test_the_first_agent_judges_each_shape_of_request_once_not_each_task(monkeypatch):
    """With no agent nothing is infeasible; the first to join judges the queued tasks
    again: once per shape of request, and task by task only those of a shape it cannot
    run (a million feasible tasks held the loop for a second, judged one by one). Those
    are told, and a strict one fails; the rest run."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    client, _ = hello(broker)
    agent = Peer(broker)
    judged: list[object] = []
    judge = broker.sched.infeasible_reason
    monkeypatch.setattr(broker.sched, "infeasible_reason",
                        lambda *args: judged.append(args) or judge(*args))
    try:
        items = [[i, {"foo": UNIT}, 0, 0, [], 2, f"q{i}", False] for i in range(1, 301)]
        items += [[i, {"bar": UNIT}, 0, 0, [], 2, f"b{i}", i == 303] for i in (301, 302, 303)]
        client.send(P.SUBMIT, {"tasks": items}, [b"f", b"a"] * len(items))
        client.take(P.ACCEPTED)
        judged.clear()
        register(agent, session=1)  # one slot: foo=1, CPU=1
        assert len(judged) <= 2 + 3, f"{len(judged)} judgings: the 300 that can run judged " \
            "one by one"
        warned = sorted(client.take(P.WARN).body["id"] for _ in range(2))
        assert warned == [301, 302]
        failed = {i[0]: i[3]["type"] for i in client.take(P.RESULTS).body["results"]}
        assert failed == {303: "InfeasibleError"}
        agent.take(P.ASSIGN)
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()
