"""Payload pickling (zres.core.serialize): calls with dependencies, results, exceptions."""

from __future__ import annotations

import pickle
import threading

import zmq

import zres
from zres.core import serialize as S
from zres.core.errors import RemoteError, RemoteTraceback

# -- serialize: calls with dependencies --------------------------------------------------


class Dep:
    """Stands in for a Future: any instance is a dependency."""

    def __init__(self, n: int) -> None:
        self.n = n


def add_all(*args, **kwargs):
    return args, kwargs


def test_call_round_trip_replaces_nested_dependencies():
    a, b = Dep(1), Dep(2)
    pickler = S.CallPickler(Dep)
    deps: list = []
    index: dict = {}
    fn_frame = pickler.function(add_all, deps, index)
    frames = pickler.call(fn_frame, ([a, {"x": b, "y": [a, (b,)]}], 5),
                          {"k": {"deep": [[a]]}, "plain": "text"}, deps, index)
    assert frames[0] == fn_frame
    assert deps == [a, b]          # each dependency once, in order of first use
    fn, args, kwargs = S.CallLoader().load(frames, ["A", "B"])
    assert args == (["A", {"x": "B", "y": ["A", ("B",)]}], 5)
    assert kwargs == {"k": {"deep": [["A"]]}, "plain": "text"}
    assert fn(*args, **kwargs) == (args, kwargs)


def test_dependency_indexes_are_shared_across_calls_of_one_batch():
    a, b, c = Dep(1), Dep(2), Dep(3)
    pickler = S.CallPickler(Dep)
    deps: list = []
    index: dict = {}
    fn_frame = pickler.function(add_all, deps, index)
    first = pickler.call(fn_frame, (b, a), {}, deps, index)
    second = pickler.call(fn_frame, (c, b), {}, deps, index)
    assert deps == [b, a, c]
    loader = S.CallLoader()
    assert loader.load(first, ["B", "A", "C"])[1] == ("B", "A")
    assert loader.load(second, ["B", "A", "C"])[1] == ("C", "B")


def test_function_closing_over_a_dependency_gets_each_tasks_value():
    dep = Dep(1)

    def use_dep():
        return dep

    pickler = S.CallPickler(Dep)
    loader = S.CallLoader()
    results = []
    for value in ("first", "second"):
        deps: list = []
        index: dict = {}
        frames = pickler.call(pickler.function(use_dep, deps, index), (), {}, deps, index)
        assert deps == [dep]
        fn, args, kwargs = loader.load(frames, [value])
        results.append(fn(*args, **kwargs))
    assert results == ["first", "second"]


def test_a_function_is_pickled_once_per_process_until_a_module_is_shipped():
    """Pickling a script's function (by value, with what it closes over) costs a submit
    100-300 us: it is pickled at its first submit and kept, as Dask and Ray do."""
    seen = []

    def scaled(x):
        return x * len(seen)

    pickler = S.CallPickler(Dep)
    first = pickler.function(scaled, [], {})
    assert S.CallPickler(Dep).function(scaled, [], {}) is first, "pickled again"
    S.forget_functions()  # (shipping a module does: how functions pickle may change)
    assert pickler.function(scaled, [], {}) is not first
    assert pickler.function(scaled, [], {}) == first


def test_loader_reuses_an_unpickled_function():
    pickler = S.CallPickler(Dep)
    fn_frame = pickler.function(add_all, [], {})
    loader = S.CallLoader()
    f1 = loader.load(pickler.call(fn_frame, (1,), {}, [], {}), [])[0]
    f2 = loader.load(pickler.call(fn_frame, (2,), {}, [], {}), [])[0]
    assert f1 is f2


def test_loader_cache_is_bounded():
    pickler = S.CallPickler(Dep)
    loader = S.CallLoader(cache_size=1)
    one = pickler.function(lambda: 1, [], {})
    two = pickler.function(lambda: 2, [], {})
    f1 = loader.load(pickler.call(one, (), {}, [], {}), [])[0]
    assert loader.load(pickler.call(two, (), {}, [], {}), [])[0]() == 2
    again = loader.load(pickler.call(one, (), {}, [], {}), [])[0]
    assert again() == 1 and again is not f1


def test_large_argument_buffers_travel_out_of_band():
    data = bytearray(b"z" * (100 * 1024))
    pickler = S.CallPickler(Dep)
    fn_frame = pickler.function(add_all, [], {})
    frames = pickler.call(fn_frame, (pickle.PickleBuffer(data),), {}, [], {})
    assert len(frames) == 3
    assert len(frames[1]) < 1024                 # the buffer is not in the pickle stream
    _, args, _ = S.CallLoader().load([bytes(f) for f in frames], [])
    assert bytes(args[0]) == bytes(data)


def test_loader_accepts_zmq_frames():
    a = Dep(1)
    pickler = S.CallPickler(Dep)
    deps: list = []
    index: dict = {}
    frames = pickler.call(pickler.function(add_all, deps, index), (a, 2), {}, deps, index)
    fn, args, kwargs = S.CallLoader().load([zmq.Frame(f) for f in frames], ["A"])
    assert fn(*args, **kwargs) == (("A", 2), {})


def test_large_bytes_arguments_are_frames_of_their_own_nested_or_not_and_come_back_as_such():
    """A bytes (a file read into memory) pickled in band was copied into the pickle stream:
    twice its size on the client, and on the worker."""
    blob = bytes(range(256)) * 1024                       # 256 KiB
    chunks = [bytes([i]) * (100 * 1024) for i in range(3)]
    buf = bytearray(b"w" * (80 * 1024))
    pickler = S.CallPickler(Dep)
    fn_frame = pickler.function(add_all, [], {})
    top = pickler.call(fn_frame, (blob,), {}, [], {})    # (plain arguments only)
    assert len(top) == 3 and len(top[1]) < 1024 and top[2] is blob  # (not even copied)
    frames = pickler.call(fn_frame, (chunks, blob, blob), {"buf": buf, "small": b"s" * 100},
                          [], {})
    assert len(frames) == 2 + 3 + 1 + 1                  # the same bytes object sent once
    assert len(frames[1]) < 1024
    for wire in (frames, [bytes(f) for f in frames], [memoryview(f) for f in frames]):
        _, args, kwargs = S.CallLoader().load(wire, [])
        assert args == (chunks, blob, blob) and kwargs == {"buf": buf, "small": b"s" * 100}
        assert [type(c) for c in args[0]] == [bytes] * 3 and type(args[1]) is bytes
        assert args[1] is args[2]
        assert type(kwargs["buf"]) is bytearray
        kwargs["buf"][0] = ord("x")                      # (its own, writable)


def test_a_bytearray_argument_is_a_snapshot_taken_at_submit():
    buf = bytearray(b"A" * (100 * 1024))
    pickler = S.CallPickler(Dep)
    frames = pickler.call(pickler.function(add_all, [], {}), ([buf],), {}, [], {})
    buf[:] = b"B" * len(buf)
    assert S.CallLoader().load(frames, [])[1] == ([bytearray(b"A" * len(buf))],)


def test_large_bytes_arguments_sit_beside_other_buffers_and_dependencies():
    dep = Dep(1)
    array = bytearray(b"a" * (70 * 1024))
    blob = b"b" * (90 * 1024)
    pickler = S.CallPickler(Dep)
    deps: list = []
    frames = pickler.call(pickler.function(add_all, deps, {}),
                          (pickle.PickleBuffer(array), blob, dep, pickle.PickleBuffer(array)),
                          {}, deps, {})
    assert deps == [dep] and len(frames) == 5
    _, args, _ = S.CallLoader().load(frames, ["A"])
    assert bytes(args[0]) == bytes(array) == bytes(args[3])
    assert args[1:3] == (blob, "A")


def test_a_bytes_argument_read_from_a_mapped_store_file_lets_its_pages_go(tmp_path):
    """A big call is read from its agent's store, mapped: the pages of a bytes argument
    copied out of the mapping are given back (each would count against the task's memory
    beside the copy)."""
    from zres.core import objects as O

    blob = bytes(range(256)) * (48 << 12)                # 48 MiB
    buf = bytearray(b"m" * (9 << 20))
    pickler = S.CallPickler(Dep)
    frames = pickler.call(pickler.function(add_all, [], {}), ([blob],), {"buf": buf}, [], {})
    O.write_object(str(tmp_path / "call"), frames)
    mapped = O.read_object(str(tmp_path / "call"))
    _, args, kwargs = S.CallLoader().load(mapped, [])
    assert type(args[0][0]) is bytes and args[0][0] == blob
    assert type(kwargs["buf"]) is bytearray and kwargs["buf"] == buf
    kwargs["buf"][-1] = 0                               # (writable, and its own)
    assert bytes(mapped[-2][-1:]) == b"m"                 # (values go last first)
    assert _resident(mapped[-1].obj) < (4 << 20), "the mapping's pages stayed resident"


def _resident(mapping) -> int:
    """Bytes of MAPPING (an mmap) resident in this process (its /proc/self/smaps Rss)."""
    import ctypes

    start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    for at, line in enumerate(lines):
        low, _, high = line.partition(" ")[0].partition("-")
        if high and int(low, 16) <= start < int(high, 16):
            rss = next(x for x in lines[at + 1:] if x.startswith("Rss:"))
            return int(rss.split()[1]) * 1024
    raise AssertionError("no such mapping")


# -- serialize: results ------------------------------------------------------------------


def test_dumps_loads_small_values_in_one_frame():
    value = {"a": [1, 2.5, "x"], "b": (None, b"bytes")}
    frames = S.dumps(value)
    assert len(frames) == 1
    assert S.loads(frames) == value


def test_large_pickle_buffer_becomes_its_own_frame():
    data = bytes(range(256)) * 512               # 128 KiB
    frames = S.dumps(pickle.PickleBuffer(data))
    assert len(frames) == 2
    assert len(frames[0]) < 1024
    assert memoryview(frames[1]).nbytes == len(data)
    assert bytes(S.loads(frames)) == data
    # Over the wire the frames arrive as separate bytes objects.
    assert bytes(S.loads([bytes(f) for f in frames])) == data


def test_pickle_buffer_below_64_kib_stays_in_band():
    data = bytearray(b"q" * (64 * 1024 - 1))
    frames = S.dumps(pickle.PickleBuffer(data))
    assert len(frames) == 1
    assert bytes(S.loads(frames)) == bytes(data)


def test_large_bytes_result_is_sent_as_it_is_and_comes_back_as_bytes():
    data = bytes(range(256)) * 400               # 100 KiB: sent as its own frame, uncopied
    frames = S.dumps(data)
    assert len(frames) == 2 and frames[1] is data
    back = S.loads([bytes(f) for f in frames])
    assert type(back) is bytes and back == data
    small = b"x" * 100                            # stays inside the pickle stream
    assert len(S.dumps(small)) == 1 and S.loads(S.dumps(small)) == small
    assert S.loads(S.dumps(b"")) == b""


def test_plain_arguments_and_results_need_no_cloudpickle():
    # The C pickler's fast path must give what the cloudpickle path gives.
    pickler = S.CallPickler(dep_type=type(None).__class__)
    frames = pickler.call(b"fn", (1, 2.5, "s", b"b", None, True), {"k": 3}, [], {})
    assert len(frames) == 2 and pickle.loads(frames[1]) == ((1, 2.5, "s", b"b", None, True),
                                                            {"k": 3})
    assert S.loads(S.dumps(lambda: 1))() == 1     # refused by pickle, done by cloudpickle


def test_several_large_buffers_keep_their_order():
    bufs = [bytes([i]) * (70 * 1024) for i in range(3)]
    frames = S.dumps([pickle.PickleBuffer(b) for b in bufs])
    assert len(frames) == 4
    assert [bytes(b) for b in S.loads(frames)] == bufs


# -- serialize: exceptions ---------------------------------------------------------------


def _raise_in_worker(exc: BaseException) -> list:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the worker catches everything
        return S.dumps_exception(caught)


class Unpicklable(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


class NeedsTwoArgs(Exception):
    """Pickles, but cannot be rebuilt: its __init__ needs an argument args does not hold."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a)
        self.b = b


def test_exception_keeps_its_type_and_gets_the_remote_traceback_as_cause():
    exc = S.loads_exception(_raise_in_worker(KeyError("boom")))
    assert type(exc) is KeyError
    assert exc.args == ("boom",)
    cause = exc.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "_raise_in_worker" in cause.tb
    assert "KeyError: 'boom'" in cause.tb
    assert "Remote traceback:" in str(cause)


def test_custom_exception_type_round_trips():
    class Custom(ValueError):
        pass

    exc = S.loads_exception(_raise_in_worker(Custom("mine")))
    assert type(exc).__name__ == "Custom"
    assert isinstance(exc, ValueError)
    assert str(exc) == "mine"
    assert isinstance(exc.__cause__, RemoteTraceback)


def test_unpicklable_exception_falls_back_to_remote_error():
    exc = S.loads_exception(_raise_in_worker(Unpicklable("locked out")))
    assert isinstance(exc, RemoteError)
    assert "Unpicklable" in str(exc) and "locked out" in str(exc)
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "Unpicklable: locked out" in exc.__cause__.tb


def test_exception_that_cannot_be_rebuilt_becomes_a_remote_error():
    exc = S.loads_exception(_raise_in_worker(NeedsTwoArgs("a", "b")))
    assert isinstance(exc, RemoteError)
    assert "cannot be unpickled" in str(exc)
    assert "NeedsTwoArgs: a" in str(exc)  # what the task raised, with its traceback
    assert "_raise_in_worker" in exc.__cause__.tb


def test_garbage_exception_payload_becomes_a_remote_error():
    exc = S.loads_exception([b"not a pickle"])
    assert isinstance(exc, RemoteError)

def test_submitted_arguments_are_a_snapshot_of_writable_buffers():
    data = bytearray(b"A" * 100_000)
    deps: list[object] = []
    frames = S.CallPickler(zres.Future).call(b"fn", (pickle.PickleBuffer(data),), {}, deps, {})
    data[:] = b"B" * 100_000
    assert bytes(frames[2][:5]) == b"AAAAA"
