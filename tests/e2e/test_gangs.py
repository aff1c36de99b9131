"""Gangs end to end on several agents (token resources ``gpu`` stand for GPUs): placement
groups by each strategy, tasks and actors in their bundles, two groups that would deadlock
if taken piecemeal, removal; multi-node command jobs (their ranks' environment, a failing
rank, cancel, logs). One cluster of three agents serves the module; the tests that kill an
agent or the broker are in test_gangs_faults."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import zres
from tests.cli.test_cli import clean_env, zres_cli
from tests.conftest import process_gone, wait_until
from tests.tasks import hold
from zres import get_task_context
from zres.core import keys as K

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
    assert "reserved all at once" in client.why(later)
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
        wait_until(lambda: "infeasible" in client.why(pg), message="infeasible")
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


def test_a_group_is_its_owners_alone(cluster, client, tmp_path):
    """Another client key may not place work in a group, remove it or find it by name."""
    pg = client.placement_group([{"gpu": 1}], name="mine")
    pg.ready().result(30)
    made = K.keygen(cluster.keys, role="client", name="alice")
    (tmp_path / "alice").mkdir()
    for key in (Path(cluster.keys) / f"{K.BROKER}.key", made[0]):
        shutil.copy(key, tmp_path / "alice")
    with zres.Client(cluster.address, keys=str(tmp_path / "alice")) as alice:
        with pytest.raises(ValueError, match="belongs to admin: only admin or an admin key"):
            alice.submit(where, 0, placement=(pg, 0)).result(30)
        with pytest.raises(zres.ZresError, match="belongs to admin"):
            alice.remove_placement_group(pg)
        with pytest.raises(ValueError, match="exists but belongs to admin"):
            alice.get_placement_group("mine")
    assert groups_of(client)[pg.id]["state"] == "ready"
    pg.remove()


# -- multi-node command jobs -------------------------------------------------------------------

# Rank 0 serves its master port; every rank writes what it was given, and rank 1 connects
# to its master and writes what the master said: the ranks see one another.
RANK = r"""
import os, socket, sys, time
out, rank = sys.argv[1], int(os.environ["NODE_RANK"])
keys = ("ZRES_NODE_RANK", "ZRES_NNODES", "ZRES_MASTER_ADDR", "ZRES_MASTER_PORT", "NODE_RANK",
        "NNODES", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ZRES_JOB_ID", "ZRES_AGENT",
        "PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT")
with open(f"{out}/env-{rank}", "w") as fh:
    fh.write(repr({k: os.environ.get(k) for k in keys}))
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    server = socket.create_server(addr)
    conn, _ = server.accept()
    conn.sendall(f"master on {os.environ['ZRES_AGENT']}".encode())
    conn.close()
else:
    deadline = time.time() + 30
    while True:
        try:
            said = socket.create_connection(addr, timeout=5).recv(100).decode()
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    open(f"{out}/said-{rank}", "w").write(said)
print(f"rank {rank} done")
"""

# Each rank writes its pid; rank FAIL exits 3 at once, the others wait for good.
LINGER = ('echo $$ > "$OUT/pid-$NODE_RANK"; if [ "$NODE_RANK" = "$FAIL" ]; then exit 3; fi; '
          'while true; do sleep 0.05; done')


def test_a_two_node_job_runs_a_rank_on_each_agent_that_see_one_another(cluster, client,
                                                                        tmp_path):
    job = client.submit_command([sys.executable, "-c", RANK, str(tmp_path)], nodes=2,
                                resources={"gpu": 2})
    result = job.result(60)
    envs = [eval((tmp_path / f"env-{rank}").read_text()) for rank in (0, 1)]
    assert [e["NODE_RANK"] for e in envs] == [e["ZRES_NODE_RANK"] for e in envs] == \
        [e["PET_NODE_RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert env["NNODES"] == env["ZRES_NNODES"] == env["WORLD_SIZE"] == \
            env["PET_NNODES"] == "2"
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == (env["MASTER_ADDR"],
                                                                    env["MASTER_PORT"])
        assert env["ZRES_JOB_ID"] == str(result.job_id)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (envs[0]["ZRES_MASTER_ADDR"],
                                                            envs[0]["ZRES_MASTER_PORT"])
    assert envs[0]["ZRES_AGENT"] != envs[1]["ZRES_AGENT"]
    assert (tmp_path / "said-1").read_text() == f"master on {envs[0]['ZRES_AGENT']}"
    (entry,) = [j for j in client.jobs(all=True) if j["id"] == result.job_id]
    assert entry["agents"] == [envs[0]["ZRES_AGENT"], envs[1]["ZRES_AGENT"]]
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
    both = zres_cli("logs", str(result.job_id), env=env).stdout.splitlines()
    assert sorted(both) == ["[rank 0] rank 0 done", "[rank 1] rank 1 done"]
    assert zres_cli("logs", str(result.job_id), "--rank", "1", env=env).stdout == \
        "rank 1 done\n"
    assert ",".join(entry["agents"]) in zres_cli("jobs", "--all", env=env).stdout


def test_a_multi_node_jobs_result_is_rank_0s_whichever_rank_ends_first(client, tmp_path):
    """Its CommandResult's agent and log are rank 0's, as ``zres jobs`` says (they were
    the rank's that happened to end first)."""
    job = client.submit_command(
        ["sh", "-c", 'echo "rank $NODE_RANK"; [ "$NODE_RANK" = 1 ] && exit 0; '
                     'while [ ! -e "$OUT/go" ]; do sleep 0.05; done'],
        nodes=2, resources={"gpu": 1}, env={"OUT": str(tmp_path)})

    def entry() -> dict:
        (found,) = [j for j in client.jobs(all=True) if j["id"] == job.id]
        return found
    wait_until(lambda: job.id is not None and entry()["ranks"][1]["state"] == "done",
               message="rank 1 ended first")
    (tmp_path / "go").touch()
    result = job.result(60)
    assert result.agent == entry()["agents"][0] == entry()["agent"]
    assert Path(result.log).read_text() == "rank 0\n"


def test_a_failing_rank_stops_the_others_and_the_job_names_it(client, tmp_path):
    job = client.submit_command(["sh", "-c", LINGER], nodes=3, resources={"gpu": 1},
                                env={"OUT": str(tmp_path), "FAIL": "2"})
    with pytest.raises(zres.CommandFailed, match=r"rank 2 .*exited with code 3"):
        job.result(60)
    (entry,) = [j for j in client.jobs(all=True) if j["id"] == job.id]
    assert entry["state"] == "failed" and entry["exit_code"] == 3
    assert entry["reason"].startswith("rank 2 on ") and "exit code 3" in entry["reason"]
    assert [r["state"] for r in entry["ranks"]] == ["cancelled", "cancelled", "failed"]
    for rank in (0, 1):  # (stopped: their process groups are gone)
        assert process_gone(int((tmp_path / f"pid-{rank}").read_text()))


def test_cancelling_a_multi_node_job_stops_every_rank(cluster, client, tmp_path):
    """From the command line: zres submit --nodes 2 prints one job id, zres cancel stops
    both ranks (their process groups), and the job ends cancelled once both are gone."""
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
    submitted = zres_cli("submit", "--nodes", "2", "-r", "gpu=2", "--env", f"OUT={tmp_path}",
                         "--env", "FAIL=none", "--shell", LINGER, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)
    wait_until(lambda: all((tmp_path / f"pid-{r}").exists() for r in (0, 1)),
               message="both ranks started")
    (entry,) = [j for j in client.jobs() if j["id"] == job_id]
    assert entry["state"] == "running" and len(set(entry["agents"])) == 2
    assert zres_cli("cancel", str(job_id), env=env).returncode == 0
    wait_until(lambda: [j["state"] for j in client.jobs(all=True) if j["id"] == job_id]
               == ["cancelled"], message="the job cancelled")
    for rank in (0, 1):
        assert process_gone(int((tmp_path / f"pid-{rank}").read_text()))


def test_status_and_metrics_show_groups_their_bundles_and_where(client):
    from zres.broker.metrics import _gangs
    from zres.cli.status_text import render_status
    pg = client.placement_group([{"gpu": 1}] * 2, strategy="STRICT_SPREAD", name="shown")
    pg.ready().result(30)
    agents = agents_of(client, pg)
    status = client.status()
    text = render_status(status)
    section = text.split("placement groups:\n")[1].split("\n\n")[0]
    line = " ".join(section.split())  # (its bundles wrap onto lines of their own)
    assert line.startswith("shown") and max(map(len, section.splitlines())) <= 100
    assert f"[0] gpu=1 on {agents[0]}" in line and f"[1] gpu=1 on {agents[1]}" in line
    assert "ready STRICT_SPREAD" in line
    families = {f.name: {tuple(s.labels.values()): s.value for s in f.samples}
                for f in _gangs(status)}
    assert families["zres_placement_groups"][("ready",)] == 1
    assert {a: families["zres_placement_group_bundles"][(a,)] for a in agents} == \
        {a: 1 for a in agents}
    pg.remove()


def test_an_agent_coming_and_going_while_a_gang_waits_is_judged_not_fatal(cluster, client):
    """An agent leaving while a gang waits in the queue made the broker judge the gang's
    queue lane as a plain request (its shape ends with the gang), and die."""
    with pytest.warns(zres.InfeasibleWarning, match="only 3 could ever hold one"):
        pg = client.placement_group([{"gpu": 1}] * 5, strategy="STRICT_SPREAD")
        wait_until(lambda: "infeasible" in client.why(pg), message="infeasible")
    cluster.add_agent({"gpu": 1}, name="d")
    wait_until(lambda: "only 4 could" in client.why(pg), message="judged again with d")
    d = cluster.agents.pop("d")
    d.terminate()  # (it says goodbye: the broker judges again)
    d.wait(30)
    wait_until(lambda: "d" not in [a["name"] for a in client.status()["agents"]],
               message="d gone")
    assert cluster.broker is not None and cluster.broker.poll() is None, "the broker died"
    wait_until(lambda: "only 3 could" in client.why(pg), message="judged again without d")
    pg.remove()


def test_a_job_on_more_nodes_than_agents_is_infeasible_and_cancelled_whole(client):
    with pytest.warns(zres.InfeasibleWarning, match="4 distinct agents"):
        job = client.submit_command(["true"], nodes=4, resources={"gpu": 1})
        wait_until(lambda: job.id is not None and job.infeasible, message="warned")
    (entry,) = [j for j in client.jobs() if j["id"] == job.id]
    assert entry["state"] == "infeasible" and "STRICT_SPREAD" in entry["reason"]
    client.cancel([job])
    assert job.cancelled()
    with pytest.raises(zres.InfeasibleError, match="4 distinct agents"):
        client.submit_command(["true"], nodes=4, resources={"gpu": 1},
                              infeasible="error").result(30)
