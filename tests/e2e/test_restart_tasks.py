"""Python work lives through a broker restart (issue 16): the broker is SIGKILLed while
tasks and a command job run, and others wait in queue and for each other; started again
on its state, it takes back what its agent still runs, and the client, which reconnects
by itself, gets every value, with nothing run twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import zres
from tests.conftest import stop_process, wait_until
from zres.client import outbox

pytestmark = pytest.mark.timeout(120)


def record(ledger: str, key: str, value: int, gate: str | None = None) -> int:
    """Note in LEDGER that KEY ran (and in which process); wait for GATE if given."""
    with open(ledger, "a") as fh:
        fh.write(f"{key} {os.getpid()}\n")
    while gate is not None and not os.path.exists(gate):
        import time
        time.sleep(0.01)
    return value


def inc(x: int) -> int:
    return x + 1


def runs(ledger: Path) -> list[str]:
    return [line.split()[0] for line in ledger.read_text().splitlines()] \
        if ledger.exists() else []


def test_running_queued_and_waiting_tasks_live_through_a_broker_kill(make_cluster,
                                                                     make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 2}], nthreads=4)
    client = make_client(cluster.address)
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    done = client.submit(record, str(ledger), "done", 1)
    assert done.result(30) == 1
    running = client.submit(record, str(ledger), "running", 2, str(gate),
                            resources={"foo": 1})
    wait_until(lambda: "running" in runs(ledger), message="the long task to start")
    pids = tmp_path / "job-pids"
    job = client.submit_command(["sh", "-c", f"echo $$ >> {pids}; "
                                 f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                                resources={"foo": 1})
    wait_until(lambda: pids.exists(), message="the job to start")
    queued = [client.submit(record, str(ledger), f"queued-{i}", 10 + i,
                            resources={"foo": 2}) for i in range(3)]
    queued_job = client.submit_command(["sh", "-c", f"echo queued >> {pids}"],
                                       resources={"foo": 2})
    chain = [client.submit(inc, running)]
    chain.append(client.submit(inc, chain[-1]))
    before = cluster.broker.pid

    cluster.restart_broker()
    gate.touch()
    assert cluster.broker.pid != before
    assert running.result(60) == 2
    assert [f.result(60) for f in queued] == [10, 11, 12]
    assert [f.result(60) for f in chain] == [3, 4]
    assert job.result(60).exit_code == 0 and queued_job.result(60).exit_code == 0
    assert len(pids.read_text().split()) == 2, "the running job was started again"
    assert client.submit(inc, done).result(30) == 2, "a result from before the restart"
    assert sorted(runs(ledger)) == sorted(["done", "running", "queued-0", "queued-1",
                                           "queued-2"]), "a task ran twice, or not at all"


def test_a_submission_the_broker_never_read_is_sent_again(make_cluster, make_client,
                                                          monkeypatch):
    """... and a client sends a broker that reads nothing at most a window of tasks: the
    rest of a large map waits in the client, and every task of it runs after the broker
    is killed and started again."""
    monkeypatch.setattr(outbox, "WINDOW", 500, raising=False)
    cluster = make_cluster(agents=[{"foo": 1}])
    client = make_client(cluster.address)
    assert client.submit(inc, 0).result(30) == 1
    stop_process(cluster.broker.pid)  # it reads nothing more, then dies
    future = client.submit(inc, 41)
    flood = client.map(inc, range(3_000))
    wait_until(lambda: len(client._io.unacked) >= 500, message="a window to be sent")
    assert len(client._io.outbox) >= 3_001 - 500, \
        "more than a window of tasks was sent to a broker that acknowledged none"
    cluster.restart_broker()
    assert future.result(60) == 42
    assert [f.result(60) for f in flood] == list(range(1, 3_001))


def test_tasks_submitted_while_the_client_reconnects_are_kept(make_cluster, make_client):
    """A thread submits all through a broker restart. Those submitted while the client's
    hello to the new broker waits for its welcome wait in the client's queue, never sent:
    they must be sent then, not reported as tasks the broker did not keep."""
    import concurrent.futures as cf
    import threading

    cluster = make_cluster(agents=[{"foo": 1}], nthreads=2)
    client = make_client(cluster.address)
    futures: list[zres.Future[int]] = []
    restarting, stop = threading.Event(), threading.Event()

    # (submits go on while the broker is away, ten thousand a second and more: all but the
    # first two thousand are made while it restarts, and queued)
    def keep_submitting() -> None:
        while not stop.is_set() and len(futures) < 5_000:
            if len(futures) == 2_000:
                restarting.wait(60)  # (the rest submitted through the restart)
            futures.append(client.submit(inc, len(futures)))

    submitter = threading.Thread(target=keep_submitting)
    submitter.start()
    try:
        wait_until(lambda: len(futures) >= 2_000, message="submits to begin")
        epoch = client._io.epoch
        restarting.set()
        cluster.restart_broker()
        wait_until(lambda: client._io.epoch != epoch, message="the client to reconnect")
        after = len(futures)
        wait_until(lambda: len(futures) > min(after + 500, 4_999), message="submits to go on")
    finally:
        restarting.set()
        stop.set()
        submitter.join(30)
    _, stuck = cf.wait(futures, timeout=90)
    assert not stuck, f"{len(stuck)} of {len(futures)} never ended, the first task " \
        f"{min(f._local for f in stuck)} (the broker has {client.status()['counts']})"
    failed = [(i, f.exception()) for i, f in enumerate(futures) if f.exception()]
    assert not failed, f"{len(failed)} of {len(futures)} failed, first: {failed[0]}"
    assert [f.result() for f in futures] == list(range(1, len(futures) + 1))


def test_a_result_let_go_of_as_the_broker_dies_is_not_kept_for_ever(make_cluster,
                                                                    make_client):
    """The client lets go of a result; its release reaches a broker that never reads it
    (SIGSTOPped, then SIGKILLed). The restarted broker restores the result as the
    client's, and the client's resume (all it still holds) lets go of it: it was held
    until the client left."""
    cluster = make_cluster(agents=[{"foo": 1}])
    client = make_client(cluster.address)
    kept, let_go = client.submit(inc, 1), client.submit(inc, 2)
    assert (kept.result(30), let_go.result(30)) == (2, 3)
    stop_process(cluster.broker.pid)
    epoch = client._io.epoch
    del let_go
    wait_until(lambda: not client._io.outbox, message="the release to be sent")
    cluster.restart_broker()
    wait_until(lambda: client._io.epoch != epoch, message="the client to reconnect")
    wait_until(lambda: client.status()["counts"] == {"finished": 1},
               message="only the result still held to be kept")
    assert client.submit(inc, kept).result(30) == 3, "the result still held was kept"


def test_a_direct_grant_sent_as_the_broker_is_killed_runs_once(make_cluster, make_client,
                                                               tmp_path):
    """The broker keeps that a direct grant may have begun before it sends it, and is
    killed right after: its agent (stopped meanwhile) either got it, and runs it (the
    restarted broker takes it back), or did not, and it is granted again, uncharged.
    Either way its body runs once."""
    cluster = make_cluster(agents=[{"foo": 1}], names=["node"], heartbeat_timeout=10.0)
    client = make_client(cluster.address)
    ledger = tmp_path / "ledger"
    assert client.submit(inc, 0).result(30) == 1
    agent = cluster.agents["node"]
    stop_process(agent.pid)  # (for a moment: its lease holds)
    try:
        future = client.submit(record, str(ledger), "once", 7, resources={"foo": 1},
                               retries=0)
        wait_until(lambda: client.why(future) == "running on node", message="the grant")
        cluster.restart_broker()
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert future.result(60) == 7
    assert runs(ledger) == ["once"]
