"""Messages between an agent and its worker processes: frames over a unix stream socket.

Every task crosses this link twice (its RUN, its DONE), on the path of its latency. Over
ZeroMQ a message between two processes wakes three threads (the sender's I/O thread, the
receiver's, then the receiver); over a unix socket it wakes one, the receiver. Both ends
are on one host and the agent starts the other, so ZeroMQ's reconnection, queues and
encryption buy nothing here.

A message is a header, the number of frames (u32) and each frame's length (u64), then
the frames. The agent's end never blocks: what the kernel does not take waits in memory
until the socket can be written (a stopped worker cannot stall the agent). A worker's
end sends blocking (the agent reads at once, and a worker has nothing else to do than
wait for it) and reads without blocking, on its main thread.

Only the agent's own workers get in: the socket lives in the agent's private directory,
a connection's first message names the worker, and the kernel's word on the peer's
process id (SO_PEERCRED) must match the process the agent started under that name.
"""

from __future__ import annotations

import os
import select
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice

from ..core.wire import Frame, buffer
from ..logs import get_logger

log = get_logger("zres.agent")

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_CHUNK = 256 * 1024           # what one read takes of small messages
_BIG = 64 * 1024              # a body at least this big is read into memory of its own
_MAX_FRAMES = 1 << 20         # more than any message has: past either, the stream is
_MAX_BYTES = 1 << 40          # garbage (a task's code may write to the socket's descriptor)
_SEND_AT_ONCE = 64            # buffers handed to one sendmsg (the kernel's iovec limit: 1024)
_BUFFER = 4 * 1024 * 1024     # the kernel's buffers: a 1 MB output takes one wake-up
_READ_AT_ONCE = 16 * 1024 * 1024  # what one read() takes at most: a peer writing without
#                                   pause holds its reader's loop up for no longer


class LinkClosed(Exception):
    """The other end has gone, or sent what is not a message."""


def _views(frames: Sequence[Frame]) -> list[memoryview]:
    """A message's buffers, its header first, each as bytes (a NumPy array's items may be
    of any size: its length is its count of bytes, not of items)."""
    views = [memoryview(buffer(frame)).cast("B") for frame in frames]
    head = _COUNT.pack(len(views)) + b"".join(_LENGTH.pack(view.nbytes) for view in views)
    return [memoryview(head), *(view for view in views if view.nbytes)]


class Stream:
    """One end of a link: whole messages out of what the socket delivers, and buffers
    written in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER)
            except OSError:
                pass  # (the kernel's ceiling: its default is still correct, only slower)
        self._buf = bytearray()
        self._big: tuple[bytearray, tuple[int, ...]] | None = None  # a body read in place
        self._got = 0
        self._out: deque[memoryview] = deque()

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[list[Frame]]:
        """The messages that have arrived (up to a budget of bytes read), without waiting;
        raise LinkClosed once the other end has gone."""
        messages: list[list[Frame]] = []
        budget = _READ_AT_ONCE
        try:
            while budget > 0:
                if self._big is not None:
                    body, lengths = self._big
                    got = self.sock.recv_into(memoryview(body)[self._got:], 0,
                                              socket.MSG_DONTWAIT)
                    if not got:
                        raise LinkClosed("the other end has gone")
                    self._got += got
                    budget -= got
                    if self._got == len(body):
                        self._big = None
                        messages.append(_cut(memoryview(body), lengths))
                    continue
                chunk = self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
                if not chunk:
                    raise LinkClosed("the other end has gone")
                self._buf += chunk
                budget -= len(chunk)
                self._parse(messages)
                if len(chunk) < _CHUNK and self._big is None:
                    return messages  # all there was (the next poll says if more came)
            return messages  # (the rest at the next poll: it says more waits)
        except (BlockingIOError, InterruptedError):
            return messages
        except OSError as exc:  # (reset by a killed peer)
            raise LinkClosed(str(exc)) from exc

    def _parse(self, messages: list[list[Frame]]) -> None:
        buf, pos = self._buf, 0
        while len(buf) - pos >= _COUNT.size:
            (count,) = _COUNT.unpack_from(buf, pos)
            if count > _MAX_FRAMES:
                raise LinkClosed(f"a message of {count} frames: not a zres link")
            start = pos + _COUNT.size + count * _LENGTH.size
            if len(buf) < start:
                break
            lengths = struct.unpack_from(f"<{count}Q", buf, pos + _COUNT.size)
            size = sum(lengths)
            if size > _MAX_BYTES:
                raise LinkClosed(f"a message of {size} bytes: not a zres link")
            have = len(buf) - start
            if have >= size:
                with memoryview(buf) as view:
                    messages.append(_cut(view[start:start + size], lengths, copy=True))
                pos = start + size
            elif size >= _BIG:  # the rest straight into memory of its own: one copy, not two
                try:
                    body = bytearray(size)
                except MemoryError:
                    raise LinkClosed(f"no memory for a message of {size} bytes") from None
                body[:have] = buf[start:]
                self._big, self._got = (body, lengths), have
                pos = len(buf)
                break
            else:
                break
        del buf[:pos]

    def queue(self, frames: Sequence[Frame]) -> None:
        """Put one message behind what waits to be written (``write`` writes it)."""
        self._out.extend(_views(frames))

    @property
    def pending(self) -> bool:
        """Whether something waits to be written."""
        return bool(self._out)

    def write(self, wait: bool) -> None:
        """Write what waits: all of it if WAIT, else what the kernel takes now. Raise
        LinkClosed once the other end has gone."""
        out = self._out
        flags = 0 if wait else socket.MSG_DONTWAIT
        while out:
            try:
                sent = self.sock.sendmsg(list(islice(out, _SEND_AT_ONCE)), [], flags)
            except (BlockingIOError, InterruptedError):
                if wait:
                    continue
                return
            except OSError as exc:  # (broken pipe, reset: a killed peer)
                out.clear()
                raise LinkClosed(str(exc)) from exc
            while sent:
                first = out[0]
                if first.nbytes <= sent:
                    sent -= first.nbytes
                    out.popleft()
                else:
                    out[0] = first[sent:]
                    sent = 0

    def close(self) -> None:
        self._out.clear()
        self.sock.close()


def _cut(body: memoryview, lengths: Sequence[int], copy: bool = False) -> list[Frame]:
    """A message's frames out of its BODY: copies of small ones, views of a big one's."""
    frames: list[Frame] = []
    pos = 0
    for length in lengths:
        piece = body[pos:pos + length]
        frames.append(bytes(piece) if copy else piece)
        pos += length
    return frames


class WorkerLinks:
    """The agent's end: a listening socket and a stream per worker, by the worker's name.

    Polled through one descriptor (``fileno``, an epoll set of them all). ALLOWED(name,
    pid) says whether a connection that names itself NAME, from process PID, is one of
    the agent's workers.
    """

    def __init__(self, path: str, allowed: Callable[[bytes, int], bool]) -> None:
        self.path = path
        self._allowed = allowed
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o600)
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._streams: dict[int, Stream] = {}            # by descriptor
        self._names: dict[int, bytes] = {}               # descriptor -> the worker's name
        self._by_name: dict[bytes, Stream] = {}
        self._writing: set[int] = set()                  # descriptors polled for room
        self._accept_failing = False                     # (logged: not again each turn)

    def fileno(self) -> int:
        return self._epoll.fileno()

    def receive(self) -> list[tuple[bytes, list[Frame]]]:
        """Accept who connected, write what waited for room, and return the messages that
        arrived, each with its worker's name."""
        out: list[tuple[bytes, list[Frame]]] = []
        for fd, events in self._epoll.poll(0):
            if fd == self._listener.fileno():
                self._accept()
                continue
            stream = self._streams.get(fd)
            if stream is None:
                continue
            try:
                if events & select.EPOLLOUT:
                    self._write(fd, stream)
                if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    for frames in stream.read():
                        name = self._names.get(fd)
                        if name is None:
                            self._hello(fd, stream, frames)
                        else:
                            out.append((name, frames))
            except LinkClosed:
                self._drop(fd)
        return out

    def send(self, name: bytes, frames: Sequence[Frame]) -> None:
        """Send the worker NAME one message (dropped if it is not connected: as a worker
        that has not said READY is never sent anything, it is one that has died)."""
        stream = self._by_name.get(name)
        if stream is None:
            return
        stream.queue(frames)
        fd = stream.fileno()
        if fd not in self._writing:  # (else it waits behind what waits for room)
            try:
                self._write(fd, stream)
            except LinkClosed:
                self._drop(fd)

    def _write(self, fd: int, stream: Stream) -> None:
        stream.write(wait=False)
        wants = stream.pending
        if wants != (fd in self._writing):
            self._epoll.modify(fd, select.EPOLLIN | (select.EPOLLOUT if wants else 0))
            (self._writing.add if wants else self._writing.discard)(fd)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (out of descriptors: tried again each turn, said once)
                if not self._accept_failing:
                    log.error("worker_link_accept_failed", error=str(exc))
                self._accept_failing = True
                return
            self._accept_failing = False
            sock.setblocking(False)
            self._streams[sock.fileno()] = Stream(sock)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _hello(self, fd: int, stream: Stream, frames: list[Frame]) -> None:
        """A connection's first message: the worker's name. Kept only if the process at
        the other end is the one the agent started under that name."""
        pid = struct.unpack("3i", stream.sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        name = bytes(buffer(frames[0])) if len(frames) == 1 else b""
        if not self._allowed(name, pid):
            log.warning("worker_link_refused", pid=pid, name=name[:64].decode("ascii", "replace"))
            raise LinkClosed("not one of this agent's workers")
        old = self._by_name.get(name)
        if old is not None:
            self._drop(old.fileno())
        self._names[fd] = name
        self._by_name[name] = stream

    def _drop(self, fd: int) -> None:
        stream = self._streams.pop(fd, None)
        if stream is None:
            return
        name = self._names.pop(fd, None)
        if name is not None and self._by_name.get(name) is stream:
            del self._by_name[name]
        self._writing.discard(fd)
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        stream.close()

    def close(self) -> None:
        for fd in list(self._streams):
            self._drop(fd)
        self._epoll.close()
        self._listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class AgentLink:
    """A worker's end: connected to its agent, named, sending from any thread (under the
    caller's lock), read by one."""

    def __init__(self, path: str, name: bytes) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        self._stream = Stream(sock)
        self.send([name])

    def fileno(self) -> int:
        return self._stream.fileno()

    def send(self, frames: Sequence[Frame]) -> None:
        """Send one message, waiting for room (raise LinkClosed if the agent has gone)."""
        self._stream.queue(frames)
        self._stream.write(wait=True)

    def read(self) -> list[list[Frame]]:
        """The messages that have arrived (see Stream.read)."""
        return self._stream.read()

    def close(self) -> None:
        self._stream.close()
