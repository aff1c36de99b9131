"""The broker's state store (issue 16): what it keeps survives a new process, ids never
repeat, and a store that cannot write refuses new jobs instead of pretending to keep them."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.broker.test_agent_link import Peer
from tests.conftest import wait_until
from zres.broker import state_lock
from zres.broker.graph import TaskGraph
from zres.broker.job_envs import JobEnvs
from zres.broker.jobs import JobRecord
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


def test_job_environments_are_kept_once_and_go_with_their_last_job(tmp_path):
    envs = JobEnvs(store := Store(str(tmp_path)))
    exported = {"PATH": "/usr/bin", "BIG": "x" * 10_000}
    first, key = envs.take(exported)
    again, same = envs.take(dict(reversed(list(exported.items()))))  # (order is no matter)
    assert same == key and again is first, "two jobs with one environment keep two"
    assert envs.take({}) == ({}, "")  # nothing to keep
    assert store.commit()
    store.close()

    store = Store(str(tmp_path))
    kept = store.envs()
    assert kept == {key: exported}
    restored = JobEnvs(store)
    assert restored.restored(key, kept) == exported and restored.restored("gone", kept) is None
    restored.drop_unused(kept)
    assert store.commit() and store.envs() == {key: exported}, "one in use was dropped"
    restored.release(key)
    assert store.commit() and store.envs() == {}
    store.close()


def test_a_commit_that_cannot_be_written_is_kept_for_later_and_said(tmp_path):
    store = Store(str(tmp_path), max_pages=8)  # as a full disk: a few pages at most
    store.cluster_id()
    store.put_job({"id": 1, "state": "queued", "argv": ["x" * 200_000]})
    assert not store.commit()
    assert "full" in (store.error or "")
    assert store.describe()["error"] == store.error
    assert store.dirty(), "what could not be written was dropped"


# A broker's store in another process (argv[1]: its directory), with a job kept; it says
# "open" and holds the store until killed.
_HOLD = """import sys
from zres.broker.store import Store
store = Store(sys.argv[1])
store.put_job({"id": 7, "state": "queued", "argv": ["true"]})
assert store.commit()
print("open", flush=True)
sys.stdin.read()
"""


def test_one_broker_at_a_time_keeps_its_state_in_a_directory(tmp_path, monkeypatch, caplog):
    """Two brokers on one state directory would hand out the same task ids and overwrite
    each other's state: a second is refused, naming the first's pid, and discards nothing
    (--fresh included); a broker killed a moment ago is waited for, and once it has gone
    its successor opens the state at once, with no stale lock to clear."""
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(state)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        monkeypatch.setattr(state_lock, "WAIT", 0.2)
        for fresh in (False, True):
            with pytest.raises(state_lock.StateInUse) as refused:
                Store(str(state), fresh=fresh)
            assert str(refused.value) == (
                f"the state directory {state} is in use by another broker (pid {holder.pid})"
                ": one broker per state directory (stop that one first, or give this one "
                "--state of its own)")

        # Started while the holder is still there (as a supervisor may, racing a kill): it
        # waits, and takes the directory as soon as the holder has gone.
        monkeypatch.setattr(state_lock, "WAIT", 60.0)
        opened: list[Store] = []
        with caplog.at_level(logging.DEBUG, logger="zres.broker"):
            waiter = threading.Thread(target=lambda: opened.append(Store(str(state))))
            waiter.start()
            wait_until(lambda: any("state_dir_busy" in r.getMessage() for r in caplog.records),
                       message="the second store to wait for the first")
            holder.kill()
            waiter.join(30)
        assert opened, "the store did not open once its holder had gone"
        assert opened[0].jobs() == [{"id": 7, "state": "queued", "argv": ["true"]}]
        opened[0].close()
        opened[0].close()  # (twice: harmless, and closes nobody else's descriptor)
        # A store dropped unclosed (a broker that failed to start, in this process) lets go
        # of the directory as it is collected.
        monkeypatch.setattr(state_lock, "WAIT", 0.2)
        dropped = Store(str(state))
        del dropped, opened[:]
        gc.collect()
        Store(str(state)).close()
    finally:
        holder.kill()
        holder.wait(10)


# A process that writes to the database at argv[1] in WAL mode and dies with it open.
_LEAVE_WAL = """import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("INSERT INTO meta (key, value) VALUES ('x', x'00')")
os._exit(0)
"""


def modes(directory: Path) -> dict[str, int]:
    """The permission bits of the database's files in DIRECTORY, by name."""
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()
            if p.name.startswith("state.")}


def test_the_database_is_private_whatever_its_directory(tmp_path, caplog):
    """Task pickles and job commands are readable by the broker's user only: its files
    are 0600 in a 0755 directory (mkdir's, systemd's), made so or found otherwise; the
    directory open to others is warned about, naming it and its mode."""
    directory = tmp_path / "state"
    mask = os.umask(0o022)  # (an ordinary user's: files 0644 unless made otherwise)
    try:
        directory.mkdir(mode=0o755)
        with caplog.at_level(logging.WARNING, logger="zres.broker"):
            store = Store(str(directory))
        store.cluster_id()
        store.put_job({"id": 1, "state": "queued", "argv": ["echo", "a secret"]})
        assert store.commit()
        assert modes(directory) == {"state.sqlite3": 0o600, "state.sqlite3-wal": 0o600,
                                    "state.sqlite3-shm": 0o600, "state.journal": 0o600}
        assert stat.S_IMODE((directory / "broker.lock").stat().st_mode) == 0o600
        store.close()
        (warned,) = [r for r in caplog.records if "state_dir_not_private" in r.getMessage()]
        assert warned.zres_event["dir"] == str(directory)  # type: ignore[attr-defined]
        assert warned.zres_event["mode"] == "0755"  # type: ignore[attr-defined]

        # Files an older version left readable by all (a process that died holding them:
        # its -wal and -shm stay) are made private when opened.
        for name in ("state.sqlite3", "state.journal"):
            os.chmod(directory / name, 0o644)
        subprocess.run([sys.executable, "-c", _LEAVE_WAL, str(directory / "state.sqlite3")],
                       check=True, timeout=30)
        assert modes(directory) == {"state.sqlite3": 0o644, "state.sqlite3-wal": 0o644,
                                    "state.sqlite3-shm": 0o644, "state.journal": 0o644}
        again = Store(str(directory))
        assert set(modes(directory).values()) == {0o600}
        assert again.jobs()[0]["argv"] == ["echo", "a secret"]
        assert again.meta("x") == 0  # (what it wrote, from the log it left: msgpack's 0)
        again.close()
    finally:
        os.umask(mask)
    caplog.clear()
    private = tmp_path / "private"
    with caplog.at_level(logging.WARNING, logger="zres.broker"):
        Store(str(private)).close()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not [r for r in caplog.records if "state_dir_not_private" in r.getMessage()]


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
        assert "cannot keep new work" in refused.body["error"]
        assert "full" in refused.body["error"]
    finally:
        client.close()
        broker.close()


def restarted_with_held_job(tmp_path: Path) -> Broker:
    """A broker restarted on a state in which job 7 was held by agent "node" (session 8:
    it may have started it) but never reported started."""
    store = Store(str(tmp_path))
    store.cluster_id()
    store.set_meta("agent_sessions", {"node": 8})
    store.put_job(dataclasses.asdict(JobRecord(
        7, "j", ["true"], {"foo": UNIT}, True, time.time(),
        {"argv": ["true"], "env": {}, "cwd": None}, held_on="node")))
    assert store.commit()
    store.close()
    return Broker("tcp://127.0.0.1:0", store=Store(str(tmp_path)))


def offer(agent: Peer, jobs: list, returned: list = (),  # type: ignore[assignment]
          **carried: int) -> P.Message:
    """Register agent "node" (foo=1) as a new session offering JOBS still running, and
    giving back RETURNED (held, never started), and perhaps the session it CARRIED."""
    agent.send(P.REGISTER, {"name": "node", "session": 9, "host": "h", "pid": 1,
                            "t": time.monotonic(), "jobs": jobs, "ended": [],
                            "returned": list(returned), **carried,
                            "slots": [{"units": {"CPU": UNIT, "foo": UNIT}, "gpus": []}]})
    return agent.take(P.WELCOME)


def job_state(client: Peer, job: int) -> str:
    """The job's state, and why it waits if it does."""
    client.send(P.JOBS, {"jobs": [job], "req": 1})
    record = client.take(P.JOBS_REPLY).body["jobs"][0]
    return f"{record['state']}: {record.get('reason', '')}"


@pytest.mark.parametrize("offered", [True, False, "never-arrived", None],
                         ids=["still-there", "never-started", "never-arrived",
                              "agent-started-anew"])
def test_a_job_held_but_not_reported_started_runs_on_or_goes_again(tmp_path, offered):
    broker = restarted_with_held_job(tmp_path)
    agent, client = Peer(broker), Peer(broker)
    try:
        assert "waiting for agent node to say whether it still runs it" in \
            job_state(client, 7), "it may have started: it must wait for its agent"
        # (never arrived: its start was sent as the broker went, and the agent carrying
        # the session it was sent to offers all it may have begun)
        welcome = offer(agent, [[7, 0, [], {"foo": UNIT}]] if offered is True else [],
                        returned=[7] if offered is False else [],
                        **({"carried": 8} if offered == "never-arrived" else {}))
        assert welcome.body["adopts"] is True
        if offered is True:  # its agent started it after all: it runs on, its foo=1 taken
            assert job_state(client, 7).startswith("running")
            assert not [m for m in agent.sync() if m.kind in (P.CANCEL, P.ASSIGN)]
        elif offered is not None:  # it never started there: granted again
            assign = agent.take(P.ASSIGN)
            assert [t[0] for t in assign.body["tasks"]] == [7]
        else:  # an agent started anew cannot say it never began: lost, not run twice
            assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "it may run twice"
            assert job_state(client, 7).startswith("lost")
    finally:
        for peer in (agent, client):
            peer.close()
        broker.close()


def test_a_finished_job_stays_finished_after_a_restart(tmp_path):
    store = Store(str(tmp_path))
    store.cluster_id()
    store.put_job(dataclasses.asdict(JobRecord(
        3, "j", ["true"], {}, True, time.time(), {"argv": ["true"]}, state="done",
        agent="node", held_on="node")))
    assert store.commit()
    store.close()
    broker = Broker("tcp://127.0.0.1:0", store=Store(str(tmp_path)))
    client = Peer(broker)
    try:
        assert job_state(client, 3) == "done: "
    finally:
        client.close()
        broker.close()


def test_a_shared_frame_is_kept_once_and_collected_once_no_task_names_it(tmp_path):
    store = Store(str(tmp_path))
    for task_id in (1, 2):
        store.new_task(task_id, b"record", b"rest", b"state", (b"k" * 16, b"function"))
    store.new_task(3, b"record", b"all", b"state")
    assert store.commit() and store.fold()  # (into the database: see the journal's tests)
    assert store.payload(2) == (b"rest", b"function") and store.payload(3) == (b"all", None)
    count = "SELECT count(*) FROM blobs"
    assert store._db.execute(count).fetchone()[0] == 1
    store.forget_task(1)
    assert store.commit() and store.fold()
    store.collect_blobs()
    assert store._db.execute(count).fetchone()[0] == 1, "a blob task 2 names was deleted"
    store.forget_task(2)
    assert store.commit() and store.fold()
    store.collect_blobs()
    assert store._db.execute(count).fetchone()[0] == 0
    store.close()
