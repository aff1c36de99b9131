"""Command jobs end to end: ``zres submit / jobs / logs / cancel / wait`` run as a user runs
them (separate processes, exit statuses, output), and ``zres.submit_command`` from Python,
against real broker and agent processes. Jobs block on files the test creates, never on
the test's sleeps."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import zres
from tests.cli.test_cli import assert_one_line_error, clean_env, free_port, zres_cli
from tests.conftest import process_gone, stop_process, wait_until
from tests.e2e.test_scheduling import FAKE_GPUS
from zres.core import keys as K

# A job that writes what it was given, then waits until the file RELEASE exists.
HOLD = ('echo "$ZRES_JOB_NAME cuda=$CUDA_VISIBLE_DEVICES gpus=$ZRES_GPU_IDS '
        'job=$ZRES_JOB_ID" > "$OUT"; while [ ! -e "$RELEASE" ]; do sleep 0.02; done')


@pytest.fixture
def cli(make_cluster):
    """Start a cluster; return (cluster, run) where run(*args) runs the zres command."""
    def start(agents, **kwargs):
        cluster = make_cluster(agents=agents, **kwargs)
        env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)

        def run(*args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
            result = zres_cli(*args, env=env)
            if check is not None:
                assert result.returncode == check, (args, result.stdout, result.stderr)
            return result
        return cluster, run
    return start


def hold_job(run, tmp_path: Path, name: str, spec: str = "") -> int:
    """Submit a HOLD job called NAME; return its id."""
    args = ["submit", "--name", name, "--env", f"ZRES_JOB_NAME={name}",
            "--env", f"OUT={tmp_path / name}.out", "--env", f"RELEASE={tmp_path / name}.go"]
    if spec:
        args += ["-r", spec]
    return int(run(*args, "--", "sh", "-c", HOLD).stdout)


def job_table(run, all_jobs: bool = True) -> dict[int, list[str]]:
    """Parse ``zres jobs``: id -> the row's cells."""
    out = run("jobs", *(["--all"] if all_jobs else [])).stdout.splitlines()
    rows = [re.split(r"\s{2,}", line) for line in out[1:] if line[:1].isdigit()]
    return {int(row[0]): row[:2] + row[3:] for row in rows}  # (less the owner: see security)


def started(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.out"
    return path.read_text().strip() if path.exists() else ""

# Run by a job: print "alive PID" for each of $PIDS still running, then "checked".
CHECK_GONE = ('for p in $PIDS; do s=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null); '
              '[ -n "$s" ] && [ "$s" != Z ] && echo "alive $p"; done; echo checked')


# -- placement ------------------------------------------------------------------------------


def test_guilds_four_runs_on_per_device_tokens(cli, tmp_path):
    cluster, run = cli([{"gpu0": 1, "gpu1": 1}], nthreads=4)
    aaa = hold_job(run, tmp_path, "aaa", "gpu0=1 gpu1=1")
    bbb = hold_job(run, tmp_path, "bbb", "gpu0=1")
    ccc = hold_job(run, tmp_path, "ccc", "gpu1=1")
    ddd = hold_job(run, tmp_path, "ddd")
    wait_until(lambda: started(tmp_path, "aaa") and started(tmp_path, "ddd"),
               message="aaa and ddd running side by side")
    table = job_table(run)
    assert table[aaa][2] == "running" and table[ddd][2] == "running"
    assert table[bbb][2] == "queued" and table[ccc][2] == "queued"
    assert "gpu0" in run("jobs").stdout.split(f"job {bbb} waits:")[1].splitlines()[0]
    for name in ("aaa", "ddd"):
        (tmp_path / f"{name}.go").touch()
    wait_until(lambda: started(tmp_path, "bbb") and started(tmp_path, "ccc"),
               message="bbb and ccc once aaa freed both devices")
    for name in ("bbb", "ccc"):
        (tmp_path / f"{name}.go").touch()
    assert run("wait", str(aaa), str(bbb), str(ccc), str(ddd)).returncode == 0
    assert started(tmp_path, "aaa") == f"aaa cuda=0,1 gpus=0,1 job={aaa}"
    assert started(tmp_path, "bbb") == f"bbb cuda=0 gpus=0 job={bbb}"
    assert started(tmp_path, "ccc") == f"ccc cuda=1 gpus=1 job={ccc}"
    assert started(tmp_path, "ddd") == f"ddd cuda= gpus= job={ddd}"
    table = job_table(run)
    assert [table[j][2] for j in (aaa, bbb, ccc, ddd)] == ["done"] * 4
    assert table[aaa][5] == "0,1" and table[bbb][5] == "0" and table[aaa][8] == "0"


def test_gpu_jobs_each_see_the_device_they_were_granted(cli, tmp_path):
    cluster, run = cli([], env={"ZRES_TEST_FAKE_GPUS": FAKE_GPUS}, nthreads=4)
    cluster.add_agent(None, name="gpu-node")  # two detected (fake NVML) devices
    one, two, three = (hold_job(run, tmp_path, name, "GPU=1") for name in ("one", "two",
                                                                           "three"))
    wait_until(lambda: started(tmp_path, "one") and started(tmp_path, "two"),
               message="two GPU=1 jobs on the two devices")
    table = job_table(run)
    assert table[three][2] == "queued"
    devices = {}
    for name, job in (("one", one), ("two", two)):
        device = table[job][5]
        assert started(tmp_path, name) == f"{name} cuda={device} gpus={device} job={job}"
        devices[name] = device
    assert sorted(devices.values()) == ["0", "1"]
    (tmp_path / "one.go").touch()
    wait_until(lambda: started(tmp_path, "three"), message="the third on the freed device")
    assert started(tmp_path, "three") == (f"three cuda={devices['one']} gpus={devices['one']} "
                                          f"job={three}")
    for name in ("two", "three"):
        (tmp_path / f"{name}.go").touch()
    assert run("wait", str(one), str(two), str(three)).returncode == 0


@pytest.mark.parametrize("capacity, parallel", [(7, False), (12, True)])
def test_two_jobs_needing_foo5_run_serially_on_7_and_together_on_12(cli, tmp_path, capacity,
                                                                     parallel):
    cluster, run = cli([{"foo": capacity}], nthreads=4)
    first = hold_job(run, tmp_path, "first", "foo=5")
    second = hold_job(run, tmp_path, "second", "foo=5")
    wait_until(lambda: started(tmp_path, "first"), message="the first job")
    if parallel:
        wait_until(lambda: started(tmp_path, "second"), message="both at once")
    else:
        wait_until(lambda: job_table(run)[second][2] == "queued"
                   and "foo" in run("jobs").stdout, message="the second job queued for foo")
        assert not started(tmp_path, "second")
    (tmp_path / "first.go").touch()
    wait_until(lambda: started(tmp_path, "second"), message="the second job")
    (tmp_path / "second.go").touch()
    assert run("wait", str(first), str(second)).returncode == 0


def test_job_needing_three_resources_runs_where_all_three_are(cli, tmp_path):
    cluster, run = cli([{"foo": 1, "bar": 1}, {"foo": 1, "bar": 1, "baz": 1}], nthreads=2)
    job = int(run("submit", "-r", "foo=1 bar=1 baz=1", "--", "true").stdout)
    assert run("wait", str(job)).returncode == 0
    assert job_table(run)[job][4] == "agent-1"


def test_jobs_of_a_file_are_queued_at_once_and_run_when_an_agent_joins(cli, tmp_path):
    """(How fast, for 1,000 jobs: bench/jobs.py.)"""
    cluster, run = cli([])
    lines = tmp_path / "runs.txt"
    lines.write_text("".join(f"true {i}\n" for i in range(200)))
    ids = [int(i) for i in run("submit", "--file", str(lines)).stdout.split()]
    assert len(set(ids)) == 200
    assert {row[2] for row in job_table(run, all_jobs=False).values()} == {"queued"}
    # (Memory limits off: a cgroup made, and /proc read, for each job took about half this
    # test's time; tests/e2e/test_limits.py covers jobs' limits.)
    cluster.add_agent({"CPU": 2}, name="late", extra_args=["--memory-limits", "off"])
    assert run("wait", *map(str, ids)).returncode == 0
    assert job_table(run, all_jobs=False) == {}


def test_jobs_run_where_they_were_submitted_from_unless_told(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
    (tmp_path / "sub").mkdir()
    (tmp_path / "train.sh").write_text("pwd\n")

    def submit(*args: str) -> int:
        result = zres_cli("submit", *args, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return int(result.stdout)

    here = submit("--", "sh", "train.sh")  # a relative path, as in `python train.py`
    there = submit("--cwd", "sub", "--", "sh", "-c", "pwd")
    nowhere = submit("--cwd", str(tmp_path / "missing"), "--name", "nowhere", "--", "true")
    assert run("wait", str(here), str(there)).returncode == 0
    assert run("logs", str(here)).stdout == f"{tmp_path}\n"
    assert run("logs", str(there)).stdout == f"{tmp_path / 'sub'}\n"
    waited = run("wait", str(nowhere), check=1)
    assert f"{tmp_path / 'missing'}" in waited.stderr


def test_jobs_submitted_before_any_agent_joins_run_when_one_does(cli, tmp_path):
    cluster, run = cli([])
    jobs = [int(run("submit", "--", "sh", "-c", f"echo {i}").stdout) for i in range(3)]
    assert {job_table(run)[j][2] for j in jobs} == {"queued"}, "waiting, not infeasible"
    cluster.add_agent({"CPU": 2}, name="late")
    assert run("wait", *map(str, jobs)).returncode == 0
    assert [run("logs", str(j)).stdout for j in jobs] == ["0\n", "1\n", "2\n"]


# -- what cannot run, and bad input --------------------------------------------------------


def test_missing_resource_is_reported_not_waited_for(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    result = run("submit", "-r", "nope=1", "--name", "lonely", "--", "true")
    job = int(result.stdout)
    assert "no agent offers nope" in result.stderr
    listing = run("jobs").stdout
    assert "infeasible" in listing and "no agent offers nope" in listing
    waited = run("wait", str(job), check=1)
    assert f"job {job} (lonely): infeasible: no agent offers nope" in waited.stderr
    # Beside a job that can still finish, wait reports the infeasible one and waits on.
    held = hold_job(run, tmp_path, "held", "foo=1")
    wait_until(lambda: started(tmp_path, "held"), message="the held job running")
    gave_up = run("wait", str(job), str(held), "--timeout", "1", check=1)
    assert f"still waiting for {held}" in gave_up.stderr
    (tmp_path / "held.go").touch()
    waited = run("wait", str(job), str(held), check=1)
    assert f"job {job} (lonely)" in waited.stderr and f"job {held}" not in waited.stderr
    refused = run("submit", "-r", "nope=1", "--infeasible", "error", "--", "true", check=1)
    assert "refused" in refused.stderr and "nope" in refused.stderr
    assert refused.stdout == ""
    # The refused job has ended: zres jobs --all lists it with its reason, not as waiting.
    ended = [j["id"] for j in json.loads(run("jobs", "--all", "--json").stdout)
             if j["finished"] and j["state"] == "infeasible"]
    assert len(ended) == 1
    listing = run("jobs", "--all").stdout
    assert f"job {job} waits: " in listing and f"job {ended[0]} waits" not in listing


def test_infeasibility_is_judged_by_the_agents_there_now(cli, tmp_path):
    cluster, run = cli([])
    first = hold_job(run, tmp_path, "first", "nope=1")
    second = hold_job(run, tmp_path, "second", "nope=1")
    strict = int(run("submit", "-r", "nope=1", "--infeasible", "error", "--name", "strict",
                     "--", "true").stdout)
    assert {job_table(run)[j][2] for j in (first, second, strict)} == {"queued"}
    cluster.add_agent({"foo": 1}, name="foo-node")  # the first agent: nope is not offered
    wait_until(lambda: {job_table(run)[j][2] for j in (first, second, strict)}
               == {"infeasible"}, message="the jobs shown infeasible")
    waited = run("wait", str(first), str(strict), check=1)
    assert f"job {first} (first): infeasible: no agent offers nope" in waited.stderr
    assert f"job {strict} (strict): infeasible" in waited.stderr
    cluster.add_agent({"nope": 1}, name="nope-node")
    wait_until(lambda: started(tmp_path, "first") or started(tmp_path, "second"),
               message="one of them running")
    waiting = second if started(tmp_path, "first") else first
    assert job_table(run)[waiting][2] == "queued", "still shown infeasible"
    for name in ("first", "second"):
        (tmp_path / f"{name}.go").touch()
    assert run("wait", str(first), str(second)).returncode == 0
    assert job_table(run)[strict][2] == "infeasible", "--infeasible error refused it for good"


def test_a_malformed_spec_command_or_env_is_refused_before_anything_is_queued(cli):
    cluster, run = cli([{"foo": 1}], nthreads=2)  # (one cluster for every case)
    for spec in ("GPU=-1", "foo", "GPU=two", "=3"):
        result = run("submit", "-r", spec, "--", "true", check=2)
        assert spec in result.stderr and result.stdout == "", (spec, result.stderr)
    assert "no command" in run("submit", "-r", "foo=1", check=2).stderr
    assert "KEY=VALUE" in run("submit", "--env", "JUSTKEY", "--", "true", check=2).stderr
    assert job_table(run) == {}


# -- running jobs: logs, cancel, exit codes ---------------------------------------------------


def test_logs_are_followed_while_the_job_runs_and_kept_after(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    go = tmp_path / "go"
    script = f'echo first; while [ ! -e "{go}" ]; do sleep 0.02; done; echo second'
    job = int(run("submit", "--", "sh", "-c", script).stdout)
    follower = subprocess.Popen([sys.executable, "-m", "zres", "logs", str(job), "--follow"],
                                stdout=subprocess.PIPE, text=True,
                                env=clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys))
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "first\n", "the log streamed while it ran"
        assert job_table(run)[job][2] == "running"
        go.touch()
        rest, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert rest == "second\n" and follower.returncode == 0
    assert run("logs", str(job)).stdout == "first\nsecond\n", "kept after the job ended"
    assert "no job 999" in run("logs", "999", check=1).stderr


def test_an_ended_jobs_log_goes_after_the_retention_and_zres_logs_says_why(cli, tmp_path):
    """An agent never fills its disk with logs: an ended job's goes job_log_retention
    seconds after its end, and ``zres logs`` then says so (it printed nothing, or a bare
    'No such file'); a running job's stays, however long it has been silent."""
    logs = tmp_path / "logs"
    cluster, run = cli([{"foo": 1}], nthreads=2, env={
        "ZRES_AGENT__JOB_LOGS": str(logs), "ZRES_AGENT__JOB_LOG_RETENTION": "0.5"})
    go = tmp_path / "go"
    held = int(run("submit", "--", "sh", "-c",
                   f'echo held; while [ ! -e "{go}" ]; do sleep 0.02; done').stdout)
    job = int(run("submit", "--", "echo", "short-lived").stdout)
    assert run("wait", str(job)).returncode == 0
    (log,) = logs.glob(f"*/{job}.log")
    wait_until(lambda: not log.exists(), timeout=30, message="the ended job's log to go")
    said = run("logs", str(job), check=1).stderr
    assert re.search(rf"zres logs: job {job}: its log was removed by agent agent-0 "
                     r"[\d.]+ s after the job ended \(job_log_retention is 0.5 s\)", said), said
    (kept,) = logs.glob(f"*/{held}.log")
    assert run("logs", str(held)).stdout == "held\n" and kept.exists()
    go.touch()
    assert run("wait", str(held)).returncode == 0
    wait_until(lambda: not kept.exists(), timeout=30, message="the held job's log to go")


def test_a_log_asked_of_an_agent_that_cannot_answer_says_so(cli, tmp_path):
    """A log asked of an agent that cannot answer (stopped, still connected) is answered by
    the broker within seconds, naming the agent: the command waited its whole timeout, then
    said no broker answered, though the broker was there."""
    cluster, run = cli([{"foo": 1}], names=["held"])
    go = tmp_path / "go"
    script = f'echo first; while [ ! -e "{go}" ]; do sleep 0.02; done'
    job = int(run("submit", "--", "sh", "-c", script).stdout)
    wait_until(lambda: run("logs", str(job)).stdout == "first\n", message="its log")
    stop_process(cluster.agents["held"].pid)
    try:
        failed = run("logs", str(job), check=1)
    finally:
        os.kill(cluster.agents["held"].pid, signal.SIGCONT)
        go.touch()
    assert "log is on agent held, which did not answer" in failed.stderr, failed.stderr


def test_logs_follow_and_wait_ride_out_a_broker_restart(cli, tmp_path, make_client):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    go = tmp_path / "go"
    script = f'echo first; while [ ! -e "{go}" ]; do sleep 0.02; done; echo second'
    job = int(run("submit", "--", "sh", "-c", script).stdout)
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
    follower, waiter = (subprocess.Popen([sys.executable, "-m", "zres", *args], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)
                        for args in (("logs", str(job), "--follow"), ("wait", str(job))))
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "first\n"
        client = make_client(cluster.address)
        wait_until(lambda: client.status()["job_waits"] == 1, message="the wait to be held")
        client.close()
        cluster.broker.kill()
        cluster.broker.wait(10)
        # Away for a while (each command meanwhile is told so): both hear it is.
        for _ in range(2):
            assert "cannot reach the zres broker" in run("jobs", check=1).stderr
        cluster.restart_broker()
        go.touch()
        rest, said = follower.communicate(timeout=60)
        _, waited = waiter.communicate(timeout=60)
    finally:
        follower.kill()
        waiter.kill()
    assert (rest, follower.returncode) == ("second\n", 0), said
    assert "waiting up to 300s for it to come back" in said
    assert waiter.returncode == 0, waited


def test_a_detached_job_is_its_submitters_across_a_broker_restart(make_cluster, make_client,
                                                                   tmp_path):
    # The client that submitted it (as zres submit does: detached) is back with the
    # restarted broker: its future resolves, its id is known; it was told the job "was not
    # kept" (and sent again, a submit not yet acknowledged was queued twice: duplicates).
    cluster = make_cluster(agents=[{"foo": 1}])
    client = make_client(cluster.address)
    go = tmp_path / "go"
    job = client.submit_command(f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo ran',
                                shell=True, detached=True, resources={"foo": 1})
    wait_until(job.running, message="the job to start")
    cluster.restart_broker()
    assert client.job_ids([job]) == [job.id]
    go.touch()
    assert job.result(60).exit_code == 0
    assert [j["id"] for j in client.jobs(all=True)] == [job.id]
    # Asked as the broker goes (zres submit asks so for the ids it prints): asked again of
    # the restarted one, not "the broker restarted before it answered".
    stop_process(cluster.broker.pid)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(client.job_ids, [job])
        wait_until(lambda: client._io.requests, message="the request to go")
        cluster.restart_broker()
        assert asked.result(60) == [job.id]


def test_cancel_kills_the_whole_process_tree_and_frees_resources(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo "$$ $!" > "{pids}"; wait'
    job = int(run("submit", "-r", "foo=1", "--", "sh", "-c", script).stdout)
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2,
               message="the job and its child")
    shell, child = map(int, pids.read_text().split())
    after = int(run("submit", "-r", "foo=1", "--", "true").stdout)
    assert run("cancel", str(job)).stdout.strip() == f"cancelled {job}"
    wait_until(lambda: process_gone(shell) and process_gone(child),
               message="the job's processes to end")
    assert run("wait", str(after)).returncode == 0, "the freed foo went to the next job"
    assert job_table(run)[job][2] == "cancelled"
    assert "already finished" in run("cancel", str(job), check=1).stderr


def test_cancel_sigkills_what_ignores_sigterm_after_the_grace_and_only_then_frees(cli,
                                                                                   tmp_path):
    logs = tmp_path / "logs"
    cluster, run = cli([{"foo": 1}], nthreads=2,
                       env={"ZRES_AGENT__JOB_GRACE": "2", "ZRES_AGENT__JOB_LOGS": str(logs)})
    pids = tmp_path / "pids"
    # The shell leaves on SIGTERM; its child ignores SIGTERM and must get SIGKILL.
    script = (f"trap 'echo got TERM; exit 143' TERM; (trap '' TERM; exec sleep 300) & "
              f'echo "$$ $!" > "{pids}"; wait')
    job = int(run("submit", "-r", "foo=1", "--", "sh", "-c", script).stdout)
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2,
               message="the job and its child")
    shell, child = map(int, pids.read_text().split())
    after = int(run("submit", "-r", "foo=1", "--env", f"PIDS={shell} {child}", "--",
                    "sh", "-c", CHECK_GONE).stdout)
    run("cancel", str(job))
    (log,) = logs.glob(f"*/{job}.log")  # one directory per cluster (named by its id)
    wait_until(lambda: "got TERM" in log.read_text(), message="SIGTERM")
    wait_until(lambda: process_gone(shell), message="the shell to leave on SIGTERM")
    assert not process_gone(child), "SIGKILL came before the grace period was over"
    wait_until(lambda: process_gone(child), message="SIGKILL after the grace period")
    assert run("wait", str(after)).returncode == 0
    assert run("logs", str(after)).stdout == "checked\n", "foo was freed before the tree went"
    assert job_table(run)[job][2] == "cancelled"


# A daemon (started under `setsid`: out of its job's group and session) that writes its pid
# to $PIDS; on SIGTERM it writes $PIDS.term and leaves only once $RELEASE exists.
DAEMON = ('trap \'touch "$PIDS.term"; while [ ! -e "$RELEASE" ]; do sleep 0.02; done; '
          'exit 0\' TERM; echo $$ > "$PIDS.part"; mv "$PIDS.part" "$PIDS"; '
          'while :; do sleep 1; done')


def test_a_job_ends_only_once_what_left_its_process_group_is_gone(cli, tmp_path):
    """A job that starts a daemon and exits is not reported finished, nor its foo granted
    to the next job, while the daemon runs: the agent finds the daemon (no cgroup here: by
    the tag in its environment), stops it, and only then does the job end."""
    cluster, run = cli([{"foo": 1}], nthreads=2, env={
        "ZRES_AGENT__JOB_GRACE": "60", "ZRES_AGENT__MEMORY_LIMITS": "off"})
    pids, release = tmp_path / "daemon", tmp_path / "release"
    try:
        # (the leader waits for the daemon to be up: stopped before its setsid, it would
        # have gone with the job's group)
        job = int(run("submit", "-r", "foo=1", "--env", f"PIDS={pids}", "--env",
                      f"RELEASE={release}", "--env", f"DAEMON={DAEMON}", "--", "sh", "-c",
                      'setsid sh -c "$DAEMON" & while [ ! -e "$PIDS" ]; do sleep 0.02; done'
                      ).stdout)
        wait_until(pids.exists, message="the daemon")
        daemon = int(pids.read_text())
        after = int(run("submit", "-r", "foo=1", "--env", f"PIDS={daemon}", "--", "sh",
                        "-c", CHECK_GONE).stdout)
        wait_until(Path(f"{pids}.term").exists, message="SIGTERM to the daemon")
        table = job_table(run)  # (the daemon leaves only once released)
        assert (table[job][2], table[after][2]) == ("running", "queued"), table
        assert not process_gone(daemon)
        release.touch()
        assert run("wait", str(job), str(after)).returncode == 0
        assert process_gone(daemon)
        assert run("logs", str(after)).stdout == "checked\n", "foo was freed before it went"
    finally:
        if pids.exists() and not process_gone(int(pids.read_text())):
            os.kill(int(pids.read_text()), signal.SIGKILL)  # (the agent failed to)


def test_exit_codes_reach_the_caller(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}], nthreads=2)
    client = make_client(cluster.address)
    ok = client.submit_command(["sh", "-c", "echo hello $ZRES_JOB_ID"], resources={"foo": 1})
    bad = client.submit_command("sh -c 'echo oops; exit 7'", name="bad")
    missing = client.submit_command(["/no/such/program"])
    result = ok.result(30)
    assert isinstance(result, zres.CommandResult) and result.exit_code == 0
    assert Path(result.log).read_text() == f"hello {result.job_id}\n"
    assert result.agent == "agent-0"
    with pytest.raises(zres.CommandFailed, match="exited with code 7") as failed:
        bad.result(30)
    assert failed.value.exit_code == 7 and "oops" in failed.value.tail
    with pytest.raises(zres.CommandFailed, match="cannot start"):
        missing.result(30)
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
    (bad_id,) = client.job_ids([bad])
    waited = zres_cli("wait", str(bad_id), str(result.job_id), env=env)
    assert waited.returncode == 1 and f"job {bad_id} (bad): exit code 7" in waited.stderr


def test_run_queue_once_returns_when_every_job_has_finished(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    go = tmp_path / "go"
    jobs = [int(run("submit", "-r", "foo=1", "--", "sh", "-c",
                    f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit {i}').stdout)
            for i in range(3)]
    queue = subprocess.Popen([sys.executable, "-m", "zres", "run-queue", "--once"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys))
    try:
        assert queue.stdout is not None
        assert queue.stdout.readline().split(": ")[1].split() == [str(j) for j in jobs]
        # Its wait is held by the broker until the jobs end (not asked again and again).
        wait_until(lambda: json.loads(run("status", "--json").stdout)["job_waits"] == 1,
                   message="the broker to hold the wait for the jobs' ends")
        go.touch()
        _, errors = queue.communicate(timeout=60)
    finally:
        queue.kill()
    assert queue.returncode == 1
    assert json.loads(run("status", "--json").stdout)["job_waits"] == 0, "a wait left held"
    table = job_table(run)
    assert [table[j][2] for j in jobs] == ["done", "failed", "failed"]
    assert f"job {jobs[1]}" in errors and "exit code 1" in errors

    # Without --once it watches: what is there already is one line, then only changes.
    watch = subprocess.Popen([sys.executable, "-m", "zres", "run-queue"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys))
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().startswith("3 job(s) so far (1 done, 2 failed)")
        later = int(run("submit", "--name", "later", "--", "true").stdout)
        seen = []
        for line in watch.stdout:
            seen.append(line)
            if line == f"job {later} later: done\n":
                break
        assert all(line.startswith(f"job {later} later: ") for line in seen), seen
    finally:
        watch.kill()
        watch.communicate()


def test_submit_file_queues_one_job_per_line(cli, tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2)
    commands = tmp_path / "jobs.txt"
    commands.write_text("sh -c 'echo one'\n\n# a comment\nsh -c 'echo two'  # trailing\n")
    ids = [int(i) for i in run("submit", "-r", "foo=1", "--file", str(commands)).stdout.split()]
    assert len(ids) == 2
    assert run("wait", *map(str, ids)).returncode == 0
    assert [run("logs", str(i)).stdout for i in ids] == ["one\n", "two\n"]
    commands.write_text("sh -c 'unbalanced\n")
    assert "jobs.txt:1" in run("submit", "--file", str(commands), check=2).stderr


def test_wait_with_no_ids_fails_for_a_job_that_failed_before_it_was_called(cli, tmp_path):
    """`zres wait` covers every job no wait has reported yet, finished ones included (as a
    shell's wait does its children): a job that failed first makes it exit 1, naming it."""
    cluster, run = cli([{"foo": 1}])
    good = int(run("submit", "--", "true").stdout)
    bad = int(run("submit", "--name", "broken", "--", "false").stdout)
    wait_until(lambda: {good, bad} <= {j for j, row in job_table(run).items()
                                       if row[2] in ("done", "failed")},
               message="both jobs to end")
    waited = run("wait", check=1)
    assert f"job {bad} (broken)" in waited.stderr and f"job {good} " not in waited.stderr
    assert run("wait").returncode == 0, "a job already reported counts again"
    later = int(run("submit", "--", "true").stdout)
    assert run("wait").returncode == 0 and job_table(run)[later][2] == "done"


def test_two_clusters_on_one_host_keep_their_job_logs_apart(make_cluster, tmp_path):
    """Job ids start at 1 on each broker: their logs must not share a file."""
    logs = tmp_path / "logs"
    said = {}
    for word in ("first", "second"):
        cluster = make_cluster(agents=[])
        cluster.add_agent({"foo": 1}, name=f"agent-{word}",
                          extra_args=["--job-logs", str(logs)])
        env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys)
        job = int(zres_cli("submit", "--", "echo", word, env=env).stdout)
        assert zres_cli("wait", str(job), env=env).returncode == 0
        said[word] = (env, job)
    assert said["first"][1] == said["second"][1] == 1
    for word, (env, job) in said.items():
        assert zres_cli("logs", str(job), env=env).stdout == f"{word}\n"


# -- where logs live: private, never written through a link -------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_job_logs_are_private_and_never_written_through_a_link(cli, tmp_path):
    logs = tmp_path / "logs"
    cluster, run = cli([{"foo": 1}], env={"ZRES_AGENT__JOB_LOGS": str(logs)})
    # While a job runs, its agent's record of it is a file of its own (its process group,
    # for the next agent of this name should this one be killed outright), gone as it ends.
    go = tmp_path / "go"
    first = int(run("submit", "--", "sh", "-c", f'echo first; while [ ! -e "{go}" ]; '
                    "do sleep 0.02; done").stdout)
    record = logs / "running-agent-0" / str(first)
    wait_until(record.exists, message="the running job's record")
    (log,) = logs.glob(f"*/{first}.log")
    assert [mode(p) for p in (logs, log.parent, log, record.parent, record)] == \
        [0o700, 0o700, 0o600, 0o700, 0o600]
    pgid = json.loads(record.read_text())["pgid"]
    assert os.getpgid(pgid) == pgid
    go.touch()
    assert run("wait", str(first)).returncode == 0
    assert list(record.parent.iterdir()) == []
    # Where the next two jobs will log (ids come in order): a link to a file the agent's
    # user can write, and an older log. Neither is written to; each job fails, naming it.
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    linked, older = log.parent / f"{first + 1}.log", log.parent / f"{first + 2}.log"
    linked.symlink_to(precious)
    older.write_text("an older log\n")
    for path in (linked, older):
        job = int(run("submit", "--", "echo", "written over").stdout)
        assert job == int(path.stem)
        said = run("wait", str(job), check=1).stderr
        assert f"its log {path}: it is there already" in said, said
    assert precious.read_text() == "keep me\n" and older.read_text() == "an older log\n"
    assert run("wait", run("submit", "--", "echo", "fine").stdout.strip()).returncode == 0


def test_job_log_and_state_directories_open_to_others_are_refused_naming_them(tmp_path):
    """An agent keeps its files only in directories of its own that nobody else may read:
    one already there that is open to others, or another user's, is refused at start (exit
    status 2, one line naming it), before anything is written there."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)  # nobody's
    else:
        foreign = Path("/")  # root's: another user's for anyone else
    address = f"tcp://127.0.0.1:{free_port()}"  # (nothing there: refused before it asks)
    for flag, path, why in (("--job-logs", open_dir, "is open to others (mode 0755)"),
                            ("--job-logs", foreign, "belongs to "),
                            ("--state", open_dir, "is open to others (mode 0755)")):
        result = zres_cli("agent", address, "--name", "refused", "--resources", "foo=1",
                          "--no-detect", "--log-level", "error", flag, str(path), timeout=30)
        said = assert_one_line_error(result)
        assert result.returncode == 2, said
        assert f" {path} {why}" in said and said.startswith("zres agent: the "), said
    assert list(open_dir.iterdir()) == []


# -- why a job ended, for its owner and for everyone else --------------------------------------


def other_key(cluster: zres.LocalCluster, tmp_path: Path, name: str) -> str:
    """A directory holding the broker's public key and a client key of NAME's own."""
    K.keygen(cluster.keys, "client", name)
    mine = tmp_path / f"keys-{name}"
    mine.mkdir(mode=0o700)
    for file in ("broker.key", f"client-{name}.key_secret"):
        (mine / file).write_bytes(Path(cluster.keys, file).read_bytes())
    return str(mine)


def test_a_job_that_cannot_start_says_why_to_its_owner_and_that_it_could_not_to_others(
        cli, make_client, tmp_path):
    cluster, run = cli([{"foo": 1}], http="127.0.0.1:0")
    bob_keys = other_key(cluster, tmp_path, "bob")
    bob = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=bob_keys)
    mine = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys, STEPS="steps-42")
    result = zres_cli("submit", "--name", "nothing", "--env", "TOKEN=s3cret", "--",
                      "./missing.sh", env=mine, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    missing = int(result.stdout)
    three = int(run("submit", "--name", "three", "--", "sh", "-c", "echo out; exit 3").stdout)
    why = "cannot start './missing.sh': No such file or directory"
    said = run("wait", str(missing), str(three), check=1).stderr
    assert f"job {missing} (nothing): failed: {why}\n" in said, said
    assert f"job {three} (three): exit code 3\n" in said, said
    # zres jobs: the agent that tried it, and why it ended (REASON, last).
    listing = run("jobs", "--all").stdout
    assert listing.splitlines()[0].split()[-3:] == ["EXIT", "PEAK", "REASON"]
    table = job_table(run)
    assert table[missing][2] == "failed" and table[missing][4] == "agent-0"
    assert table[missing][-1] == why and table[three][-1] == "exit code 3"
    assert table[three][-3] == "3"  # (then its peak memory: "-" if it ended too soon to tell)
    # zres logs: no log, and why, on stderr with exit status 1; a log when there is one.
    logs = run("logs", str(missing), check=1)
    assert logs.stdout == "" and logs.stderr == \
        f"zres logs: job {missing} has no log: it never started (failed: {why})\n"
    assert run("logs", str(three)).stdout == "out\n"
    # --json, for scripts: its owner sees the error, its environment, its command line.
    entries = {j["id"]: j for j in json.loads(run("jobs", "--all", "--json").stdout)}
    assert entries[missing]["reason"] == why and entries[missing]["agent"] == "agent-0"
    assert entries[missing]["env"] == {"TOKEN": "s3cret"}
    assert entries[missing]["exported"] > 0 and entries[missing]["argv"] == ["./missing.sh"]
    # Others read that it could not start, never what it was: not the command, the error,
    # the directory or the environment (zres jobs, --json, client.jobs(), the dashboard).
    theirs = zres_cli("jobs", "--all", "--json", env=bob)
    assert theirs.returncode == 0, theirs.stderr
    entries = {j["id"]: j for j in json.loads(theirs.stdout)}
    assert {k: entries[missing][k] for k in ("state", "agent", "reason")} == \
        {"state": "failed", "agent": "agent-0", "reason": "cannot start"}
    assert entries[three]["reason"] == "exit code 3"
    for private in ("missing.sh", "s3cret", "steps-42", str(tmp_path), "echo out"):
        assert private not in theirs.stdout, private
    assert not {"argv", "env", "cwd", "error", "exported"} & entries[missing].keys()
    assert zres_cli("jobs", "--all", env=bob).stdout.splitlines()[1:] != [] and \
        all(line.endswith(("cannot start", "exit code 3")) for line in
            zres_cli("jobs", "--all", env=bob).stdout.splitlines()[1:])
    shown = {j["id"]: j for j in make_client(cluster.address, keys=bob_keys).jobs(all=True)}
    assert shown[missing]["reason"] == "cannot start" and "env" not in shown[missing]
    with urllib.request.urlopen(f"{cluster.dashboard}api/status", timeout=10) as answer:
        page = answer.read().decode()
    dashboard = {j["id"]: j for j in json.loads(page)["jobs"]}
    assert dashboard[missing]["reason"] == "cannot start"
    assert dashboard[missing]["agent"] == "agent-0"
    for private in ("missing.sh", "s3cret", "steps-42", str(tmp_path), "echo out"):
        assert private not in page, private
    status = zres_cli("status", "--json", env=bob)
    assert status.returncode == 0 and "s3cret" not in status.stdout


# -- command lines and the submitter's environment ---------------------------------------------


def test_command_lines_run_in_a_shell_with_the_submitters_environment(cli, make_client,
                                                                      tmp_path):
    cluster, run = cli([{"foo": 1}], nthreads=2, env={"ZRES_BROKER__MAX_HEADER_BYTES": "65536"})
    env = clean_env(ZRES_BROKER=cluster.address, ZRES_KEYS=cluster.keys, STEPS="100",
                    OTHER="other", ZRES_MARK="zres's own")

    def submit(*args: str) -> list[int]:
        result = zres_cli("submit", *args, env=env)
        assert result.returncode == 0, result.stderr
        return [int(i) for i in result.stdout.split()]

    lines = tmp_path / "runs.txt"
    lines.write_text("echo hi | tr a-z A-Z\n# a comment\n\nexit 3\n"
                     "echo $STEPS ${ZRES_MARK-unset} && cd / && pwd  # a trailing comment\n")
    upper, three, steps = submit("--file", str(lines))
    [shell] = submit("--shell", "echo $STEPS $OTHER")
    [argv] = submit("--", "echo", "a | b", "$STEPS")  # executed as is: no shell
    [none] = submit("--export=NONE", "--env", "KEPT=1", "--shell",
                    "echo ${STEPS-unset} ${OTHER-unset} $KEPT")
    [some] = submit("--export=STEPS,FOO=bar", "--shell", "echo $STEPS $FOO ${OTHER-unset}")
    [more] = submit("--export", "ALL,FOO=bar", "--env", "STEPS=7", "--shell",
                    "echo $STEPS $FOO $OTHER")
    client = make_client(cluster.address)
    piped = client.submit_command("echo hi | tr a-z A-Z", shell=True, env={"X": "1"})
    split = client.submit_command("echo 'a | b'")  # a string without shell=True: split
    assert Path(piped.result(30).log).read_text() == "HI\n"
    assert Path(split.result(30).log).read_text() == "a | b\n"
    ids = [upper, three, steps, shell, argv, none, some, more]
    said = run("wait", *map(str, ids), check=1).stderr
    assert said == f"job {three} (exit): exit code 3\n"
    assert [run("logs", str(i)).stdout for i in ids if i != three] == [
        "HI\n", "100 unset\n/\n", "100 other\n", "a | b $STEPS\n", "unset unset 1\n",
        "100 bar unset\n", "7 bar other\n"]
    assert job_table(run)[three][8] == "3"

    # The environment is kept once for all the jobs that share it, and goes as they end.
    big = {**env, "BIG": "x" * 20_000}
    waiting = zres_cli("submit", "-r", "bar=1", "--file", str(lines), env=big)
    queued = [int(i) for i in waiting.stdout.split()]
    assert waiting.returncode == 0 and len(queued) == 3, waiting.stderr
    state = sqlite3.connect(f"file:{cluster.state_dir}/state.sqlite3?mode=ro", uri=True)
    try:
        envs = state.execute("SELECT count(*), sum(length(env)) FROM envs").fetchone()
        assert envs[0] == 1 and envs[1] > 20_000, envs
        records = state.execute("SELECT max(length(record)) FROM jobs").fetchone()[0]
        assert records < 2_000, f"a job's record holds {records} bytes"
        run("cancel", *map(str, queued))
        wait_until(lambda: state.execute("SELECT count(*) FROM envs").fetchone()[0] == 0,
                   message="the environment to go with its last job")
    finally:
        state.close()
    # The broker's limit on a submit still holds, and says which it is.
    refused = zres_cli("submit", "--shell", "true", env={**env, "BIG": "x" * 100_000})
    assert refused.returncode == 1 and refused.stdout == ""
    assert "its command line and environment take about" in refused.stderr
    assert "max_header_bytes" in refused.stderr
    # What is not a variable list, or two commands, are refused where they were typed.
    bad = zres_cli("submit", "--export", "A B", "--shell", "true", env=env)
    assert bad.returncode == 2 and "'A B' is not a variable name" in bad.stderr
    both = zres_cli("submit", "--shell", "true", "--", "true", env=env)
    assert both.returncode == 2 and "not -- COMMAND and --shell" in both.stderr
