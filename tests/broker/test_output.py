"""The broker passes tasks' output on to their clients: only theirs, only to clients that
want it, and no more than a client's share a second (the rest counted, not queued)."""

from __future__ import annotations

from typing import Any

import pytest

from zres.broker.agents import AgentRecord, AgentRegistry
from zres.broker.clients import ClientRegistry
from zres.broker.graph import TaskGraph
from zres.broker.output import BURST, RATE, OutputRouter
from zres.core import protocol as P
from zres.core.errors import ProtocolError
from zres.core.tasks import Task
from zres.scheduler.policy import Scheduler


def _router() -> tuple[OutputRouter, list[tuple[bytes, str, dict[str, Any]]], ClientRegistry]:
    sent: list[tuple[bytes, str, dict[str, Any]]] = []
    graph = TaskGraph(on_ready=lambda task: None, on_recorded=lambda task: None)
    agents = AgentRegistry(Scheduler(), timeout=3.0)
    agents.by_ident[b"agent"] = AgentRecord(b"agent", "node-a", "host", 1, 0.0, [], [], [],
                                            session=7)
    clients = ClientRegistry(30.0, on_drop=lambda client, event: None)
    for ident, local, task_id in ((b"alice", 1, 10), (b"bob", 1, 11)):
        clients.hello(ident, ident.decode(), 0.0)
        clients.get(ident).ids[local] = task_id  # type: ignore[union-attr]
        task = Task(task_id, ident, local, {}, 0, 0, f"job-{task_id}", False, [], [])
        task.agent = "node-a"
        graph.add(task)
    router = OutputRouter(lambda ident, kind, body=None, frames=(): sent.append(
        (ident, kind, body or {})), agents, graph, clients)
    return router, sent, clients


def _output(items: list[list[Any]], session: int = 7) -> P.Message:
    return P.Message(P.OUTPUT, {"session": session, "items": items}, [])


def test_each_client_gets_its_own_tasks_lines_in_order():
    router, sent, _ = _router()
    router.on_output(b"agent", _output([[10, 1, b"a1\n"], [11, 2, b"b1\n"], [10, 1, b"a2\n"],
                                        [99, 1, b"nobody's\n"]]), 100.0)
    assert sent == [
        (b"alice", P.OUTPUT, {"items": [[1, "job-10", "node-a", 1, b"a1\n"],
                                        [1, "job-10", "node-a", 1, b"a2\n"]]}),
        (b"bob", P.OUTPUT, {"items": [[1, "job-11", "node-a", 2, b"b1\n"]]})]


def test_no_output_to_a_quiet_client_nor_from_an_old_session():
    router, sent, clients = _router()
    clients.get(b"alice").output = False  # type: ignore[union-attr]
    router.on_output(b"agent", _output([[10, 1, b"a1\n"]]), 100.0)
    router.on_output(b"agent", _output([[11, 1, b"b1\n"]], session=6), 100.0)
    assert sent == []


def test_a_client_gets_at_most_its_share_and_a_count_of_the_rest():
    router, sent, _ = _router()
    line = b"x" * 1023 + b"\n"
    count = BURST // len(line) + 100
    router.on_output(b"agent", _output([[10, 1, line]] * count), 100.0)
    ((_, _, body),) = sent
    *lines, note = body["items"]
    assert len(lines) == BURST // len(line)
    assert note == [1, "job-10", "node-a", 1, b"[zres: 102400 bytes of output dropped]\n"]
    sent.clear()
    router.on_output(b"agent", _output([[10, 1, line]]), 100.0 + len(line) / RATE)
    assert sent[0][2]["items"] == [[1, "job-10", "node-a", 1, line]]  # it refills


def test_a_malformed_item_is_refused():
    router, _, _ = _router()
    with pytest.raises(ProtocolError, match="not \\[task id, 1 or 2, bytes\\]"):
        router.on_output(b"agent", _output([[10, 3, b"x\n"]]), 100.0)


def test_an_agent_speaks_only_for_the_tasks_it_was_given():
    router, sent, _ = _router()
    router._agents.by_ident[b"other"] = AgentRecord(b"other", "node-b", "host", 1, 0.0, [], [],
                                                    [], session=3)
    router.on_output(b"other", _output([[10, 1, b"not yours\n"]], session=3), 100.0)
    assert sent == [], "an agent wrote into another agent's task's output"
