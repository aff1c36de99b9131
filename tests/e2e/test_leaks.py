"""What a cluster up for weeks must give back: processes that run on while agents come
and go keep nothing of those that left."""

from __future__ import annotations

import os

import pytest

from tests.conftest import LOSS, wait_until
from zres.core import transfer as T

pytestmark = pytest.mark.timeout(120)
BIG = 256 * 4000  # bytes: well over what travels inline (64 KiB)


def made(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


def test_a_client_keeps_no_connection_to_the_data_port_of_an_agent_gone(
        make_cluster, make_client, monkeypatch):
    """A notebook's client reads big results from an agent restarted again and again
    (each time on another data port): its open descriptors stay as they were."""
    monkeypatch.setattr(T, "IDLE", 0.0, raising=False)  # (a connection unused now is idle)
    cluster = make_cluster(agents=[{"b": 1}], names=["agent-b"], **LOSS)
    client = make_client(cluster.address)

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def read_one() -> None:
        assert client.submit(made, BIG, resources={"b": 1}).result(60) == made(BIG)

    def serving() -> list[tuple[str, int]]:
        return [(a["name"], a["pid"]) for a in client.status()["agents"]]

    read_one()
    before = descriptors()
    for _ in range(3):
        cluster.agents["agent-b"].kill()
        cluster.agents["agent-b"].wait(10)
        # Started again at once, as a service manager restarts it: the new agent-b takes
        # the place of the one gone (not waited for to be found silent first).
        again = cluster.add_agent({"b": 1}, name="agent-b", wait=False)
        wait_until(lambda pid=again.pid: serving() == [("agent-b", pid)],
                   message="the new agent-b to take the old one's place")
        read_one()
    assert descriptors() == before, "connections to the ports of agents gone are kept"
