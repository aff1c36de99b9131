"""The state store's journal: a few Python tasks' changes are kept as one record a commit,
and a store opened after a crash finds them (``zres.broker.journal``)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.broker.test_keeping import broker_on, hello, kept_states, submit
from zres.broker.store import FILENAME, FOLD_AT, JOURNAL, Store
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(60)

# A broker's store in argv[1] keeps tasks 1-4 (three sharing a blob), changes 1, drops 2,
# each change a commit of its own (each a journal record), and is killed before any fold.
_CRASH = """import os, signal, sys
from zres.broker.store import Store
store = Store(sys.argv[1])
pad = b"p" * int(sys.argv[2])  # (in each task's payload)
for task_id in (1, 2):
    store.new_task(task_id, b"record", b"args%d" % task_id + pad, b"queued",
                   (b"k" * 16, b"fn"))
    assert store.commit()
store.new_task(3, b"record", b"all", b"queued")
assert store.commit()
store.put_task(1, b"done", b"result")
assert store.commit()
store.forget_task(2)
assert store.commit()
store.new_task(4, b"record", b"args4" + pad, b"queued", (b"k" * 16, b"fn"))  # (blob: kept)
assert store.commit()
assert store.dirty() is False and os.path.getsize(store._journal.path) > 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def crashed(state: Path, pad: int = 0) -> None:
    done = subprocess.run([sys.executable, "-c", _CRASH, str(state), str(pad)], timeout=30,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == -signal.SIGKILL


def test_tasks_kept_in_the_journal_are_found_after_a_crash(tmp_path):
    crashed(tmp_path)
    store = Store(str(tmp_path))
    try:
        assert [(i, state, result) for i, _, state, result in store.tasks()] == [
            (1, b"done", b"result"), (3, b"queued", None), (4, b"queued", None)]
        assert store.payload(1) == (b"args1", b"fn"), "the shared frame was not kept"
        assert store.payload(3) == (b"all", None)
        assert store.payload(4) == (b"args4", b"fn")
        assert os.path.getsize(tmp_path / JOURNAL) == 0, "not folded into the database"
    finally:
        store.close()
    store = Store(str(tmp_path))  # (and again: nothing applied twice, nothing lost)
    try:
        assert [i for i, *_ in store.tasks()] == [1, 3, 4]
    finally:
        store.close()


def test_a_torn_last_record_is_left_out_and_those_before_it_are_kept(tmp_path):
    crashed(tmp_path)
    journal = tmp_path / JOURNAL
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-3])  # (the last record, making task 4, cut short)
    store = Store(str(tmp_path))
    try:
        assert [(i, state) for i, _, state, _ in store.tasks()] == [
            (1, b"done"), (3, b"queued")]
    finally:
        store.close()
    other = tmp_path / "other"
    crashed(other)
    corrupt = bytearray((other / JOURNAL).read_bytes())
    corrupt[-1] ^= 0xFF  # (its body changed: its checksum does not match)
    (other / JOURNAL).write_bytes(bytes(corrupt))
    store = Store(str(other))
    try:
        assert [i for i, *_ in store.tasks()] == [1, 3]
    finally:
        store.close()


def test_records_already_folded_are_not_applied_again(tmp_path):
    """The fold and the journal's emptying are two steps: a crash between them leaves
    records the database holds; a start must not apply them over later changes."""
    store = Store(str(tmp_path))
    store.new_task(5, b"record", b"args", b"queued")
    assert store.commit()
    left = (tmp_path / JOURNAL).read_bytes()
    assert left and store.fold()
    store.forget_task(5)  # (dropped after the fold: in the next record)
    assert store.commit() and store.fold()
    store.close()
    (tmp_path / JOURNAL).write_bytes(left)  # (as if never emptied)
    store = Store(str(tmp_path))
    try:
        assert store.tasks() == [], "a folded record was applied again: task 5 is back"
        store.new_task(6, b"record", b"args", b"queued")  # (numbered after those seen)
        assert store.commit()
        store.close()
        store = Store(str(tmp_path))
        assert [i for i, *_ in store.tasks()] == [6]
    finally:
        store.close()


def test_large_changes_go_to_the_database_and_the_journal_is_folded_when_large(tmp_path):
    store = Store(str(tmp_path))
    try:
        store.new_task(1, b"record", b"x" * 100_000, b"queued")  # (written once, there)
        assert store.commit()
        assert os.path.getsize(tmp_path / JOURNAL) == 0
        task_id = 2
        while os.path.getsize(tmp_path / JOURNAL) < FOLD_AT:
            store.new_task(task_id, b"record", b"y" * 60_000, b"queued")
            assert store.commit()
            task_id += 1
        store.new_task(task_id, b"record", b"z", b"queued")
        assert store.commit()
        assert os.path.getsize(tmp_path / JOURNAL) == 0, "it grows without bound"
        assert len(store.tasks()) == task_id
    finally:
        store.close()


def test_the_database_catches_up_with_the_journal_within_a_heartbeat(tmp_path):
    """Another process reading the database (the sqlite3 shell) finds a short task's
    row once a heartbeat interval has passed."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    try:
        submit(client, 1)
        client.take(P.ACCEPTED)
        assert 1 in kept_states(tmp_path), "acknowledged before it was kept"
        assert os.path.getsize(tmp_path / JOURNAL) > 0, "(written to the journal)"
        deadline = time.monotonic() + broker.hb_interval * 4
        while os.path.getsize(tmp_path / JOURNAL) > 0:
            assert time.monotonic() < deadline, "the journal was not folded"
            client.step()
        assert [i for i, *_ in broker.store.tasks()] == [1]
    finally:
        client.close()
        broker.close()


def test_a_full_disk_refuses_a_commit_and_loses_nothing_acknowledged(tmp_path):
    """The database and the journal both full (a few pages, as a full disk): a commit
    that fits in neither fails, saying why, and is kept for the next try; every task a
    commit said was kept is found by the next start."""
    store = Store(str(tmp_path), max_pages=8)
    kept: list[int] = []
    task_id = 0
    while True:
        task_id += 1
        store.new_task(task_id, b"record", os.urandom(1500), b"queued")
        if not store.commit():
            break
        kept.append(task_id)
        assert task_id < 1000, "a few pages took a thousand tasks"
    assert kept and store.error and "full" in store.error
    assert store.dirty(), "the refused change was dropped"
    size = os.path.getsize(tmp_path / JOURNAL)
    assert not store.commit() and os.path.getsize(tmp_path / JOURNAL) == size, \
        "a refused record was left in the journal, in part or whole"
    store._journal.close()  # (a crash: nothing more is written)
    store._db.close()
    store._unlock()
    again = Store(str(tmp_path))
    try:
        assert [i for i, *_ in again.tasks()] == kept
    finally:
        again.close()


def test_a_journal_left_beside_another_database_is_never_applied_to_it(tmp_path):
    """A crash left records; then the database was replaced (restored, discarded by an
    older version's --fresh, deleted by hand) and the journal was not: its records are
    not this database's, and none is applied."""
    crashed(tmp_path)
    for name in os.listdir(tmp_path):
        if name.startswith(FILENAME):
            os.remove(tmp_path / name)
    store = Store(str(tmp_path))
    try:
        assert store.tasks() == [], "another database's tasks were applied to this one"
        assert os.path.getsize(tmp_path / JOURNAL) == 0
        store.new_task(9, b"record", b"args", b"queued")  # (its own journal works)
        assert store.commit()
    finally:
        store.close()


def test_a_start_on_a_full_disk_keeps_the_journals_tasks_and_says_why(tmp_path):
    """A crash left records, and the disk is full when the broker starts again: it starts
    (as on a full disk before the journal), its tasks all there, its error naming the
    disk, and folds them once there is room."""
    crashed(tmp_path, pad=20_000)  # (rows that need pages of their own)
    pages = sqlite3.connect(tmp_path / FILENAME).execute("PRAGMA page_count").fetchone()[0]
    store = Store(str(tmp_path), max_pages=pages)  # (not a page more: full)
    try:
        assert store.error and "full" in store.error
        assert [i for i, *_ in store.tasks()] == [1, 3, 4]
        assert store.payload(4) == (b"args4" + b"p" * 20_000, b"fn")
        assert os.path.getsize(tmp_path / JOURNAL) > 0, "dropped though not folded"
    finally:
        store._journal.close()  # (a crash again: nothing more written)
        store._db.close()
        store._unlock()
    store = Store(str(tmp_path))
    try:
        assert store.error is None and [i for i, *_ in store.tasks()] == [1, 3, 4]
        assert os.path.getsize(tmp_path / JOURNAL) == 0
    finally:
        store.close()
