"""Work whose client is gone (issue 27): a closed, interrupted or killed client's running
tasks are stopped and their resources come back within seconds; a detached task runs on, listed in
status, /api/status and /metrics with its owner and its client gone, through a broker
restart, and only its owner (or an admin) stops it by id."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.e2e.test_metrics import get, scrape
from tests.e2e.test_security import cli
from tests.tasks import hold
from zres.core import keys as K
from zres.core.errors import ZresError

pytestmark = pytest.mark.timeout(180)

# A program that holds both tokens with two tasks, says so, and waits to be killed.
PROGRAM = textwrap.dedent("""
    import os, pathlib, sys, time
    import zres

    def hold(marker):
        pathlib.Path(marker).touch()
        while True:
            time.sleep(0.02)

    address, keys, markers = sys.argv[1], sys.argv[2], sys.argv[3:]
    client = zres.Client(address, keys=keys)
    futures = [client.submit(hold, m, resources={"token": 1}, key=f"killed{i}")
               for i, m in enumerate(markers)]
    while not all(f.running() for f in futures):
        time.sleep(0.02)
    print("running", flush=True)
    time.sleep(600)
""")


# A program that submits a task and simply reaches its end: it waits for the task first.
ENDING = textwrap.dedent("""
    import pathlib, sys, time
    import zres

    def slow(marker):
        time.sleep(0.5)
        pathlib.Path(marker).touch()

    zres.Client(sys.argv[1], keys=sys.argv[2]).submit(slow, sys.argv[3], resources={"token": 1})
""")


def key_dir(cluster_keys: str, into: Path, name: str) -> str:
    """A directory holding the broker's public key and a client key of NAME."""
    made = K.keygen(cluster_keys, role="client", name=name)
    into.mkdir()
    shutil.copy(Path(cluster_keys) / f"{K.BROKER}.key", into)
    shutil.copy(made[0], into)
    return str(into)


def both_held(paths: list[Path]) -> bool:
    return all(p.exists() for p in paths)


def test_a_gone_clients_work_is_stopped_and_detached_work_kept(make_cluster, make_client,
                                                               tmp_path, spawn):
    cluster = make_cluster(agents=[{"token": 2}], nthreads=4, names=["node"],
                           http="127.0.0.1:0", env={"ZRES_BROKER__CLIENT_GRACE": "1"})
    alice_keys = key_dir(cluster.keys, tmp_path / "alice", "alice")
    bob_keys = key_dir(cluster.keys, tmp_path / "bob", "bob")
    other = make_client(cluster.address, keys=bob_keys)
    never = str(tmp_path / "never")  # (what holds a token holds it until stopped)

    # A client closed while its two tasks hold both tokens: both are stopped, and a task
    # of another client that waits for the tokens starts.
    closing = make_client(cluster.address, keys=alice_keys)
    markers = [tmp_path / f"closed{i}" for i in range(2)]
    for i, marker in enumerate(markers):
        closing.submit(hold, never, str(marker), resources={"token": 1}, key=f"closed{i}")
    wait_until(lambda: both_held(markers), message="the closing client's tasks to start")
    started = tmp_path / "waits"
    waits = other.submit(hold, never, str(started), resources={"token": 2}, key="waits")
    wait_until(lambda: waits.status == "queued" and waits.id is not None
               and cluster.status()["counts"].get("queued") == 1, message="it to queue")
    closing.close()
    wait_until(lambda: started.exists(), timeout=20,
               message="the tokens back, and the waiting task started")

    # A program interrupted (Ctrl-C: it says goodbye at exit, not waiting for its tasks),
    # and one killed (SIGKILL: no goodbye, its connection drops), alike, after the grace.
    other.cancel(waits, force=True)
    wait_until(lambda: waits.cancelled(), timeout=20, message="its task stopped")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    for how in (signal.SIGINT, signal.SIGKILL):
        markers = [tmp_path / f"{how.name}{i}" for i in range(2)]
        program = spawn([sys.executable, "-c", PROGRAM, cluster.address, alice_keys,
                         *map(str, markers)], stdout=subprocess.PIPE, env=env)
        assert program.stdout.readline() == b"running\n"
        started = tmp_path / f"waits-{how.name}"
        again = other.submit(hold, never, str(started), resources={"token": 2})
        wait_until(lambda: cluster.status()["counts"].get("queued") == 1,
                   message="it to queue")
        program.send_signal(how)
        wait_until(started.exists, timeout=20,
                   message=f"the tokens back after {how.name}, and the waiting task started")
        assert program.wait(20) == -how  # (Python ends by the signal after a Ctrl-C too)
        other.cancel(again, force=True)
        wait_until(again.cancelled, timeout=20, message="its task stopped")

    # A program that simply reaches its end waits for what it submitted, then goes.
    marker = tmp_path / "ended"
    ending = subprocess.run([sys.executable, "-c", ENDING, cluster.address, alice_keys,
                             str(marker)], env=env, capture_output=True, timeout=60)
    assert ending.returncode == 0 and marker.exists(), ending.stderr

    # A detached task of a closed client runs on, listed with its owner, its client gone,
    # in zres status, /api/status and /metrics, also after the broker restarts.
    detaching = make_client(cluster.address, keys=alice_keys, detach=True)
    marker = tmp_path / "detached"
    kept = detaching.submit(hold, never, str(marker), resources={"token": 1}, key="kept")
    wait_until(lambda: marker.exists() and kept.running() and kept.id is not None,
               message="it to start, and its client to hear so")
    task_id = kept.id
    assert repr(kept) == f"<zres.Future kept id={task_id} running>"
    detaching.close()

    def listed() -> dict | None:
        running = cluster.status()["running"]
        return running[0] if [t["name"] for t in running] == ["kept"] else None
    entry = wait_until(listed, message="the detached task listed alone")
    assert (entry["id"], entry["owner"], entry["client_gone"], entry["detached"]) == \
        (task_id, "alice", True, True)
    cluster.restart_broker()
    entry = wait_until(listed, timeout=60, message="the detached task adopted again")
    assert (entry["id"], entry["owner"], entry["client_gone"]) == (task_id, "alice", True)
    text = cli("status", cluster.address, keys=bob_keys).stdout
    assert f"kept (id {task_id}) on node  CPU=1 token=1  for " in text
    assert "owner alice  client gone (detached)" in text
    report = json.loads(get(cluster.dashboard + "api/status")[1])
    assert [(t["id"], t["owner"], t["client_gone"]) for t in report["running"]] == \
        [(task_id, "alice", True)]
    samples = scrape(cluster.dashboard)
    assert samples["zres_running_tasks", (("client", "gone"), ("owner", "alice"))] == 1
    assert samples["zres_tasks", (("state", "running"),)] == 1

    # Only its owner (or an admin) may stop it, by its id.
    refused = cli("cancel", "--task", str(task_id), "--broker", cluster.address,
                  keys=bob_keys)
    assert refused.returncode != 0 and (f"task {task_id} (kept) belongs to alice: only alice "
                                        "or an admin key may cancel it") in refused.stderr
    with pytest.raises(ZresError, match=f"task {task_id} \\(kept\\) belongs to alice"):
        other.cancel_task(task_id)  # (bob's client)
    assert listed(), "a refused cancel stopped it"
    done = cli("cancel", "--task", str(task_id), "--broker", cluster.address, keys=alice_keys)
    assert done.returncode == 0 and done.stdout == f"stopping task {task_id} (kept)\n", done
    wait_until(lambda: not cluster.status()["running"], timeout=20, message="it stopped")
    wait_until(lambda: cluster.status()["agents"][0]["slots"][0]["free"]["token"] == 2,
               message="its token back")
