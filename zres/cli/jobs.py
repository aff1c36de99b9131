"""``zres submit / jobs / logs / cancel / wait / run-queue``: command jobs from a shell.

    zres submit -r "GPU=1" --name aaa -- python train.py --lr 0.1   # prints the job id
    zres submit --shell 'python train.py | tee out.txt'               # run by /bin/sh -c
    zres jobs [--all] [--json]
    zres submit --nodes 2 -r "GPU=8" -- torchrun ...                 # one rank per agent
    zres logs JOB [--follow] [--rank K]
    zres cancel JOB
    zres wait [JOB ...]            # exit status 1 if any did not succeed, naming it
    zres run-queue --once          # wait for every queued job
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from ..core import protocol as P
from ..core.address import Unanswered, Unreachable
from ..core.errors import ZresError
from ..core.report import entry_in_user_units
from ..core.resources import format_bytes, format_units, parse_spec, units_to_float
from .options import BROKER_ORDER, broker_address, request, seconds

_FINAL = {"done", "failed", "cancelled", "lost", "infeasible", "unknown"}
_POLL = 0.2  # seconds between looks at the job table while following (or waiting, where
#              the broker does not hold a wait)
_HOLD = 5.0  # seconds the broker is asked to hold a wait for jobs' ends, at most


def add_parsers(sub: Any) -> None:
    """Add the job commands to the zres command line."""
    submit = sub.add_parser("submit", help="queue a shell command as a job")
    submit.add_argument("--resources", "-r", default="",
                        help='what it needs, e.g. "GPU=1" or "gpu0=1 gpu1=1"')
    submit.add_argument("--name", help="a name shown by zres jobs")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                        help="set an environment variable for the job (repeatable)")
    submit.add_argument("--export", default="ALL", metavar="ALL|NONE|VAR,VAR=VAL",
                        help="what of this environment the job gets, as for sbatch: ALL "
                        "(default: all of it, but zres's own ZRES_* variables), NONE (only "
                        "the agent's and --env), or these variables (ALL,... adds them to "
                        "all)")
    submit.add_argument("--cwd", help="the job's working directory on the agent (default: "
                        "this directory, as for sbatch; a relative one is taken from here)")
    submit.add_argument("--priority", type=int, default=0,
                        help="higher starts first; equal ones in the order queued "
                        "(default 0)")
    submit.add_argument("--nodes", "-N", type=int, default=1, metavar="N",
                        help="run the command once on each of N distinct agents, all started "
                        "together once all fit (a multi-node job: each copy gets its "
                        "NODE_RANK, NNODES and MASTER_ADDR/PORT; default 1)")
    submit.add_argument("--retries", type=int, default=0,
                        help="run again elsewhere if its agent is lost (default 0)")
    submit.add_argument("--infeasible", choices=["warn", "error"], default="warn",
                        help="error: refuse a job no agent could ever run")
    submit.add_argument("--shell", metavar="'COMMAND LINE'", help="run this command line "
                        "with /bin/sh -c (pipes, &&, $VAR), instead of -- COMMAND ARGS...")
    submit.add_argument("--file", help="queue one job per line of this file ('-': stdin), "
                        "each run by /bin/sh -c with these options (blank lines and lines "
                        "starting with # skipped); prints one id per line")
    submit.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="-- then the command and its arguments, executed as given (no "
                        "shell)")
    _broker_option(submit)

    jobs = sub.add_parser("jobs", help="list queued and running jobs (ended ones say why in "
                          "REASON)")
    jobs.add_argument("--all", action="store_true", help="finished jobs too")
    jobs.add_argument("--json", action="store_true", help="the table as JSON, for scripts "
                      "(resources in user units)")
    _broker_option(jobs)

    logs = sub.add_parser("logs", help="print a job's output")
    logs.add_argument("job", type=int, help="the job's id (zres submit printed it)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    logs.add_argument("--rank", type=int, metavar="K", help="a multi-node job: only rank K's "
                      "output (default: every rank's, each line prefixed [rank K])")
    _broker_option(logs)

    cancel = sub.add_parser("cancel", help="stop a job (SIGTERM, then SIGKILL), or a task "
                            "(--task)")
    cancel.add_argument("job", type=int, nargs="*", help="the ids of the jobs to stop")
    cancel.add_argument("--task", type=int, action="append", default=[], metavar="ID",
                        help="stop the task of this id (zres status and a future's repr "
                        "show it) wherever it is, as a forced cancel does; repeatable")
    _broker_option(cancel)

    wait = sub.add_parser("wait", help="block until jobs finish; exit 1 if any did not "
                          "succeed, naming it")
    wait.add_argument("job", type=int, nargs="*", help="default: every job no wait has "
                      "reported yet (queued, running, or ended since the last wait)")
    wait.add_argument("--timeout", type=seconds, help="give up after this many seconds")
    _broker_option(wait)

    queue = sub.add_parser("run-queue", help="watch the queue, printing each job's changes "
                           "from now on; --once returns when it is empty")
    queue.add_argument("--once", action="store_true", help="wait for the jobs queued or "
                       "running now, then exit (1 if any did not succeed)")
    _broker_option(queue)


def _broker_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", help=BROKER_ORDER)


def _request(args: argparse.Namespace, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return request(broker_address(args.broker), kind, body, 10.0)


def _patient(args: argparse.Namespace, kind: str, body: dict[str, Any],
             timeout: float = 10.0, deadline: float | None = None) -> dict[str, Any]:
    """The broker's answer to a request of a command that follows jobs (logs --follow,
    wait, run-queue) and has been answered before: a broker away (restarting: its address
    refusing connections, or silent) is waited for, as a client waits (its
    ``broker_timeout``, 5 minutes; DEADLINE, a monotonic time, if sooner), saying so once
    on stderr, not taken for an error."""
    address, since = broker_address(args.broker), None
    while True:
        try:
            return request(address, kind, body, timeout)
        except (Unreachable, Unanswered) as exc:
            from .. import config
            limit = float(config.load("client")["broker_timeout"])
            if since is None:
                since = time.monotonic()
                print(f"zres {args.command}: {exc}; waiting up to {limit:g}s for it to come "
                      "back", file=sys.stderr, flush=True)
            if time.monotonic() - since >= limit or \
                    deadline is not None and time.monotonic() >= deadline:
                raise
            time.sleep(_POLL)


def submit(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    given = [what for what, there in (("-- COMMAND", command), ("--shell", args.shell),
                                      ("--file", args.file)) if there]
    if len(given) > 1:
        raise ValueError(f"give one of -- COMMAND, --shell and --file, not {' and '.join(given)}")
    # An argv is executed as is; a command line (--shell, a --file line) by /bin/sh -c.
    commands: list[list[str] | str] = [command] if command else []
    if args.shell is not None:
        if not args.shell.strip():
            raise ValueError("--shell '': an empty command line")
        commands = [args.shell]
    elif args.file:
        commands = list(_read_commands(args.file))
    if not commands:
        raise ValueError("no command given: zres submit [options] -- COMMAND [ARGS...] (or "
                         "--shell 'COMMAND LINE', or --file FILE)")
    resources = parse_spec(args.resources) if args.resources.strip() else {}
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    # `zres submit -- python train.py` runs train.py from here, as typed.
    cwd = os.path.abspath(args.cwd or os.getcwd())
    # Made once: every job of a --file shares it (sent and kept once by the broker).
    from ..client.job_methods import exported_env
    export = exported_env(args.export)
    from ..client.client import Client
    from ..client.io import InfeasibleWarning
    with Client(broker_address(args.broker), connect_timeout=10.0) as client, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", InfeasibleWarning)  # said below, without a traceback
        futures = [client.submit_command(argv, shell=isinstance(argv, str),
                                         resources=units_to_float(resources), env=env,
                                         export=export, cwd=cwd, name=args.name,
                                         retries=args.retries, priority=args.priority,
                                         infeasible=args.infeasible, detached=True,
                                         nodes=args.nodes)
                   for argv in commands]
        ids = client.job_ids(futures)
        # One that was never sent (over a limit of the broker's) says why.
        unsent = [f for f in futures if f.done() and f.exception() is not None]
        table = _request(args, P.JOBS, {"jobs": [i for i in ids if i is not None]})["jobs"]
    refused = [j for j in table if j["state"] == "infeasible" and j.get("error")]
    if refused:  # --infeasible error refused them (all alike: same resources)
        raise ZresError(f"refused: {refused[0]['error']}")
    for job in table:
        print(job["id"])
        if job["state"] == "infeasible":
            print(f"zres submit: job {job['id']} is queued, but no agent can run it now: "
                  f"{job.get('reason')}", file=sys.stderr)
    if unsent:
        raise ZresError(f"{len(unsent)} of {len(futures)} job(s) not queued: "
                        f"{unsent[0].exception()}")
    return 0


def _read_commands(path: str) -> Iterator[str]:
    """The command lines of file PATH: one per line, skipping blank ones and comments
    (lines starting with #). A line whose quotes do not close is refused here, naming it,
    rather than failing later on an agent."""
    text = sys.stdin.read() if path == "-" else open(path).read()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            shlex.split(line, comments=True)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}: {line!r}") from None
        yield line


def jobs(args: argparse.Namespace) -> int:
    table = _request(args, P.JOBS, {"all": args.all})["jobs"]
    if args.json:
        print(json.dumps([entry_in_user_units(job) for job in table], indent=1))
    else:
        print(render_jobs(table))
    return 0


def render_jobs(table: list[dict[str, Any]], now: float | None = None) -> str:
    """Format the job table for people: ended jobs say why in REASON (their error, for
    their owner; words that quote nothing of them for others), waiting ones below it."""
    now = now or time.time()
    rows = [("ID", "NAME", "OWNER", "STATE", "RESOURCES", "AGENT", "GPUS", "START", "DURATION",
             "EXIT", "PEAK", "REASON")]  # PEAK: memory, at most (issue 30)
    for job in table:
        started, finished = job.get("started"), job.get("finished")
        duration = ((finished or now) - started) if started else None
        exit_code = job.get("exit_code")
        rows.append((str(job["id"]), job.get("name", ""), job.get("owner") or "-", job["state"],
                     format_units(job.get("units", {})) or "-",
                     ",".join(a for a in job.get("agents") or [job.get("agent")] if a) or "-",
                     ",".join(job.get("gpus", [])) or "-",
                     time.strftime("%H:%M:%S", time.localtime(started)) if started else "-",
                     f"{duration:.1f}s" if duration is not None else "-",
                     "-" if exit_code is None else str(exit_code),
                     format_bytes(job["peak_memory"]) if job.get("peak_memory") else "-",
                     _one_line(job.get("reason") or "") if finished else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for job in table:
        # (An ended job refused as infeasible keeps that state: its reason is in REASON.)
        if job.get("reason") and job["state"] in ("queued", "infeasible") \
                and not job.get("finished"):
            lines.append(f"  job {job['id']} waits: {job['reason']}")
    return "\n".join(lines)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def logs(args: argparse.Namespace) -> int:
    """Print a job's log (a job that ended without starting has none: why is said on
    stderr, exit status 1); a multi-node job's ranks' logs, interleaved line by line as
    they come, each line prefixed ``[rank K]`` (``--rank K``: that rank's alone)."""
    offset = 0
    body: dict[str, Any] = {"job": args.job}
    if args.rank is not None:
        body["rank"] = args.rank
    answered = False
    while True:
        body["offset"] = offset
        reply = _patient(args, P.LOGS, body) if answered else _request(args, P.LOGS, body)
        answered = args.follow  # (from now on, a broker restarting is waited for)
        if "error" in reply and args.follow and reply.get("away") and \
                not reply.get("finished"):  # (its agent reconnecting: it has the log)
            time.sleep(_POLL)
            continue
        if "error" in reply:
            raise ZresError(reply["error"])
        if reply.get("nodes", 1) > 1 and args.rank is None:
            return _rank_logs(args, reply["nodes"])
        data = reply.get("data", b"")
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            offset += len(data)
            continue
        if not args.follow or reply.get("finished") or reply.get("state") in _FINAL:
            if not offset and reply.get("state") in ("queued", "infeasible"):
                print(f"zres logs: job {args.job} has not started: {reply['state']}"
                      + (f": {reply['reason']}" if reply.get("reason") else ""),
                      file=sys.stderr)
            return 0
        time.sleep(_POLL)


def _rank_logs(args: argparse.Namespace, nodes: int) -> int:
    """Print every rank's log of a multi-node job, whole lines each prefixed [rank K]."""
    offsets, partial = [0] * nodes, [b""] * nodes
    while True:
        got, ended = False, True
        for rank in range(nodes):
            ask = _patient if args.follow else _request
            reply = ask(args, P.LOGS, {"job": args.job, "rank": rank, "offset": offsets[rank]})
            if "error" in reply and args.follow and reply.get("away") and \
                    not reply.get("finished"):
                ended = False
                continue  # (its agent reconnecting: asked again next round)
            if "error" in reply:
                raise ZresError(reply["error"])
            data = reply.get("data", b"")
            offsets[rank] += len(data)
            got = got or bool(data)
            ended = ended and bool(reply.get("finished") or reply.get("state") in _FINAL)
            *lines, partial[rank] = (partial[rank] + data).split(b"\n")
            for line in lines:
                sys.stdout.buffer.write(b"[rank %d] %s\n" % (rank, line))
        sys.stdout.flush()
        if got:
            continue  # (more may be there now)
        if not args.follow or ended:
            for rank, rest in enumerate(partial):
                if rest:
                    sys.stdout.buffer.write(b"[rank %d] %s\n" % (rank, rest))
            sys.stdout.flush()
            return 0
        time.sleep(_POLL)


def cancel(args: argparse.Namespace) -> int:
    if not args.job and not args.task:
        raise ValueError("nothing to cancel: zres cancel JOB... or zres cancel --task ID")
    failed = 0
    for task_id in args.task:
        reply = _request(args, P.TASK_CANCEL, {"task": task_id})
        if "error" in reply:
            print(f"zres cancel: {reply['error']}", file=sys.stderr)
            failed = 1
        else:
            print(f"{reply.get('state', 'cancelled')} task {task_id} ({reply.get('name')})")
    for job_id in args.job:
        reply = _request(args, P.JOB_CANCEL, {"job": job_id})
        if "error" in reply:
            print(f"zres cancel: {reply['error']}", file=sys.stderr)
            failed = 1
        else:
            print(f"cancelled {job_id}")
    return failed


def wait(args: argparse.Namespace) -> int:
    """Wait for the given jobs, or for every job no wait has reported yet (like a shell's
    wait for its children, finished ones included); report any that did not succeed."""
    wanted = list(args.job) or [j["id"] for j in
                                _request(args, P.JOBS, {"unreported": True})["jobs"]]
    return _wait_for(args, wanted, args.timeout)


def run_queue(args: argparse.Namespace) -> int:
    if args.once:
        wanted = [j["id"] for j in _request(args, P.JOBS, {})["jobs"]]
        print(f"waiting for {len(wanted)} job(s): {' '.join(map(str, wanted))}", flush=True)
        return _wait_for(args, wanted, None)
    # What is there now is the baseline, summed up in one line: only changes are printed.
    seen = {job["id"]: job["state"] for job in _request(args, P.JOBS, {"all": True})["jobs"]}
    counts = ", ".join(f"{n} {state}" for state, n in
                       sorted(collections.Counter(seen.values()).items()))
    print(f"{len(seen)} job(s) so far ({counts or 'none'}); printing what changes from now "
          "on, until Ctrl-C", flush=True)
    while True:  # watch forever (until Ctrl-C), saying what changes
        time.sleep(_POLL * 5)
        for job in _patient(args, P.JOBS, {"all": True})["jobs"]:
            if seen.get(job["id"]) != job["state"]:
                seen[job["id"]] = job["state"]
                print(f"job {job['id']} {job.get('name', '')}: {job['state']}", flush=True)


def _wait_for(args: argparse.Namespace, wanted: list[int], timeout: float | None) -> int:
    """Wait for the jobs WANTED to end (TIMEOUT: give up after that many seconds), each
    request held by the broker until they have, or for ``_HOLD`` seconds (``job_waits``):
    their ends are heard as the broker hears them, with no looking again meanwhile."""
    deadline = None if timeout is None else time.monotonic() + timeout
    answered = False  # (the first look is answered at once: the broker is there)
    while True:
        hold = _HOLD if deadline is None else min(_HOLD, deadline - time.monotonic())
        hold = hold if answered else 0.0
        reply = _held(args, {"jobs": wanted, **({"wait": hold} if hold > 0 else {})},
                      max(hold, 0.0), answered, deadline) if wanted else {"jobs": []}
        table = reply["jobs"]
        # Infeasible counts as final: such jobs are reported, not awaited.
        pending = [j for j in table if j["state"] not in _FINAL]
        if not pending:
            break
        if deadline is not None and time.monotonic() >= deadline:
            print(f"zres wait: gave up after {timeout:g}s; still waiting for "
                  f"{', '.join(str(j['id']) for j in pending)}", file=sys.stderr)
            return 1
        if answered and not reply.get("waited"):  # (a broker that held it not: look again)
            time.sleep(_POLL)
        answered = True
    if table:
        _request(args, P.JOBS, {"jobs": [], "reported": [j["id"] for j in table]})
    status = 0
    for job in table:
        if job["state"] == "done":
            continue
        status = 1
        detail = job.get("reason") or job.get("error") or ""
        code = job.get("exit_code")
        what = f"exit code {code}" if code is not None else job["state"]
        if detail == what:
            detail = ""
        print(f"job {job['id']} ({job.get('name', '')}): {what}" + (f": {detail}" if detail
                                                                     else ""),
              file=sys.stderr)
    return status


def _held(args: argparse.Namespace, body: dict[str, Any], hold: float, answered: bool,
          deadline: float | None) -> dict[str, Any]:
    """The broker's answer to a jobs request BODY it may hold for HOLD seconds. Once it has
    ANSWERED, a broker away (restarted: it has forgotten the request) is waited for and
    asked again (``_patient``, until DEADLINE); before, one that cannot be reached is an
    error, as for any request, and one that does not answer is asked once more."""
    if answered:
        return _patient(args, P.JOBS, body, hold + 10.0, deadline)
    address = broker_address(args.broker)
    try:
        return request(address, P.JOBS, body, hold + 10.0)
    except Unanswered:
        return request(address, P.JOBS, body, hold + 10.0)


COMMANDS = {"submit": submit, "jobs": jobs, "logs": logs, "cancel": cancel, "wait": wait,
            "run-queue": run_queue}
