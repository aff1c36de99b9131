"""The ``zres`` command line, run as a user runs it: a separate process, its exit status,
its stdout and stderr."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import zres
from tests.conftest import wait_until
from tests.tasks import hold
from zres.cli.cluster import _data_address
from zres.cli.main import _parser
from zres.core import keys as K

# An address where nothing listens: an agent given it must fail on its arguments first.
NOWHERE = "tcp://127.0.0.1:1"


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any ZRES_* setting, plus EXTRA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(extra)
    return env


def zres_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m zres ARGS`` to completion and capture its output."""
    return subprocess.run([sys.executable, "-m", "zres", *args], check=False,
                          capture_output=True, text=True,
                          env=clean_env() if env is None else env, cwd=cwd,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def spawn() -> Iterator:
    """Start subprocesses with Popen; every one still running is killed at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(args: list[str], **kwargs) -> subprocess.Popen[str]:
        kwargs.setdefault("env", clean_env())
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(args, text=True, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command printed exactly one line on stderr, and no traceback; return it."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {result.stderr!r}"
    return lines[0]


# -- malformed resource specs ---------------------------------------------------------------

# (spec as typed, what the one-line error must contain)
BAD_SPECS = [
    ("foo", "invalid resource spec 'foo': expected NAME=NUMBER"),
    ("GPU=two", "invalid resource spec 'GPU=two': 'two' is not a number"),
    ("GPU=-1", "invalid resource spec 'GPU=-1': amount must be >= 0"),
    ("GPU=nan", "invalid resource spec 'GPU=nan': amount must be finite"),
    ("GPU=1 GPU=2", "invalid resource spec 'GPU=2': GPU is given twice"),
    ("GPU=inf", "invalid resource spec 'GPU=inf': amount must be finite"),
    ("GPU", "invalid resource spec 'GPU': expected NAME=NUMBER"),
    ("=1", "invalid resource spec '=1': expected NAME=NUMBER"),
    ("GPU=", "invalid resource spec 'GPU=': expected NAME=NUMBER"),
    ("1gpu=1", "invalid resource spec '1gpu=1': invalid resource name '1gpu'"),
    ("GPU=1e16", "invalid resource spec 'GPU=1e16'"),
    ("foo=1, bar=x", "invalid resource spec 'bar=x': 'x' is not a number"),
]


@pytest.mark.parametrize("spec, expected", BAD_SPECS, ids=[s for s, _ in BAD_SPECS])
def test_agent_rejects_malformed_resources_flag(spec, expected, tmp_path):
    result = zres_cli("agent", NOWHERE, "--resources", spec, cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert line.startswith("zres agent: ")
    assert expected in line
    assert result.stdout == ""


@pytest.mark.parametrize("spec, expected", BAD_SPECS, ids=[s for s, _ in BAD_SPECS])
def test_agent_rejects_malformed_resources_from_environment(spec, expected, tmp_path):
    result = zres_cli("agent", NOWHERE, env=clean_env(ZRES_AGENT__RESOURCES=spec), cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert expected in line
    assert "environment" in line, "the message should say where the bad spec came from"


@pytest.mark.parametrize("value", ["two", "-1", "nan", "inf"])
def test_agent_rejects_malformed_per_name_environment_variable(value, tmp_path):
    result = zres_cli("agent", NOWHERE, env=clean_env(ZRES_AGENT__RESOURCES__GPU=value),
                      cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert "'GPU'" in line and value in line


def test_agent_rejects_malformed_spec_in_config_file(tmp_path):
    (tmp_path / "zres.toml").write_text('[agent]\nresources = "GPU=two"\n')
    result = zres_cli("agent", NOWHERE, cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert "zres.toml" in line and "'GPU=two'" in line


def test_agent_rejects_fractional_gpu_count_quoting_the_spec(tmp_path):
    # An agent offers whole GPU devices; "GPU=1.5" is a malformed spec for an agent, and the
    # design promises that the offending text is quoted, on one line.
    result = zres_cli("agent", NOWHERE, "--resources", "GPU=1.5", cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert "GPU=1.5" in line, line


def test_agent_logs_nothing_on_stdout_below_its_log_level(make_cluster, spawn, tmp_path):
    # Logs go to stderr, filtered by --log-level; stdout stays clean for the user's tools.
    cluster = make_cluster(agents=[])
    proc = spawn([sys.executable, "-m", "zres", "agent", cluster.address,
                  "--keys", cluster.keys, "--name", "quiet",
                  "--resources", "foo=1", "--log-level", "warning", "--log-format", "json"],
                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cluster.wait_for_agents(["quiet"], 30)
    proc.terminate()
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out == "", f"the agent wrote to stdout: {out!r}"
    assert "debug" not in err


def _says_unreachable(proc: subprocess.Popen[str], address: str) -> str:
    """The first line PROC logs saying it cannot reach the broker at ADDRESS."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if "broker_unreachable" in line:
            assert address in line, line
            return line
    raise AssertionError(f"the agent ended without saying so (exit {proc.wait()})")


@pytest.mark.timeout(30)
def test_an_agent_given_no_address_or_a_wrong_one_says_so_within_seconds(spawn, tmp_path):
    """One given no address tries the default one; each says it cannot reach it, and why.
    (Both at once: each says so only after a few seconds.)"""
    address = f"127.0.0.1:{free_port()}"  # HOST:PORT means tcp://HOST:PORT
    agents = {"tcp://127.0.0.1:7070": [], f"tcp://{address}": [address]}
    started = {where: spawn([sys.executable, "-m", "zres", "agent", *given, "--resources",
                             "foo=1", "--no-detect"], cwd=tmp_path, stderr=subprocess.PIPE)
               for where, given in agents.items()}
    for where, agent in started.items():
        line = _says_unreachable(agent, where)
        assert "connection refused" in line, line


@pytest.mark.timeout(30)
def test_an_agent_logs_how_it_limits_memory_at_start(spawn, tmp_path):
    agent = spawn([sys.executable, "-m", "zres", "agent", f"127.0.0.1:{free_port()}",
                   "--resources", "foo=1", "--no-detect", "--memory-limits", "watcher",
                   "--memory-reserve", "64MiB", "--log-format", "json"],
                  cwd=tmp_path, stderr=subprocess.PIPE)
    assert agent.stderr is not None
    said = next((json.loads(line) for line in agent.stderr if "memory_limits" in line), None)
    assert said is not None, f"the agent ended without saying so (exit {agent.wait()})"
    assert (said["mode"], said["reserve"], said["not_cgroup"]) == ("watcher", "64 MiB",
                                                                   "asked for"), said


def test_agent_with_a_bad_memory_reserve_or_mode_is_a_usage_error(tmp_path):
    result = zres_cli("agent", NOWHERE, "--memory-reserve", "lots", "--no-detect", cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "memory_reserve 'lots': give a number of bytes" in assert_one_line_error(result)
    result = zres_cli("agent", NOWHERE, "--memory-limits", "cgroups", "--no-detect",
                      cwd=tmp_path)
    assert result.returncode == 2 and "--memory-limits" in result.stderr
    config = tmp_path / "zres.toml"
    config.write_text('[agent]\nmemory_limits = "cgroups"\n')
    result = zres_cli("agent", NOWHERE, "--config", str(config), "--no-detect", cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "memory_limits 'cgroups': give one of auto, cgroup, watcher, off" in \
        assert_one_line_error(result)


def test_agent_with_a_bad_job_log_retention_or_max_bytes_is_a_usage_error(tmp_path):
    for flag, value, says in (
            ("--job-log-retention", "-1", "command line: job_log_retention must be a positive "
                                          "float, got '-1'"),
            ("--job-log-max-bytes", "lots", "job_log_max_bytes 'lots': give a number of bytes"),
            ("--job-log-max-bytes", "0", "job_log_max_bytes '0': give a positive number")):
        result = zres_cli("agent", NOWHERE, flag, value, "--no-detect", cwd=tmp_path)
        assert result.returncode == 2, (result.returncode, result.stderr)
        assert says in assert_one_line_error(result), result.stderr


def test_agent_with_bad_numeric_flag_is_a_usage_error(tmp_path):
    result = zres_cli("agent", NOWHERE, "--nworkers", "many", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--nworkers" in result.stderr


def test_agent_refuses_a_device_count_past_the_limit_at_once(tmp_path):
    # (GPU=1e9 once built a billion device ids, 3.7 GB, and never registered; 1e6 here
    # keeps the old code's failure affordable: it hangs, connecting, past the timeout)
    result = zres_cli("agent", NOWHERE, "--resources", "GPU=1e6", "--no-detect", cwd=tmp_path,
                      timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert "'GPU=1000000': more than 4096 devices" in line


@pytest.mark.parametrize("address", ["garbage", "tcp://127.0.0.1:99999"])
def test_agent_with_a_bad_data_port_address_is_a_usage_error(address, tmp_path):
    """(It was given to libzmq after the agent had started: `Invalid argument`, or port
    99999 bound as 34463.)"""
    result = zres_cli("agent", NOWHERE, "--data-listen", address, "--no-detect",
                      cwd=tmp_path, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert f"data_listen {address!r} is not a data port's address" in \
        assert_one_line_error(result)


def test_a_data_ports_address_may_be_any_ipv6_one_in_brackets():
    for address in ("tcp://[::1]:0", "tcp://[fe80::1%eth0]:0", "tcp://*:0"):
        _data_address(address, "data_listen")  # (a link-local one names its zone)
    with pytest.raises(ValueError, match=r"in brackets, its port after them: tcp://\[::1\]:0"):
        _data_address("tcp://::1:0", "data_listen")
    with pytest.raises(ValueError, match=r"data_listen 'tcp://\[fe80::1\]:0': a link-local"):
        _data_address("tcp://[fe80::1]:0", "data_listen")


def test_demo_refuses_a_count_of_inputs_below_one(tmp_path):
    result = zres_cli("demo", "--inputs", "-5", cwd=tmp_path, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stdout)
    assert "'-5': give a whole number, 1 or more" in assert_one_line_error(result)


def test_agent_with_zero_workers_is_rejected(tmp_path):
    result = zres_cli("agent", NOWHERE, "--nworkers", "0", "--no-detect", cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = assert_one_line_error(result)
    assert "nworkers" in line


# -- broker -----------------------------------------------------------------------------------

def test_broker_prints_its_address_on_stdout(spawn, tmp_path):
    proc = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0"],
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path)
    line = proc.stdout.readline().strip()
    match = re.fullmatch(r"zres broker serving tcp://127\.0\.0\.1:(\d+)", line)
    assert match, line
    assert int(match.group(1)) > 0
    # The address printed is one a client can use.
    status = zres.local.request(line.rsplit(" ", 1)[1], "status", {}, timeout=10)
    assert status["agents"] == []


def test_broker_raises_its_open_files_limit_to_the_hard_limit(spawn, tmp_path):
    """Each agent keeps two connections and each of its worker processes one: the usual
    soft limit of 1,024 open files is a few hundred agents."""
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this machine's hard limit of open files is {hard}: nothing to raise")
    proc = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0"],
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path,
                 preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    assert proc.stdout.readline().startswith("zres broker serving")
    with open(f"/proc/{proc.pid}/limits") as limits:
        soft = next(line.split()[3] for line in limits if line.startswith("Max open files"))
    assert soft == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard)) or \
        int(soft) >= 10240, f"the broker runs with a soft limit of {soft} open files"


def test_broker_warns_of_keys_others_may_use(spawn, tmp_path):
    keys = tmp_path / "keys"
    K.keygen(keys)
    os.chmod(keys / "agent.key_secret", 0o644)  # (as a careless copy leaves it)
    proc = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0",
                  "--keys", str(keys), "--http", "off"], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout.readline().startswith("zres broker serving")
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "keys_not_private" in err and "agent.key_secret is readable by others" in err


def test_broker_on_an_address_in_use_fails_with_one_line(spawn, tmp_path):
    port = free_port()
    first = spawn([sys.executable, "-m", "zres", "broker", "--listen",
                   f"tcp://127.0.0.1:{port}"], stdout=subprocess.PIPE,
                  stderr=subprocess.DEVNULL, cwd=tmp_path)
    assert first.stdout.readline().startswith("zres broker serving")
    # (a state directory of its own: the first's, its port's default, is refused first)
    result = zres_cli("broker", "--listen", f"tcp://127.0.0.1:{port}", "--state",
                      str(tmp_path / "own"), cwd=tmp_path, timeout=30)
    assert result.returncode != 0
    line = assert_one_line_error(result)
    assert line.startswith(f"zres broker: cannot listen on tcp://127.0.0.1:{port}: ")


def test_a_second_broker_on_a_state_directory_in_use_is_refused_naming_the_first(spawn, tmp_path):
    """(It used to start: two brokers handing out the same task ids, each overwriting the
    other's state.) The first keeps serving, with what it keeps left alone."""
    state = tmp_path / "state"
    first = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0",
                   "--state", str(state), "--http", "off"], stdout=subprocess.PIPE,
                  stderr=subprocess.DEVNULL, cwd=tmp_path)
    address = first.stdout.readline().split()[-1]
    env = {**clean_env(), "ZRES_BROKER": address}
    job = zres_cli("submit", "-r", "CPU=1", "--", "true", env=env, cwd=tmp_path, timeout=60)
    assert job.returncode == 0, job.stderr
    result = zres_cli("broker", "--listen", "tcp://127.0.0.1:0", "--state", str(state),
                      "--fresh", "--http", "off", cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    line = assert_one_line_error(result)
    assert line == (f"zres broker: the state directory {state} is in use by another broker "
                    f"(pid {first.pid}): one broker per state directory (stop that one "
                    "first, or give this one --state of its own)")
    listed = zres_cli("jobs", "--all", env=env, cwd=tmp_path, timeout=60)
    assert job.stdout.strip() in listed.stdout.split(), listed.stdout


def test_broker_on_an_address_not_of_this_host_says_what_to_bind(tmp_path):
    """(libzmq's own words were `No such device (addr=...)`: a host name is taken for an
    interface's.)"""
    K.keygen(tmp_path / "keys")
    for host in ("nonexistent.invalid", "192.0.2.1"):  # (192.0.2.0/24: for documentation)
        result = zres_cli("broker", "--listen", f"tcp://{host}:{free_port()}", "--keys",
                          str(tmp_path / "keys"), "--http", "off", cwd=tmp_path, timeout=30)
        assert result.returncode == 1
        line = assert_one_line_error(result)
        assert line.startswith(f"zres broker: cannot listen on tcp://{host}:"), line
        assert line.endswith("(bind to an address of this host, an interface's name or *)")


# -- status -----------------------------------------------------------------------------------



@pytest.mark.filterwarnings("ignore::zres.InfeasibleWarning")
def test_status_lists_agents_resources_counts_and_waiting_reasons(make_cluster, make_client,
                                                                  tmp_path):
    cluster = make_cluster(agents=[{"GPU": 2}, {"foo": 3}], nthreads=2,
                           names=["gpu-node", "foo-node"])
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    try:
        running = client.submit(hold, release, marker, resources={"GPU": 1}, key="holder")
        wait_until(lambda: os.path.exists(marker), message="the GPU task to start")
        huge = client.submit(hold, release, marker, resources={"GPU": 4}, key="huge")
        exotic = client.submit(hold, release, marker, resources={"bar": 1}, key="exotic")
        wait_until(lambda: huge.infeasible and exotic.infeasible,
                   message="the infeasible warnings")

        result = zres_cli("status", cluster.address,
                          "--keys", cluster.keys, "--timeout", "10", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert cluster.address in out
        lines = out.splitlines()
        gpu_line = next(line for line in lines if line.strip().startswith("gpu-node"))
        assert "running=1" in gpu_line
        assert "CPU=1/2" in gpu_line and "GPU=1/2" in gpu_line
        assert "gpus=0,1" in gpu_line
        foo_line = next(line for line in lines if line.strip().startswith("foo-node"))
        assert "running=0" in foo_line
        assert "CPU=2/2" in foo_line and "foo=3/3" in foo_line
        assert "queued=2" in out and "running=1" in out
        waiting = out[out.index("waiting and queued:"):out.index("running:")]
        assert "huge" in waiting and "needs GPU=4, largest agent has GPU=2" in waiting
        assert "exotic" in waiting and "no agent offers bar" in waiting
        assert "holder" not in waiting
        assert "holder (id 1) on gpu-node  CPU=1 GPU=1  for " in out[out.index("running:"):]
    finally:
        Path(release).touch()
    assert running.result(30) == "released"


def test_status_of_an_empty_broker_says_no_agents(make_cluster, tmp_path):
    cluster = make_cluster(agents=[])
    result = zres_cli("status", cluster.address, "--keys", cluster.keys, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "(none)" in result.stdout
    assert "tasks: none" in result.stdout


def test_status_uses_zres_broker_from_the_environment(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], names=["env-node"])
    result = zres_cli("status", env=clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys),
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "env-node" in result.stdout


def test_status_without_a_broker_fails_with_one_line(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    result = zres_cli("status", address, cwd=tmp_path, timeout=30)
    assert result.returncode != 0
    line = assert_one_line_error(result)
    assert line.startswith("zres status: ")
    # Said at once, from the refused connection, not after the 10 s the answer may take.
    assert address in line and "connection refused" in line
    assert "start one with `zres broker`" in line, "and how to get one"
    assert result.stdout == ""


def test_status_takes_host_colon_port(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], names=["plain"], address="tcp://127.0.0.1:0")
    result = zres_cli("status", cluster.address.removeprefix("tcp://"),
                      "--keys", cluster.keys, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "plain" in result.stdout


def test_a_client_pointed_at_nothing_fails_at_once_naming_why():
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(zres.ZresError, match="connection refused") as caught:
        zres.Client(address, connect_timeout=30)
    assert address in str(caught.value)


@pytest.fixture
def http_port() -> Iterator[str]:
    """An HTTP server's address (where a dashboard would be), as HOST:PORT."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_client_or_command_given_an_http_port_says_so(http_port, tmp_path):
    # (Both used to wait out their whole timeout, then say no broker answered.)
    with pytest.raises(zres.ZresError, match="is an HTTP server .*, not a zres broker's port"):
        zres.Client(http_port, connect_timeout=30)
    result = zres_cli("status", http_port, "--timeout", "30", cwd=tmp_path)
    assert result.returncode == 1
    line = assert_one_line_error(result)
    assert f"tcp://{http_port} is an HTTP server (the dashboard?)" in line
    assert "zres broker --listen" in line


@pytest.mark.parametrize("args", [
    ["status", "not-an-address", "--timeout", "0.5"],
    ["agent", "not-an-address", "--resources", "foo=1", "--no-detect"],
    ["broker", "--listen", "not-an-address"],
    # (libzmq takes a port modulo 65536: this broker served on 34463, these dialled it)
    ["broker", "--listen", "tcp://127.0.0.1:99999", "--insecure", "--http", "off"],
    ["status", "127.0.0.1:99999", "--timeout", "0.5"],
    ["agent", "tcp://127.0.0.1:99999", "--resources", "foo=1", "--no-detect"],
    # (an IPv6 address with no brackets: which colon begins the port?)
    ["broker", "--listen", "tcp://::1:7070", "--insecure", "--http", "off"],
    ["agent", "::1:7070", "--resources", "foo=1", "--no-detect"],
], ids=["status", "agent", "broker", "broker-port", "status-port", "agent-port",
        "broker-ipv6", "agent-ipv6"])
def test_malformed_address_fails_with_one_line(args, tmp_path):
    result = zres_cli(*args, cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    line = assert_one_line_error(result)
    assert line.startswith(f"zres {args[0]}: ")
    assert any(says in line for says in ("not-an-address", "port 99999 is past 65535",
                                         "an IPv6 address goes in brackets, its port after "
                                         "them: tcp://[::1]:7070", "them: [::1]:7070"))


@pytest.mark.parametrize(("args", "says"), [
    (["agent", "--keys", "somewhere", "--insecure", "--resources", "foo=1", "--no-detect"],
     "--keys and --insecure: give one"),
    (["keygen", "{tmp}/keys", "--role", "client", "--name", "two words"],
     "a name of letters, digits and _.@-"),
], ids=["keys-and-insecure", "keygen-name"])
def test_contradictory_or_malformed_flags_are_usage_errors(args, says, tmp_path):
    """--keys with --insecure ignored the keys; a key name with a space exited 1, as if
    something had failed rather than been typed wrong."""
    result = zres_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], cwd=tmp_path,
                      timeout=30)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_status_with_a_negative_timeout_does_not_wait_forever(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    try:
        result = zres_cli("status", address, "--timeout", "-1", cwd=tmp_path, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("zres status --timeout -1 was still waiting after 10s")
    assert result.returncode != 0
    assert_one_line_error(result)


# -- demo, help ------------------------------------------------------------------------------

def test_demo_runs_and_reports_where_tasks_ran(tmp_path):
    result = zres_cli("demo", "--inputs", "6", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    rows = re.findall(r"input +(\d+): load on (\S+) +process on (\S+) GPU (\d+)", out)
    assert sorted(int(r[0]) for r in rows) == list(range(6)), out
    for _, load_on, process_on, gpu in rows:
        assert load_on in {"gpu-a", "gpu-b", "bigmem"}
        assert process_on in {"gpu-a", "gpu-b"}, "GPU work must run on a GPU agent"
        assert gpu in {"0", "1"}
    total = sum(v * v for n in range(6) for v in range(n, n + 10))
    assert f"aggregate on bigmem: 6 inputs, total {total}" in out
    assert re.search(r"^\(aggregate-\d+ bigmem\) combining 6 results$", out, re.M), out
    assert "Traceback" not in result.stderr


def test_help_lists_the_commands(tmp_path):
    result = zres_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("broker", "agent", "status", "resources", "demo"):
        assert command in result.stdout
    for command in ("broker", "agent", "status"):
        sub = zres_cli(command, "--help", cwd=tmp_path)
        assert sub.returncode == 0 and "usage: zres " + command in sub.stdout


def test_every_command_and_option_has_help_text():
    def undocumented(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                documented = {choice.dest for choice in action._choices_actions
                              if choice.help}
                for name, command in action.choices.items():
                    if name not in documented:
                        yield f"{path} {name}"
                    yield from undocumented(command, f"{path} {name}")
            elif not action.help or action.help == argparse.SUPPRESS:
                yield f"{path} {'/'.join(action.option_strings) or action.dest}"

    assert list(undocumented(_parser(), "zres")) == []


def test_no_command_is_a_usage_error(tmp_path):
    result = zres_cli(cwd=tmp_path)
    assert result.returncode == 2
    assert "usage:" in result.stderr and "Traceback" not in result.stderr


def test_unknown_command_is_a_usage_error(tmp_path):
    result = zres_cli("frobnicate", cwd=tmp_path)
    assert result.returncode == 2
    assert "frobnicate" in result.stderr and "Traceback" not in result.stderr


# -- resources --------------------------------------------------------------------------------

def test_resources_command_changes_capacity_and_rejects_bad_input(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], names=["res-node"])
    ok = zres_cli("resources", "res-node", "foo=3", "--broker", cluster.address,
                  "--keys", cluster.keys, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "foo=3" in ok.stdout
    status = cluster.status()
    assert status["agents"][0]["slots"][0]["total"]["foo"] == 3

    bad = zres_cli("resources", "res-node", "foo=three", "--broker", cluster.address,
                   "--keys", cluster.keys,
                   cwd=tmp_path)
    assert bad.returncode == 2
    assert "'foo=three'" in assert_one_line_error(bad)

    unknown = zres_cli("resources", "no-such-node", "foo=1", "--broker", cluster.address,
                       "--keys", cluster.keys,
                       cwd=tmp_path)
    assert unknown.returncode != 0
    line = assert_one_line_error(unknown)
    assert "no-such-node" in line and "res-node" in line


# -- signals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_agent_stops_cleanly_on_signal(sig, make_cluster, spawn, tmp_path):
    cluster = make_cluster(agents=[])
    env = clean_env(ZRES_AGENT__HEARTBEAT_INTERVAL="0.2", ZRES_AGENT__HEARTBEAT_TIMEOUT="2.0")
    proc = spawn([sys.executable, "-m", "zres", "agent", cluster.address,
                  "--keys", cluster.keys, "--name", "sig-node",
                  "--resources", "foo=1", "--no-detect"], env=env, cwd=tmp_path,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster.wait_for_agents(["sig-node"], 30)
    proc.send_signal(sig)
    assert proc.wait(10) == 0
