"""Clients, agents and their broker compare zres, Python (major.minor) and cloudpickle
versions when they connect: a mismatch is refused, naming both sides. Each mismatched
peer is a real process whose versions were changed before it connected."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest

import zres
from tests.conftest import wait_until
from zres.core import versions

pytestmark = pytest.mark.timeout(90)

# Runs the zres command line in a process whose zres version is argv[1].
AS_VERSION = ("import sys, zres.core.versions as v; v.ZRES_VERSION = sys.argv[1]; "
              "from zres.cli.main import main; main(sys.argv[2:])")
PYTHON = versions.mine()["python"]


def test_a_client_of_another_python_and_cloudpickle_is_refused_naming_both(make_cluster):
    cluster = make_cluster([{"CPU": 1}])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, time, cloudpickle, zres
        cloudpickle.__version__ = "0.0.1"
        sys.version_info = (3, 99, 0, "final", 0)
        start = time.monotonic()
        try:
            zres.Client(sys.argv[1], keys=sys.argv[2])
        except zres.ZresError as exc:
            print(f"{time.monotonic() - start:.1f}", exc)
        """), cluster.address, cluster.keys], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seconds, message = done.stdout.split(" ", 1)
    assert float(seconds) < 5, "the refusal was not at once"
    assert f"the broker at {cluster.address} refused this client" in message
    assert (f"this client runs zres {zres.__version__} / Python 3.99 / cloudpickle 0.0.1, "
            f"the broker runs zres {zres.__version__} / Python {PYTHON} / cloudpickle "
            f"{cloudpickle.__version__} (python, cloudpickle differ)") in message


def test_an_agent_of_another_zres_exits_1_naming_both(make_cluster, make_client, spawn):
    cluster = make_cluster([{"CPU": 1}], names=["same"])
    agent = spawn([sys.executable, "-c", AS_VERSION, "0.0.9", "agent", cluster.address,
                   "--keys", cluster.keys, "--name", "older", "--no-detect",
                   "--log-format", "json"], stderr=subprocess.PIPE, text=True)
    assert agent.wait(30) == 1
    log = agent.stderr.read()
    assert '"event": "agent_refused"' in log
    assert (f"this agent runs zres 0.0.9 / Python {PYTHON} / cloudpickle "
            f"{cloudpickle.__version__}, the broker runs zres {zres.__version__}") in log
    # The broker serves on, with the agents that agree with it.
    client = make_client(cluster.address, keys=cluster.keys)
    assert client.submit(abs, -2).result(timeout=30) == 2
    assert [a["name"] for a in client.status()["agents"]] == ["same"]


def test_a_broker_restarted_as_another_version_refuses_its_agents_and_clients(
        make_cluster, make_client):
    cluster = make_cluster([{"CPU": 1}], names=["old"])
    client = make_client(cluster.address, keys=cluster.keys)
    running = client.submit(time.sleep, 60)
    wait_until(running.running, message="the task starts")
    agent = cluster.agents["old"]
    # Upgraded in place: killed, started again on its state as zres 0.2.0.
    assert cluster.broker is not None
    cluster.broker.kill()
    cluster.broker.wait(10)
    cluster.broker.stdout.close()  # type: ignore[union-attr]
    cluster.broker = subprocess.Popen(
        [sys.executable, "-c", AS_VERSION, "0.2.0", "broker", "--listen", cluster.address,
         "--state", cluster.state_dir, "--keys", cluster.keys],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert cluster.broker.stdout.readline().startswith(b"zres broker serving")
    # The agent's registration after the restart goes through the same check.
    wait_until(lambda: agent.poll() is not None, timeout=30, message="the agent exits")
    assert agent.returncode == 1
    # The client is refused when it says hello again: what it waits for fails, saying so.
    with pytest.raises(zres.ZresError, match=r"refused this client: .*this client runs "
                       rf"zres {zres.__version__} .* the broker runs zres 0\.2\.0"):
        running.result(timeout=30)
