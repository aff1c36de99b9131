"""Gangs under faults (token resources ``gpu`` stand for GPUs): an agent killed under
placement groups and multi-node jobs, and a broker restarted under them."""

from __future__ import annotations

import os
import signal
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

import zres
from tests.conftest import LOSS, process_gone, stop_process, wait_until
from tests.tasks import hold, ledgered, starts, wait_for_file
from zres import get_task_context

pytestmark = pytest.mark.timeout(120)

# Each rank notes its pid (by agent, rank and job), then waits for the file $OUT/go.
RANK = ('echo $$ > "$OUT/pid-$ZRES_AGENT-$NODE_RANK-$ZRES_JOB_ID"; '
        'while [ ! -e "$OUT/go" ]; do sleep 0.05; done')


def where() -> str:
    return get_task_context().agent


def noted_hold(ledger: str, release: str) -> str:
    """Note the start in LEDGER, wait for RELEASE; return the agent it ran on."""
    ledgered(ledger, "x")
    wait_for_file(release)
    return where()


def held_in(client: zres.Client, pg: zres.PlacementGroup, bundle: int, tmp_path: Path
            ) -> tuple[zres.Future, str]:
    """A task placed in PG's BUNDLE, started: it notes its start in TMP_PATH/ledger (returned
    with it) and ends once TMP_PATH/go exists, returning the agent it ran on."""
    ledger = str(tmp_path / "ledger")
    task = client.submit(noted_hold, ledger, str(tmp_path / "go"), placement=(pg, bundle))
    wait_until(lambda: starts(ledger), message="the task in the group to start")
    return task, ledger


def removed_all_free(client: zres.Client, pg: zres.PlacementGroup) -> None:
    """Remove PG, then wait until every slot of every agent is free again."""
    pg.remove()
    wait_until(lambda: all(s["free"] == s["total"] for a in client.status()["agents"]
                           for s in a["slots"]), message="everything given back")


def group(client: zres.Client, pg: zres.PlacementGroup) -> dict:
    (found,) = [g for g in client.status()["placement_groups"] if g["id"] == pg.id]
    return found


def job(client: zres.Client, future: zres.Future) -> dict:
    (found,) = [j for j in client.jobs(all=True) if j["id"] == future.id]
    return found


def pids(out: Path, agent: str, job_id: int) -> list[int]:
    return [int(p.read_text()) for p in out.glob(f"pid-{agent}-*-{job_id}")]


def test_an_agent_lost_under_gangs(make_cluster, make_client, tmp_path, request):
    """Agent a dies under two placement groups (restarts=1: reserved again, whole, on b;
    no restarts: it fails, what runs in its bundle on b carrying on) and two 2-node
    jobs: the one with a retry is queued again whole (infeasible on b alone) and runs
    again once a third agent joins, the other fails naming its lost rank, its rank on b
    stopped."""
    # (the ranks a's death leaves running, as an agent killed outright leaves its jobs,
    # end with the test, however it ends)
    request.addfinalizer((tmp_path / "go").touch)
    cluster = make_cluster(agents=[{"gpu": 4}] * 2, names=["a", "b"], **LOSS)
    client = make_client(cluster.address)
    pg = client.placement_group([{"gpu": 1}] * 2, strategy="SPREAD", restarts=1)
    doomed = client.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD")
    pg.ready().result(30)
    doomed.ready().result(30)
    env = {"OUT": str(tmp_path)}
    again = client.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                                  retries=1, env=env)
    once = client.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1}, env=env)
    wait_until(lambda: all(len(pids(tmp_path, a, f.id or -1)) == 1 for a in "ab"
                           for f in (again, once)), message="both jobs' ranks started")
    # (work running in the doomed group's bundle on b carries on when the group fails)
    (on_b,) = [i for i, b in enumerate(group(client, doomed)["bundles"]) if b["agent"] == "b"]
    carries, ledger = held_in(client, doomed, on_b, tmp_path)
    cluster.agents["a"].kill()
    with pytest.raises(zres.AgentLostError, match=r"rank \d of job \d+ was lost"):
        once.result(30)
    assert process_gone(pids(tmp_path, "b", once.id)[0]), "its rank on b was stopped"
    assert "lost" in job(client, once)["reason"]
    wait_until(lambda: group(client, pg)["state"] == "ready"
               and [b["agent"] for b in group(client, pg)["bundles"]] == ["b", "b"],
               message="the group reserved again, whole, on b")
    assert group(client, pg)["restarts_left"] == 0 and group(client, pg)["starts"] == 2
    assert client.submit(where, placement=(pg, 0)).result(30) == "b"
    # (no restarts: it failed, and work sent to it is told why)
    assert doomed.id not in [g["id"] for g in client.status()["placement_groups"]]
    with pytest.raises(ValueError, match=r"bundle \d was lost with agent a.*no restarts"):
        client.submit(where, placement=(doomed, 1)).result(30)
    # (requeued whole: on b alone, its two ranks could never be placed, and it says so)
    wait_until(lambda: job(client, again)["state"] == "infeasible", message="requeued whole")
    assert "2 distinct agents" in job(client, again)["reason"]
    cluster.add_agent({"gpu": 3}, name="c")
    wait_until(lambda: pids(tmp_path, "c", again.id), message="run again, on b and c")
    assert not carries.done(), "work running in a failed group's other bundle carries on"
    (tmp_path / "go").touch()
    assert again.result(30).exit_code == 0
    assert sorted(job(client, again)["agents"]) == ["b", "c"]
    assert carries.result(30) == "b" and starts(ledger) == {"x": 1}
    pg.remove()


def test_a_broker_restart_keeps_groups_and_running_gangs(make_cluster, make_client,
                                                          tmp_path):
    cluster = make_cluster(agents=[{"gpu": 2}] * 2, names=["a", "b"])
    client = make_client(cluster.address)
    pg = client.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", name="kept")
    pg.ready().result(30)
    agents = [b["agent"] for b in group(client, pg)["bundles"]]
    inside = client.submit(hold, str(tmp_path / "go"), str(tmp_path / "inside"),
                           placement=(pg, 0))
    gang = client.submit_command(["sh", "-c", RANK], nodes=2, resources={"gpu": 1},
                                 env={"OUT": str(tmp_path)})
    wait_until(lambda: (tmp_path / "inside").exists() and gang.id is not None
               and all(pids(tmp_path, a, gang.id) for a in "ab"), message="all started")
    cluster.restart_broker()
    wait_until(lambda: group(client, pg)["state"] == "ready", message="the group taken back")
    assert [b["agent"] for b in group(client, pg)["bundles"]] == agents
    wait_until(lambda: job(client, gang)["state"] == "running", message="the job taken back")
    # bundle 1 is free for more; bundle 0's task still holds it (taken back into it)
    assert client.submit(where, placement=(pg, 1)).result(30) == agents[1]
    assert "bundle 0" in client.why(client.submit(where, placement=(pg, 0)))
    (tmp_path / "go").touch()
    assert inside.result(30) == "released"
    assert gang.result(30).exit_code == 0
    assert [r["state"] for r in job(client, gang)["ranks"]] == ["done", "done"]
    removed_all_free(client, pg)


def test_work_in_a_group_waiting_to_be_reserved_again_is_taken_back_once(make_cluster,
                                                                         make_client,
                                                                         tmp_path):
    """A task runs in bundle 0 of a group whose bundle 1 was lost with its agent: the group
    waits to be reserved again, the task holds what it took. A broker restarted then takes
    the task back as such (it did not: stopped there, it waited to run again, as if it had
    never arrived, its retries=0 notwithstanding)."""
    cluster = make_cluster(agents=[{"gpu": 1}] * 2, names=["a", "b"], **LOSS)
    client = make_client(cluster.address)
    pg = client.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", restarts=1)
    pg.ready().result(30)
    (first, second) = [b["agent"] for b in group(client, pg)["bundles"]]
    task, ledger = held_in(client, pg, 0, tmp_path)
    cluster.agents[second].kill()
    wait_until(lambda: group(client, pg)["state"] == "restarting", message="restarting")
    # (why it waits again, not how its first reservation ended: "finished")
    assert "its 2 bundles" in client.why(pg)
    cluster.restart_broker()
    wait_until(lambda: [a["name"] for a in client.status()["agents"]] == [first],
               message="its agent back")
    assert group(client, pg)["state"] == "restarting"
    (tmp_path / "go").touch()
    assert task.result(30) == first
    assert starts(ledger) == {"x": 1}
    removed_all_free(client, pg)


def test_a_group_is_taken_back_where_it_was_whatever_agent_comes_back_first(make_cluster,
                                                                           make_client,
                                                                           tmp_path):
    """The agent holding a group's bundle comes back after another: the group waits for it
    (it was placed anew on the first one back, away from its work, which then ran again);
    and removing it ends the work a restarted broker took back into it (it was left to run,
    and what waited in it waited forever)."""
    cluster = make_cluster(agents=[{"gpu": 1}] * 2, names=["a", "b"])
    client = make_client(cluster.address)
    pg = client.placement_group([{"gpu": 1}], strategy="PACK", name="kept")
    pg.ready().result(30)
    (holder,) = [b["agent"] for b in group(client, pg)["bundles"]]
    inside, ledger = held_in(client, pg, 0, tmp_path)
    waits = client.submit(noted_hold, ledger, str(tmp_path / "go"), placement=(pg, 0))
    wait_until(lambda: "waits for room in bundle 0" in client.why(waits), message="queued")
    stop_process(cluster.agents[holder].pid)
    try:
        cluster.restart_broker()
        other = "b" if holder == "a" else "a"
        wait_until(lambda: [a["name"] for a in client.status()["agents"]] == [other],
                   message="the other agent back first")
    finally:
        os.kill(cluster.agents[holder].pid, signal.SIGCONT)
    wait_until(lambda: len(client.status()["agents"]) == 2, message="both back")
    wait_until(lambda: group(client, pg)["state"] == "ready", message="the group back")
    assert [b["agent"] for b in group(client, pg)["bundles"]] == [holder]
    assert client.why(inside) == f"running on {holder}"
    pg.remove()
    with pytest.raises(CancelledError):
        inside.result(30)
    with pytest.raises(zres.ZresError, match="placement group kept was removed"):
        waits.result(30)
    assert starts(ledger) == {"x": 1}
    wait_until(lambda: all(s["free"] == s["total"] for a in client.status()["agents"]
                           for s in a["slots"]), message="everything given back")


def test_an_agent_drained_under_a_group_moves_it_without_spending_a_restart(make_cluster,
                                                                          make_client):
    """A planned leave (SIGTERM: drained, goodbye) of an agent holding a bundle reserves
    the group again on what is left, its restarts untouched: a node drained for
    maintenance does not fail the groups on it (restarts=0, the default)."""
    cluster = make_cluster(agents=[{"gpu": 2}] * 2, names=["a", "b"])
    client = make_client(cluster.address)
    pg = client.placement_group([{"gpu": 1}] * 2, strategy="SPREAD")
    pg.ready().result(30)
    assert sorted(b["agent"] for b in group(client, pg)["bundles"]) == ["a", "b"]
    cluster.agents["a"].terminate()
    wait_until(lambda: group(client, pg)["state"] == "ready"
               and [b["agent"] for b in group(client, pg)["bundles"]] == ["b", "b"],
               message="the group reserved again on b")
    assert group(client, pg)["restarts_left"] == 0
    assert client.submit(where, placement=(pg, 0)).result(30) == "b"
    pg.remove()
