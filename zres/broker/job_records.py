"""A command job as the broker keeps it: its record, the spec a client sends to make one,
and why one ended in words anyone may read.

A job that has ended says why in ``reason``: to its owner and admin keys, its error as
the agent or broker gave it (``cannot start './run.sh': No such file or directory``); to
everyone else (and on the dashboard, which asks no key) only words that quote nothing of
the job's own: ``cannot start``, ``exit code 3``, ``killed by signal SIGKILL``, or what the
broker said of it in terms that are public anyway (which agent was lost and why, what
resources no agent offers). The agent's text may quote the command, its working directory
and its log's path, which are its owner's alone.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field
from typing import Any

from ..core import protocol as P
from ..core.context import TOKEN_ENV
from ..core.errors import ProtocolError

# What anyone may see of a job (the dashboard, and keys other than its owner's and admins').
PUBLIC_FIELDS = frozenset({"id", "name", "owner", "state", "reason", "agent", "units", "gpus",
                           "submitted", "started", "finished", "exit_code",
                           "peak_memory", "nodes", "agents"})

# How a failed job's error type reads in the table.
FAILED_STATES = {"CancelledError": "cancelled", "InfeasibleError": "infeasible",
                 "AgentLostError": "lost", "WorkerLostError": "lost",
                 "BrokerLostError": "lost"}


@dataclass(slots=True)
class JobRecord:
    id: int
    name: str
    argv: list[str]
    units: dict[str, int]
    detached: bool               # outlives the client that submitted it
    submitted: float             # wall-clock seconds
    run: dict[str, Any]          # what the agent runs: {argv, env, cwd}
    state: str = "queued"        # queued, running, done, failed, cancelled, infeasible, lost
    agent: str = ""
    gpus: list[str] = field(default_factory=list)
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    peak_memory: int | None = None   # bytes, at most, its processes used (from its agent)
    error: str = ""
    reported: bool = False       # a `zres wait` of its owner's has reported how it ended
    priority: int = 0
    strict: bool = False         # fails at once if infeasible
    retries: int = 0             # retries left (kept: a restarted broker's task has them)
    held_on: str = ""            # the agent that may start it (it heard the grant held)
    # The client that submitted it, by routing id and its own id for it: a restarted
    # broker gives it back to that client when it comes back (a detached job's too: that
    # client, sending again what the broker had not acknowledged, must not queue it twice,
    # nor hear that it was not kept).
    client: bytes = b""
    owner: str = ""              # the name of the key that submitted it ("": no keys)
    local: int = -1
    ended: list[Any] = field(default_factory=list)  # [outcome, info, frames], for it
    reason: str = ""             # why it ended, in words anyone may read (see above)
    exported: int = 0            # variables exported from its submitter's environment,
    export_key: str = ""         # kept once per distinct environment (``job_envs``) under
    # this key while it may run; the dict itself, shared by the jobs that have the same
    # (in memory only: a record names it by its key).
    export: dict[str, str] = field(default_factory=dict)
    # A multi-node job (issue 31: ``gangs.ranks``): on NODES distinct agents, each rank
    # [grant id, agent, state, exit code, GPUs], and where rank 0 listens [address, port].
    nodes: int = 1
    ranks: list[list[Any]] = field(default_factory=list)
    master: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "argv": self.argv, "units": self.units,
                "state": self.state, "agent": self.agent, "gpus": self.gpus,
                "submitted": self.submitted, "started": self.started,
                "finished": self.finished, "exit_code": self.exit_code, "error": self.error,
                "peak_memory": self.peak_memory,
                "reason": self.reason, "owner": self.owner, "cwd": self.run.get("cwd"),
                "env": self.run.get("env"), "exported": self.exported, "nodes": self.nodes,
                "agents": [r[1] for r in self.ranks] if self.nodes > 1 else [self.agent],
                **({"ranks": [{"agent": r[1], "state": r[2], "exit_code": r[3], "gpus": r[4]}
                              for r in self.ranks]} if self.nodes > 1 else {})}

    def record(self) -> dict[str, Any]:
        """What the state store keeps of it: every field but the exported environment
        itself (kept once for all the jobs that share it, under ``export_key``)."""
        return {f.name: getattr(self, f.name) for f in STORED}

    def for_agent(self, token: str | None) -> dict[str, Any]:
        """What its agent runs: {argv, env, cwd}, the env its exported environment, then
        its own variables, then the task TOKEN its programs act with (if any)."""
        env = {**self.export, **self.run["env"]}
        if token:
            env[TOKEN_ENV] = token
        return {**self.run, "env": env}


STORED = [f for f in dataclasses.fields(JobRecord) if f.name != "export"]


def ended_reason(outcome: str, state: str, code: Any, error: str) -> str:
    """Why a job ended, as anyone may read it: nothing of its command line or directory."""
    if outcome == P.RAISED:  # the agent's: the program exited, or could not be started
        if not isinstance(code, int):
            return "cannot start"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"
    # The broker's own words: which agent was lost and why, what no agent offers.
    return error if state in ("lost", "infeasible") else ""


def check_job_spec(spec: Any) -> dict[str, Any]:
    """Validate a job spec {argv, env, export, cwd, detached, nodes?} off the wire."""
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list) \
            or not spec["argv"] or not all(isinstance(a, str) for a in spec["argv"]):
        raise ProtocolError("submit: a job needs argv, a non-empty array of strings")
    env, export = spec.get("env", {}), spec.get("export", {})
    for what, given in (("env", env), ("exported environment", export)):
        if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in given.items()):
            raise ProtocolError(f"submit: a job's {what} must map strings to strings")
    if not isinstance(spec.get("cwd"), (str, type(None))):
        raise ProtocolError("submit: a job's cwd must be a string")
    # What the agent's exec would refuse, refused here, naming it.
    texts = [*spec["argv"], *env, *env.values(), *export, *export.values(),
             spec.get("cwd") or ""]
    if any("\0" in text for text in texts):
        raise ProtocolError("submit: a job's argv, env and cwd cannot hold a NUL character")
    if any("=" in key or not key for key in [*env, *export]):
        raise ProtocolError("submit: a job's environment variable names must be non-empty "
                            "and hold no '='")
    nodes = spec.get("nodes", 1)
    if type(nodes) is not int or not 1 <= nodes <= 4096:
        raise ProtocolError("submit: a job's nodes must be an int from 1 to 4096")
    return {"argv": spec["argv"], "env": env, "export": export, "cwd": spec.get("cwd"),
            "detached": bool(spec.get("detached")), "nodes": nodes}
