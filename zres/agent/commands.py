"""Command jobs: shell commands queued with resources, run by a worker as a task.

A command job is an ordinary task whose function is ``run_command``: it waits for its
resources like any task, then its worker (started with CUDA_VISIBLE_DEVICES set to the
granted devices) runs the command in a process group of its own, with its output in a
log file on the agent (``$ZRES_JOB_LOGS/<job id>.log``) that outlives the job. The exit
code goes to the broker in the task's report, so ``zres jobs`` shows it without unpickling
anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.context import get_task_context
from ..core.errors import CommandFailed

GRACE = 5.0          # seconds between SIGTERM and SIGKILL when a job is cancelled
_TAIL_LINES = 20

_running: dict[int, subprocess.Popen[bytes]] = {}
_cancelled: dict[int, tuple[float, threading.Timer]] = {}  # job id -> SIGKILL deadline, timer
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a finished command job left: its id, exit code, where its log is."""

    job_id: int
    exit_code: int
    log: str
    agent: str


def default_log_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"zres-jobs-{os.getuid()}")


def log_path(log_dir: str, job_id: int) -> str:
    return os.path.join(log_dir, f"{int(job_id)}.log")


def run_command(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> CommandResult:
    """Run ARGV as this task's job; raise CommandFailed on a non-zero exit."""
    ctx = get_task_context()
    log_dir = os.environ.get("ZRES_JOB_LOGS") or default_log_dir()
    os.makedirs(log_dir, exist_ok=True)
    path = log_path(log_dir, ctx.task_id)
    gpus = ",".join(ctx.gpu_ids)
    full_env = {**os.environ, **env, "ZRES_JOB_ID": str(ctx.task_id), "ZRES_GPU_IDS": gpus,
                "CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    ctx.report["log"] = path
    with open(path, "wb") as log:
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=full_env, cwd=cwd,
                                    start_new_session=True)  # its own process group
        except OSError as exc:
            # Popen names the missing thing: the program, or the working directory.
            where = f": {exc.filename}" if exc.filename not in (None, argv[0]) else ""
            why = f"cannot start {argv[0]!r}: {exc.strerror or exc}{where}"
            log.write(f"zres: {why}\n".encode())
            ctx.report["error"] = why
            raise CommandFailed(f"job {ctx.task_id}: {why}", None, path, "") from None
        with _lock:
            _running[ctx.task_id] = proc
        try:
            code = proc.wait()
        finally:
            with _lock:
                _running.pop(ctx.task_id, None)
                cancelled = _cancelled.pop(ctx.task_id, None)
        if cancelled is not None:
            # Its resources come back when this returns: not before the whole tree is gone.
            _await_group(proc, *cancelled)
    ctx.report["exit_code"] = code
    if code != 0:
        tail = _tail(path)
        how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        raise CommandFailed(f"job {ctx.task_id} ({' '.join(argv)}) {how}; the log's last "
                            f"lines:\n{tail}", code, path, tail)
    return CommandResult(ctx.task_id, code, path, ctx.agent)


def grace_period() -> float:
    """Return the seconds between SIGTERM and SIGKILL: $ZRES_JOB_GRACE (set by the agent)."""
    try:
        grace = float(os.environ.get("ZRES_JOB_GRACE", GRACE))
    except ValueError:
        return GRACE
    return grace if grace >= 0 else GRACE


def terminate(job_id: int, grace: float | None = None) -> bool:
    """SIGTERM JOB_ID's process group, then SIGKILL it after GRACE seconds if still there."""
    grace = grace_period() if grace is None else grace
    with _lock:
        proc = _running.get(job_id)
        if proc is None or job_id in _cancelled:
            return False
        # The timer is for a leader that ignores SIGTERM (run_command waits for it).
        timer = threading.Timer(grace, _kill_if_alive, (proc,))
        timer.daemon = True
        _cancelled[job_id] = (time.monotonic() + grace, timer)
    _signal_group(proc, signal.SIGTERM)
    timer.start()
    return True


def terminate_all() -> None:
    """SIGKILL every running job's process group (the worker is going away)."""
    with _lock:
        procs = list(_running.values())
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)


def _kill_if_alive(proc: subprocess.Popen[bytes]) -> None:
    # Even when the leader has exited, children it left in the group are killed.
    _signal_group(proc, signal.SIGKILL)


def _await_group(proc: subprocess.Popen[bytes], deadline: float,
                 timer: threading.Timer) -> None:
    """Wait until PROC's group is empty; SIGKILL what is left of it at DEADLINE."""
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.02)
    timer.cancel()
    if _group_alive(proc.pid):  # (an empty group's number may be reused: leave it be)
        _signal_group(proc, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, though not ours to signal
    return True


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, lines: int = _TAIL_LINES, limit: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - limit))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def read_log(log_dir: str, job_id: int, offset: int, limit: int = 256 * 1024) -> bytes:
    """Return up to LIMIT bytes of JOB_ID's log from OFFSET; FileNotFoundError if none."""
    with open(log_path(log_dir, job_id), "rb") as fh:
        fh.seek(offset)
        return fh.read(limit)
