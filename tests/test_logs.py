"""Logging: zres logs through the standard logging module, a program using it sees nothing
on stdout, the daemons render their logs with structlog, and --log-level refuses levels
it does not know."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import zres

pytestmark = pytest.mark.timeout(90)


def run_program(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_program_using_a_private_cluster_prints_nothing_on_stdout():
    done = run_program("""
        import zres
        assert zres.submit(abs, -3).result(timeout=30) == 3
        zres.default_client().close()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "started a private cluster for this program" in done.stderr


def test_client_warnings_go_to_stderr_through_logging_not_stdout(make_cluster):
    cluster = make_cluster([{"foo": 1}])
    done = run_program("""
        import sys, warnings, zres
        client = zres.Client(sys.argv[1], keys=sys.argv[2])
        future = client.submit(abs, -1, resources={"bar": 1})
        # Warnings made errors: the client's I/O thread logs the news instead.
        warnings.simplefilter("error")
        import time
        deadline = time.monotonic() + 30
        while future.infeasible is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert future.infeasible, "never reported infeasible"
        client.close()
    """, cluster.address, cluster.keys)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "task_infeasible" in done.stderr and "bar" in done.stderr


def test_a_program_configures_zres_logging_with_the_standard_module(make_cluster,
                                                                   make_client):
    cluster = make_cluster([{"foo": 1}])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logging.getLogger("zres").addHandler(handler)
    try:
        client = make_client(cluster.address, keys=cluster.keys)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the client's I/O thread logs the news instead)
            future = client.submit(abs, -1, resources={"bar": 1})
            deadline_wait(lambda: future.infeasible)
        deadline_wait(lambda: any(r.name == "zres.client" for r in records))
    finally:
        logging.getLogger("zres").removeHandler(handler)
    (record,) = [r for r in records if r.name == "zres.client"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("task_infeasible task=")
    assert record.zres_event["event"] == "task_infeasible"  # type: ignore[attr-defined]
    assert "bar" in record.zres_event["reason"]  # type: ignore[attr-defined]
    # (where it was logged: zres's own line, for a program whose format shows it)
    assert record.pathname.endswith(os.path.join("zres", "client", "io.py")), record.pathname


def deadline_wait(condition) -> None:
    from tests.conftest import wait_until
    wait_until(condition, timeout=30)


def test_daemons_render_json_lines_on_stderr(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "zres", "agent", "tcp://127.0.0.1:9", "--insecure",
         "--no-detect", "--resources", "foo=1", "--log-format", "json", "--log-level",
         "DEBUG"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = json.loads(proc.stderr.readline())
        line = json.loads(proc.stderr.readline())
        if line["event"] == "memory_limits":  # (how it limits memory, said at its start)
            line = json.loads(proc.stderr.readline())
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert first["event"] == "resources_detected" and first["cpu_from"]
    assert line["event"] == "agent_started" and line["level"] == "info"
    assert line["slots"] == ["CPU=1 foo=1"] or line["slots"][0].endswith("foo=1")
    assert "timestamp" in line
    assert out == ""


@pytest.mark.parametrize("command", [["broker"], ["agent"], ["status"], ["jobs"],
                                     ["submit", "--", "true"]])
def test_log_level_refuses_an_unknown_level(command):
    argv = [command[0], "--log-level", "loud", *command[1:]]
    done = subprocess.run([sys.executable, "-m", "zres", *argv],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "unknown log level 'loud'" in done.stderr
    assert "debug, info, warning, error, critical" in done.stderr


@pytest.mark.parametrize(("variable", "said"), [
    ("ZRES_LOG_LEVEL", "unknown log level 'chatty'"),
    ("ZRES_LOG_FORMAT", "unknown log format 'chatty' (choose from console, json)")])
def test_an_unknown_level_or_format_in_the_environment_is_refused_too(variable, said):
    done = subprocess.run([sys.executable, "-m", "zres", "broker", "--insecure", "--listen",
                           "tcp://127.0.0.1:9"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, variable: "chatty"})
    assert done.returncode == 2
    assert said in done.stderr


@pytest.mark.parametrize("command", [["status"], ["jobs"]])
def test_a_command_refuses_an_unknown_level_in_the_environment_naming_it(command):
    done = subprocess.run([sys.executable, "-m", "zres", *command, "tcp://127.0.0.1:9"
                           if command == ["status"] else "--broker=tcp://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "ZRES_LOG_LEVEL": "verbose"})
    assert done.returncode == 2
    assert "$ZRES_LOG_LEVEL: unknown log level 'verbose'" in done.stderr


def test_version():
    done = subprocess.run([sys.executable, "-m", "zres", "--version"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert done.stdout.startswith(f"zres {zres.__version__} (Python ")
    assert "cloudpickle" in done.stdout
