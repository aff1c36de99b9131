"""How long an agent keeps ended command jobs' logs (``zres.agent.log_retention``), without a
broker: real jobs and files, the wall clock given to each step (no test waits for a
retention to pass). Never removed: a running job's log, one another agent sharing the
directory records as running, one written since its job ended."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from zres.agent.files import JobLogs
from zres.agent.jobs import JobRunner
from zres.agent.log_retention import LogRetention, duration
from zres.core import protocol as P

pytestmark = pytest.mark.timeout(60)
HOUR = 3600.0


def runner(logs_dir: Path, keep: tuple[float, int | None] = (HOUR, None)) -> JobRunner:
    jobs = JobRunner(JobLogs(str(logs_dir), "node"), "node", lambda *report: None,
                     keep=keep)
    jobs.cluster = "c0ffee"
    return jobs


def run_to_end(jobs: JobRunner, job_id: int, argv: list[str]) -> None:
    jobs.start(job_id, {"argv": argv, "env": {}, "cwd": None}, [])
    wait_until(lambda: (jobs.reap(), job_id not in jobs.jobs)[1], message=f"job {job_id}")


def plant(path: Path, age: float, text: str = "old\n") -> Path:
    """A log at PATH last written AGE seconds ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for directory in (path.parent, path.parent.parent):  # (the agent refuses others')
        os.chmod(directory, 0o700)
    path.write_text(text)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def asked(jobs: JobRunner, job_id: int, **extra: Any) -> dict[str, Any]:
    return jobs.log_reply(P.Message(P.LOGS, {"token": 1, "job": job_id, "offset": 0, **extra},
                                    []))


def test_an_ended_jobs_log_goes_after_the_retention_and_a_running_ones_never(tmp_path):
    logs_dir = tmp_path / "logs"
    jobs = runner(logs_dir)
    try:
        jobs.start(2, {"argv": ["sleep", "60"], "env": {}, "cwd": None}, [])
        running = logs_dir / "c0ffee" / "2.log"
        os.utime(running, (1.0, 1.0))  # (silent for decades: it runs all the same)
        # A job silent for longer than the retention before it ends keeps its log the
        # whole retention after its end: its end, not its last write, is what counts.
        script = 'echo one; touch -d "3 hours ago" "$0"'
        run_to_end(jobs, 1, ["sh", "-c", script, str(logs_dir / "c0ffee" / "1.log")])
        ended = time.time()
        log = logs_dir / "c0ffee" / "1.log"
        assert log.stat().st_mtime >= ended - 5
        assert jobs.retention.poll(ended + HOUR - 10) == 0 and log.exists()
        assert asked(jobs, 1)["data"] == b"one\n"
        assert jobs.retention.poll(ended + HOUR + 1) == 1
        assert not log.exists() and running.exists()
        said = asked(jobs, 1)["error"]
        assert said == ("job 1: its log was removed by agent node 1 hour after the job "
                        "ended (job_log_retention is 1 hour)"), said
        assert asked(jobs, 2)["data"] == b""
        assert "has no log for job 9: No such file" in asked(jobs, 9)["error"]
    finally:
        jobs.stop_all()
        jobs.logs.close()


def test_a_log_removed_before_the_agent_restarted_is_explained_by_the_jobs_end(tmp_path):
    jobs = runner(tmp_path / "logs", (7 * 24 * HOUR, None))
    try:
        long_ago = time.time() - 9 * 24 * HOUR
        said = asked(jobs, 5, ended=long_ago)["error"]
        assert said == ("job 5: its log was removed by agent node: the job ended 9 days "
                        "ago, and job_log_retention is 7 days"), said
        said = asked(jobs, 5, ended=time.time() - HOUR)["error"]
        assert said.startswith("agent node has no log for job 5: No such file"), said
    finally:
        jobs.logs.close()


def test_the_walk_at_start_removes_only_what_earlier_runs_left_past_its_time(tmp_path):
    """What an agent killed outright (or stopped) left: old logs go; a fresh one, one that
    another agent sharing the directory runs, and the log of a job the dead agent left
    running (stopped now, so ended now, however long it was silent) stay."""
    logs_dir = tmp_path / "logs"
    old = [plant(logs_dir / "c0ffee" / "1.log", 2 * HOUR),
           plant(logs_dir / "beef" / "1.log", 3 * HOUR)]
    fresh = plant(logs_dir / "c0ffee" / "2.log", 60)
    theirs = plant(logs_dir / "c0ffee" / "3.log", 5 * HOUR)
    left_running = plant(logs_dir / "c0ffee" / "5.log", 5 * HOUR)
    other = plant(logs_dir / "c0ffee" / "notes.txt", 5 * HOUR)
    (logs_dir / "c0ffee" / "4.log").symlink_to(other)
    for agent, job in (("other", 3), ("node", 5)):
        record = logs_dir / f"running-{agent}"
        record.mkdir(mode=0o700, exist_ok=True)
        (record / str(job)).write_text('{"pgid": 999999999}')
    jobs = runner(logs_dir)
    try:
        now = time.time()
        jobs.stop_leftovers()
        assert jobs.retention.poll(now) == 2
        assert not any(path.exists() for path in old)
        assert all(path.exists() for path in (fresh, theirs, left_running, other))
        assert (logs_dir / "c0ffee" / "4.log").is_symlink()
        assert jobs.retention.poll(now + HOUR + 5) == 2
        assert not fresh.exists() and not left_running.exists()
        assert theirs.exists() and other.exists(), "another agent's running job's log"
    finally:
        jobs.logs.close()


def test_an_agent_killed_midway_through_removing_loses_nothing_that_should_stay(tmp_path):
    logs_dir = tmp_path / "logs"
    old = [plant(logs_dir / "c0ffee" / f"{i}.log", 2 * HOUR) for i in range(1, 6)]
    fresh = plant(logs_dir / "c0ffee" / "9.log", 60)
    first = runner(logs_dir)
    first.stop_leftovers()
    assert first.retention.poll(batch=2) == 2  # ... and killed here
    first.logs.close()
    second = runner(logs_dir)
    try:
        second.stop_leftovers()
        assert second.retention.poll() == 3
        assert not any(path.exists() for path in old) and fresh.exists()
    finally:
        second.logs.close()


def test_a_log_written_since_its_job_ended_here_is_not_removed(tmp_path):
    """A later attempt of the job, on another agent sharing the directory, made its log
    anew: it is that agent's to keep."""
    logs_dir = tmp_path / "logs"
    logs = JobLogs(str(logs_dir), "node")
    try:
        retention = LogRetention(logs, "node", HOUR)
        os.close(logs.create("c0ffee", 1))
        ended = time.time() - 10
        retention.ended("c0ffee", 1, ended)
        with open(logs_dir / "c0ffee" / "1.log", "a") as fh:
            fh.write("a later attempt\n")
        assert retention.poll(ended + HOUR + 1) == 0
        assert (logs_dir / "c0ffee" / "1.log").exists()
    finally:
        logs.close()


def test_past_max_bytes_the_oldest_ended_logs_go_first(tmp_path):
    logs_dir = tmp_path / "logs"
    logs = JobLogs(str(logs_dir), "node")
    try:
        retention = LogRetention(logs, "node", HOUR, max_bytes=250)
        now = time.time()
        for job in (1, 2, 3):
            fd = logs.create("c0ffee", job)
            os.write(fd, b"x" * 100)
            os.close(fd)
            retention.ended("c0ffee", job, now + job)
            retention.poll(now + job)
        assert sorted(p.name for p in (logs_dir / "c0ffee").iterdir()) == ["2.log", "3.log"]
        assert retention.bytes == 200
        assert "to keep its ended jobs' logs under job_log_max_bytes (250 bytes), the " \
            "oldest first" in (retention.why_missing("c0ffee", 1) or "")
    finally:
        logs.close()


def test_durations_read_as_words():
    assert [duration(s) for s in (1.5, 90, 3600, 5400, 7 * 86400)] == \
        ["1.5 s", "1.5 minutes", "1 hour", "1.5 hours", "7 days"]
