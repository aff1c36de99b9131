"""Wire format (zres.core.protocol)."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from zres.core import protocol as P
from zres.core.errors import ProtocolError

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
        assert P.waiting(router)  # (the heartbeat: a drain asks, not ending on zmq.Again)
        assert P.decode(P.recv(router)[1:]).kind == P.HEARTBEAT
        assert not P.waiting(router)
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
