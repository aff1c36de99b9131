"""A failure at the head of a chain deeper than Python's recursion limit fails it all."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.tasks import wait_for_file


def fail_when(path: str) -> None:
    wait_for_file(path)
    raise KeyError("head of the chain")


def step(previous: object) -> object:
    return previous


def test_a_failure_at_the_head_of_a_long_chain_fails_the_whole_chain(make_cluster, make_client,
                                                                    tmp_path):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    head = client.submit(fail_when, str(tmp_path / "go"))
    chain = [head]
    for _ in range(3000):  # deeper than Python's recursion limit
        chain.append(client.submit(step, chain[-1]))
    wait_until(lambda: "waiting for 1 of 1" in client.why(chain[-1]), message="chain queued")
    (tmp_path / "go").touch()
    with pytest.raises(KeyError):
        chain[-1].result(60)
    assert cluster.broker.poll() is None
    assert client.submit(step, 7).result(30) == 7
