"""An object as it is kept on an agent and moved between processes: a result's (or a put
value's) pickled frames in one file, written once and never changed, read with ``mmap``.

    offset 0    8 bytes   b"ZRESOBJ1"
    offset 8    8 bytes   n, the number of frames (little-endian)
    offset 16   8*n bytes each frame's length
    then        each frame, from a multiple of 64 bytes (zeros between)

The file's bytes are also what travels on the data ports (a fetch asks for a range of
them); a reader puts them straight where its frames will live (``ObjectBuffer``). A frame is 64-
byte aligned so that a NumPy array unpickled from it (pickle protocol 5, out of band)
keeps its alignment. Readers map a file privately (copy on write): the buffers handed to
``loads`` are writable, and a task that writes to its input array changes nobody else's.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import struct
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

MAGIC = b"ZRESOBJ1"
_ALIGN = 64
MAP_MIN = 1 << 20   # bytes from which an object is mapped rather than read: a process has
#                     about 65,000 mappings (vm.max_map_count), and a small one costs more
#                     to map than to copy
HEAD = 4096         # bytes read first: the header, for where the rest goes
# A big read is shared by a few threads: filling fresh memory is mostly the kernel's
# work of giving each new page (3 us a 4 KiB page on a virtual machine: 100 MB take
# 55-80 ms, a copy only 10-20), which goes on in parallel in one process; two threads
# read 100 MB in 28-32 ms against 51-56, and twenty 10 MB objects at 2.6-3.5 GB/s
# against 1.3-1.9 (measured on the 2-core machine). Pieces of at least _PIECE bytes.
_PIECE = 4 << 20
_READERS = max(1, min(4, os.cpu_count() or 1))
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


def _lengths(view: memoryview, size: int) -> list[int]:
    """The frame lengths in the header at the start of VIEW, of an object of SIZE bytes;
    ObjectError if it is not one (or VIEW is too short to hold its header)."""
    if view.nbytes < 16 or bytes(view[:8]) != MAGIC:
        raise ObjectError("not a zres object")
    count = _U64.unpack_from(view, 8)[0]
    if count > (min(size, view.nbytes) - 16) // 8:
        raise ObjectError("a zres object's header is cut short")
    lengths = [_U64.unpack_from(view, 16 + 8 * i)[0] for i in range(count)]
    end = _layout(lengths)[0]
    if end > size:
        raise ObjectError(f"a zres object of {end} bytes has only {size}")
    return lengths


def frames_of(data: Any) -> list[memoryview]:
    """The frames of the object whose bytes are DATA (a buffer: an mmap, a bytearray),
    as views into it, no copy; ObjectError if it is not a whole object."""
    view = memoryview(data).cast("B")
    lengths = _lengths(view, view.nbytes)
    return [view[offset:offset + length]
            for offset, length in zip(_layout(lengths)[1], lengths)]


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
        return map_file(fd, size)
    finally:
        os.close(fd)


def map_file(fd: int, size: int) -> mmap.mmap:
    """The first SIZE bytes of the file FD mapped privately (copy on write, as
    ``map_object``); the descriptor may be closed after."""
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def is_bytes_value(head: Any, size: int) -> bool:
    """Whether the object of SIZE bytes whose file starts with HEAD is one ``bytes`` value
    (``serialize.dumps`` makes it an empty frame, then the bytes): a value that must be
    copied into memory of its own whatever is done."""
    try:
        lengths = _lengths(memoryview(head).cast("B"), size)
    except ObjectError:
        return False
    return len(lengths) == 2 and not lengths[0] and lengths[1] > 0


def read_object(path: str) -> list[Any]:
    """The frames of the object at PATH (``read_file``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return read_file(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def read_file(fd: int, size: int) -> list[Any]:
    """The frames of the object in the file FD (SIZE bytes): views into a private mapping
    of it (copy on write) if it is big and not one bytes value, else read into memory of
    its own (``ObjectBuffer``: each byte copied once; a mapping would be copied again
    to make the value)."""
    head = os.pread(fd, min(size, HEAD), 0)
    if size >= MAP_MIN and not is_bytes_value(head, size):
        try:
            return frames_of(map_file(fd, size))
        except (OSError, ValueError):
            pass  # (no mapping left to this process: read instead)
    buffer = ObjectBuffer(size)
    buffer.read_from(fd, head)
    return buffer.frames()


class ObjectWriter:
    """An object's file filled a range at a time (chunks of a transfer, in any order),
    put in place at PATH by ``done`` once every byte of its SIZE has come."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        self.written_at = time.monotonic()  # (when a range last came: an upload gone idle)
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
        self.written_at = time.monotonic()
        while view.nbytes:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written
            self._filled += written

    def complete(self) -> bool:
        return self._filled >= self.size

    def fill_from(self, fd: int) -> None:
        """Take the whole object from FD, a file holding it (an object on another agent
        of this host), copied by the kernel: no byte through this process."""
        _copy_file(fd, self._fd, self.size)
        self._filled = self.size

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


class ObjectBuffer:
    """An object fetched into memory a range at a time (chunks of a transfer, in any
    order), each byte copied once, straight to where its value will live: an object that
    is one ``bytes`` value (``serialize.dumps`` makes it an empty frame, then the bytes)
    into a new bytes object, any other into one buffer whose frames are views (writable,
    64-byte aligned: NumPy arrays are made on them without a copy).

    Neither is zeroed first: on the client, a fetch spent most of its time in the kernel
    zeroing fresh pages (a bytearray's allocation writes zeros, then a bytes value was
    copied out of it into memory fresh again), more than decrypting (measured with perf).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._early: list[tuple[int, memoryview]] = []  # ranges come before the header
        self._into: list[tuple[int, int, memoryview]] | None = None  # [start, end): where
        self._frames: list[Any] = []
        self._filled = 0

    def write(self, offset: int, data: Any) -> None:
        """Put DATA (a buffer) at OFFSET (each range once); ObjectError if the first bytes
        are not an object's header."""
        view = memoryview(data).cast("B")
        if offset < 0 or offset + view.nbytes > self.size:
            raise ObjectError(f"bytes {offset}..{offset + view.nbytes} are outside an "
                              f"object of {self.size}")
        self._filled += view.nbytes
        if self._into is None:
            if offset:
                self._early.append((offset, view))  # (the view keeps its chunk alive)
                return
            self._lay_out(view)
            for early in self._early:
                self._copy(*early)
            self._early = []
        self._copy(offset, view)

    def read_from(self, fd: int, head: bytes) -> None:
        """Fill it from FD, a file holding the object, whose first bytes are HEAD: each
        byte read straight to where it goes, once."""
        self.write(0, head[:self.size])
        assert self._into is not None
        todo = [(at, where[at - start:end - start]) for start, end, where in self._into
                if (at := max(start, len(head))) < end]
        _read_pieces(fd, _split(todo), self.size)
        self._filled = self.size

    def _lay_out(self, first: memoryview) -> None:
        """Where each byte goes, from the header at the start of FIRST."""
        try:
            lengths = _lengths(first, self.size)
        except ObjectError:
            if first.nbytes >= self.size or first.nbytes < 16 or bytes(first[:8]) != MAGIC:
                raise
            lengths = None  # (a header longer than the first chunk: read at the end)
        if lengths is not None and len(lengths) == 2 and not lengths[0] and lengths[1] \
                and BYTES_DATA:
            value, where = new_bytes(lengths[1])
            start = _layout(lengths)[1][1]
            self._into, self._frames = [(start, start + lengths[1], where)], [b"", value]
            return
        whole = _aligned(self.size)
        self._into = [(0, self.size, whole)]
        if lengths is not None:
            self._frames = [whole[offset:offset + length]
                            for offset, length in zip(_layout(lengths)[1], lengths)]
        else:
            self._frames = [whole.obj, whole]  # (split by frames())

    def _copy(self, offset: int, view: memoryview) -> None:
        assert self._into is not None
        for start, end, where in self._into:
            low, high = max(start, offset), min(end, offset + view.nbytes)
            if low < high:
                where[low - start:high - start] = view[low - offset:high - offset]

    def frames(self) -> list[Any]:
        """The object's frames (views, or a bytes value); ObjectError if some bytes never
        came."""
        if self._filled < self.size or self._into is None:
            raise ObjectError(f"{self._filled} bytes of an object of {self.size} came")
        if len(self._frames) == 2 and isinstance(self._frames[0], bytearray):
            self._frames = frames_of(self._frames[1])
        return self._frames


def _split(ranges: list[tuple[int, memoryview]]) -> list[tuple[int, memoryview]]:
    """RANGES (a file offset and where its bytes go) cut into about as many pieces as
    there are readers, each of _PIECE bytes at least."""
    total = sum(view.nbytes for _, view in ranges)
    count = min(_READERS, total // _PIECE)
    if count <= 1:
        return ranges
    step = -(-total // count)
    pieces = []
    for at, view in ranges:
        for cut in range(0, view.nbytes, step):
            pieces.append((at + cut, view[cut:cut + step]))
    return pieces


def _read_pieces(fd: int, pieces: list[tuple[int, memoryview]], size: int) -> None:
    """Fill each piece (a file offset, where its bytes go) from FD: the first here, the
    others on the readers' threads at the same time."""
    def fill(at: int, view: memoryview) -> None:
        while view.nbytes:
            got = os.preadv(fd, [view], at)
            if got <= 0:
                raise ObjectError(f"a file of {at} bytes holds no object of {size}")
            at, view = at + got, view[got:]
    waits: list[Future[None]] = [_readers().submit(fill, *piece) for piece in pieces[1:]]
    try:
        if pieces:
            fill(*pieces[0])
    finally:
        for wait in waits:
            wait.result()  # (each waited for, even after a failure: they write into it)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    """The threads that share big reads (started when first needed)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_READERS, thread_name_prefix="zres-read")
        return _pool


def _forget_readers() -> None:
    """In a child forked from a process whose readers ran: it has none of those threads
    (nor, perhaps, a free lock)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_readers)


def _copy_file(source: int, target: int, size: int) -> None:
    """Copy SIZE bytes from the start of file SOURCE to TARGET's, in the kernel where it
    can (copy_file_range), else a piece at a time."""
    at = 0
    try:
        while at < size:
            done = os.copy_file_range(source, target, size - at, at, at)
            if done <= 0:
                raise ObjectError(f"a file of {at} bytes holds no object of {size}")
            at += done
        return
    except OSError:
        pass  # (not between these files: the way every system has)
    while at < size:
        piece = os.pread(source, min(4 << 20, size - at), at)
        if not piece:
            raise ObjectError(f"a file of {at} bytes holds no object of {size}")
        at += os.pwrite(target, piece, at)


def _c_api() -> tuple[Any, Any, int]:
    """CPython's constructors of a bytes and a bytearray object left unfilled, and where a
    bytes object's data starts in its memory; (None, None, 0) if this is not CPython, or
    not as expected (values are then made by a copy, and bytearrays zeroed)."""
    try:
        make_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
        new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
        for function in (make_bytes, new_bytearray):
            function.restype = ctypes.py_object
            function.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
        probe = b"zres-probe-" + os.urandom(8)
        offset = bytes.__basicsize__ - 1  # (PyBytesObject's ob_sval: its last member)
        if ctypes.string_at(id(probe) + offset, len(probe)) == probe:
            return make_bytes, new_bytearray, offset
    except (AttributeError, OSError, ValueError):
        pass
    return None, None, 0


_PyBytes_New, _PyByteArray_New, BYTES_DATA = _c_api()


def new_bytes(size: int) -> tuple[bytes, memoryview]:
    """A new bytes object of SIZE bytes, not yet filled (CPython's own way to build one:
    ``PyBytes_FromStringAndSize(NULL, size)``), and a writable view of its bytes, to fill
    it before anyone else sees it. Only where BYTES_DATA (not 0: see _c_api)."""
    value = _PyBytes_New(None, size)
    where = (ctypes.c_char * size).from_address(id(value) + BYTES_DATA)
    return value, memoryview(where).cast("B")


def _aligned(size: int) -> memoryview:
    """A writable view of SIZE bytes starting at a multiple of 64, in a bytearray not
    zeroed first (its bytes are all written after)."""
    whole = bytearray(size + _ALIGN) if _PyByteArray_New is None \
        else _PyByteArray_New(None, size + _ALIGN)
    skip = -ctypes.addressof(ctypes.c_char.from_buffer(whole)) % _ALIGN
    return memoryview(whole)[skip:skip + size]
