"""The agent's command jobs (``zres.agent.jobs``) without a broker: what starting and ending
a job costs on disk. Each running job has a record file of its own, so the N-th start (and
any end) reads and writes nothing of the others'; an agent killed outright leaves the
records its next start needs to stop what it left. Jobs are real processes."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import process_gone, wait_until
from zres.agent.cpus import CoreBinder
from zres.agent.files import JobLogs
from zres.agent.jobprocs import Escapes, group_alive
from zres.agent.jobs import JobRunner
from zres.agent.memory import cgroups, procs
from zres.agent.memory.cgroups import Cgroups
from zres.agent.memory.monitor import Monitor
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(60)

# File-system events (Python's audit hooks) seen while ``watching`` holds a list: a hook
# cannot be removed, so one is added for the whole module and records only when asked.
_FILE_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir"}
watching: list[list[tuple[str, str]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if watching and event in _FILE_EVENTS and args:
        watching[-1].append((event, os.fsdecode(args[0]) if isinstance(args[0], (str, bytes))
                             else str(args[0])))


sys.addaudithook(_hook)


def touched(action: Any) -> list[tuple[str, str]]:
    """Run ACTION(); return the file-system events it caused (event, name)."""
    watching.append([])
    try:
        action()
    finally:
        seen = watching.pop()
    return seen


def records(logs_dir: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under LOGS_DIR that is not a job's log: path -> (inode, mtime, bytes)."""
    found = {}
    for path in logs_dir.rglob("*"):
        if path.is_file() and path.suffix != ".log":
            st = path.stat()
            found[str(path.relative_to(logs_dir))] = (st.st_ino, st.st_mtime_ns,
                                                      path.read_bytes())
    return found


def runner(logs_dir: Path, ended: list[Any]) -> JobRunner:
    jobs = JobRunner(JobLogs(str(logs_dir), "node"), "node",
                     lambda *report: ended.append(report))
    jobs.cluster = "c0ffee"
    return jobs


def test_starting_the_nth_job_reads_and_writes_nothing_of_the_others(tmp_path):
    logs_dir = tmp_path / "logs"
    ended: list[Any] = []
    jobs = runner(logs_dir, ended)
    spec = {"argv": ["sleep", "60"], "env": {}, "cwd": None}
    try:
        for job_id in range(1, 31):
            jobs.start(job_id, spec, [])
        before = records(logs_dir)
        seen = touched(lambda: jobs.start(31, spec, []))
        after = records(logs_dir)
        assert {k: v for k, v in after.items() if k in before} == before, \
            "starting a job rewrote the others' records"
        assert len(before) == 30 and len(after) == 31  # one record per running job
        others = {str(i) for i in range(1, 31)} | {f"{i}.log" for i in range(1, 31)}
        # (and the new job's own oom_score_adj: the kernel picks it before the agent; and
        # the last process id handed out: those after it are the job's, should one leave
        # its group)
        oom = f"/proc/{jobs.jobs[31].proc.pid}/oom_score_adj"
        assert {"31", "31.log"} <= {name for _, name in seen} <= \
            {"31", "31.log", "c0ffee", os.devnull, oom, "/proc/sys/kernel/ns_last_pid"}, seen
        assert not {name for _, name in seen} & others
        assert not any("running" in name or event in ("os.listdir", "os.scandir", "os.rename")
                       for event, name in seen), seen
        # Ending one: only its own record goes (/proc is walked, for what left its group).
        os.kill(jobs.jobs[7].proc.pid, signal.SIGKILL)
        seen = touched(lambda: wait_until(lambda: (jobs.reap(), ended)[1],
                                          message="job 7 to be reaped"))
        assert [report[0] for report in ended] == [7]
        assert {k: v for k, v in records(logs_dir).items()} == \
            {k: v for k, v in after.items() if not k.endswith("/7")}
        assert not any(name in {str(i) for i in range(1, 32) if i != 7} or "running" in name
                       or event in ("os.listdir", "os.scandir", "os.rename") and name != "/proc"
                       for event, name in seen), seen
    finally:
        jobs.stop_all()
        jobs.logs.close()
    assert records(logs_dir) == {}, "a stopped agent leaves no record of running jobs"


def test_records_are_private_and_a_killed_agents_jobs_are_stopped_by_the_next(tmp_path):
    logs_dir = tmp_path / "logs"
    first = runner(logs_dir, [])
    spec = {"argv": ["sleep", "60"], "env": {}, "cwd": None}
    for job_id in (3, 4):
        first.start(job_id, spec, [])
    first.start(5, escaping(tmp_path / "escaped", leave=False), [])  # (and what left job 5)
    escaped = int(wait_until(lambda: escaped_pid(tmp_path / "escaped"), message="escape"))
    pids = [job.proc.pid for job in first.jobs.values()] + [escaped]
    record_dir = logs_dir / "running-node"
    assert sorted(p.name for p in record_dir.iterdir()) == ["3", "4", "5"]
    assert [oct(p.stat().st_mode & 0o777) for p in (record_dir, record_dir / "3")] == \
        ["0o700", "0o600"]
    # Killed outright: nothing of the first runner is stopped or cleaned; the next one of
    # this name finds the records (a malformed one, and a link, are dropped unread).
    first.logs.close()
    (record_dir / "junk").write_text("not json")
    (record_dir / "9").symlink_to(tmp_path / "elsewhere")
    second = runner(logs_dir, [])
    try:
        assert second.stop_leftovers() == 3
        assert process_gone(escaped), "what left a job's group outlived the agent's restart"
        for proc in [job.proc for job in first.jobs.values()]:
            proc.wait(10)  # (they are this test's children: reaped here)
        assert all(process_gone(pid) for pid in pids)
        assert list(record_dir.iterdir()) == []
    finally:
        second.logs.close()
        kill_escaped(tmp_path / "escaped")


# A daemon: writes its pid to argv[1] (and ARGV[1].term on each SIGTERM, which it ignores).
DAEMON = """import os, signal, sys, time
path = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(path + ".term", "w").close())
with open(path + ".part", "w") as fh:
    fh.write(str(os.getpid()))
os.rename(path + ".part", path)
while True:
    time.sleep(60)
"""
# A job that starts DAEMON as daemons start: a double fork, the first child calling setsid()
# (argv: DAEMON, its pid file; "scrub": the daemon's environment is empty; "leave": then the
# job's leader exits, else it waits).
LEADER = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        env = {} if sys.argv[3] == "scrub" else dict(os.environ)
        os.execve(sys.executable, [sys.executable, "-c", sys.argv[1], sys.argv[2]], env)
    os._exit(0)
os.wait()
while sys.argv[4] != "leave":
    time.sleep(60)
"""


def escaping(pid_file: Path, leave: bool = True, scrub: bool = False) -> dict[str, Any]:
    """A job's spec: LEADER starting DAEMON, which writes its pid to PID_FILE."""
    return {"argv": [sys.executable, "-c", LEADER, DAEMON, str(pid_file),
                     "scrub" if scrub else "keep", "leave" if leave else "stay"],
            "env": {}, "cwd": None}


def escaped_pid(pid_file: Path) -> int | None:
    return int(pid_file.read_text()) if pid_file.exists() else None


def kill_escaped(pid_file: Path) -> None:
    """Kill the daemon a test's job started, if the agent's code did not (it failed)."""
    if (pid := escaped_pid(pid_file)) is not None and not process_gone(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("found_by", ["walk", "walk-every-process", "cgroup"])
def test_a_job_ends_only_once_what_left_its_group_has_been_stopped(tmp_path, monkeypatch,
                                                                   found_by):
    """Its leader exits, leaving a daemon (out of its group and session) that ignores
    SIGTERM: the job is not reported ended while it runs; it gets SIGTERM, then SIGKILL
    once the grace is over, and only then does the job end. The walk reads the processes
    made since the job started (every process, where the kernel does not say which those
    are); where the job has a cgroup, the cgroup finds the daemon even with its environment
    (and so its tag) gone."""
    made = None
    if found_by == "walk-every-process":
        monkeypatch.setattr(procs, "last_pid", lambda: None)
    if found_by == "cgroup":
        made, why = cgroups.detect(f"test-{uuid.uuid4().hex[:8]}", move=False)
        if made is None:
            pytest.skip(f"no cgroup can be made here: {why}")
    ended: list[Any] = []
    memory = Monitor(made, made is not None, 0)
    jobs = JobRunner(JobLogs(str(tmp_path / "logs"), "node"), "node",
                     lambda *report: ended.append(report), grace=0.5, memory=memory)
    jobs.cluster = "c0ffee"
    pid_file = tmp_path / "daemon"
    try:
        jobs.start(1, escaping(pid_file, scrub=made is not None), [])
        escaped = int(wait_until(lambda: escaped_pid(pid_file), message="the daemon"))
        wait_until(lambda: jobs.jobs[1].proc.poll() is not None, message="the leader to exit")
        jobs.reap()  # (SIGKILL comes from a reap only: the daemon outlives this one)
        assert ended == [] and not process_gone(escaped), "ended while its daemon ran"
        wait_until(Path(f"{pid_file}.term").exists, message="SIGTERM to the daemon")

        def reaped() -> list[Any]:
            jobs.reap()
            assert not ended or process_gone(escaped), "ended while its daemon ran"
            return ended
        wait_until(reaped, message="the job to end")
        assert [report[:2] for report in ended] == [(1, "ok")]
    finally:
        jobs.stop_all()
        jobs.logs.close()
        memory.close()
        if made is not None:
            made.close()
        kill_escaped(pid_file)


def test_the_ids_made_since_a_job_started_are_followed_as_they_wrap_round(monkeypatch):
    """The kernel hands out process ids in turn, from the lowest free one again past
    pid_max: a job's candidates are the ids after the last one when it started, wrapping
    round once; past that, every process is."""
    handed = iter([100, 150, 200, 40, 60, 160])  # (the last id, as the agent looks)
    monkeypatch.setattr(procs, "last_pid", lambda: next(handed))
    escapes = Escapes(Monitor(None, False, 0))  # 100
    escapes.started(1)  # 150
    assert escapes.made_since([1]) == (150, 200)
    escapes.tick()  # 40: wrapped round
    assert escapes.made_since([1]) == (150, 60)
    assert escapes.made_since([1]) is None  # 160: past where it started, once round


@pytest.mark.parametrize("how", ["cancel", "stop_all"])
def test_what_left_a_jobs_group_is_stopped_with_the_job(tmp_path, how):
    """Cancelled (SIGTERM, SIGKILL after the grace), or its agent stopping (SIGKILL): the
    daemon a running job started goes with it."""
    ended: list[Any] = []
    jobs = JobRunner(JobLogs(str(tmp_path / "logs"), "node"), "node",
                     lambda *report: ended.append(report), grace=0.5)
    jobs.cluster = "c0ffee"
    pid_file = tmp_path / "daemon"
    try:
        jobs.start(1, escaping(pid_file, leave=False), [])
        escaped = int(wait_until(lambda: escaped_pid(pid_file), message="the daemon"))
        if how == "cancel":
            jobs.cancel(1)
            wait_until(Path(f"{pid_file}.term").exists, message="SIGTERM to the daemon")
            wait_until(lambda: (jobs.reap(), ended)[1], message="the job to end")
            assert ended[0][3].get("type") == "CancelledError"
            assert process_gone(escaped), "cancelled, and reported so, while its daemon ran"
        else:
            jobs.stop_all()
            wait_until(lambda: process_gone(escaped), timeout=5, message="the daemon to go")
    finally:
        jobs.stop_all()
        jobs.logs.close()
        kill_escaped(pid_file)


class WatchedLate(Monitor):
    """The agent's memory monitor, watching a job only once the job has written WRITTEN:
    whatever the agent does to it after its start comes after what it started at once."""

    def __init__(self, written: Path, cgroups: Cgroups | None = None) -> None:
        super().__init__(cgroups, cgroups is not None, 0)
        self.written = written

    def watch(self, unit_id: int, pid: int, limit: int | None, started: bool = False) -> None:
        wait_until(self.written.exists, message="the job to write")
        super().watch(unit_id, pid, limit, **({"started": True} if started else {}))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="one core here: a job bound to it sees what an unbound one does")
def test_a_job_bound_to_cores_is_born_on_them(tmp_path):
    counted = tmp_path / "nproc"
    everything = os.sched_getaffinity(0)
    jobs = JobRunner(JobLogs(str(tmp_path / "logs"), "node"), "node", lambda *report: None,
                     memory=WatchedLate(counted), cpus=CoreBinder(1))
    jobs.cluster = "c0ffee"
    try:
        # (`nproc` runs at once: binding the job after its start came too late for it)
        jobs.start(1, {"argv": ["sh", "-c", f"nproc > {counted}.part; mv {counted}.part "
                                f"{counted}"], "env": {}, "cwd": None}, [],
                   place=(0, [], {"CPU": UNIT}))
        assert counted.read_text().strip() == "1"
        assert os.sched_getaffinity(0) == everything, "the agent's own thread stays unbound"
    finally:
        jobs.stop_all()
        jobs.logs.close()


@pytest.mark.parametrize("told", [True, False], ids=["last-pid-told", "not-told"])
def test_what_a_job_started_before_its_cgroup_was_made_is_moved_into_it(tmp_path,
                                                                        monkeypatch, told):
    """Its shell's child, and what that child started while the agent was moving it (after
    the agent looked: it was still outside then), are moved into the job's cgroup; every
    process on the node is read once for it, where the kernel says which process ids it
    handed out last (else as often as the agent looks)."""
    made, why = cgroups.detect(f"test-{uuid.uuid4().hex[:8]}", move=False)
    if made is None:
        pytest.skip(f"no cgroup with a memory limit can be made here: {why}")
    child, grandchild = tmp_path / "child", tmp_path / "grandchild"
    script = tmp_path / "child.sh"
    script.write_text(f"trap 'sleep 60 & echo $! > {grandchild}.part; mv {grandchild}.part "
                      f"{grandchild}' USR1\necho $$ > {child}.part; mv {child}.part {child}\n"
                      "while :; do sleep 60 & wait $!; done\n")
    enter, table, reads = Cgroups.enter, procs.table, []

    def entering(self: Cgroups, path: str, pid: int) -> None:
        if pid == int(child.read_text()) and not grandchild.exists():
            os.kill(pid, signal.SIGUSR1)  # (it starts one more before it is moved)
            wait_until(grandchild.exists, message="the job's child to start another")
        enter(self, path, pid)

    monkeypatch.setattr(Cgroups, "enter", entering)
    monkeypatch.setattr(procs, "table", lambda: reads.append(1) or table())
    if not told:
        monkeypatch.setattr(procs, "last_pid", lambda: None)
    elif procs.last_pid() is None:
        pytest.skip("this kernel does not say which process id it handed out last")
    memory = WatchedLate(child, made)
    jobs = JobRunner(JobLogs(str(tmp_path / "logs"), "node"), "node", lambda *report: None,
                     memory=memory)
    jobs.cluster = "c0ffee"
    try:
        # (its shell forks at once: the agent moves the job into its cgroup after that)
        jobs.start(1, {"argv": ["sh", "-c", f"sh {script} & wait"], "env": {}, "cwd": None},
                   [], place=(0, [], {"MEMORY": 100_000_000 * UNIT}))
        inside = made.pids(os.path.join(made.base, "t-1"))
        assert {jobs.jobs[1].proc.pid, int(child.read_text()),
                int(grandchild.read_text())} <= set(inside), inside
        if told:
            assert len(reads) == 1, f"every process was read {len(reads)} times for a start"
    finally:
        jobs.stop_all()
        jobs.logs.close()
        memory.close()
        made.close()


def test_a_group_whose_processes_have_all_ended_is_gone_though_one_is_not_reaped():
    """A process that has ended is a zombie until its parent reaps it: an orphan's parent
    is init, which may take seconds, or an agent that is its container's PID 1, which
    never does. It holds nothing: its group, all ended, is gone (its job ends)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a group of its own, left once the pipe closes; reaped by nobody yet
        os.close(write)
        os.setpgid(0, 0)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        wait_until(lambda: os.getpgid(pid) == pid, message="the group to be made")
        assert group_alive(pid)
        os.close(write)
        wait_until(lambda: process_gone(pid), message="the process to end")
        assert not group_alive(pid), "a group of one zombie taken for alive"
    finally:
        os.kill(pid, signal.SIGKILL)  # (were it still reading)
        os.waitpid(pid, 0)
