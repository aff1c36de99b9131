"""Every view says the same (issue 27): one list of task states in zres status, its JSON,
/api/status, /metrics, client.status() and the futures' reprs; the broker's task id in a
future's repr; memory as it was given (64 GiB) in status, reasons and notebook cards; a
pending future's card says why it waits, an actor's its state, agent and holdings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import zres
from tests.conftest import wait_until
from tests.e2e.test_metrics import get, scrape
from tests.tasks import hold
from zres.cli.status_text import render_status
from zres.client import html
from zres.core.report import STATES

pytestmark = pytest.mark.timeout(120)


def fail() -> None:
    raise KeyError("on purpose")


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def _secret(self) -> int:
        return 42


def test_every_view_says_the_same(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1, "MEMORY": "64GiB"}], nthreads=4,
                           names=["node"], http="127.0.0.1:0")
    # (another client's task first: the broker's ids are not this client's own numbers)
    assert make_client(cluster.address).submit(abs, -1).result(30) == 1
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    futures = {"finished": client.submit(abs, -1, key="finished"),
               "error": client.submit(fail, key="error")}
    zres.wait(list(futures.values()), timeout=30)
    futures["running"] = client.submit(hold, release, marker, resources={"slot": 1},
                                       key="running")
    wait_until(lambda: os.path.exists(marker), message="a task to run")
    futures["queued"] = client.submit(hold, release, marker, resources={"slot": 1},
                                      key="queued")
    futures["waiting"] = client.submit(abs, futures["queued"], key="waiting")
    futures["cancelled"] = client.submit(hold, release, marker, resources={"slot": 1},
                                         key="cancelled")
    assert futures["cancelled"].cancel()
    with pytest.warns(zres.InfeasibleWarning):
        big = client.submit(abs, 1, resources={"MEMORY": "128GiB"}, key="big")
        wait_until(lambda: big.infeasible, message="the infeasible warning")
    counter = client.actor(Counter, resources={"MEMORY": "1GiB"})
    assert counter.add(2).result(30) == 2

    # One word per state, the same in every view (the actor's construction has finished).
    expected = {"waiting": 1, "queued": 2, "running": 1, "finished": 2, "error": 1,
                "cancelled": 1}
    wait_until(lambda: client.status()["counts"] == expected,
               message=f"the counts to be {expected}, not {client.status()['counts']}")
    report = json.loads(get(cluster.dashboard + "api/status")[1])
    assert report["counts"] == expected
    samples = scrape(cluster.dashboard)
    assert {s: samples["zres_tasks", (("state", s),)] for s in STATES} == \
        {s: expected.get(s, 0) for s in STATES}
    assert "tasks: waiting=1, queued=2, running=1, finished=2, error=1, cancelled=1" in \
        render_status(client.status())
    for word, future in futures.items():
        # A future says the state status says, and the task id status and errors use.
        assert future.status == word, (word, future.status)
        assert repr(future) == f"<zres.Future {word} id={future.id} {word}>"
    [running] = client.status()["running"]
    assert (running["id"], running["name"]) == (futures["running"].id, "running")
    assert futures["running"].id != futures["running"]._local, "the broker's id, not ours"

    # Memory as it was given, wherever it is shown.
    text = render_status(client.status())
    assert "MEMORY=63 GiB/64 GiB" in text, text  # (the actor holds 1 GiB)
    assert "needs MEMORY=128 GiB, largest agent has MEMORY=64 GiB" in " ".join(text.split())
    card = html.cluster("zres.Client", cluster.address, client.status())
    # (bars of what is in use: a quarter of the CPUs, all of the slot)
    assert "width:25%" in card.split("<td>CPU</td>")[1].split("</tr>")[0]
    assert "63 GiB / 64 GiB" in card and "width:100%" in card.split("<td>slot</td>")[1]
    # Cards: why a pending future waits, the state of the others; an actor's state, agent
    # and holdings, its public methods only.
    assert "needs CPU=1 slot=1; node has slot=0 free" in futures["queued"]._repr_html_()
    assert "waiting for 1 of 1 dependencies: queued" in futures["waiting"]._repr_html_()
    assert ">finished</b>" in futures["finished"]._repr_html_()
    card = counter._repr_html_()
    assert "<b>alive</b> on node" in card and "holds MEMORY=1 GiB" in card
    assert "methods: add</div>" in card and "_secret" not in card
    Path(release).touch()
    assert futures["queued"].result(30) == "released"
