"""A broker restart (issue 16): the state directory keeps the cluster's identity, its job
table and its ids, so a broker killed with SIGKILL and started again on the same
directory carries on: queued jobs run, finished ones are still listed, ids continue.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import clean_env, free_port, spawn, zres_cli  # noqa: F401
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)
FAST = {"ZRES_BROKER__HEARTBEAT_INTERVAL": "0.2", "ZRES_BROKER__HEARTBEAT_TIMEOUT": "2",
        "ZRES_AGENT__HEARTBEAT_INTERVAL": "0.2", "ZRES_AGENT__HEARTBEAT_TIMEOUT": "2"}


class Cluster:
    """A broker on a fixed port with a state directory, and one agent offering foo=1."""

    def __init__(self, spawn, tmp_path: Path) -> None:  # noqa: ANN001, F811
        self.spawn = spawn
        self.state = tmp_path / "state"
        self.logs = tmp_path / "logs"
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.env = clean_env(**FAST, ZRES_AGENT__JOB_LOGS=str(self.logs))
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

    def submit(self, script: str) -> int:
        return int(self.run("submit", "-r", "foo=1", "--", "sh", "-c", script).stdout)

    def jobs(self) -> dict[int, str]:
        """Job id -> state, from ``zres jobs --all``."""
        rows = [re.split(r"\s{2,}", line) for line in self.run("jobs", "--all").stdout
                .splitlines()[1:] if line[:1].isdigit()]
        return {int(row[0]): row[2] for row in rows}

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
    started = tmp_path / "started"
    running = cluster.submit(f"touch {started}; sleep 300")
    wait_until(started.exists, message="the long job to start")
    queued = cluster.submit("echo after the restart")
    assert cluster.jobs()[queued] == "queued"

    cluster.kill_broker()
    cluster.broker = cluster.start_broker()

    assert cluster.cluster_id() == before, "a restarted broker is the same cluster"
    jobs = cluster.jobs()
    assert jobs[finished] == "done", "a finished job is still listed"
    assert jobs[running] == "lost"
    said = cluster.run("wait", str(running), check=1).stderr
    assert "the broker restarted while it ran, and its agent stopped it" in said
    # The queued job was kept, and runs once the agent is back.
    assert cluster.run("wait", str(queued)).returncode == 0
    assert cluster.run("logs", str(queued)).stdout == "after the restart\n"
    assert cluster.run("logs", str(finished)).stdout == "first\n", "a log was overwritten"
    newer = cluster.submit("echo new")
    assert newer > queued, "job ids repeat after a restart"
    assert cluster.run("wait", str(newer)).returncode == 0
    status = cluster.run("status").stdout
    assert f"state: {cluster.state}" in status and "last written" in status


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
    assert f"--fresh discarded the state in {cluster.state} (jobs: 1 done)" in err


def test_an_unusable_state_directory_is_refused_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = zres_cli("broker", "--listen", f"tcp://127.0.0.1:{free_port()}",
                      "--state", str(blocker / "state"))
    assert result.returncode != 0
    assert f"cannot keep the broker's state in {blocker / 'state'}" in result.stderr
