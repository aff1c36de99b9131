"""Conventions users rely on (issue 15): futures that run and cancel as the standard says,
a forced cancel that stops a running task, actors that hold only what they ask for, and
exiting programs that do not lose their work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import process_gone, wait_until
from tests.tasks import hold, wait_for_file
from zres.core import keys

pytestmark = pytest.mark.timeout(90)
FAST = {"heartbeat_interval": 0.2, "heartbeat_timeout": 3.0}


def spin(marker: str) -> str:
    """Run Python code for ever (a forced cancel's exception lands between bytecodes)."""
    Path(marker).touch()
    try:
        while True:
            sum(range(1000))
    finally:
        Path(marker + ".cleaned").touch()  # finally blocks run when it is stopped


def sleep_in_c(marker: str) -> None:
    """Block in C for a long time: only killing the process stops it."""
    Path(marker).touch()
    time.sleep(600)


def worker_pid(_: object = None) -> int:
    return os.getpid()


def test_a_task_runs_and_a_running_task_cannot_be_cancelled(make_cluster, make_client,
                                                            tmp_path):
    cluster = make_cluster(agents=[{"CPU": 1}], **FAST)
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "go"), str(tmp_path / "started")
    running = client.submit(hold, release, marker)
    queued = client.submit(hold, release, str(tmp_path / "second"))
    wait_until(running.running, 30, message="the client to hear that the task began")
    assert not queued.running()
    assert not running.cancel(), "cancel() of a running task must return False"
    assert running.running() and not running.cancelled()
    assert queued.cancel() and queued.cancelled() and queued.done()
    Path(release).touch()
    assert running.result(30) == "released"


def running_in_worker(make_cluster, make_client, cpus: int, fn, tmp_path):  # noqa: ANN001, ANN201
    """A one-agent cluster with CPUS running FN (which touches its marker): the client, the
    running future, and the pid of the worker process that runs it."""
    cluster = make_cluster(agents=[{"CPU": cpus}], **FAST)
    client = make_client(cluster.address)
    marker = str(tmp_path / "running")
    future = client.submit(fn, marker)
    wait_for_file(marker, 30)
    wait_until(future.running, 30, message="running")
    return client, future, client.submit(worker_pid, resources={"CPU": 0}).result(30)


def touch(path: str) -> str:
    Path(path).touch()
    return path


def test_cancel_is_exact_what_it_cancels_never_runs_and_the_rest_finishes(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"CPU": 2}], **FAST)
    client = make_client(cluster.address)
    paths = [str(tmp_path / f"ran-{i}") for i in range(400)]
    futures = [client.submit(touch, p) for p in paths]
    wait_until(lambda: any(f.done() for f in futures), 30, message="the first to finish")
    # Cancelled while agents take them: one by one, then the rest at once.
    answers = [f.cancel() for f in futures[:200]]
    client.cancel(futures[200:])
    answers += [f.cancelled() for f in futures[200:]]
    # Whatever ran drains before a task that needs the whole agent can start.
    assert client.submit(worker_pid, resources={"CPU": 2}).result(30)
    for future, path, cancelled in zip(futures, paths, answers):
        assert future.cancelled() == cancelled
        if cancelled:
            assert not os.path.exists(path), f"{future.name} was cancelled yet it ran"
        else:
            assert future.result(30) == path
    assert any(answers) and not all(answers), "the test did not race cancels with starts"


@pytest.mark.parametrize("by_id", [False, True], ids=["cancel-force", "cancel_task"])
def test_a_forced_cancel_stops_a_running_call_and_frees_its_resources_when_it_ends(
        make_cluster, make_client, tmp_path, by_id):
    client, future, pid = running_in_worker(make_cluster, make_client, 1, spin, tmp_path)
    marker = str(tmp_path / "running")
    if by_id:  # (as zres cancel --task does: it answers at once, the task still running)
        assert client.cancel_task(future.id, timeout=5) == "stopping"
    else:
        client.cancel(future, force=True)
    wait_until(future.done, 30, message="the forced cancel")
    assert future.cancelled()
    assert os.path.exists(marker + ".cleaned"), "the call's finally block did not run"
    # The call was stopped in its thread: the worker process lives on, and the CPU is free.
    assert client.submit(worker_pid).result(30) == pid


def test_a_forced_cancel_kills_a_worker_blocked_in_c(make_cluster, make_client, tmp_path):
    client, future, pid = running_in_worker(make_cluster, make_client, 2, sleep_in_c,
                                            tmp_path)
    client.cancel([future], force=True)
    wait_until(future.done, 30, message="the worker to be killed")
    assert future.cancelled()
    wait_until(lambda: process_gone(pid), 30, message="the old worker process to be gone")
    assert client.submit(worker_pid, resources={"CPU": 2}).result(30) != pid


def test_a_forced_cancel_stops_a_running_job(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"CPU": 1}], **FAST)
    client = make_client(cluster.address)
    marker = tmp_path / "job-started"
    job = client.submit_command([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, time
        pathlib.Path({str(marker)!r}).touch()
        time.sleep(600)""")])
    wait_for_file(str(marker), 30)
    wait_until(job.running, 30, message="the job to run")
    assert not job.cancel()
    client.cancel(job, force=True)
    wait_until(job.done, 30, message="the job to stop")
    assert job.cancelled()


def test_an_actor_call_cannot_be_force_cancelled_alone(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 1}], **FAST)
    client = make_client(cluster.address)

    class Counter:
        def get(self) -> int:
            return 1

    counter = client.actor(Counter)
    call = counter.get()
    with pytest.raises(ValueError, match="kill the actor"):
        client.cancel(call, force=True)
    assert call.result(30) == 1


def test_idle_actors_hold_no_cpu_unless_they_ask(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 1}], **FAST)
    client = make_client(cluster.address)

    class Idle:
        def ping(self) -> str:
            return "pong"

    actors = [client.actor(Idle) for _ in range(3)]
    assert [a.ping().result(30) for a in actors] == ["pong"] * 3
    assert client.submit(worker_pid).result(30) > 0, "idle actors kept the only CPU"
    busy = client.actor(Idle, resources={"CPU": 1})
    assert busy.ping().result(30) == "pong"
    shown = {a["id"][:8]: a["units"] for a in client.status()["actors"]}
    assert sorted(shown.values(), key=len) == [{}, {}, {}, {"CPU": 1.0}]
    from zres.cli.status_text import render_status
    text = render_status(client.status())
    assert text.count("holds nothing") == 3 and "holds CPU=1" in text


def _python(code: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k != "ZRES_BROKER" and not k.startswith("ZRES_CLIENT")}
    root = str(Path(__file__).resolve().parents[2])
    base["PYTHONPATH"] = os.pathsep.join([root, base.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def test_a_program_that_ends_with_work_pending_on_its_private_cluster_waits(tmp_path):
    marker = tmp_path / "done"
    done = _python(f"""
        import pathlib, time, zres
        def slow(path):
            time.sleep(1)
            pathlib.Path(path).touch()
        zres.submit(slow, {str(marker)!r})
        """, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), "the program's pending task was lost at exit"
    assert "started a private cluster" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_private_cluster_fails_an_infeasible_task_at_once(tmp_path):
    done = _python("""
        import zres
        try:
            zres.submit(abs, 1, resources={"GPU": 64}).result(30)
        except zres.InfeasibleError as exc:
            print("infeasible:", exc)
        """, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("infeasible:"), done.stdout + done.stderr


def test_client_reads_the_config_file_and_zres_broker_comes_before_it(make_cluster,
                                                                      tmp_path):
    cluster = make_cluster(agents=[{"CPU": 1}], **FAST)
    (tmp_path / "zres.toml").write_text(f'[client]\nbroker = "{cluster.address}"\n'
                                        f'[security]\nkeys = "{cluster.keys}"\n')
    code = """
        import zres
        client = zres.Client(connect_timeout=10)
        print(client.address, client.cluster is None)
        """
    done = _python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [cluster.address, "True"]
    other = make_cluster(agents=[{"CPU": 1}], **FAST)
    done = _python(code, cwd=tmp_path, env={"ZRES_BROKER": other.address,
                                            "ZRES_KEYS": other.keys})
    assert done.stdout.split() == [other.address, "True"], done.stderr


def test_everything_finds_a_broker_on_the_default_address(make_cluster, tmp_path,
                                                         monkeypatch):
    """zres broker; zres agent; zres.submit(...): no address anywhere (the cluster's
    keys are this user's own: see test_security)."""
    cluster = make_cluster(agents=[], address="tcp://127.0.0.1:7070", **FAST)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    shutil.copytree(cluster.keys, keys.default_dir())
    agent = subprocess.Popen([sys.executable, "-m", "zres", "agent", "--resources", "CPU=1",
                              "--no-detect", "--name", "default"], cwd=tmp_path,
                             env={k: v for k, v in os.environ.items() if k != "ZRES_BROKER"},
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        cluster.wait_for_agents(["default"], 30)
        done = _python("""
            import zres
            print(zres.submit(abs, -4, resources={"CPU": 1}).result(30))
            print(zres.default_client().address)
            """, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["4", "tcp://127.0.0.1:7070"]
        assert "private" not in done.stderr
        # Client(keys=DIR) asks the broker found at the default address with those keys,
        # not with this user's (here none), and a refusal names a client, not a command.
        bare = {"XDG_CONFIG_HOME": str(tmp_path / "no-keys")}
        done = _python(f"""
            import zres
            print(zres.Client(keys={str(cluster.keys)!r}, connect_timeout=10).address)
            """, cwd=tmp_path, env=bare)
        assert done.stdout.split() == ["tcp://127.0.0.1:7070"], done.stderr
        done = _python("import zres; zres.Client(connect_timeout=10)", cwd=tmp_path, env=bare)
        assert done.returncode != 0 and "refused this client: it has no key" in done.stderr
    finally:
        agent.terminate()
        agent.wait(10)
