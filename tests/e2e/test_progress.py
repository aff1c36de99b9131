"""What a user watching work sees: a progress bar over futures, and a future that says it
runs once it runs."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import hold

pytestmark = pytest.mark.timeout(60)


def fails_on(i: int, bad: int) -> int:
    if i == bad:
        raise ValueError(f"{i} is bad")
    return i


def test_progress_counts_what_ended_and_what_failed(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    futures = client.map(fails_on, range(5), [3] * 5)
    out = io.StringIO()
    returned = zres.progress({"some": futures[:2], "rest": futures[2:]}, file=out,
                             desc="work")
    assert sorted(f.id for f in returned) == sorted(f.id for f in futures)
    assert None not in [f.id for f in futures], "the broker's ids, told before the results"
    assert all(f.done() for f in futures)
    final = out.getvalue().splitlines()[-1] if "\n" in out.getvalue() else out.getvalue()
    assert "work" in final and "5/5" in final and "error=1" in final, out.getvalue()
    with pytest.raises(TypeError, match="progress\\(\\) takes futures"):
        zres.progress([futures[0], 42])


def test_a_future_says_running_once_its_task_runs(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"CPU": 1}])
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    held = client.submit(hold, release, marker)
    waiting = client.submit(hold, release, str(tmp_path / "second"))
    wait_until(lambda: os.path.exists(marker), message="the task to start")
    wait_until(lambda: "running" in repr(held), message="its future to say so")
    assert "queued" in repr(waiting), "a task waiting for the CPU does not run"
    Path(release).touch()
    assert held.result(30) == "released"
    assert "finished" in repr(held)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


def test_notebooks_show_clients_clusters_futures_and_actors(make_cluster, make_client,
                                                            tmp_path):
    cluster = make_cluster(agents=[{"GPU": 1, "MEMORY": "4GiB"}], names=["gpu-a"],
                           http="127.0.0.1:0")
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    held = client.submit(hold, release, marker, resources={"GPU": 1})
    wait_until(lambda: os.path.exists(marker) and held.running(), message="the task to run")

    card = client._repr_html_()
    assert cluster.address in card and "gpu-a" in card
    assert "<td>GPU</td>" in card and "<td>0 / 1</td>" in card, card
    assert "<td>4 GiB / 4 GiB</td>" in card, card
    assert "1 running" in card
    assert f'href="{cluster.dashboard}"' in card, "a link to the dashboard"
    assert "gpu-a" in cluster._repr_html_()
    assert ">running</b>" in held._repr_html_()
    infeasible = client.submit(hold, release, marker, resources={"GPU": 2})
    wait_until(lambda: infeasible.infeasible, message="the infeasible warning")
    assert "GPU=2" in infeasible._repr_html_()
    Path(release).touch()
    held.result(30)
    assert ">finished</b> on gpu-a" in held._repr_html_()

    counter = client.actor(Counter, name="counter")
    assert "Counter" in counter._repr_html_() and "add" in counter._repr_html_()
    client.close()
    assert "closed" in client._repr_html_()
