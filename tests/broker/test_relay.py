"""The broker's relay (issue 29), mostly on its own: a holder a process cannot reach is
fetched from through the relay, chunk by chunk, and remembered; the relay forwards only
what a token allows, to the agent named, answers for an agent that stops answering it,
and at once for one the broker declared lost, keeps nothing of a requester that went,
takes uploads, and lets in the cluster's keys only; a broker stepped by hand tells it
where an agent is, from where its connection comes, and says where it is in its
welcome."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import zmq

from tests.conftest import wait_until
from zres.agent.data.server import DataServer
from zres.agent.data.store import MIN_BUDGET, ObjectStore
from zres.broker.relay import Relay, listen_beside, targets
from zres.broker.server import Broker
from zres.cli.status_text import _relayed
from zres.core import keys as K
from zres.core import objects as O
from zres.core import protocol as P
from zres.core import transfer as T
from zres.core.relaying import Routes, mode_of, resolve
from zres.core.resources import UNIT
from zres.core.serialize import dumps, loads

pytestmark = pytest.mark.timeout(60)
SECRET = b"r" * 32


class Cluster:
    """An agent's data port and a relay that knows it, under one keys directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.keys = str(tmp_path / "keys")
        K.keygen(self.keys)
        self.store = ObjectStore(str(tmp_path / "state"), MIN_BUDGET)
        self.server = DataServer(self.store, "tcp://127.0.0.1:0", "tcp://127.0.0.1:1",
                                 K.peer_key(self.keys, ("agent",)))
        self.server.secret = SECRET
        self.server.start()
        self.relay = Relay("tcp://127.0.0.1:0", self.keys, SECRET, timeout=1.0)
        # Registered as an agent behind NAT would be: what it advertises is not reachable.
        self.relay.route("agent-a", {"address": "tcp://127.0.0.1:1", "key": self.server.key,
                                     "bound": self.server.bound}, "127.0.0.1")
        self.client = K.peer_key(self.keys, ("client",))
        self.transfers: list[T.Transfers] = []

    def put(self, object_id: int, value: Any) -> int:
        size = O.write_object(self.store.new_path(object_id), dumps(value))
        self.store.added(object_id, size)
        return size

    def ref(self, object_id: int, size: int, address: str, agent: str = "agent-a",
            token: bytes | None = None) -> T.Ref:
        return T.Ref(object_id, size, token or T.token(SECRET, "get", object_id),
                     (T.Holder(agent, address, self.server.key),),
                     (self.relay.address, self.relay.key))

    def routed(self, mode: str = "auto", key: K.PeerKey | None = None,
               timeout: float = 5.0) -> tuple[T.Transfers, Routes]:
        routes = Routes("tcp://127.0.0.1:9", "me", key or self.client, mode,
                        lambda: (self.relay.address, self.relay.key))  # (the welcome's)
        transfers = T.Transfers(timeout=timeout, routes=routes)
        self.transfers.append(transfers)
        return transfers, routes

    def close(self) -> None:
        for transfers in self.transfers:
            transfers.close()
        self.relay.close()
        self.server.stop()
        self.store.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.close()


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that takes connections and never says a word (a port behind a NAT
    that forwards nowhere, say)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_holder_that_does_not_answer_is_fetched_through_the_relay_and_remembered(
        cluster, silent):
    big = os.urandom(2 * T.CHUNK + 777)
    size = cluster.put(1, big)
    transfers, routes = cluster.routed(timeout=0.5)
    assert loads(transfers.fetch([cluster.ref(1, size, silent)])[0]) == big
    assert all(h.relay for h in routes.route(cluster.ref(1, size, silent)).holders), \
        "a holder that did not answer is still tried directly"
    assert loads(transfers.fetch([cluster.ref(1, size, silent)])[0]) == big
    status = cluster.relay.status()
    assert (status["transfers"], status["bytes"], status["inflight"]) == (2, 2 * size, 0)
    assert status["clients"] == [{"owner": "client", "client": "me", "transfers": 2,
                                  "bytes": 2 * size}]
    assert "relayed through the broker" in "\n".join(_relayed(status))
    refused = T.Holder("agent-a", "tcp://127.0.0.1:1", "")  # (nothing listens: at once)
    assert not routes.direct(refused)
    assert routes.uploads(refused)[0].relay


def test_the_relay_forwards_with_a_token_only_to_an_agent_it_knows(cluster):
    size = cluster.put(1, b"x" * 100_000)
    transfers, _ = cluster.routed("always")
    wrong = cluster.ref(1, size, cluster.server.address, token=T.token(SECRET, "get", 2))
    with pytest.raises(T.TransferError, match="refused: not a token"):
        transfers.fetch([wrong])
    with pytest.raises(T.TransferError, match="no agent agent-z is known"):
        transfers.fetch([cluster.ref(1, size, cluster.server.address, agent="agent-z")])
    assert cluster.server.served == 0, "the relay forwarded a request it should refuse"
    assert loads(transfers.fetch([cluster.ref(1, size, "tcp://127.0.0.1:1")])[0]) \
        == b"x" * 100_000


def test_an_agent_that_stops_answering_the_relay_fails_its_requesters_at_once(
        cluster, silent):
    """Its requesters get an error (and try their next holder, or ask the broker where
    the object is now) before their own timeout, and the relay keeps nothing of them."""
    cluster.relay.route("agent-s", {"address": silent, "key": cluster.server.key}, "")
    transfers, _ = cluster.routed("always", timeout=30.0)
    with pytest.raises(T.TransferError, match="did not answer the broker's relay"):
        transfers.fetch([cluster.ref(5, 10 * T.CHUNK, silent, agent="agent-s")])
    wait_until(lambda: cluster.relay.status()["inflight"] == 0,
               message="the relay to let go of the requests the agent left unanswered")


def test_an_agent_declared_lost_has_its_requests_answered_so_at_once(cluster, silent):
    """Those in flight to it and those that come later are told it was lost (their
    requesters try their next holder, or ask the broker where the object is now), with no
    timeout waited out, until it registers again."""
    cluster.relay.timeout = 3600.0  # (none of it is waited out: it would fail the test)
    cluster.relay.route("agent-s", {"address": silent, "key": cluster.server.key}, "")
    transfers, _ = cluster.routed("always", timeout=3600.0)
    failed: list[BaseException] = []

    def fetch() -> None:
        try:
            transfers.fetch([cluster.ref(5, 10 * T.CHUNK, silent, agent="agent-s")])
        except BaseException as exc:  # noqa: BLE001 (looked at below)
            failed.append(exc)

    fetching = threading.Thread(target=fetch, daemon=True)
    fetching.start()
    wait_until(lambda: cluster.relay.status()["inflight"] > 0,
               message="the relay to forward the requests")
    cluster.relay.forget("agent-s", "it went silent")
    fetching.join(30)
    assert not fetching.is_alive(), "its requester still waits for an agent declared lost"
    assert isinstance(failed[0], T.TransferError)
    assert "agent-s was declared lost by the broker (it went silent)" in str(failed[0])
    assert cluster.relay.status()["inflight"] == 0
    size = cluster.put(1, b"q" * 100_000)
    route = {"address": "tcp://127.0.0.1:1", "key": cluster.server.key,
             "bound": cluster.server.bound}
    cluster.relay.forget("agent-a", "its heartbeats stopped")
    more, _ = cluster.routed("always", timeout=3600.0)
    with pytest.raises(T.TransferError, match="agent-a was declared lost by the broker"):
        more.fetch([cluster.ref(1, size, "tcp://127.0.0.1:1")])
    assert cluster.server.served == 0, "the relay forwarded a request for a lost agent"
    cluster.relay.route("agent-a", route, "127.0.0.1")  # (registered again)
    assert loads(more.fetch([cluster.ref(1, size, "tcp://127.0.0.1:1")])[0]) == b"q" * 100_000


def test_a_requester_gone_mid_transfer_leaves_nothing_in_the_relay(cluster):
    value = os.urandom(8 * T.CHUNK)
    size = cluster.put(1, value)
    ctx = zmq.Context.instance()
    gone = ctx.socket(zmq.DEALER)
    K.secure(gone, K.PeerKey(cluster.keys, cluster.relay.key.encode(), cluster.client.public,
                             cluster.client.secret, "client", "client"))
    gone.connect(cluster.relay.address)
    for req in range(8):
        P.send(gone, P.encode(P.GET, {"id": 1, "token": T.token(SECRET, "get", 1),
                                      "offset": req * T.CHUNK, "length": T.CHUNK,
                                      "req": req, "agent": "agent-a", "from": "gone"}))
    wait_until(lambda: cluster.server.served > 0, message="the relay to forward them")
    gone.close(0)
    wait_until(lambda: cluster.relay.status()["inflight"] == 0,
               message="the relay to drop what it was moving for a requester gone")
    transfers, _ = cluster.routed("always")
    assert loads(transfers.fetch([cluster.ref(1, size, "tcp://127.0.0.1:1")])[0]) == value


def test_an_upload_goes_through_the_relay_with_its_token(cluster):
    transfers, routes = cluster.routed("always")
    frames = dumps(os.urandom(3 * T.CHUNK))
    size = O.object_size(frames)
    holder = routes.uploads(T.Holder("agent-a", "tcp://127.0.0.1:1", cluster.server.key))[0]
    assert holder.relay
    with pytest.raises(T.TransferError, match="refused"):
        transfers.upload(holder, 9, T.token(SECRET, "put", 9, size + 1), frames)
    assert transfers.upload(holder, 9, T.token(SECRET, "put", 9, size), frames) == size
    assert cluster.server.stored.get(timeout=5) == (9, size)
    assert cluster.relay.status()["bytes"] == size


def test_only_the_clusters_keys_get_into_the_relay(cluster, tmp_path):
    size = cluster.put(1, b"y" * 100_000)
    stranger = tmp_path / "stranger"
    K.keygen(stranger)
    foreign = K.peer_key(str(stranger), ("client",))
    transfers, _ = cluster.routed("always", key=foreign, timeout=0.5)
    with pytest.raises(T.TransferError, match="did not answer"):
        transfers.fetch([cluster.ref(1, size, "tcp://127.0.0.1:1")])
    assert cluster.relay.status()["transfers"] == 0


def test_the_broker_tells_its_relay_where_an_agent_is_from_where_its_connection_comes(
        cluster):
    """An agent bound to every interface, advertising an address nobody reaches (behind
    NAT): the broker's relay reaches it at that port on the host its connection came from
    (here the agent's port is on loopback, and so is its connection)."""
    broker = Broker("tcp://127.0.0.1:0", prefetch=0)
    agent = zmq.Context.instance().socket(zmq.DEALER)
    try:
        cluster.server.secret = broker.objects.secret
        size = cluster.put(1, b"z" * 300_000)
        agent.connect(broker.address)
        port = urlsplit(cluster.server.bound).port
        P.send(agent, P.encode(P.REGISTER, {
            "name": "agent-n", "session": 1, "host": "h", "pid": 1, "t": time.monotonic(),
            "slots": [{"units": {"CPU": UNIT}, "gpus": []}],
            "data": {"address": "tcp://127.0.0.1:1", "key": cluster.server.key,
                     "bound": f"tcp://0.0.0.0:{port}"}}))
        while not agent.poll(0):
            broker.poll_once(time.monotonic(), timeout=0.01)
        welcome = P.decode(agent.recv_multipart())
        assert broker.relay is not None and welcome.body["relay"] == [broker.relay.address, ""]
        transfers, _ = cluster.routed("always", key=None)
        ref = T.Ref(1, size, T.token(broker.objects.secret, "get", 1),
                    (T.Holder("agent-n", "tcp://127.0.0.1:1", cluster.server.key),),
                    (welcome.body["relay"][0], ""))
        assert loads(transfers.fetch([ref])[0]) == b"z" * 300_000
        assert broker.status()["relay"]["bytes"] == size
    finally:
        agent.close(0)
        broker.close()


def test_where_the_relay_listens_and_reaches_agents():
    assert listen_beside("tcp://0.0.0.0:7070", None) == "tcp://0.0.0.0:0"
    assert listen_beside("tcp://10.0.0.1:7070", "tcp://10.0.0.1:7171") == "tcp://10.0.0.1:7171"
    assert listen_beside("ipc:///run/zres", None) == "ipc:///run/zres-relay"
    assert listen_beside("tcp://127.0.0.1:7070", "off") is None
    assert resolve("tcp://0.0.0.0:41000", "tcp://broker.example:7070") \
        == "tcp://broker.example:41000"
    assert resolve("tcp://10.0.0.1:41000", "tcp://broker.example:7070") == "tcp://10.0.0.1:41000"
    # An agent bound every interface is reached where its connection comes from; one
    # bound to an address, there; then where it says it is (behind NAT: its public one).
    assert targets("tcp://203.0.113.5:7071", "tcp://0.0.0.0:41234", "10.1.2.3") \
        == ["tcp://10.1.2.3:41234", "tcp://203.0.113.5:7071"]
    assert targets("tcp://127.0.0.1:1", "tcp://127.0.0.1:5555", "127.0.0.1") \
        == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:1"]
    assert targets("tcp://h:1", "tcp://[::]:9", "::1") == ["tcp://[::1]:9", "tcp://h:1"]
    # (an IPv4 peer of a broker on every address of both families, [::])
    assert targets("tcp://h:1", "tcp://*:9", "::ffff:10.1.2.3") == ["tcp://10.1.2.3:9",
                                                                   "tcp://h:1"]
    assert targets("tcp://h:1", None, "") == ["tcp://h:1"]
    assert mode_of(True) == "always" and mode_of("never") == "never"
    with pytest.raises(ValueError, match="sometimes"):
        mode_of("sometimes")
