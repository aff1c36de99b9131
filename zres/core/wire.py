"""The frames of a message: encoding a header, sending and receiving without copies,
and reading fields and payload frames checked (the kinds and bodies: ``protocol``, which
re-exports all of this)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from .errors import ProtocolError
from .limits import check_units_map, quote

VERSION = 1

Frame = Any  # bytes, or zmq.Frame when received with copy=False


@dataclass(slots=True)
class Message:
    kind: str
    body: dict[str, Any]
    frames: list[Frame]


def encode(kind: str, body: dict[str, Any] | None = None,
           frames: Sequence[Frame] = ()) -> list[Frame]:
    """Return the frames of one message, ready for send."""
    return [msgpack.packb([VERSION, kind, body or {}], use_bin_type=True), *frames]


# pyzmq's send_multipart and recv_multipart cost about 4 us a frame in Python (flag enums,
# a type check and a getsockopt per part); the backend's own send and recv, with plain int
# flags and the received frame's ``more``, under 1. Every message on the hot path goes
# through these two.
_backend_send = zmq.backend.Socket.send
_backend_recv = zmq.backend.Socket.recv
_backend_get = zmq.backend.Socket.get
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)


def send(sock: zmq.Socket[Any], frames: Sequence[Frame]) -> None:
    """Send FRAMES as one message; large buffers go without a copy.

    Every frame must be bytes, a zmq.Frame or a buffer: a frame refused halfway would
    leave a partial message on the socket (this is not checked, to stay cheap; only zres's
    own encoders build these lists).
    """
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _backend_send(sock, frame, _SNDMORE if i < last else 0, False)


def send_now(sock: zmq.Socket[Any], frames: Sequence[Frame]) -> None:
    """Send FRAMES (a one-frame message) unless that would wait (no connection): for a
    heartbeat, hello or goodbye, sent again or not needed, whose sender must never be
    stuck (a DEALER's send waits while it has no connection, as after a refused key)."""
    try:
        _backend_send(sock, frames[0], _NOBLOCK, False)
    except zmq.Again:
        pass


def recv(sock: zmq.Socket[Any]) -> list[Frame]:
    """Return the next message's frames (zmq.Frame); raise zmq.Again if none is waiting."""
    frame = _backend_recv(sock, _NOBLOCK, False)
    frames = [frame]
    while frame.more:  # the rest of a message arrives with its first frame
        frame = _backend_recv(sock, _NOBLOCK, False)
        frames.append(frame)
    return frames


def waiting(sock: zmq.Socket[Any]) -> bool:
    """Whether a message waits on SOCK: a loop that drains a socket asks this after each
    message rather than ending on recv's zmq.Again (an exception made and raised costs a
    few microseconds, on every wake-up of every loop)."""
    return bool(int(_backend_get(sock, _EVENTS)) & _POLLIN)  # type: ignore[arg-type]


def buffer(frame: Frame) -> Any:
    """Return FRAME's contents without a copy (a received zmq.Frame's memory, or bytes)."""
    return frame.buffer if hasattr(frame, "buffer") else frame


def field(msg: Message, name: str, kind: type | tuple[type, ...]) -> Any:
    """Return body[name] checked against KIND; raise ProtocolError naming what is wrong."""
    try:
        value = msg.body[name]
    except KeyError:
        raise ProtocolError(f"{msg.kind}: missing field {name!r}") from None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ProtocolError(f"{msg.kind}: field {name!r} has type {type(value).__name__}")
    return value


def split_frames(frames: list[Frame], counts: Sequence[int]) -> list[list[Frame]]:
    """Cut FRAMES into consecutive groups of COUNTS; raise if they do not add up."""
    if any(type(c) is not int or c < 0 for c in counts) or sum(counts) != len(frames):
        raise ProtocolError(f"frame counts {quote(list(counts), 80)} do not match "
                            f"{len(frames)} frames")
    out, pos = [], 0
    for count in counts:
        out.append(frames[pos:pos + count])
        pos += count
    return out


def check_units(value: Any, what: str) -> dict[str, int]:
    """Validate a units map received off the wire."""
    return check_units_map(value, what)
