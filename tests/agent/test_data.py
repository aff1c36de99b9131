"""An agent's objects and its data port (issue 29), with no broker: objects written and
mapped, served in chunks to a fetch with the right token only, uploaded, spilled past the
memory budget, freed."""

from __future__ import annotations

import errno
import mmap
import os
import queue
import select
import socket
import stat
import threading
import time
from typing import Any

import numpy as np
import pytest
import zmq

from tests.conftest import wait_until
from zres.agent.data.local import LocalPort
from zres.agent.data.server import DataServer
from zres.agent.data.store import MIN_BUDGET, ObjectStore
from zres.agent.data.worker_side import WorkerObjects
from zres.core import keys as K
from zres.core import local_reads
from zres.core import objects as O
from zres.core import protocol as P
from zres.core import transfer as T
from zres.core.serialize import dumps, loads

pytestmark = pytest.mark.timeout(60)
SECRET = b"s" * 32


def test_an_object_keeps_its_frames_aligned_and_maps_writable_without_touching_its_file(
        tmp_path):
    array = np.arange(1_000_000, dtype=np.float64)
    frames = dumps(array)
    assert len(frames) > 1, "the array's buffer travels out of band"
    path = str(tmp_path / "7")
    size = O.write_object(path, frames)
    assert size == os.path.getsize(path) == O.object_size(frames)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = loads(O.read_object(path))
    assert (back == array).all() and back.ctypes.data % 64 == 0
    back[0] = -1  # (copy on write: the file, and whoever else maps it, keep theirs)
    assert loads(O.read_object(path))[0] == 0
    with pytest.raises(O.ObjectError):
        O.frames_of(b"not an object at all")


@pytest.fixture
def served(tmp_path):
    key_dir = tmp_path / "keys"
    K.keygen(key_dir)
    store = ObjectStore(str(tmp_path / "state"), MIN_BUDGET)
    server = DataServer(store, "tcp://127.0.0.1:0", "tcp://127.0.0.1:1",
                        K.peer_key(str(key_dir), ("agent",)))
    server.secret = SECRET
    server.start()
    transfers = T.Transfers(timeout=5.0, local=False)  # (over the data port: its chunks)
    yield store, server, transfers
    transfers.close()
    server.stop()
    store.close()


def put_local(store: ObjectStore, object_id: int, value: object) -> int:
    size = O.write_object(store.new_path(object_id), dumps(value))
    store.added(object_id, size)
    return size


def ref(server: DataServer, object_id: int, size: int, token: bytes | None = None) -> T.Ref:
    return T.Ref(object_id, size, token or T.token(SECRET, "get", object_id),
                 (T.Holder("a", server.address, server.key),))


def test_objects_are_fetched_in_chunks_with_their_token_only(served, tmp_path):
    store, server, transfers = served
    big = os.urandom(3 * T.CHUNK + 12345)  # (several chunks, the last a short one)
    sizes = {1: put_local(store, 1, big), 2: put_local(store, 2, {"small": [1, 2]})}
    first, second = transfers.fetch([ref(server, i, n) for i, n in sizes.items()])
    assert loads(first) == big and loads(second) == {"small": [1, 2]}
    refuses_and_copies(transfers, server, sizes[1], big, 3, str(tmp_path / "replica"))


def refuses_and_copies(transfers: T.Transfers, server: DataServer, size: int, big: bytes,
                       missing: int, replica: str) -> None:
    """Object 1 (BIG, SIZE bytes) is refused for another's token; object MISSING is said
    missing; object 1 copied to the file REPLICA is whole."""
    with pytest.raises(T.TransferError, match="refused"):
        transfers.fetch([ref(server, 1, size, token=T.token(SECRET, "get", 2))])
    with pytest.raises(T.TransferError, match="missing"):
        transfers.fetch([ref(server, missing, 100)])
    transfers.fetch_to(ref(server, 1, size), replica)
    assert loads(O.read_object(replica)) == big


def test_a_fetch_keeps_at_most_a_window_of_requests_in_flight_to_a_holder():
    """A fetch asked for every chunk of every object at once; a holder's port (a ROUTER)
    drops its answers to a reader past zmq's high-water mark (1,000 messages), so a
    gather of 1,500 results of 70 KB from one agent, its reader slowed (a loaded machine),
    lost answers, waited 5 s and failed. Now WINDOW requests at most go to one holder
    before it answers; and a holder answering slowly but steadily is not given up on."""
    ctx = zmq.Context()
    holder = ctx.socket(zmq.ROUTER)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    objects = {i: b"".join(bytes(p) for p in O.parts(dumps(i * 7))) for i in range(1, 101)}
    refs = [T.Ref(i, len(data), b"t", (T.Holder("a", f"tcp://127.0.0.1:{port}"),))
            for i, data in objects.items()]
    transfers = T.Transfers(timeout=1.5, local=False)  # (100 answers, 30 ms apart)
    fetched: list[Any] = []
    reader = threading.Thread(target=lambda: fetched.extend(transfers.fetch(refs)))
    reader.start()

    def answer(ident: bytes, header: bytes) -> None:
        get = P.decode([header]).body
        data = objects[get["id"]]
        holder.send_multipart([ident, *P.encode(P.CHUNK, {
            "req": get["req"], "id": get["id"], "offset": 0, "size": len(data)}, [data])])
    try:
        asked = []
        while len(asked) < len(refs):
            assert holder.poll(2000), f"the reader asked for {len(asked)} chunks, then no more"
            asked.append(holder.recv_multipart())
            if len(asked) == T.WINDOW:  # (what it asks before any answer: no more)
                assert not holder.poll(300), "more than WINDOW requests before an answer"
            if len(asked) >= T.WINDOW:
                time.sleep(0.03)  # (a holder slow but steady, not gone)
                answer(*asked[len(asked) - T.WINDOW])
        for request in asked[len(asked) - T.WINDOW + 1:]:
            answer(*request)
        reader.join(10)
        assert [loads(f) for f in fetched] == [i * 7 for i in objects]
    finally:
        reader.join(10)
        transfers.close()
        holder.close(0)
        ctx.term()


def test_an_upload_with_its_token_is_kept_and_said(served):
    store, server, transfers = served
    frames = dumps(list(range(100_000)))
    holder = T.Holder("a", server.address, server.key)
    size = O.object_size(frames)
    with pytest.raises(T.TransferError, match="refused"):
        transfers.upload(holder, 9, T.token(SECRET, "put", 9, size + 1), frames)
    assert transfers.upload(holder, 9, T.token(SECRET, "put", 9, size), frames) == size
    assert server.stored.get(timeout=5) == (9, size)
    # (and the agent's loop is woken for it: it heard of each put at its poll's timeout)
    wait_until(lambda: select.select([server.stored_fd], [], [], 0)[0],
               message="the port to wake the agent's loop for the stored upload")
    assert loads(O.read_object(store.path(9))) == list(range(100_000))


def test_an_upload_its_sender_abandons_is_dropped_not_kept_in_memory_for_ever(
        served, monkeypatch):
    """A client killed (or ^C'd) mid-put left its partial upload in the memory tier for as
    long as the agent ran: memory the store does not count."""
    from zres.agent.data import server as data_server
    monkeypatch.setattr(data_server, "UPLOAD_IDLE", 0.2, raising=False)
    store, server, _ = served
    size = 2 * T.CHUNK
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.curve_serverkey = server.key.encode()
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(server.address)
    try:  # (its first chunk only, and then nothing)
        P.send(sock, P.encode(P.PUT, {"id": 5, "size": size, "offset": 0, "req": 1,
                                      "token": T.token(SECRET, "put", 5, size)},
                              [bytes(T.CHUNK)]))
        assert sock.poll(5000), "the port did not acknowledge the chunk"
        assert "error" not in P.decode(P.recv(sock)).body
        parts = lambda: [n for n in os.listdir(store.memory_dir) if ".part" in n]  # noqa: E731
        assert parts(), "the upload under way has no file"
        wait_until(lambda: not parts(), timeout=10, message="the abandoned upload dropped")
    finally:
        sock.close(0)


def test_past_its_budget_the_store_spills_the_oldest_and_still_serves_them(served):
    store, server, transfers = served
    chunk = os.urandom(MIN_BUDGET // 3)
    sizes = [put_local(store, i, chunk + bytes([i])) for i in range(1, 5)]
    wait_until(lambda: store.stats()["memory"] <= store.budget, message="the spill")
    stats = store.stats()
    assert stats["memory"] <= store.budget and stats["spilled"] >= sizes[0], stats
    assert store.path(1).startswith(store.spill_dir), "the oldest did not move to disk"
    assert loads(transfers.fetch([ref(server, 1, sizes[0])])[0]) == chunk + b"\x01"
    store.free([1, 2, 3, 4])
    assert store.stats() == {"objects": 0, "memory": 0, "spilled": 0, "budget": store.budget}
    assert store.path(1) is None


def mapped(array: np.ndarray) -> bool:
    """Whether ARRAY's memory is a mapping of a file (read in place, not copied)."""
    base = array
    while getattr(base, "base", None) is not None:
        base = base.base
    return isinstance(getattr(base, "obj", None), mmap.mmap)


def test_a_reader_on_the_holders_host_is_given_the_file_for_its_token_and_reads_it_in_place(
        served, tmp_path):
    """Over the data port every byte is encrypted and copied through a socket; a reader
    on the agent's own host now asks the port where its local socket is (before its
    first request for bytes), and reads each object's file in place: a NumPy array is a
    mapping of the store, no byte served over the port, the first fetch's neither."""
    store, server, _ = served
    array = np.arange(O.MAP_MIN // 4, dtype=np.float64)
    big = os.urandom(3 * T.CHUNK + 12345)
    values: dict[int, Any] = {1: big, 2: {"small": [1, 2]}, 3: array}
    sizes = {i: put_local(store, i, v) for i, v in values.items()}
    transfers = T.Transfers(timeout=5.0, local=True)
    try:
        first = transfers.fetch([ref(server, i, n) for i, n in sizes.items()])
        again = transfers.fetch([ref(server, i, n) for i, n in sizes.items()])
        served_before = server.served
        assert served_before == 0, "bytes came over the data port"
        for frames in (first, again):
            back = [loads(f) for f in frames]
            assert back[0] == big and back[1] == {"small": [1, 2]}
            assert (back[2] == array).all()
        assert mapped(loads(again[2])), "the array was copied, not mapped"
        loads(again[2])[0] = -1  # (copy on write: the store's file keeps its own)
        assert loads(O.read_object(store.path(3)))[0] == 0
        refuses_and_copies(transfers, server, sizes[1], big, 9, str(tmp_path / "replica"))
        assert server.served == served_before
    finally:
        transfers.close()


def test_an_input_no_copy_of_which_can_be_kept_here_is_read_into_memory_never_looped_on(
        served, tmp_path, monkeypatch):
    """A fetch into a full file system (ENOSPC) took its failure to write for the
    holder's local socket failing: it asked the port, was given the file again, failed
    again, for ever (a worker stuck, its task never ending). It fails; and a worker whose
    store cannot keep a copy (full, or its directory gone: /dev/shm emptied under it)
    reads the input into its own memory, and its task runs."""
    store, server, _ = served
    value = b"x" * 100_000
    size = put_local(store, 1, value)
    objects = WorkerObjects(f"{tmp_path}/gone:{tmp_path}/gone-spill")
    assert loads(objects.inputs([[]], {0: ref(server, 1, size).wire()})[0]) == value

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(O, "_copy_file", full)
    transfers = T.Transfers(timeout=5.0, local=True)
    ended: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def fetch() -> None:
        try:
            transfers.fetch_to(ref(server, 1, size), str(tmp_path / "copy"))
            ended.put(None)
        except BaseException as exc:
            ended.put(exc)

    threading.Thread(target=fetch, daemon=True).start()
    outcome = ended.get(timeout=10)  # (queue.Empty: it never ended; its thread still runs)
    transfers.close()
    assert isinstance(outcome, OSError) and outcome.errno == errno.ENOSPC, outcome
    assert sorted(os.listdir(tmp_path)) == ["keys", "state"], "the failed copy left a part"


def test_an_input_with_no_holder_connected_is_lost_to_its_task_not_its_worker(tmp_path):
    """An input whose holders were all away (a broker restarted before they came back)
    went to the worker as no reference at all: its ValueError ended the worker process
    (exit 70), every task in it lost. Its task is told it cannot read it (ran nothing)."""
    from zres.agent.data.worker_side import InputLost
    objects = WorkerObjects(f"{tmp_path}/objects:{tmp_path}/spill")
    with pytest.raises(InputLost, match="input 7 cannot be read now") as lost:
        objects.inputs([[]], {0: [7, 100, b"", []]})
    assert lost.value.object_id == 7


def test_a_local_socket_that_fails_or_is_not_the_agents_is_not_read_from(served):
    """A reader checks the socket's peer is the process the data port named (nobody else
    on the host poses as the agent); a socket that stops answering (its agent restarted,
    its thread gone) leaves the reader on the data port, and nothing fails."""
    store, server, _ = served
    size = put_local(store, 1, b"x" * 100_000)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    impostor.bind("\0zres-test-impostor-" + os.urandom(8).hex())
    impostor.listen(1)
    links = local_reads.Links(timeout=1.0)
    at = ("tcp://x", "")
    assert links.unknown(at)
    links.asked(at, 1)
    assert not links.unknown(at)  # (asked once)
    # (the port named the agent's process; the socket is this process's)
    assert links.answered({"req": 1, "socket": impostor.getsockname()[1:].decode(),
                           "pid": os.getppid(), "uid": os.getuid()}) == at
    assert links.link(at) is None, "a socket of another process was taken for the agent's"
    links.asked(("tcp://y", ""), 3)
    assert links.answered({"req": 3, "socket": impostor.getsockname()[1:].decode(),
                           "pid": os.getpid(), "uid": os.getuid()}) == ("tcp://y", "")
    assert links.link(("tcp://y", "")) is not None  # (what the check lets through)
    links.close()
    impostor.close()
    transfers = T.Transfers(timeout=5.0, local=True)
    try:
        assert loads(transfers.fetch([ref(server, 1, size)])[0]) == b"x" * 100_000
        server.local.stop()  # (its socket gone: a read in place fails from now on)
        served_before = server.served
        assert loads(transfers.fetch([ref(server, 1, size)])[0]) == b"x" * 100_000
        assert server.served > served_before, "not read over the data port instead"
    finally:
        transfers.close()


def test_a_holder_whose_local_socket_stops_answering_is_given_up_on_in_time():
    """A stopped agent (SIGSTOP) keeps its socket open and answers nothing: a read in
    place waits the transfer's timeout, as one over the data port does, then the next
    holder is tried (none here: the fetch fails naming the agent), never forever."""
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stuck.bind("\0zres-test-stuck-" + os.urandom(8).hex())
    stuck.listen(4)
    ctx = zmq.Context()
    holder = ctx.socket(zmq.ROUTER)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    objects = {i: b"".join(bytes(p) for p in O.parts(dumps(i * 7))) for i in (1, 2)}
    refs = {i: T.Ref(i, len(data), b"t", (T.Holder("a", f"tcp://127.0.0.1:{port}"),))
            for i, data in objects.items()}
    done = threading.Event()

    def serve() -> None:  # (the data port: chunks, and where its local socket is)
        while not done.is_set():
            if not holder.poll(50):
                continue
            ident, header = holder.recv_multipart()
            msg = P.decode([header])
            if msg.kind == P.LOCAL:
                holder.send_multipart([ident, *P.encode(P.LOCAL_REPLY, {
                    "req": msg.body["req"], "socket": stuck.getsockname()[1:].decode(),
                    "pid": os.getpid(), "uid": os.getuid()})])
            else:
                data = objects[msg.body["id"]]
                holder.send_multipart([ident, *P.encode(P.CHUNK, {
                    "req": msg.body["req"], "id": msg.body["id"], "offset": 0,
                    "size": len(data)}, [data])])
    server = threading.Thread(target=serve)
    server.start()
    transfers = T.Transfers(timeout=0.5, local=True)
    try:
        started = time.monotonic()
        with pytest.raises(T.TransferError, match="agent a .* did not answer within 0.5s"):
            transfers.fetch([refs[1]])  # (asks where the socket is, then reads there)
        assert time.monotonic() - started < 5
        over_port = T.Transfers(timeout=5, local=False)  # (its port answers meanwhile)
        assert loads(over_port.fetch([refs[2]])[0]) == 14
        over_port.close()
    finally:
        done.set()
        server.join(5)
        transfers.close()
        holder.close(0)
        ctx.term()
        stuck.close()


def test_a_local_socket_stopped_twice_closes_nobody_elses_descriptors(tmp_path):
    """Stopped twice (the test above, then its fixture), the socket closed its waker's
    pipe twice: by then the numbers were zmq's, whose context aborted the process."""
    store = ObjectStore(str(tmp_path / "state"), MIN_BUDGET)
    port = LocalPort(store, lambda: SECRET)
    port.start()
    port.stop()
    others = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]  # (the lowest numbers)
    try:
        port.stop()
        for fd in others:
            os.fstat(fd)  # (OSError: closed by the second stop)
    finally:
        for fd in others:
            os.close(fd)
        store.close()
