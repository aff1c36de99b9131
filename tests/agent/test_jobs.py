"""The agent's command jobs (``zres.agent.jobs``) without a broker: what starting and ending
a job costs on disk. Each running job has a record file of its own, so the N-th start (and
any end) reads and writes nothing of the others'; an agent killed outright leaves the
records its next start needs to stop what it left. Jobs are real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import process_gone, wait_until
from zres.agent import jobprocs
from zres.agent.cpus import CoreBinder
from zres.agent.files import JobLogs
from zres.agent.jobprocs import Escapes, group_alive, send, started
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
# What to do as this process opens a path (once): the agent stopped at that instant.
on_open: dict[str, Callable[[], None]] = {}


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if watching and event in _FILE_EVENTS and args:
        watching[-1].append((event, os.fsdecode(args[0]) if isinstance(args[0], (str, bytes))
                             else str(args[0])))
    if on_open and event == "open" and args and isinstance(args[0], str) \
            and (action := on_open.pop(args[0], None)) is not None:
        action()


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
# job's leader exits, else it waits; a sixth: a file it waits for before it forks).
LEADER = """import os, sys, time
while len(sys.argv) > 5 and not os.path.exists(sys.argv[5]):
    time.sleep(0.01)
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


def escaping(pid_file: Path, leave: bool = True, scrub: bool = False,
             go: Path | None = None) -> dict[str, Any]:
    """A job's spec: LEADER starting DAEMON, which writes its pid to PID_FILE (once GO
    exists, if given)."""
    return {"argv": [sys.executable, "-c", LEADER, DAEMON, str(pid_file),
                     "scrub" if scrub else "keep", "leave" if leave else "stay",
                     *([str(go)] if go is not None else [])],
            "env": {}, "cwd": None}


def job_runner(tmp_path: Path, **kwargs: Any) -> tuple[JobRunner, list[Any]]:
    """A job runner of node "node" (cluster "c0ffee", a grace of 0.5 s), and the list its
    reports of ended jobs go to."""
    ended: list[Any] = []
    jobs = JobRunner(JobLogs(str(tmp_path / "logs"), "node"), "node",
                     lambda *report: ended.append(report), grace=0.5, **kwargs)
    jobs.cluster = "c0ffee"
    return jobs, ended


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
    memory = Monitor(made, made is not None, 0)
    jobs, ended = job_runner(tmp_path, memory=memory)
    pid_file = tmp_path / "daemon"
    try:
        # (With its environment scrubbed, a daemon is found by the cgroup alone, so it must
        # be made once the job is in its cgroup: one made before the agent has moved the
        # job there, in its first milliseconds, is outside it, and is not found: README.)
        go = tmp_path / "go"
        jobs.start(1, escaping(pid_file, scrub=made is not None, go=go), [])
        go.touch()
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
    # A look seconds after the last (the agent stopped): how often the ids wrapped round
    # meanwhile is not known (150, 100 could be two wraps): every process is read.
    handed = iter([100, 150, 100])
    escapes = Escapes(Monitor(None, False, 0))
    escapes.started(1)
    monkeypatch.setattr(jobprocs.time, "monotonic", lambda: time.time() + 60)
    assert escapes.made_since([1]) is None


def test_a_signal_goes_only_to_the_process_found():
    """Its id taken by another process since it was found (another start time): that
    one is never signalled."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        begun = started(other.pid)
        assert begun is not None
        send({other.pid: begun + 1}, signal.SIGKILL)  # (the one found started earlier)
        send({other.pid: begun}, signal.SIGTERM)  # (what it dies of says which came)
        assert other.wait(10) == -signal.SIGTERM, "another process was killed"
    finally:
        other.kill()
        other.wait()


def take_id(pid: int) -> subprocess.Popen[bytes]:
    """A process of this user's, in a session of its own, given id PID (free now): where the
    kernel lets this process say which id it hands out next (as root)."""
    for _ in range(20):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                fh.write(str(pid - 1))
        except OSError as exc:
            pytest.skip(f"no process id can be chosen here: {exc.strerror}")
        other = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if other.pid == pid:
            return other
        other.kill()  # (another process forked meanwhile: again)
        other.wait()
    pytest.fail(f"id {pid} could not be taken")


@pytest.mark.parametrize("reused", ["escaped", "group"])
def test_an_id_reused_while_a_job_stops_is_never_signalled(tmp_path, reused):
    """ESCAPED: a cancelled job's process that left its group ends on SIGTERM, its id taken
    by another process before the grace is over. GROUP: a job's leader exits, its group goes,
    and its daemon ignores SIGTERM; the group's number is taken by another session. The
    other process outlives the SIGKILL that ends the job."""
    jobs, ended = job_runner(tmp_path)
    pid_file, other = tmp_path / "daemon", None
    # (ESCAPED: it starts a daemon that ends on SIGTERM, then ignores SIGTERM itself)
    spec = escaping(pid_file) if reused == "group" else {"argv": ["sh", "-c", (
        f"setsid sleep 60 & echo $! > {pid_file}.part; mv {pid_file}.part {pid_file}; "
        "trap '' TERM; while :; do sleep 0.1; done")], "env": {}, "cwd": None}
    try:
        jobs.start(1, spec, [])
        escaped = int(wait_until(lambda: escaped_pid(pid_file), message="the daemon"))
        if reused == "escaped":
            jobs.cancel(1)
            wait_until(lambda: process_gone(escaped), message="the daemon to end on SIGTERM")
            other = take_id(escaped)
        else:
            wait_until(lambda: jobs.jobs[1].proc.poll() is not None, message="the leader")
            jobs.reap()  # (its group has gone: its daemon is told SIGTERM)
            wait_until(Path(f"{pid_file}.term").exists, message="SIGTERM to the daemon")
            other = take_id(jobs.jobs[1].proc.pid)
        wait_until(lambda: (jobs.reap(), ended)[1], message="the job to end")
        assert other.poll() is None, f"another process was killed ({other.returncode})"
        assert reused == "escaped" or process_gone(escaped)  # (ESCAPED: its id is other's)
    finally:
        jobs.stop_all()
        jobs.logs.close()
        kill_escaped(pid_file)
        if other is not None:
            other.kill()
            other.wait()


# A job that counts the SIGTERMs it gets in argv[1], and runs on; with argv[2] "escaped",
# in a child out of its group. The counting process starts two threads, then writes its id
# and theirs to argv[1].ready.
COUNTS = """import os, signal, sys, threading, time
if sys.argv[2] == "escaped" and os.fork():
    while True:
        time.sleep(0.01)
if sys.argv[2] == "escaped":
    os.setsid()
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], "a").write("TERM\\n"))
ids = []
for _ in range(2):
    threading.Thread(target=lambda: ids.append(threading.get_native_id()) or time.sleep(60),
                     daemon=True).start()
while len(ids) < 2:
    time.sleep(0.01)
with open(sys.argv[1] + ".part", "w") as fh:
    fh.write(" ".join(map(str, [os.getpid(), *sorted(ids)])))
os.rename(sys.argv[1] + ".part", sys.argv[1] + ".ready")
while True:
    time.sleep(0.01)
"""


@pytest.mark.parametrize("where", ["in-group", "escaped"])
def test_a_cancelled_jobs_process_gets_one_sigterm(tmp_path, monkeypatch, where):
    """IN-GROUP: the group's SIGTERM reaches it; the walk for what left the group, which
    finds it too (it carries the job's tag), does not tell it again. ESCAPED: the walk, which
    tries its threads' ids too, tells it once. To some programs a second SIGTERM means "stop
    now, skip the clean-up"."""
    monkeypatch.setattr(jobprocs, "_FEW", 1 << 30)  # (every id tried, threads' included)
    jobs, ended = job_runner(tmp_path)
    counted = tmp_path / "terms"
    try:
        jobs.start(1, {"argv": [sys.executable, "-c", COUNTS, str(counted), where],
                       "env": {}, "cwd": None}, [])
        ready = Path(f"{counted}.ready")
        ids = [int(n) for n in wait_until(lambda: ready.exists() and ready.read_text(),
                                          message="the job to start").split()]
        # (the walk reads it, or its thread, once it has heard the first: none is merged)
        read_late = jobs.jobs[1].proc.pid if where == "in-group" else ids[1]
        on_open[f"{procs.PROC}/{read_late}/environ"] = lambda: wait_until(
            counted.exists, message="the first SIGTERM")
        jobs.cancel(1)
        assert not on_open, "the walk did not read it"
        wait_until(lambda: (jobs.reap(), ended)[1], message="the job to end (SIGKILL)")
        assert counted.read_text() == "TERM\n"
    finally:
        on_open.clear()
        jobs.stop_all()
        jobs.logs.close()
        if where == "escaped" and not process_gone(ids[0]):
            os.kill(ids[0], signal.SIGKILL)


# A job whose child leaves its group and waits for SIGUSR1 (its pid in argv[1]); told, it
# starts DAEMON (pid file argv[2]) and exits: a daemon's double fork, at the instant chosen.
FORKS_LATER = """import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
if os.fork() == 0:
    os.setsid()
    with open(sys.argv[1] + ".part", "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    signal.sigwait({signal.SIGUSR1})
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", sys.argv[3], sys.argv[2]])
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    signal.sigtimedwait(set(), 0.01)
"""


def test_a_process_made_as_the_walk_passes_is_found(tmp_path):
    """A job's leader exits; its child, out of its group, forks the daemon and exits just
    as the agent's walk comes to read it (the agent stopped there): the daemon's id is
    newer than any the walk was to read. The ids handed out during the walk are read
    after it: the job is not reported ended while the daemon runs."""
    jobs, ended = job_runner(tmp_path)
    child_file, pid_file = tmp_path / "child", tmp_path / "daemon"
    try:
        jobs.start(1, {"argv": [sys.executable, "-c", FORKS_LATER, str(child_file),
                                str(pid_file), DAEMON], "env": {}, "cwd": None}, [])
        child = int(wait_until(lambda: escaped_pid(child_file), message="the child"))
        wait_until(lambda: jobs.jobs[1].proc.poll() is not None, message="the leader")

        def fork_now() -> None:
            os.kill(child, signal.SIGUSR1)
            wait_until(lambda: escaped_pid(pid_file), message="the daemon")
            wait_until(lambda: process_gone(child), message="the child to exit")
        on_open[f"{procs.PROC}/{child}/environ"] = fork_now
        jobs.reap()
        assert not on_open, "the walk did not read the child"
        escaped = int(pid_file.read_text())
        assert ended == [] and not process_gone(escaped), "ended while its daemon ran"
        wait_until(lambda: (jobs.reap(), ended)[1], message="the job to end")
        assert process_gone(escaped)
    finally:
        on_open.clear()
        jobs.stop_all()
        jobs.logs.close()
        kill_escaped(pid_file)


@pytest.mark.parametrize("how", ["cancel", "stop_all"])
def test_what_left_a_jobs_group_is_stopped_with_the_job(tmp_path, how):
    """Cancelled (SIGTERM, SIGKILL after the grace), or its agent stopping (SIGKILL): the
    daemon a running job started goes with it."""
    jobs, ended = job_runner(tmp_path)
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
