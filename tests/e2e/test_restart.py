"""A broker restart (issue 16): the state directory keeps the cluster's identity, its job
table and its ids, so a broker killed with SIGKILL and started again on the same
directory carries on: queued jobs run, finished ones are still listed, ids continue.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import clean_env, free_port, spawn, zres_cli  # noqa: F401
from tests.conftest import process_gone, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = {"ZRES_BROKER__HEARTBEAT_INTERVAL": "0.2", "ZRES_BROKER__HEARTBEAT_TIMEOUT": "2",
        "ZRES_AGENT__HEARTBEAT_INTERVAL": "0.2", "ZRES_AGENT__HEARTBEAT_TIMEOUT": "2"}


class Cluster:
    """A broker on a fixed port with a state directory, and one agent offering foo=1."""

    def __init__(self, spawn, tmp_path: Path, **env: str) -> None:  # noqa: ANN001, F811
        self.spawn = spawn
        self.state = tmp_path / "state"
        self.logs = tmp_path / "logs"
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.env = clean_env(**FAST, ZRES_AGENT__JOB_LOGS=str(self.logs), **env)
        self.broker = self.start_broker()
        self.agent = spawn([sys.executable, "-m", "zres", "agent", self.address,
                            "-r", "foo=1", "--name", "node"], env=self.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: "node" in self.run("status").stdout, message="the agent")

    def start_broker(self, *extra: str) -> subprocess.Popen[str]:
        proc = self.spawn([sys.executable, "-m", "zres", "broker", "--listen", self.address,
                           "--state", str(self.state), *extra], env=self.env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("zres broker serving"), proc.stderr
        return proc

    def run(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        result = zres_cli(*args, env={**self.env, "ZRES_BROKER": self.address})
        if check is not None:
            assert result.returncode == check, (args, result.stdout, result.stderr)
        return result

    def submit(self, script: str, resources: str = "foo=1") -> int:
        return int(self.run("submit", "-r", resources, "--", "sh", "-c", script).stdout)

    def jobs(self) -> dict[int, str]:
        """Job id -> state, from ``zres jobs --all``."""
        rows = [re.split(r"\s{2,}", line) for line in self.run("jobs", "--all").stdout
                .splitlines()[1:] if line[:1].isdigit()]
        return {int(row[0]): row[3] for row in rows}  # (id, name, owner, state, ...)

    def cluster_id(self) -> str:
        return re.search(r"cluster: (\S+)", self.run("status").stdout).group(1)

    def kill_broker(self) -> None:
        self.broker.kill()
        self.broker.wait(10)


def test_a_killed_broker_restarted_on_its_state_carries_on(spawn, tmp_path):  # noqa: F811
    cluster = Cluster(spawn, tmp_path)
    before = cluster.cluster_id()
    finished = cluster.submit("echo first")
    assert cluster.run("wait", str(finished)).returncode == 0
    started_pid = tmp_path / "started"
    running = cluster.submit(f"echo $$ > {started_pid}.tmp; mv {started_pid}.tmp "
                             f"{started_pid}; exec sleep 300")
    wait_until(started_pid.exists, message="the long job to start")
    # (what it exported from its submitter's environment is kept, once, across the restart)
    exported = zres_cli("submit", "-r", "foo=1", "--shell", "echo after the restart $STEPS",
                        env={**cluster.env, "ZRES_BROKER": cluster.address, "STEPS": "100"})
    queued = int(exported.stdout)
    assert cluster.jobs()[queued] == "queued"

    pid = pid_of(started_pid)
    cluster.kill_broker()
    cluster.broker = cluster.start_broker()

    assert cluster.cluster_id() == before, "a restarted broker is the same cluster"
    jobs = cluster.jobs()
    assert jobs[finished] == "done", "a finished job is still listed"
    # The running job ran on: its agent offered it back, and it was not restarted.
    wait_until(lambda: cluster.jobs()[running] == "running" and "node" in
               cluster.run("status").stdout, message="the agent to offer its job back")
    assert not process_gone(pid), "the running job was stopped"
    assert pid_of(started_pid) == pid, "the running job was started again"
    # foo=1 is its: the queued job waits until it ends, then runs.
    assert cluster.jobs()[queued] == "queued"
    cluster.run("cancel", str(running))
    assert cluster.run("wait", str(queued)).returncode == 0
    assert cluster.run("logs", str(queued)).stdout == "after the restart 100\n"
    assert cluster.run("logs", str(finished)).stdout == "first\n", "a log was overwritten"
    newer = cluster.submit("echo new")
    assert newer > queued, "job ids repeat after a restart"
    assert cluster.run("wait", str(newer)).returncode == 0
    status = cluster.run("status").stdout
    assert f"state: {cluster.state}" in status and "last written" in status


def pid_of(path: Path) -> int:
    return int(path.read_text())


def test_fresh_starts_empty_and_says_what_it_discarded(spawn, tmp_path):  # noqa: F811
    cluster = Cluster(spawn, tmp_path)
    before = cluster.cluster_id()
    job = cluster.submit("echo one")
    assert cluster.run("wait", str(job)).returncode == 0
    cluster.broker.terminate()
    cluster.broker.wait(10)
    cluster.broker = cluster.start_broker("--fresh")
    assert cluster.jobs() == {}
    assert cluster.cluster_id() != before, "a fresh start is a new cluster (logs apart)"
    cluster.broker.terminate()
    _, err = cluster.broker.communicate(timeout=10)
    assert f"--fresh discarded the state in {cluster.state} (jobs done: 1)" in err


def test_the_state_is_private_in_a_directory_open_to_others(spawn, tmp_path):  # noqa: F811
    """A --state directory made 0755 beforehand (mkdir's, systemd's): the database holding
    job commands is 0600 all the same, and the broker warns, naming the directory."""
    mask = os.umask(0o022)
    try:
        (tmp_path / "state").mkdir(mode=0o755)
        cluster = Cluster(spawn, tmp_path)
        job = cluster.submit("echo a-token-on-the-command-line")
        assert cluster.run("wait", str(job)).returncode == 0
    finally:
        os.umask(mask)
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in cluster.state.iterdir()
             if p.name.startswith("state.sqlite3")}
    assert files == {"state.sqlite3": 0o600, "state.sqlite3-wal": 0o600,
                     "state.sqlite3-shm": 0o600}
    cluster.broker.terminate()
    _, err = cluster.broker.communicate(timeout=10)
    (warning,) = [line for line in err.splitlines() if "state_dir_not_private" in line]
    assert str(cluster.state) in warning and "0755" in warning


def test_an_unusable_state_directory_is_refused_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = zres_cli("broker", "--listen", f"tcp://127.0.0.1:{free_port()}",
                      "--state", str(blocker / "state"))
    assert result.returncode != 0
    assert f"cannot keep the broker's state in {blocker / 'state'}" in result.stderr


def test_a_job_that_ends_while_the_broker_is_down_keeps_its_outcome(spawn, tmp_path):  # noqa: F811
    cluster = Cluster(spawn, tmp_path)
    go, began = tmp_path / "go", tmp_path / "began"
    job = cluster.submit(f"touch {began}; while [ ! -e {go} ]; do sleep 0.02; done; "
                         "echo finished; exit 3")
    wait_until(began.exists, message="the job to start")
    # A wait the broker holds when it is killed: it waits for the broker to come back
    # (saying so), and asks the new one.
    waiting = subprocess.Popen([sys.executable, "-m", "zres", "wait", str(job)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**cluster.env, "ZRES_BROKER": cluster.address})
    wait_until(lambda: json.loads(cluster.run("status", "--json").stdout)["job_waits"] == 1,
               message="the broker to hold the wait")
    cluster.kill_broker()
    go.touch()  # it ends with nobody to tell but its agent
    wait_until(lambda: "finished" in next(cluster.logs.glob(f"*/{job}.log")).read_text(),
               message="the job to end")
    cluster.broker = cluster.start_broker()
    said = cluster.run("wait", str(job), check=1).stderr
    assert "exit code 3" in said, said
    _, told = waiting.communicate(timeout=60)
    assert waiting.returncode == 1 and "exit code 3" in told, told
    assert "waiting up to 300s for it to come back" in told, told
    assert cluster.run("logs", str(job)).stdout == "finished\n"
    # Its foo=1 is free again: the next job runs.
    assert cluster.run("wait", str(cluster.submit("true"))).returncode == 0


def test_a_job_the_restarted_broker_does_not_know_is_stopped_and_holds_until_gone(
        spawn, tmp_path):  # noqa: F811
    cluster = Cluster(spawn, tmp_path, ZRES_AGENT__JOB_GRACE="1")  # (then SIGKILL: not 5 s)
    cluster.kill_broker()
    older = tmp_path / "older-state"
    shutil.copytree(cluster.state, older)  # a state from before the job
    cluster.broker = cluster.start_broker()
    pid_file = tmp_path / "pid"
    # It ignores SIGTERM for a while: its foo=1 must stay taken until it is gone.
    job = cluster.submit(f"trap '' TERM; echo $$ > {pid_file}.tmp; mv {pid_file}.tmp "
                         f"{pid_file}; sleep 300")
    wait_until(pid_file.exists, message="the job to start")
    pid = pid_of(pid_file)
    cluster.kill_broker()
    shutil.rmtree(cluster.state)
    shutil.copytree(older, cluster.state)
    cluster.broker = cluster.start_broker()
    # The agent offers it; the broker counts its foo=1 while it stops it.
    wait_until(lambda: "running=1" in cluster.run("status").stdout, message="the offer")
    after = cluster.submit("true")
    assert after > job, "an id that runs on an agent was handed out again"
    wait_until(lambda: process_gone(pid), timeout=30, message="the unknown job to be stopped")
    assert cluster.run("wait", str(after)).returncode == 0


def test_an_adopted_gpu_job_keeps_its_device_and_a_new_one_gets_the_other(spawn, tmp_path):  # noqa: F811
    gpus = json.dumps([{"name": "Fake GPU", "memory": 16e9}] * 2)
    cluster = Cluster(spawn, tmp_path, ZRES_TEST_FAKE_GPUS=gpus)
    seen = tmp_path / "first"
    first = cluster.submit(f'echo "$CUDA_VISIBLE_DEVICES" > {seen}.tmp; mv {seen}.tmp {seen}; '
                           "exec sleep 300", "GPU=1")
    wait_until(seen.exists, message="the GPU job to start")
    device = seen.read_text().strip()
    cluster.kill_broker()
    cluster.broker = cluster.start_broker()
    wait_until(lambda: "running=1" in cluster.run("status").stdout, message="its adoption")
    other = tmp_path / "second"
    second = cluster.submit(f'echo "$CUDA_VISIBLE_DEVICES" > {other}', "GPU=1")
    assert cluster.run("wait", str(second)).returncode == 0
    assert {device, other.read_text().strip()} == {"0", "1"}, "one device granted twice"
    # A third must wait: both devices are taken (the adopted job holds its own).
    third = cluster.submit("true", "GPU=2")
    assert cluster.jobs()[third] == "queued"
    cluster.run("cancel", str(first))
    assert cluster.run("wait", str(third)).returncode == 0
