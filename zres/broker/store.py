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
cut, not only a crash); one that changes only Python tasks is not (see ``commit``).
Whatever tells a submitter that its job was accepted waits for that commit. A commit
that fails (disk full, directory gone) keeps its changes for the next try and is
reported in ``error``: the broker then refuses new jobs, naming why, and serves the rest.

The database holds task pickles and job commands and environments: it and its ``-wal`` and
``-shm`` files are 0600 whatever the directory's mode (a directory made by ``mkdir`` or
systemd is 0755), and a directory others may read or write is warned about at start.

One broker at a time keeps its state in a directory (``state_lock``). Other programs (the
``sqlite3`` shell) may read the database while it runs.
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import time
import weakref
from typing import Any

import msgpack

from ..logs import get_logger
from . import state_lock

log = get_logger("zres.broker")

FILENAME = "state.sqlite3"
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
        _warn_if_open(self.directory)
        self.path = os.path.join(self.directory, FILENAME)
        # (before anything is read or discarded: another broker's state is left alone)
        lock = state_lock.hold(self.directory)
        # (let go of with the store: by close(), or when a store never closed is collected)
        self._unlock = weakref.finalize(self, os.close, lock)
        try:
            self._open(fresh, max_pages)
        except BaseException:
            if hasattr(self, "_db"):
                self._db.close()
            self._unlock()
            raise
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
        # Wall-clock time of the last commit (at start: of the files' last change).
        self.last_commit: float | None = max(
            (os.path.getmtime(p) for p in (self.path, self.path + "-wal")
             if os.path.exists(p)), default=None)
        self.error: str | None = None           # why the last commit failed, if it did

    def _open(self, fresh: bool, max_pages: int) -> None:
        """Open (FRESH: first discard) the database, making what is missing."""
        self.discarded: dict[str, int] = {}
        if fresh:
            self.discarded = _discard(self.path)
        # SQLite makes the -wal and -shm files with the database's own mode; the umask
        # covers any it makes before it looks (it is this process's for a moment only).
        _private_files(self.path)
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
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB)")
        self._db.execute("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, "
                         "record BLOB NOT NULL)")
        # (one b-tree, keyed by the digest: no rowid table beside an index)
        self._db.execute("CREATE TABLE IF NOT EXISTS envs (key TEXT PRIMARY KEY, "
                         "env BLOB NOT NULL) WITHOUT ROWID")
        # A task's record (what it is: written once), its state (what became of it) and
        # its result.
        self._db.execute("CREATE TABLE IF NOT EXISTS tasks (id INTEGER PRIMARY KEY, "
                         "record BLOB NOT NULL, payload BLOB, state BLOB, result BLOB)")
        self._db.execute("CREATE TABLE IF NOT EXISTS actors (id TEXT PRIMARY KEY, "
                         "record BLOB NOT NULL, spawn BLOB)")
        # A frame many tasks share (a map's pickled function), kept once, by its digest:
        # a task's row names it (``blob``) instead of holding it.
        self._db.execute("CREATE TABLE IF NOT EXISTS blobs (key BLOB PRIMARY KEY, "
                         "data BLOB NOT NULL)")
        if "blob" not in {row[1] for row in self._db.execute("PRAGMA table_info(tasks)")}:
            self._db.execute("ALTER TABLE tasks ADD COLUMN blob BLOB")  # (an older store)
        if max_pages:  # (after the tables: a full disk cannot stop a start here)
            self._db.execute(f"PRAGMA max_page_count={int(max_pages)}")

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
        one by one, as they are needed: see ``payload``)."""
        return self._db.execute(
            "SELECT id, record, state, result FROM tasks ORDER BY id").fetchall()

    def actors(self) -> list[tuple[str, bytes, bytes]]:
        """Every actor kept: (id, record, construction frames)."""
        return self._db.execute("SELECT id, record, spawn FROM actors").fetchall()

    def payload(self, task_id: int) -> tuple[bytes | None, bytes | None]:
        """The payload kept for TASK_ID, if any, and the blob its first frame is kept as
        (None: none, the payload holds every frame)."""
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
        key = None
        if blob is not None:
            key = blob[0]
            if key not in self._blob_keys:
                self._blob_keys.add(key)
                self._new_blobs[key] = blob[1]
        self._new_tasks[task_id] = [record, payload, state, None, key]

    def put_task(self, task_id: int, state: bytes, result: bytes | None) -> None:
        """Keep a task's new STATE and RESULT (None: none kept) at the next commit."""
        fresh = self._new_tasks.get(task_id)
        if fresh is not None:
            fresh[2], fresh[3] = state, result
        else:
            self._changed_tasks[task_id] = (state, result)

    def forget_task(self, task_id: int) -> None:
        """Drop TASK_ID's record at the next commit."""
        if self._new_tasks.pop(task_id, None) is None:
            self._changed_tasks.pop(task_id, None)
            self._dropped_tasks.add(task_id)

    def put_actor(self, actor_id: str, record: bytes, spawn: bytes) -> None:
        """Keep an actor's RECORD and construction frames (SPAWN) at the next commit."""
        self._dropped_actors.discard(actor_id)
        self._actors[actor_id] = (record, spawn)

    def forget_actor(self, actor_id: str) -> None:
        """Drop ACTOR_ID's record (it ended) at the next commit."""
        self._actors.pop(actor_id, None)
        self._dropped_actors.add(actor_id)

    def dirty(self) -> bool:
        return bool(self._meta or self._jobs or self._forget or self._new_tasks
                    or self._new_blobs
                    or self._changed_tasks or self._dropped_tasks or self._actors
                    or self._dropped_actors or self._envs or self._dropped_envs)

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
        """Write what changed since the last commit, in one transaction; False if it could
        not be written (kept for the next try, and the reason in ``error``)."""
        if not self.dirty():
            return self.error is None
        # Jobs, actors and ids are fsynced (they survive a power cut); a turn that changed only
        # Python tasks is written to the log without an fsync of its own (it survives the
        # broker's crash, an OOM kill, a clean reboot; the next fsync covers it): an fsync
        # costs ~0.4 ms, several times a short task's own cost here.
        sync = "FULL" if self._meta or self._jobs or self._forget or self._actors \
            or self._dropped_actors or self._envs or self._dropped_envs else "NORMAL"
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
        if self.error is not None:
            log.info("state_commit_recovered", dir=self.directory)
        self.error = None
        for pending in (self._meta, self._jobs, self._forget, self._new_tasks,
                        self._new_blobs,
                        self._changed_tasks, self._dropped_tasks, self._actors,
                        self._dropped_actors, self._envs, self._dropped_envs):
            pending.clear()
        self.last_commit = time.time()
        return True

    def collect_blobs(self) -> None:
        """Delete the blobs no kept task names any more (a walk of the task table: run
        while it is small; nothing else waits on the disk then)."""
        if self.dirty() or self.error is not None:
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
        """Bytes on disk: the database and its write-ahead log."""
        return sum(os.path.getsize(p) for p in (self.path, self.path + "-wal")
                   if os.path.exists(p))

    def describe(self) -> dict[str, Any]:
        return {"dir": self.directory, "bytes": self.size(), "last_commit": self.last_commit,
                "error": self.error}

    def close(self) -> None:
        try:
            self.commit()
            self._db.close()
        finally:
            self._unlock()  # (another broker may start on the directory now; once only)


def _warn_if_open(directory: str) -> None:
    """Warn when others may read or write DIRECTORY (they could list, or replace, the
    database's files)."""
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o066:
        log.warning("state_dir_not_private", dir=directory, mode=f"{mode:04o}",
                    why="others may read or write it; its files are 0600, but chmod 700 it")


def _private_files(path: str) -> None:
    """Make the database at PATH (0600, if missing) and its -wal and -shm files, if any,
    readable by this user only; never through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        try:
            fd = os.open(path + suffix, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _discard(path: str) -> dict[str, int]:
    """Delete the database at PATH; return what it held (jobs by state)."""
    if not os.path.exists(path):
        return {}
    held: dict[str, int] = {}
    try:
        db = sqlite3.connect(path)
        for (record,) in db.execute("SELECT record FROM jobs"):
            state = f"jobs {msgpack.unpackb(record).get('state', '?')}"
            held[state] = held.get(state, 0) + 1
        for table, what in (("tasks", "Python tasks"), ("actors", "actors")):
            exists = db.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,))
            if exists.fetchone()[0]:
                count = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if count:
                    held[what] = count
        db.close()
    except sqlite3.Error:
        held["unreadable"] = 1
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return held
