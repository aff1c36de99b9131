"""The broker's state on disk: an SQLite database (Python's own ``sqlite3``, WAL mode).

What it keeps, so that a restarted broker (after a crash, an upgrade, a reboot) carries
on as the same cluster:
- the cluster's identity (job logs are kept under it);
- a ceiling under which task ids have been handed out: a restarted broker starts above
  it, so task ids, job ids and job log paths never repeat;
- the job table: every command job with what it needs to run (its command, resources,
  priority) and how it ended; the environments jobs exported from their submitters, each
  once however many queued and running jobs use it (``envs``, named by a digest that the
  jobs' records hold: see ``job_envs``); a multi-node job's record also keeps its ranks
  ([grant id, agent, state, exit code, GPUs]) and its master's [address, port];
- the Python tasks its clients hold: each one's call (the pickled payload), options,
  dependencies and owner, whether an agent holds it, and how it ended, with its result
  when that is small, the placement group it makes or the bundle it runs in
  (``keeping``);
- the actors: each one's class, options, placement (and bundle) and construction call
  (``actor_keeping``; their constructions and calls are kept as Python tasks);
- the live placement groups, as one map in ``meta`` (``placement_groups``: id -> record:
  bundles, strategy, owner, restarts, state, and where each bundle is: agent, slot
  index, GPU positions; see ``gangs.keeping``).

Changes are collected during a loop turn and committed once at its end (group commit).
A commit that changes jobs or ids is fsynced (``synchronous=FULL``: it survives a power
cut, not only a crash); one that changes only Python tasks is not (see ``commit``). One
that changes only a few Python tasks (a short task's submit, its result) is appended to
the journal (``journal``: ``state.journal``) instead, a record a write, and the journal
is folded into the database in one transaction once a heartbeat, when it grows large,
and with any other commit; a start applies what it holds beyond the last fold.
Whatever tells a submitter that its job was accepted waits for that commit. A commit
that fails (disk full, directory gone) keeps its changes for the next try and is
reported in ``error``: the broker then refuses new jobs, naming why, and serves the rest.

The database holds task pickles and job commands and environments: it and its ``-wal`` and
``-shm`` files are 0600 whatever the directory's mode (a directory made by ``mkdir`` or
systemd is 0755), and a directory others may read or write is warned about at start.

One broker at a time keeps its state in a directory (``state_lock``). Other programs (the
``sqlite3`` shell) may read the database while it runs: it is behind by what the journal
holds, a heartbeat interval's tasks at most.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
import weakref
from typing import Any

import msgpack

from ..logs import get_logger
from . import state_lock
from .journal import Journal, journal_key
from .state_files import discard, make_tables, private_files, warn_if_open

log = get_logger("zres.broker")

FILENAME = "state.sqlite3"
JOURNAL = "state.journal"
# A commit of Python tasks only, at most this many changes and bytes (a large submit's
# would be written twice), is a journal record while the journal is under FOLD_AT bytes
# (folded then: bounded memory for its rows, bounded work for a restart).
_JOURNAL_OPS = 64
_JOURNAL_BYTES = 64 << 10
FOLD_AT = 1 << 20
ID_BLOCK = 100_000  # task ids reserved per write of the ceiling


class StateUnwritable(Exception):
    """The broker cannot write its state: what it would have to keep is refused."""


class Store:
    """The state database in DIRECTORY (created 0700 if missing). FRESH: discard what it
    held (``discarded`` then says what). MAX_PAGES caps the database's size in pages, as a
    full disk would."""

    def __init__(self, directory: str, fresh: bool = False, max_pages: int = 0) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        warn_if_open(self.directory)
        self.path = os.path.join(self.directory, FILENAME)
        # (before anything is read or discarded: another broker's state is left alone)
        lock = state_lock.hold(self.directory)
        # (let go of with the store: by close(), or when a store never closed is collected)
        self._unlock = weakref.finalize(self, os.close, lock)
        self._meta: dict[str, Any] = {}
        self._jobs: dict[int, dict[str, Any]] = {}
        self._forget: set[int] = set()
        self._envs: dict[str, dict[str, str]] = {}
        self._dropped_envs: set[str] = set()
        # Tasks new this turn (record, payload, state, result) and older ones changed
        # (state, result): a task written and dropped within one turn never reaches the
        # disk.
        self._new_tasks: dict[int, list[Any]] = {}
        self._new_blobs: dict[bytes, Any] = {}
        self._blob_keys: set[bytes] = set()  # blobs written, or to be at the next commit
        self._changed_tasks: dict[int, tuple[bytes, bytes | None]] = {}
        self._dropped_tasks: set[int] = set()
        self._actors: dict[str, tuple[bytes, bytes]] = {}   # actor id -> record, spawn
        self._dropped_actors: set[str] = set()
        # This turn's task changes, for the journal (the task rows above also hold those
        # journaled and not yet folded), and about how many bytes they carry.
        self._ops: list[list[Any]] = []
        self._ops_bytes = 0
        self.error: str | None = None           # why the last commit failed, if it did
        try:
            self._open(fresh, max_pages)
            self._journal = Journal(os.path.join(self.directory, JOURNAL), journal_key(self._db),
                                    max_pages * self._db.execute("PRAGMA page_size")
                                    .fetchone()[0])
            # Wall-clock time of the last commit (at start: of the files' last change).
            self.last_commit: float | None = max(
                (os.path.getmtime(p) for p in (self.path, self.path + "-wal",
                                               self._journal.path)
                 if os.path.exists(p)), default=None)
            self._seq = self._replay()  # (the journal's last record)
        except BaseException:
            if hasattr(self, "_db"):
                self._db.close()
            self._unlock()
            raise

    def _open(self, fresh: bool, max_pages: int) -> None:
        """Open (FRESH: first discard) the database, making what is missing."""
        self.discarded: dict[str, int] = {}
        if fresh:
            self.discarded = discard(self.path, os.path.join(self.directory, JOURNAL))
        # SQLite makes the -wal and -shm files with the database's own mode; the umask
        # covers any it makes before it looks (it is this process's for a moment only).
        private_files(self.path)
        mask = os.umask(0o077)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(mask)
        self._db.execute("PRAGMA synchronous=FULL")
        self._sync = "FULL"
        # Fewer, larger checkpoints (each one fsyncs): the log may grow to ~40 MB.
        self._db.execute("PRAGMA wal_autocheckpoint=10000")
        make_tables(self._db, max_pages)

    # -- reading, at start-up -----------------------------------------------------------
    def meta(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else msgpack.unpackb(row[0])

    def jobs(self) -> list[dict[str, Any]]:
        """Every job kept, in id order."""
        return [msgpack.unpackb(record) for (record,) in
                self._db.execute("SELECT record FROM jobs ORDER BY id")]

    def envs(self) -> dict[str, dict[str, str]]:
        """Every job environment kept, by its key."""
        return {key: msgpack.unpackb(env) for key, env in
                self._db.execute("SELECT key, env FROM envs")}

    def tasks(self) -> list[tuple[int, bytes, bytes, bytes | None]]:
        """Every task kept: (id, record, state, result), in id order (payloads are read
        one by one, as they are needed: see ``payload``), with those of the journal that
        a start could not fold (a full disk)."""
        rows = {i: (i, *rest) for i, *rest in self._db.execute(
            "SELECT id, record, state, result FROM tasks")}
        for i, (state, result) in self._changed_tasks.items():
            if i in rows:
                rows[i] = (i, rows[i][1], state, result)
        for i in self._dropped_tasks:
            rows.pop(i, None)
        rows.update((i, (i, new[0], new[2], new[3])) for i, new in self._new_tasks.items())
        return [rows[i] for i in sorted(rows)]

    def actors(self) -> list[tuple[str, bytes, bytes]]:
        """Every actor kept: (id, record, construction frames)."""
        return self._db.execute("SELECT id, record, spawn FROM actors").fetchall()

    def payload(self, task_id: int) -> tuple[bytes | None, bytes | None]:
        """The payload kept for TASK_ID, if any, and the blob its first frame is kept as
        (None: none, the payload holds every frame)."""
        if (new := self._new_tasks.get(task_id)) is not None:  # (not folded yet)
            key = new[4]
            if key is None or key in self._new_blobs:
                return new[1], None if key is None else self._new_blobs[key]
            row = self._db.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
            return new[1], None if row is None else row[0]
        row = self._db.execute("SELECT t.payload, b.data FROM tasks t LEFT JOIN blobs b ON "
                               "b.key = t.blob WHERE t.id = ?", (task_id,)).fetchone()
        return (None, None) if row is None else (row[0], row[1])

    def cluster_id(self) -> str:
        """This cluster's identity: made (12 hex digits) and kept on first start."""
        known = self.meta("cluster")
        if isinstance(known, str):
            return known
        made = f"{random.getrandbits(48):012x}"
        self.set_meta("cluster", made)
        if not self.commit():
            raise OSError(f"cannot write the broker's state in {self.directory}: "
                          f"{self.error}")
        return made

    # -- writing --------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._meta[key] = value

    def put_job(self, record: dict[str, Any]) -> None:
        """Keep RECORD (a job's, with its ``id``) at the next commit."""
        self._jobs[int(record["id"])] = record

    def put_env(self, key: str, env: dict[str, str]) -> None:
        """Keep a job environment under KEY at the next commit."""
        self._dropped_envs.discard(key)
        self._envs[key] = env

    def forget_env(self, key: str) -> None:
        """Drop the job environment KEY (no job uses it any more) at the next commit."""
        self._envs.pop(key, None)
        self._dropped_envs.add(key)  # (a row that is not there costs nothing to delete)

    def new_task(self, task_id: int, record: bytes, payload: bytes, state: bytes,
                 blob: tuple[bytes, Any] | None = None) -> None:
        """Keep a new task at the next commit; BLOB (its digest and data) is its payload's
        first frame, kept once for every task that shares it."""
        key = data = None
        if blob is not None:
            key = blob[0]
            if key not in self._blob_keys:
                self._blob_keys.add(key)
                self._new_blobs[key] = data = blob[1]
        self._new_tasks[task_id] = [record, payload, state, None, key]
        self._ops.append(["n", task_id, record, payload, state, key, data])  # (data: once)
        self._ops_bytes += len(record) + len(payload) + len(state) + (len(data) if data else 0)

    def put_task(self, task_id: int, state: bytes, result: bytes | None) -> None:
        """Keep a task's new STATE and RESULT (None: none kept) at the next commit."""
        fresh = self._new_tasks.get(task_id)
        if fresh is not None:
            fresh[2], fresh[3] = state, result
        else:
            self._changed_tasks[task_id] = (state, result)
        self._ops.append(["c", task_id, state, result])
        self._ops_bytes += len(state) + (len(result) if result else 0)

    def forget_task(self, task_id: int) -> None:
        """Drop TASK_ID's record at the next commit."""
        if self._new_tasks.pop(task_id, None) is None:
            self._changed_tasks.pop(task_id, None)
            self._dropped_tasks.add(task_id)
        self._ops.append(["d", task_id])

    def put_actor(self, actor_id: str, record: bytes, spawn: bytes) -> None:
        """Keep an actor's RECORD and construction frames (SPAWN) at the next commit."""
        self._dropped_actors.discard(actor_id)
        self._actors[actor_id] = (record, spawn)

    def forget_actor(self, actor_id: str) -> None:
        """Drop ACTOR_ID's record (it ended) at the next commit."""
        self._actors.pop(actor_id, None)
        self._dropped_actors.add(actor_id)

    def dirty(self) -> bool:
        """Whether something changed that is not kept yet (in the database or journal)."""
        return bool(self._ops or self._beyond_tasks())

    def _beyond_tasks(self) -> bool:
        """Whether something other than Python tasks changed (the journal keeps tasks)."""
        return bool(self._meta or self._jobs or self._forget or self._actors
                    or self._dropped_actors or self._envs or self._dropped_envs)

    def _unfolded(self) -> bool:
        return bool(self._new_tasks or self._new_blobs or self._changed_tasks
                    or self._dropped_tasks)

    def reserve_ids(self, above: int) -> int:
        """Note that task ids up to a new ceiling over ABOVE may be handed out, durably,
        before any is; return the ceiling."""
        ceiling = above + ID_BLOCK
        self.set_meta("id_ceiling", ceiling)
        if not self.commit():
            log.error("state_not_written", dir=self.directory, error=self.error,
                      what="the task id ceiling; ids may repeat after a restart")
        return ceiling

    def commit(self) -> bool:
        """Keep what changed since the last commit: a few Python tasks' changes as one
        record of the journal, anything else in one transaction of the database, with what
        the journal holds; False if it could not be written (kept for the next try, and the
        reason in ``error``)."""
        if not self.dirty():
            return self.error is None
        if len(self._ops) <= _JOURNAL_OPS and self._ops_bytes <= _JOURNAL_BYTES \
                and self._journal.size < FOLD_AT and self._journal.keyed \
                and not self._beyond_tasks():
            try:
                self._journal.append(self._seq + 1, msgpack.packb(self._ops))
            except OSError:
                pass  # (a full disk, a torn record left: the database may take it)
            else:
                self._seq += 1
                self._ops.clear()
                self._ops_bytes = 0
                self._committed()
                return True
        return self.fold()

    def fold(self) -> bool:
        """Write every change not in the database yet (the journal's too), in one
        transaction, then empty the journal; False as ``commit``."""
        if not (self.dirty() or self._unfolded() or self._journal.size):
            return self.error is None
        # Jobs, actors and ids are fsynced (they survive a power cut); a turn that changed only
        # Python tasks is written to the log without an fsync of its own (it survives the
        # broker's crash, an OOM kill, a clean reboot; the next fsync covers it): an fsync
        # costs ~0.4 ms, several times a short task's own cost here.
        sync = "FULL" if self._meta or self._jobs or self._forget or self._actors \
            or self._dropped_actors or self._envs or self._dropped_envs else "NORMAL"
        if self._journal.size:  # (its records up to this one are in: not applied again)
            self._meta["journal_seq"] = self._seq
        writes = [(sql, rows) for sql, rows in (
            ("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
             [(k, msgpack.packb(v)) for k, v in self._meta.items()]),
            ("INSERT OR REPLACE INTO jobs (id, record) VALUES (?, ?)",
             [(i, msgpack.packb(r)) for i, r in self._jobs.items()]),
            ("DELETE FROM jobs WHERE id = ?", [(i,) for i in self._forget]),
            ("INSERT OR REPLACE INTO envs (key, env) VALUES (?, ?)",
             [(k, msgpack.packb(e)) for k, e in self._envs.items()]),
            ("DELETE FROM envs WHERE key = ?", [(k,) for k in self._dropped_envs]),
            ("INSERT OR IGNORE INTO blobs (key, data) VALUES (?, ?)",
             list(self._new_blobs.items())),
            ("INSERT OR REPLACE INTO tasks (id, record, payload, state, result, blob) "
             "VALUES (?, ?, ?, ?, ?, ?)", [(i, *row) for i, row in self._new_tasks.items()]),
            ("UPDATE tasks SET state = ?, result = ? WHERE id = ?",
             [(st, r, i) for i, (st, r) in self._changed_tasks.items()]),
            ("DELETE FROM tasks WHERE id = ?", [(i,) for i in self._dropped_tasks]),
            ("INSERT OR REPLACE INTO actors (id, record, spawn) VALUES (?, ?, ?)",
             [(i, *row) for i, row in self._actors.items()]),
            ("DELETE FROM actors WHERE id = ?", [(i,) for i in self._dropped_actors]))
            if rows]  # (an empty one would still cost a statement's preparation)
        try:
            if sync != self._sync:
                self._db.execute(f"PRAGMA synchronous={sync}")
                self._sync = sync
            if len(writes) == 1 and len(writes[0][1]) == 1:
                # One row (as when a turn ended one task): a statement is a transaction of
                # its own, as atomic and as durable, without a BEGIN and a COMMIT to run.
                self._db.execute(writes[0][0], writes[0][1][0])
            else:
                self._db.execute("BEGIN")
                for sql, rows in writes:
                    self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # no transaction was left open
            if self.error is None:
                log.error("state_commit_failed", dir=self.directory, error=str(exc))
            self.error = str(exc)
            return False
        for pending in (self._meta, self._jobs, self._forget, self._new_tasks,
                        self._new_blobs,
                        self._changed_tasks, self._dropped_tasks, self._actors,
                        self._dropped_actors, self._envs, self._dropped_envs, self._ops):
            pending.clear()
        self._ops_bytes = 0
        if self._journal.size or self._journal.torn:
            try:
                self._journal.clear()
            except OSError as exc:  # (its records are folded: a start skips them)
                log.warning("state_journal_not_emptied", dir=self.directory, error=str(exc))
        self._committed()
        return True

    def _committed(self) -> None:
        if self.error is not None:
            log.info("state_commit_recovered", dir=self.directory)
        self.error = None
        self.last_commit = time.time()

    def _replay(self) -> int:
        """Apply the journal's records beyond the last fold, fold them; return the last
        record's sequence number."""
        folded = last = self.meta("journal_seq", 0)
        applied = 0
        for seq, body in self._journal.records():
            last = max(last, seq)
            if seq <= folded:
                continue
            applied += 1
            for op in msgpack.unpackb(body):
                if op[0] == "n":
                    task_id, record, payload, state, key, blob = op[1:]
                    if blob is not None:
                        self._blob_keys.add(key)
                        self._new_blobs[key] = blob
                    self._new_tasks[task_id] = [record, payload, state, None, key]
                elif op[0] == "c":
                    self.put_task(op[1], op[2], op[3])
                else:
                    self.forget_task(op[1])
        self._seq = last
        if applied:
            log.info("state_journal_replayed", dir=self.directory, records=applied)
        self.fold()  # (failing, on a full disk: kept, as any commit's, and ``error`` says so)
        return last

    def collect_blobs(self) -> None:
        """Delete the blobs no kept task names any more (a walk of the task table: run
        while it is small; nothing else waits on the disk then)."""
        if self.dirty() or self._unfolded() or self.error is not None:
            return
        try:
            self._db.execute("DELETE FROM blobs WHERE key NOT IN "
                             "(SELECT blob FROM tasks WHERE blob IS NOT NULL)")
        except sqlite3.Error as exc:
            log.warning("state_blobs_not_collected", dir=self.directory, error=str(exc))
            return
        self._blob_keys.clear()

    def forget_job(self, job_id: int) -> None:
        """Drop the record of JOB_ID (a finished job past what is remembered)."""
        self._jobs.pop(job_id, None)
        self._forget.add(job_id)

    def size(self) -> int:
        """Bytes on disk: the database, its write-ahead log and the journal."""
        return self._journal.size + sum(os.path.getsize(p) for p in (
            self.path, self.path + "-wal") if os.path.exists(p))

    def describe(self) -> dict[str, Any]:
        return {"dir": self.directory, "bytes": self.size(), "last_commit": self.last_commit,
                "error": self.error}

    def close(self) -> None:
        try:
            self.commit()
            self.fold()
            self._journal.close()
            self._db.close()
        finally:
            self._unlock()  # (another broker may start on the directory now; once only)
