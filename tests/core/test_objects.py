"""An object fetched into memory (objects.ObjectBuffer): whatever order its chunks come in,
its frames are what was written, a bytes value comes back as bytes made for it (no copy
of a copy), arrays come back writable and aligned."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

from zres.core import objects as O
from zres.core.serialize import dumps, loads


def chunks(frames: list, size: int, shuffle: bool) -> list[tuple[int, bytes]]:
    data = b"".join(bytes(memoryview(p).cast("B")) for p in O.parts(frames))
    out = [(at, data[at:at + size]) for at in range(0, len(data), size)]
    if shuffle:
        random.Random(1).shuffle(out)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_bytes_value_is_filled_in_place_whatever_the_order_of_its_chunks(shuffle):
    value = os.urandom(300_000)
    frames = dumps(value)
    buffer = O.ObjectBuffer(O.object_size(frames))
    for at, data in chunks(frames, 65_536, shuffle):
        buffer.write(at, data)
    got = buffer.frames()
    assert type(got[1]) is bytes and got[1] == value, "not a bytes value made for it"
    assert loads(got) is got[1], "loads copied it once more"


@pytest.mark.parametrize("shuffle", [False, True])
def test_arrays_come_back_writable_and_aligned(shuffle):
    arrays = {"a": np.arange(100_000.0), "b": np.ones(70_000, dtype=np.int8), "c": [1, 2]}
    frames = dumps(arrays)
    assert len(frames) > 2
    buffer = O.ObjectBuffer(O.object_size(frames))
    for at, data in chunks(frames, 50_000, shuffle):
        buffer.write(at, data)
    back = loads(buffer.frames())
    assert (back["a"] == arrays["a"]).all() and back["c"] == [1, 2]
    assert back["a"].ctypes.data % 64 == 0 and back["b"].ctypes.data % 64 == 0
    back["a"][0] = -1.0  # (writable)


def test_a_header_longer_than_the_first_chunk_and_what_is_no_object():
    many = [np.full(70_000, i, dtype=np.uint8) for i in range(40)]  # (40 frames)
    frames = dumps(many)
    buffer = O.ObjectBuffer(O.object_size(frames))
    for at, data in chunks(frames, 64, shuffle=True):  # (the header alone spans chunks)
        buffer.write(at, data)
    assert [int(a[0]) for a in loads(buffer.frames())] == list(range(40))
    with pytest.raises(O.ObjectError):
        O.ObjectBuffer(1000).write(0, b"x" * 1000)
    short = O.ObjectBuffer(O.object_size(frames))
    short.write(0, chunks(frames, 4096, shuffle=False)[0][1])
    with pytest.raises(O.ObjectError, match="came"):
        short.frames()


def test_a_big_file_is_read_whole_in_pieces_and_a_cut_one_is_refused(tmp_path):
    """A value over several readers' pieces (read on threads at the same time) comes back
    byte for byte, a bytes value as bytes made for it, arrays as a mapping of the file; a
    file cut short says so, from whichever piece found it."""
    value = os.urandom(3 * O._PIECE + 12_345)
    array = np.arange(O._PIECE // 2, dtype=np.float64)  # (4 MiB: mapped, not read)
    for name, obj in (("bytes", value), ("mixed", {"v": value, "a": array})):
        path = str(tmp_path / name)
        O.write_object(path, dumps(obj))
        frames = O.read_object(path)
        back = loads(frames)
        if name == "bytes":
            assert type(frames[1]) is bytes and back == value
        else:
            assert back["v"] == value and (back["a"] == array).all()
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 10)
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(O.ObjectError, match="holds no object"):
                O.read_file(fd, os.path.getsize(path) + 10)
        finally:
            os.close(fd)


def test_a_child_forked_after_big_reads_reads_big_values_too(tmp_path):
    """The readers' threads are not in a forked child: it starts its own (a child waiting
    on its parent's pool would hang)."""
    value = os.urandom(3 * O._PIECE)
    path = str(tmp_path / "v")
    O.write_object(path, dumps(value))
    assert loads(O.read_object(path)) == value  # (the pool runs here now)
    pid = os.fork()
    if pid == 0:  # (the child: its exit status says whether it read the value)
        os._exit(0 if loads(O.read_object(path)) == value else 3)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child hung"
