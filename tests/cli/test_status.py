"""``zres status`` for people and scripts: waiting work grouped by request and reason,
running tasks listed and cut, every line within 100 columns, --json, --watch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import clean_env, zres_cli
from tests.conftest import wait_until
from tests.tasks import hold

LONG = "a-task-whose-name-goes-on-and-on-" * 5  # 165 characters, no space to break at


@pytest.fixture
def busy(make_cluster, make_client, tmp_path):
    """A cluster with 24 tasks running, 30 waiting for room, 5 that can never run and 2
    waiting for a dependency; released at teardown."""
    cluster = make_cluster(agents=[{"GPU": 2, "slot": 24, "MEMORY": "4096MiB"}], nthreads=30,
                           names=["node-with-a-rather-long-name-for-a-node"])
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    markers = [str(tmp_path / f"m{i}") for i in range(24)]
    running = [client.submit(hold, release, m, resources={"slot": 1}, key=f"run{i}")
               for i, m in enumerate(markers)]
    wait_until(lambda: all(os.path.exists(m) for m in markers), timeout=60,
               message="24 tasks to start")
    blocked = [client.submit(hold, release, str(tmp_path / "x"), resources={"slot": 1},
                             key=LONG if i == 0 else f"blocked{i}") for i in range(30)]
    with pytest.warns(Warning):
        never = [client.submit(pow, 1, 1, resources={"GPU": 3}, key=f"never{i}")
                 for i in range(5)]
        wait_until(lambda: all(f.infeasible for f in never), message="infeasible warnings")
    after = [client.submit(len, running[0], key=f"after{i}") for i in range(2)]
    yield cluster, client
    Path(release).touch()
    for future in running + blocked + after:
        future.result(60)


def test_status_groups_waiting_work_and_cuts_long_lists(busy, tmp_path):
    cluster, _ = busy
    result = zres_cli("status", cluster.address, "--keys", cluster.keys, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    text = result.stdout
    waiting = text[text.index("waiting and queued:"):text.index("running:")]
    # One line (wrapped within 100 columns) per request and reason, with its count.
    assert "30 x CPU=1 slot=1 (" in waiting and "blocked1, blocked2, ..." in waiting
    assert "5 x CPU=1 GPU=3 (never0, never1, never2, ...): infeasible: needs GPU=3, " \
           "largest agent has GPU=2" in " ".join(waiting.split())
    assert "2 x CPU=1 (after0, after1): waiting for dependencies" in waiting
    assert waiting.count(" x ") == 3
    running = text[text.index("running:"):].splitlines()[1:]
    assert len(running) == 21 and running[-1] == "  ... and 4 more"
    assert all(" on node-with-a-rather-long-name-for-a-node  CPU=1 slot=1  for " in line
               for line in running[:-1])


def test_status_json_is_the_report_in_user_units(busy, tmp_path):
    cluster, client = busy
    result = zres_cli("status", cluster.address, "--keys", cluster.keys, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    slot = report["agents"][0]["slots"][0]
    assert slot["total"] == {"CPU": 30.0, "GPU": 2.0, "slot": 24.0, "MEMORY": 4294967296.0}
    assert slot["free"]["slot"] == 0.0 and slot["free"]["CPU"] == 6.0
    assert report["counts"]["running"] == 24
    assert {(g["request"], g["count"]) for g in report["groups"]} == {
        ("CPU=1 slot=1", 30), ("CPU=1 GPU=3", 5), ("CPU=1", 2)}
    assert len(report["running"]) == 24 and report["running"][0]["units"] == \
        {"CPU": 1.0, "slot": 1.0}
    # client.status() is the same report: 4096 MiB is 4294967296 bytes, not fixed point.
    mine = client.status()
    assert mine["agents"][0]["slots"][0]["total"]["MEMORY"] == 4096 * 2**20
    assert mine["groups"] == report["groups"]


def test_status_watch_refreshes_until_interrupted(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], names=["watched"])
    watch = subprocess.Popen([sys.executable, "-m", "zres", "status", cluster.address,
                              "--keys", cluster.keys, "--watch", "0.2", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env(), cwd=tmp_path)
    try:
        first = json.loads(watch.stdout.readline())
        assert [a["name"] for a in first["agents"]] == ["watched"]
        cluster.add_agent({"bar": 1}, name="joined")
        # Refreshed screens until one shows the agent that joined since the first.
        for line in watch.stdout:
            if [a["name"] for a in json.loads(line)["agents"]] == ["joined", "watched"]:
                break
        watch.send_signal(signal.SIGINT)
        assert watch.wait(10) == 130
        assert "Traceback" not in watch.stderr.read()
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.stdout.close()
        watch.stderr.close()
    # Its reader gone (`| head`), it ends quietly at its next refresh.
    piped = subprocess.run(f"{sys.executable} -m zres status {cluster.address} --keys "
                           f"{cluster.keys} --watch 0.1 | head -n 1", shell=True, env=clean_env(),
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert piped.stdout.count("\n") == 1, piped.stdout
    assert piped.stderr == ""


def test_a_reserved_task_is_a_group_of_its_own(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=4, names=["node"],
                           env={"ZRES_BROKER__STARVATION_AFTER": "0.3"})
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    holding = client.submit(hold, release, marker, resources={"slot": 1}, key="holding")
    wait_until(lambda: os.path.exists(marker), message="the first task to start")
    wide = [client.submit(hold, release, str(tmp_path / f"w{i}"), resources={"slot": 2},
                          key=f"wide{i}") for i in range(3)]

    def groups():  # (count, names, whether it holds the reservation)
        client.submit(abs, 1).result(30)  # a scheduling pass: one reserves, once starved
        return sorted((g["count"], g["names"], "holds a reservation on node" in g["reason"])
                      for g in client.status()["groups"])
    # The first to wait reserves the node once it has starved; the others wait behind it.
    wait_until(lambda: groups() == [(1, ["wide0"], True), (2, ["wide1", "wide2"], False)],
               message=f"the reserved task apart, not {groups()}")
    Path(release).touch()
    assert holding.result(30) == "released" and [f.result(30) for f in wide] == ["released"] * 3


def test_owners_are_shown_in_fair_share_order_with_their_holdings_and_quotas():
    """Several owners (or a quota): each one's holdings, share of recent use, tasks
    waiting and quotas, in the order a pass serves them; one owner alone: nothing new."""
    from zres.cli.status_text import render_status
    from zres.core.report import in_user_units
    from zres.core.resources import UNIT

    def owner(name: str, holds: dict[str, int], share: float, waiting: int,
              quota: dict[str, int] | None = None, queued: int | None = None) -> dict:
        return {"owner": name, "holds": holds, "grants": len(holds), "weight": 0.1,
                "usage": 1.0, "share": share, "charge": 1.0, "waiting": waiting,
                "quota": quota, "queued_quota": queued}

    report = {"address": "tcp://b:1", "clients": 2, "agents": [], "counts": {},
              "owners": [owner("bob", {"CPU": UNIT}, 0.02, 3),
                         owner("alice", {"GPU": 4 * UNIT}, 0.98, 299_996,
                               {"GPU": 4 * UNIT}, 300_000)]}
    lines = render_status(in_user_units(report)).splitlines()
    start = lines.index("owners (fair share: served in this order, least recent use first):")
    bob, alice = lines[start + 1], " ".join(lines[start + 2:])
    assert bob.split()[0] == "bob" and "holds CPU=1 (1 grant)" in bob and \
        "recent use 2%" in bob
    assert alice.split()[0] == "alice" and "quota GPU=4" in alice and \
        "may queue 300,000" in alice and "waiting 299,996" in alice
    assert max(len(line) for line in lines) <= 100
    alone = {**report, "owners": [owner("", {"CPU": UNIT}, 1.0, 5)]}
    assert "owners" not in render_status(in_user_units(alone))


def test_an_agents_stored_results_are_counted_in_words():
    from zres.cli.status_text import render_status
    from zres.core.report import in_user_units
    from zres.core.resources import UNIT

    def report(objects: int) -> str:
        agent = {"name": "node", "slots": [{"total": {"CPU": UNIT}, "free": {"CPU": UNIT},
                                            "running": 0, "gpus": []}],
                 "store": {"objects": objects, "memory": 5 << 20, "spilled": 0}}
        return render_status(in_user_units({"address": "tcp://b:1", "clients": 0,
                                            "agents": [agent], "counts": {}}))
    assert "holds 1 result: 5 MiB in memory, 0 B on disk" in report(1)
    assert "holds 2 results: 5 MiB in memory" in report(2)


def test_an_actors_memory_is_shown_as_a_tasks_is():
    from zres.cli.status_text import render_status
    from zres.core.report import in_user_units
    from zres.core.resources import UNIT

    actor = {"id": "c0ffee00", "cls": "Model", "name": "model", "agent": "node",
             "state": "alive", "units": {"MEMORY": 300 * UNIT}, "running": 1, "queued": 0,
             "restarts_left": 0, "memory": 120 << 20, "peak_memory": 130 << 20,
             "memory_shown": "120 MiB (peak 130 MiB)"}
    text = render_status(in_user_units({"address": "tcp://b:1", "clients": 0, "agents": [],
                                        "counts": {}, "actors": [actor]}))
    assert "Model(model)" in text and "memory 120 MiB (peak 130 MiB)" in text, text
