"""The broker's HTTP port on a live cluster: /metrics says what the cluster did, /health
answers probes, nothing there changes anything, and a port in use is said plainly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import zres
from tests.conftest import wait_until
from tests.tasks import hold


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels)."""
    status, text = get(url + "metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.filterwarnings("ignore::zres.InfeasibleWarning")
def test_metrics_say_what_the_cluster_did(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"GPU": 2, "MEMORY": "4096MiB"}, {"foo": 1}], nthreads=2,
                           names=["gpu-node", "foo-node"], http="127.0.0.1:0")
    client = make_client(cluster.address)
    assert [f.result(30) for f in [client.submit(pow, 2, i) for i in range(7)]] == \
        [2 ** i for i in range(7)]
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    running = client.submit(hold, release, marker, resources={"GPU": 1})
    wait_until(lambda: os.path.exists(marker), message="the GPU task to start")
    never = [client.submit(pow, 1, 1, resources={"GPU": 3}) for _ in range(2)]
    wait_until(lambda: all(f.infeasible for f in never), message="infeasible warnings")

    url = cluster.dashboard
    samples = wait_until(lambda: (m := scrape(url)).get(("zres_tasks", (("state", "running"),)))
                         == 1 and m, message="the running task in /metrics")
    assert samples["zres_tasks_finished_total", (("outcome", "finished"),)] == 7
    assert samples["zres_tasks", (("state", "queued"),)] == 2
    assert samples["zres_infeasible_tasks", ()] == 2
    assert samples["zres_waiting_tasks", (("request", "CPU=1 GPU=3"),)] == 2
    gpu = (("agent", "gpu-node"), ("resource", "GPU"))
    assert samples["zres_agent_resource_total", gpu] == 2
    assert samples["zres_agent_resource_free", gpu] == 1
    memory = (("agent", "gpu-node"), ("resource", "MEMORY"))
    assert samples["zres_agent_resource_total", memory] == 4096 * 2**20  # bytes, not units
    assert samples["zres_agent_resource_free", (("agent", "foo-node"), ("resource", "foo"))] == 1
    assert samples["zres_agents", ()] == 2 and samples["zres_clients", ()] == 1
    assert samples["zres_messages_received_total", ()] > 10
    assert samples["zres_received_bytes_total", ()] > samples["zres_messages_received_total", ()]
    assert samples["zres_sent_bytes_total", ()] > samples["zres_messages_sent_total", ()] > 10
    assert samples["zres_scheduling_seconds_count", ()] >= 1
    assert samples["zres_journal_commit_seconds_count", ()] >= 1  # (a LocalCluster keeps state)

    # The same figures as JSON for the page, amounts in user units.
    status, text = get(url + "api/status")
    assert status == 200
    report = json.loads(text)
    node = next(a for a in report["agents"] if a["name"] == "gpu-node")
    assert node["slots"][0]["free"]["GPU"] == 1.0 and node["slots"][0]["gpus"] == ["0", "1"]
    assert [(g["count"], g["request"], g["infeasible"]) for g in report["groups"]] == \
        [(2, "CPU=1 GPU=3", True)]
    Path(release).touch()
    assert running.result(30) == "released"
    wait_until(lambda: scrape(url)["zres_agent_resource_free", gpu] == 2,
               message="the GPU back in /metrics")


def test_the_broker_spins_while_work_streams_in_unless_told_not_to(make_cluster, make_client):
    """[broker] spin: while messages come close together (a map's) the broker polls for a
    moment before it sleeps, told in /metrics; spin = 0 never does."""
    for env, spins in (({"ZRES_BROKER__SPIN": "0"}, False), ({}, True)):
        cluster = make_cluster(agents=[{"slot": 2}], nthreads=2, env=env, http="127.0.0.1:0")
        client = make_client(cluster.address)
        assert client.gather(client.map(abs, range(-300, 0))) == list(range(300, 0, -1))
        spun = scrape(cluster.dashboard)["zres_loop_spin_seconds_total", ()]
        assert (spun > 0) is spins, f"{env or 'the default'}: spun {spun} s"
        client.close()
        cluster.close()


def test_health_answers_and_nothing_changes_the_cluster(make_cluster):
    cluster = make_cluster(agents=[{"foo": 1}], http="127.0.0.1:0")
    assert get(cluster.dashboard + "health") == (200, "ok\n")
    for method in ("POST", "HEAD", "OPTIONS"):
        request = urllib.request.Request(cluster.dashboard + "api/status", method=method,
                                         data=b"{}" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert (method, refused.value.code, refused.value.headers["Allow"]) == \
            (method, 405, "GET")
        assert refused.value.read() == (b"" if method == "HEAD" else
                                        b"read only: nothing here changes the cluster\n")
    assert get(cluster.dashboard + "nothing-here")[0] == 404
    page = get(cluster.dashboard)
    assert page[0] == 200 and "<title>zres dashboard</title>" in page[1]


def test_a_cluster_has_no_http_port_unless_asked(make_cluster):
    cluster = make_cluster(agents=[{"foo": 1}])
    assert cluster.dashboard is None
    assert make_cluster(agents=[], http="none").dashboard is None, "any word for off"


def _broker(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "zres", "broker", "--listen",
                             "tcp://127.0.0.1:0", "--insecure", *args], cwd=cwd, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_an_http_port_in_use_is_said_plainly(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        asked = _broker("--http", f"127.0.0.1:{port}", cwd=tmp_path)
        out, err = asked.communicate(timeout=30)
        assert asked.returncode == 1 and out == ""
        assert err.strip().splitlines()[-1] == (
            f"zres broker: cannot serve HTTP on 127.0.0.1:{port}: Address already in use "
            "(--http HOST:PORT for another address, --http off for none)")
    finally:
        taken.close()


def test_the_default_http_port_in_use_leaves_the_broker_serving(tmp_path):
    # Whoever holds 8787 (this test, or another program on this machine), it is taken.
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 8787))
        taken.listen()
    except OSError:
        pass
    broker = _broker(cwd=tmp_path)
    try:
        assert broker.stdout.readline().startswith("zres broker serving tcp://127.0.0.1:")
        warning = next(json.loads(line) for line in broker.stderr
                       if "http_unavailable" in line)
        assert warning["error"].startswith("cannot serve HTTP on 127.0.0.1:8787: Address "
                                           "already in use")
        assert warning["why"] == "serving without a dashboard"
        assert broker.poll() is None
    finally:
        broker.terminate()
        broker.wait(10)
        broker.stdout.close()
        broker.stderr.close()
        taken.close()


@pytest.mark.parametrize("given", ["8787", "localhost", "127.0.0.1:99999", "http:/x:1"])
def test_a_malformed_http_address_is_refused_where_it_was_typed(tmp_path, given):
    proc = _broker("--http", given, cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out == ""
    assert err.strip() == (f"zres broker: --http {given!r}: give HOST:PORT "
                           "(e.g. 127.0.0.1:8787, [::1]:8787) or off")


def test_the_http_address_comes_from_the_environment_too(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    broker = subprocess.Popen([sys.executable, "-m", "zres", "broker", "--listen",
                               "tcp://127.0.0.1:0", "--insecure"], cwd=tmp_path, text=True,
                              env={**os.environ, "ZRES_BROKER__HTTP": f"127.0.0.1:{port}"},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    try:
        assert broker.stdout.readline().startswith("zres broker serving ")
        assert broker.stdout.readline().strip() == \
            f"zres broker dashboard http://127.0.0.1:{port}/"
        assert get(f"http://127.0.0.1:{port}/health") == (200, "ok\n")
    finally:
        broker.terminate()
        broker.wait(10)
        broker.stdout.close()


def test_the_open_port_shows_no_command_line_error_or_state_directory(make_cluster,
                                                                      make_client):
    cluster = make_cluster(agents=[{"foo": 1}], http="127.0.0.1:0")
    client = make_client(cluster.address)
    job = client.submit_command(["sh", "-c", "exit 3", "--token=s3cret-value"],
                                resources={"foo": 1}, name="deploy")
    with pytest.raises(zres.CommandFailed):
        job.result(30)
    wait_until(lambda: '"deploy"' in get(cluster.dashboard + "api/status")[1],
               message="the job on the dashboard")
    text = get(cluster.dashboard + "api/status")[1]
    assert "s3cret" not in text, "a job's command line is served to anyone on the port"
    assert cluster.state_dir not in text, "where the broker keeps its state"
    assert json.loads(text)["jobs"][0]["exit_code"] == 3


def test_a_loopback_dashboard_answers_only_to_loopback_names(make_cluster):
    """A web page elsewhere whose host name is made to point here (DNS rebinding) must not
    read the cluster through the browser of someone on this machine."""
    cluster = make_cluster(agents=[{"foo": 1}], http="127.0.0.1:0")
    port = cluster.dashboard.rsplit(":", 1)[1].strip("/")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        request = urllib.request.Request(cluster.dashboard + "api/status",
                                         headers={"Host": host})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
    request = urllib.request.Request(cluster.dashboard + "api/status",
                                     headers={"Host": f"attacker.example:{port}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 421


TIMEOUT = 2.0  # the broker's http_request_timeout in the test below


def test_idle_connections_neither_keep_health_from_answering_nor_stay(make_cluster):
    """Forty connections that send a request's first lines and then nothing (more than the
    page answers at once) cannot make a liveness probe fail, and each is closed once it has
    had its request timeout ([broker] http_request_timeout, shortened here) to finish its
    request."""
    cluster = make_cluster(agents=[{"foo": 1}], http="127.0.0.1:0",
                           env={"ZRES_BROKER__HTTP_REQUEST_TIMEOUT": str(TIMEOUT)})
    host, port = cluster.dashboard[len("http://"):].strip("/").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    try:
        for sock in idle:
            sock.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert get(cluster.dashboard + "health") == (200, "ok\n")
        for sock in idle:
            sock.settimeout(2 * TIMEOUT)  # (the default, 5 s, would not do)
            try:
                assert sock.recv(1024) == b"", "an idle connection was answered"
            except ConnectionResetError:
                pass  # (closed: all the same)
    finally:
        for sock in idle:
            sock.close()
    assert get(cluster.dashboard + "health") == (200, "ok\n")
