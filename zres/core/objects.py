"""An object as it is kept on an agent and moved between processes: a result's (or a put
value's) pickled frames in one file, written once and never changed, read with ``mmap``.

    offset 0    8 bytes   b"ZRESOBJ1"
    offset 8    8 bytes   n, the number of frames (little-endian)
    offset 16   8*n bytes each frame's length
    then        each frame, from a multiple of 64 bytes (zeros between)

The file's bytes are also what travels on the data ports (a fetch asks for a range of
them), so a reader rebuilds the frames from a copy in memory the same way. A frame is 64-
byte aligned so that a NumPy array unpickled from it (pickle protocol 5, out of band)
keeps its alignment. Readers map a file privately (copy on write): the buffers handed to
``loads`` are writable, and a task that writes to its input array changes nobody else's.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from collections.abc import Sequence
from typing import Any

MAGIC = b"ZRESOBJ1"
_ALIGN = 64
_U64 = struct.Struct("<Q")


class ObjectError(Exception):
    """A file or buffer is not an object, or not a whole one."""


def _layout(lengths: Sequence[int]) -> tuple[int, list[int]]:
    """The header's length and each frame's offset for frames of LENGTHS."""
    at = len(MAGIC) + 8 + 8 * len(lengths)
    offsets = []
    for length in lengths:
        at = -(-at // _ALIGN) * _ALIGN
        offsets.append(at)
        at += length
    return at, offsets


def header(frames: Sequence[Any]) -> bytes:
    """The header of an object made of FRAMES (buffers)."""
    lengths = [memoryview(f).nbytes for f in frames]
    return MAGIC + _U64.pack(len(lengths)) + b"".join(_U64.pack(n) for n in lengths)


def object_size(frames: Sequence[Any]) -> int:
    """The length of the object FRAMES make (its file's, and what a fetch moves)."""
    return _layout([memoryview(f).nbytes for f in frames])[0]


def parts(frames: Sequence[Any]) -> list[Any]:
    """The object's bytes, in order, as buffers to write (header, padding, frames)."""
    lengths = [memoryview(f).nbytes for f in frames]
    out: list[Any] = [header(frames)]
    at = len(out[0])
    for frame, offset, length in zip(frames, _layout(lengths)[1], lengths):
        if offset > at:
            out.append(bytes(offset - at))
        out.append(frame)
        at = offset + length
    return out


def frames_of(data: Any) -> list[memoryview]:
    """The frames of the object whose bytes are DATA (a buffer: an mmap, a bytearray),
    as views into it, no copy; ObjectError if it is not a whole object."""
    view = memoryview(data).cast("B")
    if view.nbytes < 16 or bytes(view[:8]) != MAGIC:
        raise ObjectError("not a zres object")
    count = _U64.unpack_from(view, 8)[0]
    if count > (view.nbytes - 16) // 8:
        raise ObjectError("a zres object's header is cut short")
    lengths = [_U64.unpack_from(view, 16 + 8 * i)[0] for i in range(count)]
    end, offsets = _layout(lengths)
    if end > view.nbytes:
        raise ObjectError(f"a zres object of {end} bytes has only {view.nbytes}")
    return [view[offset:offset + length] for offset, length in zip(offsets, lengths)]


def write_object(path: str, frames: Sequence[Any]) -> int:
    """Write the object FRAMES make at PATH (0600, never through a link; in place only
    once whole); return its size."""
    tmp = f"{path}.part-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        todo = [memoryview(p).cast("B") for p in parts(frames)]
        while todo:
            written = os.writev(fd, todo[:512])
            while written:  # (a short write leaves the rest of a part for the next)
                if written >= todo[0].nbytes:
                    written -= todo.pop(0).nbytes
                else:
                    todo[0], written = todo[0][written:], 0
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    return size


def map_object(path: str) -> mmap.mmap:
    """PATH's object mapped privately: copy on write, so its buffers are writable and
    nothing written reaches the file (FileNotFoundError if there is none)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise ObjectError(f"{path} is empty")
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def read_object(path: str) -> list[memoryview]:
    """The frames of the object at PATH, as views into a private mapping of it."""
    return frames_of(map_object(path))


class ObjectWriter:
    """An object's file filled a range at a time (chunks of a transfer, in any order),
    put in place at PATH by ``done`` once every byte of its SIZE has come."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        self._tmp = f"{path}.part-{secrets.token_hex(4)}"
        self._fd = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                           0o600)
        self._filled = 0
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            self.abandon()
            raise

    def write(self, offset: int, data: Any) -> None:
        """Put DATA at OFFSET (each range once)."""
        view = memoryview(data).cast("B")
        if offset < 0 or offset + view.nbytes > self.size:
            raise ObjectError(f"bytes {offset}..{offset + view.nbytes} are outside an "
                              f"object of {self.size}")
        while view.nbytes:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written
            self._filled += written

    def complete(self) -> bool:
        return self._filled >= self.size

    def done(self) -> None:
        """Check it is a whole object and put it in place."""
        try:
            with mmap.mmap(self._fd, self.size, prot=mmap.PROT_READ) as data:
                frames_of(data)
        except (ObjectError, ValueError) as exc:
            self.abandon()
            raise ObjectError(f"what came for {self.path} is not a whole object: {exc}") \
                from None
        os.close(self._fd)
        self._fd = -1
        os.rename(self._tmp, self.path)

    def abandon(self) -> None:
        """Drop what came (a transfer that failed)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass
