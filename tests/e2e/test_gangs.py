"""Gangs end to end on several agents (token resources ``gpu`` stand for GPUs): placement
groups by each strategy, tasks and actors in their bundles, two groups that would deadlock
if taken piecemeal, removal; multi-node command jobs (their ranks' environment, a failing
rank, cancel, logs). One cluster of three agents serves the module; the tests that kill an
agent or the broker are in test_gangs_faults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import hold
from zres import get_task_context

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster() -> Iterator[zres.LocalCluster]:
    with zres.LocalCluster(agents=[{"gpu": 2}] * 3, names=["a", "b", "c"],
                           heartbeat_interval=0.2, heartbeat_timeout=3.0) as local:
        yield local


@pytest.fixture
def client(cluster: zres.LocalCluster) -> Iterator[zres.Client]:
    with zres.Client(cluster.address) as connected:
        yield connected
    # (every test leaves the cluster idle: what it made ends with its client)
    with zres.Client(cluster.address) as check:
        wait_until(lambda: all(s["free"] == s["total"] for a in check.status()["agents"]
                               for s in a["slots"]), message="the cluster idle again")


def where(tag: object) -> tuple[str, object]:
    return get_task_context().agent, tag


def groups_of(client: zres.Client) -> dict[str, dict]:
    return {g["id"]: g for g in client.status()["placement_groups"]}


def agents_of(client: zres.Client, pg: zres.PlacementGroup) -> list[str]:
    return [b["agent"] for b in groups_of(client)[pg.id]["bundles"]]


# -- placement groups ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy, distinct", [("PACK", 1), ("SPREAD", 2),
                                                ("STRICT_PACK", 1), ("STRICT_SPREAD", 2)])
def test_each_strategy_places_its_bundles_and_tasks_run_there(client, strategy, distinct):
    pg = client.placement_group([{"gpu": 1}] * 2, strategy=strategy)
    assert pg.ready().result(30) is None
    agents = agents_of(client, pg)
    assert len(set(agents)) == distinct and all(agents)
    ran = [client.submit(where, i, placement=(pg, i)) for i in range(2)]
    assert [f.result(30) for f in ran] == [(agents[0], 0), (agents[1], 1)]
    pg.remove()
    assert pg.id not in groups_of(client)


def test_work_in_a_bundle_draws_on_it_alone(client, tmp_path):
    pg = client.placement_group([{"gpu": 1, "CPU": 1}], strategy="PACK", name="one")
    pg.ready().result(30)
    with pytest.raises(ValueError, match=r"gpu=2.*more than bundle 0.*gpu=1"):
        client.submit(where, 0, placement=(pg, 0), resources={"gpu": 2})
    first = client.submit(hold, str(tmp_path / "go"), str(tmp_path / "first"),
                          placement=(pg, 0))
    second = client.submit(where, 2, placement=(pg, 0))
    wait_until(lambda: (tmp_path / "first").exists(), message="the first task started")
    # the agent has a gpu free beside the bundle, but the second task waits for the bundle
    wait_until(lambda: "bundle 0" in client.why(second), message="why names the bundle")
    assert not second.done()
    (tmp_path / "go").touch()
    assert first.result(30) == "released"
    assert second.result(30)[0] == agents_of(client, pg)[0]
    # an actor in the bundle holds what it asks of it; found by name from another client
    counter = client.actor(Counter, placement=(zres.get_placement_group("one"), 0),
                           resources={"gpu": 1})
    assert counter.where().result(30) == agents_of(client, pg)[0]
    pg.remove()
    with pytest.raises(zres.ActorDiedError, match="placement group one"):
        counter.where().result(30)


class Counter:
    def where(self) -> str:
        return get_task_context().agent


def test_two_groups_that_would_deadlock_piecemeal_both_finish(client, tmp_path):
    """Three agents of two gpus; two groups of three two-gpu bundles, one per agent.
    Taken piecemeal each would hold some agents and wait for the other's forever; reserved
    all at once, one holds all three, the other holds nothing until then."""
    first = client.placement_group([{"gpu": 2}] * 3, strategy="STRICT_SPREAD")
    second = client.placement_group([{"gpu": 2}] * 3, strategy="STRICT_SPREAD")
    wait_until(lambda: first.ready().done() or second.ready().done(), 30,
               message="a group reserved")
    now, later = (first, second) if first.ready().done() else (second, first)
    assert groups_of(client)[later.id]["state"] == "pending"
    assert not any(groups_of(client)[later.id]["bundles"][i]["agent"] for i in range(3))
    assert "reserved all at once" in client.why(later.ready())
    done = [client.submit(where, i, placement=(now, i)) for i in range(3)]
    assert sorted(a for a, _ in (f.result(30) for f in done)) == ["a", "b", "c"]
    now.remove()
    later.ready().result(30)
    done = [client.submit(where, i, placement=(later, i)) for i in range(3)]
    assert len({a for a, _ in (f.result(30) for f in done)}) == 3
    later.remove()


def test_a_group_no_agents_could_hold_is_reported_at_once(client):
    with pytest.warns(zres.InfeasibleWarning, match="STRICT_SPREAD"):
        pg = client.placement_group([{"gpu": 1}] * 4, strategy="STRICT_SPREAD")
        wait_until(lambda: "infeasible" in client.why(pg.ready()), message="infeasible")
    with pytest.raises(zres.InfeasibleError, match="bundle 0"):
        client.placement_group([{"gpu": 3}], infeasible="error").ready().result(30)
    pg.remove()
    with pytest.raises(zres.ZresError, match="removed"):
        pg.ready().result(30)


def test_an_unnamed_group_goes_with_its_client(cluster, client):
    with zres.Client(cluster.address) as other:
        pg = other.placement_group([{"gpu": 1}] * 3, strategy="SPREAD")
        pg.ready().result(30)
        named = other.placement_group([{"gpu": 1}], name="kept")
        named.ready().result(30)
    wait_until(lambda: pg.id not in groups_of(client), message="the unnamed group removed")
    kept = zres.get_placement_group("kept")
    assert kept.id == named.id and kept.id in groups_of(client)
    kept.remove()
