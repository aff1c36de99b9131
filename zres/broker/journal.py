"""The state store's journal: an append-only file of checksummed records, one for each
commit that changed only a few Python tasks, folded into the database in batches.

Why: such a commit is the broker's most frequent (a short task's submit, then its
result), and one SQLite statement costs 60-70 us in the loop (locks on the ``-shm`` file,
two page writes, cold after each idle moment), twice on every task's round trip. One
``write(2)`` of a record costs a few. It is as durable as those statements were: written,
not fsynced (it survives the broker's crash and an OOM kill; the database's next fsync
does not cover it, a power cut may lose its tail, as the database's unsynced log would).

A record is its body's length (4 bytes), a CRC-32 of the journal's key, its sequence
number and body (4), its sequence number (8) and its body. The key is the database's own
(kept in it): records a journal left beside another database (one replaced, or discarded
by an older version) do not check, and are never applied to this one. A record written
only in part (the disk full mid-write) is cut off again at once, so a torn or corrupt
record can only be the last, from a crash mid-write: reading stops there. The store
writes the sequence number of the last record it folded into the database in the same
transaction as the fold: a record at or below it is not applied again, whether or not
the file was emptied after the fold.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import struct
import weakref
import zlib
from collections.abc import Iterator

import msgpack

_HEAD = struct.Struct("<IIQ")  # body length, CRC-32 of (sequence number, body), sequence


class Journal:
    """The journal at PATH (made 0600 if missing) of the database whose KEY it is; LIMIT:
    bytes it may hold (0: no limit but the disk's), as the store's page cap limits the
    database."""

    def __init__(self, path: str, key: bytes, limit: int = 0) -> None:
        self.path = path
        self.keyed = bool(key)  # (no key: the database could not keep one; not used)
        self._key = zlib.crc32(key)
        self._limit = limit
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o600)
        self.close = weakref.finalize(self, os.close, self._fd)  # (once; or when collected)
        os.fchmod(self._fd, 0o600)
        self.size = os.fstat(self._fd).st_size
        self.torn = False  # (part of a record could not be cut off: write no more after it)

    def records(self) -> Iterator[tuple[int, bytes]]:
        """Each whole record from the start, as (sequence number, body), up to the first
        torn or corrupt one."""
        data = os.pread(self._fd, self.size, 0)
        at = 0
        while at + _HEAD.size <= len(data):
            length, crc, seq = _HEAD.unpack_from(data, at)
            body = data[at + _HEAD.size:at + _HEAD.size + length]
            if len(body) < length or zlib.crc32(
                    body, zlib.crc32(data[at + 8:at + 16], self._key)) != crc:
                return
            yield seq, body
            at += _HEAD.size + length

    def append(self, seq: int, body: bytes) -> None:
        """Add the record SEQ (BODY) at the end; raise OSError if it is not all written
        (what was written of it is cut off again)."""
        packed_seq = struct.pack("<Q", seq)
        record = struct.pack("<II", len(body), zlib.crc32(
            body, zlib.crc32(packed_seq, self._key))) + packed_seq + body
        if self.torn:
            raise OSError(errno.EIO, "the state's journal ends in a torn record")
        if self._limit and self.size + len(record) > self._limit:
            raise OSError(errno.ENOSPC, "database or disk is full (the state's journal)")
        try:
            written = os.write(self._fd, record)
        except OSError:
            self._cut()
            raise
        if written != len(record):
            self._cut()
            raise OSError(errno.ENOSPC, "a record of the state's journal was written in part")
        self.size += written

    def clear(self) -> None:
        """Empty the file (every record is in the database)."""
        os.ftruncate(self._fd, 0)
        self.size, self.torn = 0, False

    def _cut(self) -> None:
        try:
            os.ftruncate(self._fd, self.size)
        except OSError:
            self.torn = True  # (until a fold empties the file)


def journal_key(db: sqlite3.Connection) -> bytes:
    """The database DB's key for its journal, made and kept in it on its first start; b""
    where it cannot be kept (a full disk): no journal then, for this start."""
    row = db.execute("SELECT value FROM meta WHERE key = 'journal_key'").fetchone()
    if row is not None:
        return bytes(msgpack.unpackb(row[0]))
    try:
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?)",
                   ("journal_key", msgpack.packb(key := os.urandom(8))))
    except sqlite3.Error:
        return b""
    return key
