"""The broker's state store (issue 16): what it keeps survives a new process, ids never
repeat, and a store that cannot write refuses new jobs instead of pretending to keep them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.test_agent_link import Peer
from zres.broker.graph import TaskGraph
from zres.broker.server import Broker
from zres.broker.store import ID_BLOCK, Store
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(30)


def graph(store: Store) -> TaskGraph:
    return TaskGraph(lambda task: None, lambda task: None, reserve_ids=store.reserve_ids,
                     first_id=store.meta("id_ceiling", 0) + 1)


def test_what_is_committed_is_there_for_the_next_broker_and_ids_never_repeat(tmp_path):
    store = Store(str(tmp_path))
    cluster = store.cluster_id()
    ids = [graph(store).new_id() for _ in range(3)]
    first = graph(store)
    handed = [first.new_id() for _ in range(5)]
    store.put_job({"id": handed[-1], "state": "queued", "argv": ["true"]})
    assert store.commit()
    store.close()

    again = Store(str(tmp_path))
    assert again.cluster_id() == cluster
    assert again.jobs() == [{"id": handed[-1], "state": "queued", "argv": ["true"]}]
    later = graph(again).new_id()
    assert later > max(ids + handed), "an id was handed out again after a restart"
    assert later <= max(handed) + 2 * ID_BLOCK + 1


def test_a_commit_that_cannot_be_written_is_kept_for_later_and_said(tmp_path):
    store = Store(str(tmp_path), max_pages=8)  # as a full disk: a few pages at most
    store.cluster_id()
    store.put_job({"id": 1, "state": "queued", "argv": ["x" * 200_000]})
    assert not store.commit()
    assert "full" in (store.error or "")
    assert store.describe()["error"] == store.error
    assert store.dirty(), "what could not be written was dropped"


def job_submit(local: int) -> tuple[dict, list]:
    spec = {"argv": ["true"], "env": {}, "cwd": None, "detached": True}
    return {"tasks": [[local, {"CPU": UNIT}, 0, 0, [], 0, "job", False, {"job": spec}]]}, []


def test_a_broker_that_cannot_keep_its_state_refuses_new_jobs_naming_why(tmp_path: Path):
    store = Store(str(tmp_path), max_pages=8)
    broker = Broker("tcp://127.0.0.1:0", store=store)
    client = Peer(broker)
    try:
        client.send(P.HELLO, {"client": "c"})
        client.take(P.WELCOME)
        # A job too big for what is left on "disk": not acknowledged (no job id) ...
        spec = {"argv": ["x" * 200_000], "env": {}, "cwd": None, "detached": True}
        client.send(P.SUBMIT, {"tasks": [[1, {"CPU": UNIT}, 0, 0, [], 0, "big", False,
                                          {"job": spec}]]})
        client.send(P.JOBS, {"ids": [1], "jobs": [], "req": 7})
        reply = client.take(P.JOBS_REPLY)
        assert "ids" not in reply.body and "could not keep its state" in reply.body["error"]
        # ... and the next job is refused outright, saying why.
        client.send(P.SUBMIT, *job_submit(2))
        refused = client.take(P.REFUSED)
        assert refused.body["ids"] == [2]
        assert "cannot keep new jobs" in refused.body["error"]
        assert "full" in refused.body["error"]
    finally:
        client.close()
        broker.sock.close(0)
        broker._monitor.close(0)
