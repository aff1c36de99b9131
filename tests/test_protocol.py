"""Wire format (zres.protocol) and payload pickling (zres.serialize)."""

from __future__ import annotations

import pickle
import threading

import msgpack
import pytest
import zmq

from zres import protocol as P
from zres import serialize as S
from zres.errors import ProtocolError, RemoteError, RemoteTraceback

# -- protocol: encode / decode -----------------------------------------------------------


def test_encode_decode_round_trip_with_payload_frames():
    body = {"tasks": [[1, {"CPU": 10_000, "gpu0": 5_000}, 0, 2, [7, 8], 2, "f", False]]}
    frames = P.encode(P.SUBMIT, body, [b"fn", b"args"])
    assert len(frames) == 3
    msg = P.decode(frames)
    assert msg.kind == P.SUBMIT
    assert msg.body == body
    assert msg.frames == [b"fn", b"args"]


def test_encode_without_body_gives_an_empty_map():
    msg = P.decode(P.encode(P.STATUS))
    assert (msg.kind, msg.body, msg.frames) == (P.STATUS, {}, [])


@pytest.mark.parametrize("kind", sorted(P.KINDS))
def test_every_kind_round_trips(kind):
    msg = P.decode(P.encode(kind, {"id": 1}))
    assert (msg.kind, msg.body) == (kind, {"id": 1})


def test_decode_accepts_zmq_frames():
    frames = [zmq.Frame(f) for f in P.encode(P.HEARTBEAT, {"epoch": 3}, [b"x"])]
    msg = P.decode(frames)
    assert (msg.kind, msg.body) == (P.HEARTBEAT, {"epoch": 3})
    assert len(msg.frames) == 1


def test_binary_and_int_keys_survive():
    body = {"blob": b"\x00\xff", 3: "three"}
    assert P.decode(P.encode(P.WHY_REPLY, body)).body == body


def test_decode_empty_message():
    with pytest.raises(ProtocolError, match="empty message"):
        P.decode([])


@pytest.mark.parametrize("header", [b"\xc1", b"", b"\x93\x01", P.encode(P.STATUS)[0] + b"junk"])
def test_decode_header_that_is_not_msgpack(header):
    with pytest.raises(ProtocolError, match="not msgpack"):
        P.decode([header])


@pytest.mark.parametrize("header", [{"v": 1}, [1, "hello"], [1, "hello", {}, 4], "hello", 5])
def test_decode_header_of_the_wrong_shape(header):
    with pytest.raises(ProtocolError, match=r"\[version, kind, body\]"):
        P.decode([msgpack.packb(header)])


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_decode_wrong_version(version):
    with pytest.raises(ProtocolError, match="version"):
        P.decode([msgpack.packb([version, P.HELLO, {}])])


@pytest.mark.parametrize("version", [True, 1.0])
def test_decode_version_must_be_the_integer_one(version):
    """msgpack keeps True and 1.0 distinct from 1; so must the version check."""
    with pytest.raises(ProtocolError, match="version"):
        P.decode([msgpack.packb([version, P.HELLO, {}])])


@pytest.mark.parametrize("kind", ["nope", "", "HELLO", 3, None])
def test_decode_unknown_kind(kind):
    with pytest.raises(ProtocolError, match="unknown message kind"):
        P.decode([msgpack.packb([P.VERSION, kind, {}])])


@pytest.mark.parametrize("kind", [["hello"], {"a": 1}])
def test_decode_unhashable_kind_is_a_protocol_error(kind):
    """A malformed header must raise ProtocolError, never a bare TypeError."""
    with pytest.raises(ProtocolError):
        P.decode([msgpack.packb([P.VERSION, kind, {}])])


@pytest.mark.parametrize("body", [[1, 2], "text", 3, None])
def test_decode_body_that_is_not_a_map(body):
    with pytest.raises(ProtocolError, match="hello: body is not a map"):
        P.decode([msgpack.packb([P.VERSION, P.HELLO, body])])


def test_protocol_error_messages_are_one_line():
    for frames in ([], [b"\xc1"], [msgpack.packb([9, P.HELLO, {}])]):
        with pytest.raises(ProtocolError) as info:
            P.decode(frames)
        assert "\n" not in str(info.value)


# -- protocol: field, split_frames, check_units ------------------------------------------


def test_field_checks_presence_and_type():
    msg = P.decode(P.encode(P.WHY, {"id": 3, "flag": True, "name": "x"}))
    assert P.field(msg, "id", int) == 3
    assert P.field(msg, "name", (str, bytes)) == "x"
    with pytest.raises(ProtocolError, match="why: missing field 'nope'"):
        P.field(msg, "nope", int)
    with pytest.raises(ProtocolError, match="'id' has type int"):
        P.field(msg, "id", str)
    with pytest.raises(ProtocolError, match="'flag' has type bool"):
        P.field(msg, "flag", int)


def test_send_and_recv_keep_messages_whole_and_apart():
    """Every frame arrives in order, large ones intact, and one message never runs into
    the next (send and recv bypass pyzmq's multipart helpers)."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://send-recv")
        dealer.connect("inproc://send-recv")
        big = bytes(range(256)) * 4096          # 1 MiB: goes without a copy
        first = P.encode(P.DONE, {"n": 1}, [b"a", big, memoryview(b"tail")])
        P.send(dealer, first)
        P.send(dealer, P.encode(P.HEARTBEAT))
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        assert poller.poll(5000)
        got = P.recv(router)
        ident, msg = got[0].bytes, P.decode(got[1:])
        assert (msg.kind, msg.body) == (P.DONE, {"n": 1})
        assert [f.bytes for f in msg.frames] == [b"a", big, b"tail"]
        P.send(router, [ident, *P.encode(P.WELCOME, {"epoch": 2})])
        assert P.decode(P.recv(router)[1:]).kind == P.HEARTBEAT
        with pytest.raises(zmq.Again):
            P.recv(router)
        assert dealer.poll(5000)
        assert P.decode(P.recv(dealer)).body == {"epoch": 2}
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_split_frames_in_order():
    frames = [b"a", b"b", b"c", b"d"]
    assert P.split_frames(frames, [1, 0, 3]) == [[b"a"], [], [b"b", b"c", b"d"]]
    assert P.split_frames([], []) == []


@pytest.mark.parametrize("counts", [[1, 1], [2, 3], [4, 1], [5, -1], [2.0, 2], ["2", 2]])
def test_split_frames_mismatch(counts):
    with pytest.raises(ProtocolError, match="do not match 4 frames"):
        P.split_frames([b"a", b"b", b"c", b"d"], counts)


def test_check_units_accepts_non_negative_ints():
    assert P.check_units({"CPU": 10_000, "gpu0": 0}, "register") == {"CPU": 10_000, "gpu0": 0}
    assert P.check_units({}, "register") == {}


@pytest.mark.parametrize("units", [{"CPU": -1}, {"CPU": True}, {"CPU": False}, {1: 5},
                                   {b"CPU": 5}, {"CPU": 1.0}, {"CPU": "1"}, {"CPU": None},
                                   [("CPU", 1)], None, "CPU=1"])
def test_check_units_rejects_bad_maps(units):
    with pytest.raises(ProtocolError, match="submit: resources must map names"):
        P.check_units(units, "submit")


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


def test_garbage_exception_payload_becomes_a_remote_error():
    exc = S.loads_exception([b"not a pickle"])
    assert isinstance(exc, RemoteError)
