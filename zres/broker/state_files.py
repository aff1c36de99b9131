"""The state directory's files: the database's tables, the files readable by the broker's
user only, and discarded whole (``zres broker --fresh``), saying what they held."""

from __future__ import annotations

import os
import sqlite3
import stat

import msgpack

from ..logs import get_logger

log = get_logger("zres.broker")

def warn_if_open(directory: str) -> None:
    """Warn when others may read or write DIRECTORY (they could list, or replace, the
    database's files)."""
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o066:
        log.warning("state_dir_not_private", dir=directory, mode=f"{mode:04o}",
                    why="others may read or write it; its files are 0600, but chmod 700 it")


def private_files(path: str) -> None:
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


def discard(path: str, journal: str) -> dict[str, int]:
    """Delete the database at PATH and its JOURNAL; return what the database held (jobs
    by state)."""
    if os.path.exists(journal):
        os.remove(journal)
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


def make_tables(db: sqlite3.Connection, max_pages: int) -> None:
    """Make what is missing of the database DB's tables (MAX_PAGES: cap its size, in
    pages, as a full disk would)."""
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB)")
    db.execute("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, "
               "record BLOB NOT NULL)")
    # (one b-tree, keyed by the digest: no rowid table beside an index)
    db.execute("CREATE TABLE IF NOT EXISTS envs (key TEXT PRIMARY KEY, "
               "env BLOB NOT NULL) WITHOUT ROWID")
    # A task's record (what it is: written once), its state (what became of it) and
    # its result.
    db.execute("CREATE TABLE IF NOT EXISTS tasks (id INTEGER PRIMARY KEY, "
               "record BLOB NOT NULL, payload BLOB, state BLOB, result BLOB)")
    db.execute("CREATE TABLE IF NOT EXISTS actors (id TEXT PRIMARY KEY, "
               "record BLOB NOT NULL, spawn BLOB)")
    # A frame many tasks share (a map's pickled function), kept once, by its digest:
    # a task's row names it (``blob``) instead of holding it.
    db.execute("CREATE TABLE IF NOT EXISTS blobs (key BLOB PRIMARY KEY, "
               "data BLOB NOT NULL)")
    if "blob" not in {row[1] for row in db.execute("PRAGMA table_info(tasks)")}:
        db.execute("ALTER TABLE tasks ADD COLUMN blob BLOB")  # (an older store)
    if max_pages:  # (after the tables: a full disk cannot stop a start here)
        db.execute(f"PRAGMA max_page_count={int(max_pages)}")
