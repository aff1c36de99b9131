"""Fair share and quotas between owners, end to end (issue 28): two named client keys,
alice and bob, on one cluster whose broker gives alice quotas (from its environment, as
config): she may hold foo=2 at once and have 350 tasks waiting."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zres
from tests.conftest import wait_until
from tests.e2e.test_security import key_dir
from tests.tasks import hold
from zres.core import keys as K

pytestmark = pytest.mark.timeout(120)

QUOTAS = {"ZRES_QUOTAS__ALICE": "foo=2", "ZRES_QUOTAS__QUEUED__ALICE": "350"}


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def after(seconds: float, gate: Any) -> float:
    return nap(seconds)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    """The cluster, and alice's and bob's keys directories."""
    cluster = zres.LocalCluster(agents=[{"CPU": 2, "foo": 4}], heartbeat_interval=0.2,
                                env=QUOTAS)
    try:
        tmp = tmp_path_factory.mktemp("owners")
        for name in ("alice", "bob"):
            K.keygen(cluster.keys, "client", name)
        yield cluster, key_dir(cluster, tmp, "client-alice"), key_dir(cluster, tmp, "client-bob")
    finally:
        cluster.close()


@pytest.fixture
def clients(cluster: tuple[Any, str, str]) -> Iterator[tuple[zres.Client, zres.Client]]:
    local, alice_keys, bob_keys = cluster
    alice = zres.Client(local.address, keys=alice_keys)
    bob = zres.Client(local.address, keys=bob_keys)
    try:
        yield alice, bob
    finally:
        alice.close()
        bob.close()


def owners(client: zres.Client) -> dict[str, dict[str, Any]]:
    return {o["owner"]: o for o in client.status()["owners"]}


def test_bobs_task_runs_before_alices_flood_at_top_priority_drains(clients):
    alice, bob = clients
    flood = alice.map(nap, [0.02] * 300, priority=1000)
    wait_until(lambda: any(f.running() or f.done() for f in flood), message="the flood runs")
    mine = bob.submit(nap, 0.0, priority=-1000)
    assert mine.result(60) == 0.0
    done = sum(f.done() for f in flood)
    assert done < 250, f"bob's task waited behind {done} of alice's 300"
    shown = owners(bob)
    assert shown["alice"]["waiting"] > 0 and shown["alice"]["share"] > shown["bob"]["share"]
    assert zres.wait(flood, timeout=60).not_done == set()


def test_a_priority_out_of_range_is_refused_at_submit(clients):
    _, bob = clients
    with pytest.raises(ValueError, match="priority must be between -1000 and 1000, got 1001"):
        bob.submit(nap, 0.0, priority=1001)


def test_alices_quota_holds_while_bobs_work_passes(clients, tmp_path):
    alice, bob = clients
    release = str(tmp_path / "release")
    hers = [alice.submit(hold, release, str(tmp_path / f"a{i}"), resources={"foo": 1, "CPU": 0})
            for i in range(4)]
    wait_until(lambda: sum(f.running() for f in hers) == 2, message="two of alice's run")
    his = [bob.submit(hold, release, str(tmp_path / f"b{i}"), resources={"foo": 1, "CPU": 0})
           for i in range(2)]
    wait_until(lambda: all(f.running() for f in his), message="bob's pass alice's")
    assert sum(f.running() for f in hers) == 2
    waiting = next(f for f in hers if not f.running())
    why = waiting.why()
    assert "waits for its owner alice's quota" in why and "foo=2" in why, why
    shown = owners(alice)
    assert shown["alice"]["holds"] == {"foo": 2.0} and shown["alice"]["quota"] == {"foo": 2.0}
    assert shown["bob"]["holds"] == {"foo": 2.0} and shown["bob"]["quota"] is None
    # One more of bob's waits for room, beside alice's two that wait for her quota: the
    # status tells the two apart (a reason per owner and request).
    his.append(bob.submit(hold, release, str(tmp_path / "b2"), resources={"foo": 1, "CPU": 0}))
    groups = wait_until(lambda: [(g["count"], "alice's quota" in g["reason"])
                                 for g in bob.status()["groups"]
                                 if g["request"] == "foo=1"], message="bob's waits")
    assert sorted(groups) == [(1, False), (2, True)], groups
    Path(release).touch()
    assert [f.result(30) for f in hers + his] == ["released"] * 7


def test_a_submit_over_alices_queued_quota_is_refused_to_her_alone(clients, tmp_path):
    alice, bob = clients
    release = str(tmp_path / "release")
    gate = alice.submit(hold, release, str(tmp_path / "gate"), resources={"foo": 1, "CPU": 0})
    over = alice.map(after, [0.0] * 351, gate=gate, resources={"CPU": 0})  # all wait
    refused = wait_until(lambda: [f for f in over if f.done() and f.exception()],
                         message="alice's submit is refused")
    assert "over the queued quota of owner alice: 350 tasks waiting at once " \
           "([quotas.queued] alice)" in str(refused[0].exception())
    assert owners(alice)["alice"]["waiting"] <= 350
    theirs = bob.map(nap, [0.0] * 351, resources={"CPU": 0})
    assert len(zres.gather(theirs)) == 351, "bob's work is not held to alice's quota"
    Path(release).touch()
    assert all(f.result(60) == 0.0 for f in over if f not in refused)
    assert alice.submit(nap, 0.0).result(30) == 0.0, "within her quota she submits again"


def test_the_quota_holds_after_a_broker_restart(cluster, tmp_path):
    """The quota is config: a restarted broker reads it again. (Use is not kept: it is a
    short memory of the recent past, and a restart starts it afresh.)"""
    local, alice_keys, _ = cluster
    local.restart_broker()
    wait_until(lambda: local.status()["agents"], message="the agent is back")
    alice = zres.Client(local.address, keys=alice_keys)
    try:
        release = str(tmp_path / "release")
        hers = [alice.submit(hold, release, str(tmp_path / f"a{i}"),
                             resources={"foo": 1, "CPU": 0}) for i in range(3)]
        wait_until(lambda: sum(f.running() for f in hers) == 2, message="two of alice's run")
        waiting = next(f for f in hers if not f.running())
        assert "waits for its owner alice's quota" in waiting.why()
        Path(release).touch()
        assert [f.result(30) for f in hers] == ["released"] * 3
    finally:
        alice.close()
