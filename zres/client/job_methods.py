"""The command-job face of ``zres.Client``: queue shell commands, find their job ids, list
the job table."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core import protocol as P
from ..core.errors import ZresError
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

    def submit_command(self, argv: str | Iterable[str], *,
                       resources: Mapping[str, Any] | None = None,
                       env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None
                       = None, name: str | None = None, retries: int | None = None,
                       priority: int | None = None, infeasible: str | None = None,
                       detached: bool = False) -> Future:
        """Queue a shell command as a job; return a future of its ``CommandResult``.

        It runs on an agent with RESOURCES free, in a process group of its own, with
        CUDA_VISIBLE_DEVICES set to the granted devices and ZRES_JOB_ID, ZRES_GPU_IDS in
        its environment; its output goes to a log on that agent (``zres logs``). A
        non-zero exit fails the future with ``CommandFailed``. A string ARGV is split as a
        shell would (no shell runs it). A DETACHED job outlives this client.
        """
        args = shlex.split(argv) if isinstance(argv, str) else list(argv)
        if not args or not all(isinstance(a, str) for a in args):
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
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
        label = name or os.path.basename(args[0])
        # The agent runs the command itself: nothing is pickled, the spec travels as is.
        spec = {"argv": args, "env": extra_env, "cwd": None if cwd is None else os.fspath(cwd),
                "detached": bool(detached)}
        future = self._make_future(args[0], label, [], [], opts, {"job": spec})
        self._io.wake()
        return future

    def job_ids(self, futures: Iterable[Future], timeout: float = 10.0) -> list[int | None]:
        """Return the broker's job id of each command-job future (None if unknown)."""
        ids = [f._local for f in futures]
        reply = self._io.request(P.JOBS, {"ids": ids, "jobs": []}, timeout)
        if "error" in reply:
            raise ZresError(reply["error"])
        return list(reply["ids"])

    def jobs(self, all: bool = False, timeout: float = 10.0) -> list[dict[str, Any]]:  # noqa: A002
        """Return the job table: queued and running jobs, finished ones too with ALL."""
        return [entry_in_user_units(job)
                for job in self._io.request(P.JOBS, {"all": all}, timeout)["jobs"]]
