"""The command-job face of ``zres.Client``: queue shell commands, find their job ids, list
the job table; what of the submitter's environment a job takes (``exported_env``)."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import BrokerLostError, ZresError
from ..core.report import entry_in_user_units  # (what users read)
from .futures import Future


class JobMethods:
    """Mixed into ``Client``: command jobs, which are tasks the agent runs as processes."""

    if TYPE_CHECKING:  # (the client's own, used here)
        _io: Any

        def _options(self, resources: Mapping[str, Any] | None, retries: int | None = None,
                     priority: int | None = None, infeasible: str | None = None,
                     key: str | None = None) -> dict[str, Any]: ...

        def _make_future(self, fn: Any, name: str | None, frames: list[Any],
                         deps: list[Future[Any]], opts: dict[str, Any],
                         extra: dict[str, Any] | None = None) -> Future[Any]: ...

    def submit_command(self, argv: str | Iterable[str], *, shell: bool = False,
                       resources: Mapping[str, Any] | None = None,
                       env: Mapping[str, str] | None = None,
                       export: str | Mapping[str, str] = "ALL",
                       cwd: str | os.PathLike[str] | None = None, name: str | None = None,
                       retries: int | None = None, priority: int | None = None,
                       infeasible: str | None = None, detached: bool = False,
                       nodes: int = 1) -> Future:
        """Queue a command as a job; return a future of its ``CommandResult``.

        It runs on an agent with RESOURCES free, in a process group of its own, with
        CUDA_VISIBLE_DEVICES set to the granted devices and ZRES_JOB_ID, ZRES_GPU_IDS in
        its environment; its output goes to a log on that agent (``zres logs``). A
        non-zero exit fails the future with ``CommandFailed``. ARGV is executed as is; a
        string is split as a shell would split it, unless SHELL: then the string is a
        command line that ``/bin/sh -c`` runs (pipes, ``&&``, ``$VAR``, ``exit 3``).

        Its environment is the agent's, then what EXPORT takes from this process's (as
        sbatch's ``--export``: "ALL", the default, all of it but zres's own ``ZRES_*``
        variables; "NONE"; "VAR,VAR=value,...", those only, "ALL,..." all and those; or a
        mapping, exactly that), then ENV. A DETACHED job outlives this client.

        NODES > 1: the command runs once on each of NODES distinct agents with RESOURCES
        free, all started together once all fit, each with ``NODE_RANK`` (0..NODES-1),
        ``NNODES``, ``WORLD_SIZE`` and rank 0's ``MASTER_ADDR`` and ``MASTER_PORT`` (and the
        same with ``ZRES_``); one failing rank stops the others, and the job fails naming it.
        """
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(f"nodes must be an int >= 1, got {nodes!r}")
        if shell:
            if not isinstance(argv, str) or not argv.strip():
                raise ValueError(f"shell=True takes a command line (a non-empty string), "
                                 f"got {argv!r}")
            args = ["/bin/sh", "-c", argv]
            label = name or os.path.basename(argv.split()[0])
        else:
            args = shlex.split(argv) if isinstance(argv, str) else list(argv)
            if not args or not all(isinstance(a, str) for a in args):
                raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
            label = name or os.path.basename(args[0])
        exported = exported_env(export)
        extra_env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()):
            raise TypeError("env must map strings to strings")
        bad = next((k for k in extra_env if not k or "=" in k), None)
        if bad is not None:
            raise ValueError(f"env: {bad!r} is not an environment variable name")
        if any("\0" in text for text in [*args, *extra_env, *extra_env.values(),
                                          os.fspath(cwd or "")]):
            raise ValueError("argv, env and cwd cannot hold a NUL character")
        opts = self._options(resources, retries, priority, infeasible, name)
        # The agent runs the command itself: nothing is pickled, the spec travels as is.
        spec: dict[str, Any] = {"argv": args, "env": extra_env, "export": exported,
                "cwd": None if cwd is None else os.fspath(cwd), "detached": bool(detached)}
        if nodes > 1:
            spec["nodes"] = nodes
        future = self._make_future(args[0], label, [], [], opts, {"job": spec})
        self._io.wake()
        return future

    def job_ids(self, futures: Iterable[Future], timeout: float = 10.0) -> list[int | None]:
        """Return the broker's job id of each command-job future (None if unknown). A
        broker that restarts before it answers is asked again once this client is back
        with it (what it had not kept sent again first), within the client's reconnect
        window (``broker_timeout``), as the futures wait for it."""
        ids = [f._local for f in futures]
        deadline = time.monotonic() + max(timeout, self._io.broker_timeout)
        while True:
            try:
                reply = self._io.request(P.JOBS, {"ids": ids, "jobs": []},
                                         max(timeout, deadline - time.monotonic()))
            except BrokerLostError:  # (it restarted before it answered: ask the new one)
                reply = {}
            if "error" in reply:
                raise ZresError(reply["error"])
            if "ids" in reply:
                return list(reply["ids"])
            # (none: a restarted broker that has not heard this client's hello yet)
            if time.monotonic() >= deadline:
                raise BrokerLostError("the broker restarted, and did not say which jobs it "
                                      f"had kept within {self._io.broker_timeout:g}s")
            time.sleep(0.05)

    def jobs(self, all: bool = False, timeout: float = 10.0) -> list[dict[str, Any]]:  # noqa: A002
        """Return the job table: queued and running jobs, finished ones too with ALL."""
        return [entry_in_user_units(job)
                for job in self._io.request(P.JOBS, {"all": all}, timeout)["jobs"]]


# The last environment exported, and what it was made from: a loop of submits (or a
# file of commands) shares one dict, sent and kept as one.
_last_export: list[tuple[Any, dict[str, str]]] = [(None, {})]


def exported_env(export: str | Mapping[str, str],
                 environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What of ENVIRON a job takes, as sbatch's ``--export`` says it (see
    ``submit_command``); ValueError naming what is wrong with EXPORT.

    zres's own variables (``ZRES_*``) never travel with ALL: they belong to the submitter's
    host and role (its key directory and broker address, the task token of the task it
    runs in, its settings), and the agent gives each job its own (``ZRES_JOB_ID``,
    ``ZRES_TASK_TOKEN``, ...)."""
    if not isinstance(export, str):
        given = export if type(export) is dict else dict(export)
        if not all(isinstance(k, str) and k and "=" not in k and "\0" not in k
                   and isinstance(v, str) and "\0" not in v for k, v in given.items()):
            raise ValueError("export: a mapping of variable names to strings (no '=' in a "
                             "name, no NUL character)")
        return given
    key = (export, tuple(environ.items()))
    last_key, last = _last_export[0]  # (one read: another thread may replace it)
    if last_key == key:
        return last
    made: dict[str, str] = {}
    items = [item.strip() for item in export.split(",")]
    if items != ["NONE"]:
        for item in items:
            name, sep, value = item.partition("=")
            if item == "ALL":
                made.update((k, v) for k, v in environ.items() if not k.startswith("ZRES_"))
            elif not name or item == "NONE" or "\0" in item or any(c.isspace() for c in name):
                raise ValueError(f"export {export!r}: {item!r} is not a variable name: give "
                                 "ALL, NONE, or VAR,VAR=value,... (as sbatch's --export)")
            elif sep:
                made[name] = value
            elif name in environ:  # (one that is not set is not exported, as in sbatch)
                made[name] = environ[name]
    _last_export[0] = (key, made)
    return made
