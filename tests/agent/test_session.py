"""An agent's session, against a broker played by hand on a ROUTER socket: a broker that
no longer knows the agent (it restarted) is asked whether it has the session still, and
is never offered the agent's resources as if nothing ran there."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import zmq

from zres.core import protocol as P

pytestmark = pytest.mark.timeout(60)


def next_message(sock: zmq.Socket, kind: str) -> tuple[bytes, P.Message]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if sock.poll(100):
            ident, *frames = sock.recv_multipart()
            msg = P.decode(frames)
            if msg.kind == kind:
                return ident, msg
    raise AssertionError(f"no {kind} came")


@contextlib.contextmanager
def played_broker() -> Iterator[zmq.Socket]:
    """A ROUTER socket playing the broker, and an agent (named a) started against it.
    (A plain socket: no keys, whatever earlier tests of the suite left in this user's
    default keys directory.)"""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    agent = subprocess.Popen(
        [sys.executable, "-m", "zres", "agent", f"tcp://127.0.0.1:{port}", "--name", "a",
         "--resources", "foo=1", "--no-detect", "--nworkers", "1", "--insecure"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield sock
    finally:
        agent.kill()
        agent.wait(10)
        sock.close()


def test_an_agent_a_broker_forgot_asks_to_resume_its_session(tmp_path):
    with played_broker() as sock:
        ident, first = next_message(sock, P.REGISTER)
        assert not first.body.get("resume")
        session = first.body["session"]
        P.send(sock, [ident, *P.encode(P.WELCOME, {
            "epoch": 1, "session": session, "agent": "a", "cluster": "abc", "heartbeat": 0.1,
            "adopts": True, "lease": 5.0, "starve": 5.0})])
        P.send(sock, [ident, *P.encode(P.UNKNOWN, {})])  # a new broker: it knows no one
        ident, again = next_message(sock, P.REGISTER)
        assert again.body["session"] == session and again.body.get("resume") is True, \
            "registered afresh, as if nothing ran there: its resources would be granted twice"


def test_an_agent_fenced_once_is_not_fenced_again_by_the_answer_to_its_new_sessions_beat():
    """Declared lost, an agent begins a new session; its first heartbeat can reach the
    broker before that session's registration, and is answered with how the old one ended
    (naming the new one). Taken as its own end, the agent began a third session, and the
    broker, having welcomed the second, lost it and what it had granted there (a
    placement group's bundle, and with it the group's restart)."""
    with played_broker() as sock:
        ident, first = next_message(sock, P.REGISTER)
        P.send(sock, [ident, *P.encode(P.WELCOME, {
            "epoch": 1, "session": first.body["session"], "agent": "a", "cluster": "abc",
            "heartbeat": 0.1, "adopts": True, "lease": 5.0, "starve": 5.0})])
        P.send(sock, [ident, *P.encode(P.UNKNOWN, {"ended": "declared lost: silent",
                                                  "session": first.body["session"]})])
        ident, second = next_message(sock, P.REGISTER)
        assert second.body["session"] != first.body["session"] and "resume" not in second.body
        P.send(sock, [ident, *P.encode(P.UNKNOWN, {"ended": "silent",
                                                  "session": second.body["session"]})])
        ident, again = next_message(sock, P.REGISTER)
        assert again.body["session"] == second.body["session"], \
            "it began yet another session: the one the broker welcomes next is lost"
