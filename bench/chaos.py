"""Chaos: a seeded, mixed workload on a local cluster while agents and workers are killed,
stopped and restarted at random instants; then every promise is checked.

    python bench/chaos.py [--rounds N] [--seed S] [--tasks N] [--json out.json]

Each round starts a cluster (two CPU agents offering slot=2, one agent with two fake GPUs),
submits tasks with dependencies and retries (some returning results over 64 KiB, kept on
the agent that made them, that later tasks take as inputs: the data plane), pipelined
short tasks, GPU tasks, calls to actors that restart, and command jobs, and meanwhile
SIGKILLs agents (restarting them),
SIGSTOPs them for up to twice the heartbeat timeout, SIGKILLs worker processes and
SIGTERMs agents (which drain); it also cancels tasks as they go (some with force). With
--broker-kills it also SIGKILLs the broker and restarts it on its state.
Every task body appends its start and end to a ledger and,
while it runs, holds an exclusive lock (flock) on one unit of what it was granted: a slot
unit, or its GPU device. The kernel drops a lock the moment its process ends, however it
ends, so a lock found taken means two bodies ran at once on one unit: an over-grant.

Checked per round, and printed as a table:
- every future resolved, with the right value or a zres error that tells the truth
  ("while running" only if the body began);
- no retries=0 body began twice, and no retries=N body more than N+1 times (counted
  apart: "twice0", bodies of retries=0 tasks that began twice, which must be 0);
- results lost with their agent (an agent killed, or a broker restarted without it) are
  made again only where their task may run again: "recomputed" counts the bodies that
  began again after they had ended; a future or dependent of a lost result that may not
  be made again fails with ResultLostError (a truthful error);
- a task whose cancel() said True never began, and ended cancelled; nothing ended
  cancelled that was not cancelled (with force or not), or waited on one that was;
- no unit of a resource over-granted at any instant;
- no process of the round left behind once the cluster is closed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zres  # noqa: E402

FAKE_GPUS = json.dumps([{"name": "Fake GPU", "memory": 16e9}] * 2)
HEARTBEAT, TIMEOUT = 0.2, 2.0
TRUTHFUL = (zres.AgentLostError, zres.WorkerLostError, zres.ActorDiedError,
            zres.ResultLostError)
BIG = 70_000  # bytes a "big" task adds to its result: over 64 KiB, kept on its agent

# A command job's body: the same protocol as `body`, in its own process.
JOB = """
import fcntl, os, sys, time
ledger, key, lockdir, seconds = sys.argv[1:5]
agent = os.environ["ZRES_AGENT"]
def note(what):
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{what} {key} {os.getpid()} {time.time():.6f}\\n".encode()); os.close(fd)
note("start")
held = None
for unit in range(2):
    fh = open(os.path.join(lockdir, f"{agent}-slot-{unit}"), "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB); held = fh; break
    except BlockingIOError:
        fh.close()
if held is None:
    open(os.path.join(lockdir, "overgrant"), "a").write(f"{key} slot\\n")
time.sleep(float(seconds))
note("end")
"""


# -- what the tasks run (by value: this file is __main__ for the workers) ------------------

def _note(ledger: str, what: str, key: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def _lock_one(lockdir: str, names: list[str], key: str) -> Any:
    """Hold an exclusive lock on one of NAMES (units of what was granted); note an
    over-grant if every one is taken."""
    for name in names:
        fh = open(os.path.join(lockdir, name), "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except BlockingIOError:
            fh.close()
    with open(os.path.join(lockdir, "overgrant"), "a") as out:
        out.write(f"{key} {names}\n")
    return None


def body(ledger: str, lockdir: str, key: str, seconds: float, value: int,
         *inputs: int) -> int:
    """A task: note its start, hold a unit of what it was granted, return a checkable sum."""
    ctx = zres.get_task_context()
    _note(ledger, "start", key)
    if ctx.gpu_ids:
        names = [f"{ctx.agent}-gpu-{g}" for g in ctx.gpu_ids]
    else:
        names = [f"{ctx.agent}-slot-{u}" for u in range(2)]
    held = _lock_one(lockdir, names, key)
    try:
        time.sleep(seconds)
    finally:
        if held is not None:
            held.close()
    _note(ledger, "end", key)
    return value + sum(i[0] if isinstance(i, tuple) else i for i in inputs)


def big_body(ledger: str, lockdir: str, key: str, seconds: float, value: int,
             *inputs: Any) -> tuple[int, bytes]:
    """As body, with BIG bytes more in its result (kept on its agent, not sent inline)."""
    return body(ledger, lockdir, key, seconds, value, *inputs), bytes(BIG)


class Tally:
    """An actor whose calls note themselves in the ledger; it holds a slot unit's lock for
    its life, as it holds the unit."""

    def __init__(self, ledger: str, lockdir: str) -> None:
        self.ledger = ledger
        agent = zres.get_task_context().agent
        self.held = _lock_one(lockdir, [f"{agent}-slot-{u}" for u in range(2)], "actor")

    def add(self, key: str, value: int) -> int:
        _note(self.ledger, "start", key)
        time.sleep(0.005)
        _note(self.ledger, "end", key)
        return value


# -- one round ---------------------------------------------------------------------------

class Round:
    def __init__(self, number: int, seed: int, tasks: int, workdir: Path,
                 broker_kills: bool = False) -> None:
        self.number = number
        self.broker_kills = broker_kills
        self.rng = random.Random(seed)
        self.tasks = tasks
        self.dir = workdir
        self.ledger = str(workdir / "ledger")
        self.lockdir = str(workdir / "locks")
        os.makedirs(self.lockdir, exist_ok=True)
        self.marker = f"zres-chaos-{os.getpid()}-{number}-{seed}"
        self.expected: dict[str, int] = {}      # key -> right value
        self.retries: dict[str, int] = {}       # key -> retries it was given
        self.futures: dict[str, zres.Future] = {}
        self.inputs: dict[str, list[str]] = {}  # key -> the keys it waits on
        self.cancel_said: dict[str, bool] = {}  # key -> what its cancel() answered
        self.forced: set[str] = set()           # keys cancelled with force
        self.faults: Counter[str] = Counter()
        self.timeline: list[tuple[float, str, str]] = []   # when, fault, agent
        self.stop_faults = threading.Event()

    def run(self) -> dict[str, Any]:
        env = {"ZRES_TEST_FAKE_GPUS": FAKE_GPUS, "ZRES_CHAOS": self.marker,
               "ZRES_BROKER__PREFETCH": "8"}
        specs = {"cpu-a": {"slot": 2}, "cpu-b": {"slot": 2}, "gpu-c": {"GPU": 2, "slot": 0}}
        cluster = zres.LocalCluster(agents=list(specs.values()), names=list(specs),
                                    nthreads=4, heartbeat_interval=HEARTBEAT,
                                    heartbeat_timeout=TIMEOUT, env=env, drain_grace=1.0)
        try:
            with zres.Client(cluster.address, infeasible="warn") as client, \
                    warnings.catch_warnings():
                # The GPU agent is down at times: its tasks wait, as they should.
                warnings.simplefilter("ignore", zres.InfeasibleWarning)
                chaos = threading.Thread(target=self._faults, args=(cluster, specs),
                                         daemon=True)
                chaos.start()
                self._submit(client)
                deadline = time.monotonic() + 180
                zres.wait(list(self.futures.values()),
                          timeout=max(1.0, deadline - time.monotonic()))
                self.stop_faults.set()
                chaos.join(30)
                report = self._check()
        finally:
            cluster.close()
        report["left_behind"] = _left_behind(self.marker)
        return report

    def _submit(self, client: zres.Client) -> None:
        rng = self.rng
        common = (self.ledger, self.lockdir)
        # Warm the short kind, so that pipelining queues it.
        zres.wait(client.map(body, *zip(*[(*common, f"w{i}", 0.003, 0) for i in range(40)]),
                             resources={"slot": 1}), timeout=60)
        actors = [client.actor(Tally, self.ledger, self.lockdir, resources={"slot": 1},
                               restarts=-1) for _ in range(2)]
        done: list[str] = []
        for i in range(self.tasks):
            kind = rng.choices(["plain", "short", "gpu", "call", "job"], [4, 6, 2, 2, 1])[0]
            if kind == "plain" and rng.random() < 0.4:
                kind = "big"  # (a plain task whose result is kept on its agent)
            key = f"{kind[0]}{i}"
            value = rng.randint(0, 1000)
            retries = rng.choice([0, 0, 1, 2])
            if kind in ("plain", "big"):
                inputs = [k for k in rng.sample(done, min(len(done), rng.randint(0, 2)))
                          if k[0] in "psb"]
                self.expected[key] = value + sum(self.expected[k] for k in inputs)
                self.inputs[key] = inputs
                self.futures[key] = client.submit(
                    big_body if kind == "big" else body, *common, key,
                    rng.uniform(0.005, 0.05), value, *[self.futures[k] for k in inputs],
                    resources={"slot": 1}, retries=retries, key=key)
            elif kind == "short":
                retries = 0
                self.expected[key] = value
                self.futures[key] = client.submit(body, *common, key, 0.003, value,
                                                  resources={"slot": 1}, key=key)
            elif kind == "gpu":
                self.expected[key] = value
                self.futures[key] = client.submit(body, *common, key, rng.uniform(0.02, 0.1),
                                                  value, resources={"GPU": 1},
                                                  retries=retries, key=key)
            elif kind == "call":
                self.expected[key] = value
                method = rng.choice(actors).add
                self.futures[key] = method.options(retries=retries, key=key)(key, value)
            else:
                retries = 0
                self.futures[key] = client.submit_command(
                    [sys.executable, "-c", JOB, self.ledger, key, self.lockdir,
                     str(rng.uniform(0.05, 0.3))], resources={"slot": 1}, name=key)
            self.retries[key] = retries
            done.append(key)
            if rng.random() < 0.08:
                self._cancel(client, rng.choice(done[-30:]))
            if i % 50 == 49:
                time.sleep(rng.uniform(0.0, 0.2))  # arrivals spread over the round

    def _cancel(self, client: zres.Client, key: str) -> None:
        """Cancel KEY's task, most often as Future.cancel() does, at times with force."""
        future = self.futures[key]
        if key[0] == "c" or key in self.cancel_said or key in self.forced:
            return  # an actor's call cannot be stopped alone; one cancel each
        if self.rng.random() < 0.25:
            client.cancel(future, force=True)
            self.forced.add(key)
        else:
            self.cancel_said[key] = future.cancel()

    def _waits_on_cancelled(self, key: str) -> bool:
        return any(self.futures[k].cancelled() or self._waits_on_cancelled(k)
                   for k in self.inputs.get(key, ()))

    def _faults(self, cluster: zres.LocalCluster, specs: dict[str, dict[str, Any]]) -> None:
        rng = self.rng.__class__(self.rng.random())
        while not self.stop_faults.wait(rng.uniform(0.3, 1.2)):
            name = rng.choice(list(specs))
            proc = cluster.agents.get(name)
            if proc is None or proc.poll() is not None:
                self._restart(cluster, name, specs)
                continue
            fault = rng.choice(["kill", "stop", "worker", "term"] * 3
                               + (["broker"] * 3 if self.broker_kills else []))
            self.faults[fault] += 1
            self.timeline.append((time.time(), fault, name))
            try:
                if fault == "broker":
                    cluster.restart_broker()  # SIGKILL, then the same state and address
                elif fault == "kill":
                    proc.kill()
                    proc.wait(10)
                    self._restart(cluster, name, specs)
                elif fault == "stop":
                    os.kill(proc.pid, signal.SIGSTOP)
                    self.stop_faults.wait(rng.uniform(0.3, 2 * TIMEOUT))
                    os.kill(proc.pid, signal.SIGCONT)
                elif fault == "worker":
                    workers = _children(proc.pid)
                    if workers:
                        os.kill(rng.choice(workers), signal.SIGKILL)
                else:
                    proc.terminate()
                    proc.wait(30)
                    self._restart(cluster, name, specs)
            except (ProcessLookupError, OSError):
                pass

    def _restart(self, cluster: zres.LocalCluster, name: str,
                 specs: dict[str, dict[str, Any]]) -> None:
        cluster.add_agent(specs[name], name=name, wait=False)

    def _check(self) -> dict[str, Any]:
        starts: Counter[str] = Counter()
        ended: set[str] = set()
        recomputed: Counter[str] = Counter()  # began again after it had ended
        for line in open(self.ledger):
            what, key, *_ = line.split()
            if what == "start":
                starts[key] += 1
                if key in ended:
                    recomputed[key] += 1
            elif what == "end":
                ended.add(key)
        outcomes: Counter[str] = Counter()
        problems: list[str] = []
        for key, future in self.futures.items():
            if not future.done():
                outcomes["unresolved"] += 1
                problems.append(f"{key}: never resolved ({future.why()})")
                continue
            said = self.cancel_said.get(key)
            if said and (starts[key] or not future.cancelled()):
                problems.append(f"{key}: cancel() said True, yet it began {starts[key]} "
                                f"times and ended {future._state}")
            if future.cancelled():
                outcomes["cancelled"] += 1
                if not said and key not in self.forced \
                        and not self._waits_on_cancelled(key):
                    problems.append(f"{key}: ended cancelled; cancel() said {said}")
                continue
            error = future.exception()
            if error is None:
                try:  # (a result kept on an agent is fetched now: it may be lost)
                    result = future.result(60)
                except Exception as exc:
                    error = exc
            if error is None:
                outcomes["ok"] += 1
                expected = self.expected.get(key)
                if key[0] == "b" and result[1] == bytes(BIG):
                    result = result[0]
                if expected is not None and result != expected:
                    problems.append(f"{key}: returned {result!r}, expected {expected}")
            elif isinstance(error, TRUTHFUL) or isinstance(error, zres.CommandFailed):
                outcomes[type(error).__name__] += 1
                # (A dependent fails with its dependency's error, which names that task.)
                if f"while running task {key}," in str(error) and not starts[key]:
                    problems.append(f"{key}: {type(error).__name__} says it ran; it never "
                                    "began")
            else:
                outcomes[type(error).__name__] += 1
                problems.append(f"{key}: {type(error).__name__}: {error}{_raised_at(error)}")
            if starts[key] > self.retries[key] + 1:
                problems.append(f"{key}: began {starts[key]} times with retries="
                                f"{self.retries[key]}; {self._story(key, future)}")
        overgrant = Path(self.lockdir, "overgrant")
        overgrants = overgrant.read_text().splitlines() if overgrant.exists() else []
        return {"round": self.number, "tasks": len(self.futures), "outcomes": dict(outcomes),
                "twice": sum(1 for k, n in starts.items() if k in self.retries
                             and n > self.retries[k] + 1),
                "twice0": sum(1 for k, n in starts.items() if n > 1
                              and self.retries.get(k) == 0),
                "recomputed": sum(recomputed.values()),
                "big": sum(1 for k in self.futures if k[0] == "b"),
                "overgrants": len(overgrants), "faults": dict(self.faults),
                "problems": problems + [f"over-grant: {o}" for o in overgrants]}


    def _story(self, key: str, future: zres.Future) -> str:
        """What the ledger and the faults say about KEY, for a problem's report."""
        lines = [line.split() for line in open(self.ledger) if line.split()[1] == key]
        first = float(lines[0][3]) if lines else 0.0
        events = [f"{what} pid {pid} at {float(t) - first:+.3f}" for what, _, pid, t in lines]
        faults = [f"{fault} {agent} at {t - first:+.3f}" for t, fault, agent in self.timeline
                  if first - 3 < t < first + 6]
        outcome = future.exception() or "ok"
        return f"ledger: {events}; faults: {faults}; outcome: {outcome!r}"


def _raised_at(error: BaseException) -> str:
    """Where ERROR was raised in this process (its innermost frames), to find a bug by."""
    frames = traceback.extract_tb(error.__traceback__)[-4:]
    return (" (raised at " + " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                        for f in reversed(frames)) + ")") if frames else ""


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _left_behind(marker: str) -> int:
    """Processes whose environment carries MARKER, still there after a short grace."""
    deadline = time.monotonic() + 10
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    environ = Path(f"/proc/{entry}/environ").read_bytes()
                    state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if f"ZRES_CHAOS={marker}".encode() in environ.split(b"\0") and state != "Z":
                    found.append(int(entry))
        if not found or time.monotonic() > deadline:
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return len(found)
        time.sleep(0.2)


def run(rounds: int, seed: int, tasks: int,
        broker_kills: bool = False) -> list[dict[str, Any]]:
    """Run ROUNDS rounds; return their reports (see Round._check)."""
    reports = []
    with tempfile.TemporaryDirectory(prefix="zres-chaos-") as tmp:
        for number in range(1, rounds + 1):
            workdir = Path(tmp, f"round-{number}")
            workdir.mkdir()
            started = time.monotonic()
            report = Round(number, seed + number, tasks, workdir, broker_kills).run()
            report["seconds"] = round(time.monotonic() - started, 1)
            reports.append(report)
            print(_row(report), flush=True)
    return reports


def _row(r: dict[str, Any]) -> str:
    outcomes = " ".join(f"{k}={v}" for k, v in sorted(r["outcomes"].items()))
    faults = " ".join(f"{k}={v}" for k, v in sorted(r["faults"].items()))
    status = "ok" if not r["problems"] and not r["left_behind"] else "FAILED"
    return (f"round {r['round']:>3}  {status:<6}  tasks={r['tasks']:<4} {outcomes:<58} "
            f"big={r['big']} recomputed={r['recomputed']} twice0={r['twice0']} "
            f"twice={r['twice']} overgrants={r['overgrants']} left={r['left_behind']}  "
            f"faults: {faults}  {r['seconds']}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=300, help="tasks per round")
    parser.add_argument("--json", help="also write every round's report here")
    parser.add_argument("--broker-kills", action="store_true",
                        help="also SIGKILL the broker and restart it on its state: tasks, "
                        "jobs and actors run on and their futures resolve as before")
    args = parser.parse_args(argv)
    reports = run(args.rounds, args.seed, args.tasks, args.broker_kills)
    failed = [r for r in reports if r["problems"] or r["left_behind"]]
    totals: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for r in reports:
        totals.update(r["outcomes"])
        faults.update(r["faults"])
    print(f"\n{len(reports)} rounds, {sum(r['tasks'] for r in reports)} tasks: "
          + " ".join(f"{k}={v}" for k, v in sorted(totals.items()))
          + "; faults: " + " ".join(f"{k}={v}" for k, v in sorted(faults.items()))
          + f"; big results: {sum(r['big'] for r in reports)}"
          + f", recomputed: {sum(r['recomputed'] for r in reports)}"
          + f"; retries=0 bodies begun twice: {sum(r['twice0'] for r in reports)}"
          + f"; ran twice: {sum(r['twice'] for r in reports)}"
          + f"; over-grants: {sum(r['overgrants'] for r in reports)}"
          + f"; left behind: {sum(r['left_behind'] for r in reports)}")
    for r in failed:
        for problem in r["problems"][:20]:
            print(f"  round {r['round']}: {problem}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(reports, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
