"""A fleet of simulated agents against a real broker: what a thousand agents cost it (issue 28).

    python bench/fleet.py [--agents 1,100,1000] [--tasks 100000] [--answer acked|once]
                          [--procs 1] [--threads 2] [--side late|always] [--churn]
                          [--json PATH]

Each size starts a fresh ``zres.LocalCluster(agents=[])`` (a broker with keys and a state
directory, as a user runs it, and its HTTP port for /metrics), then a fleet of fake agents
in ``--procs`` processes of this script. Each fake agent is a DEALER socket of its own with
the agents' key (CURVE), speaking the real protocol: it registers a session (one slot of
``--threads`` CPUs), beats every heartbeat interval on its connection and, while the
broker's echoes of those are late, on a second socket of its own, as a real agent's
heartbeat thread does (``side``; counted in ``fleet.side_beats``), and answers each
grant at once with a no-op's result. ``--answer acked`` (the default) answers as a real
agent does: a direct grant (it fits now) held, started and ended in one report; a queued
one (pipelined) held in a report, then, once the broker has acknowledged it, started and
ended in another; ``once`` says all of it in one report for either. The fake
agents run no code: their CPU is the fleet's, not the broker's.

A client then maps a no-op over ``--tasks`` tasks and waits for all. Reported, per size:

- agents lost: every ``unknown{ended}`` the broker sent a fake agent (each re-registers as a
  real agent would), and the fewest agents the broker's status listed while the tasks ran;
  how long the broker took to find silent the one agent that goes silent two seconds into
  the run (it finishes what it may start, then neither beats nor takes anything: the
  heartbeat timeout is 3 s; a broker behind its messages finds it later, never falsely);
  and the slowest heartbeat round trip a fake agent saw (how far the loop fell behind);
- the broker's CPU while the agents only beat (per cent of one core, over five seconds
  before the tasks are submitted);
- the time for all (submit to the last result);
- the broker process's CPU (all its threads, from /proc/PID/stat) per task and per message
  (messages in and out of its socket, from /metrics), and per task net of what the
  heartbeats cost it meanwhile (the idle rate times the time for all: a slower run on a
  busy machine pays more heartbeats per task);
- scheduling time per decision (``zres_scheduling_seconds``'s sum over the grants) and per
  pass;
- the loop's longest turn (``status()["loop"]["longest_turn"]``: what any message may have
  waited behind);
- tasks failed, by exception type (none, as a rule).

``--churn`` then runs, per size, a fleet that keeps its grants unanswered (its slots full,
the rest of the tasks queued at the broker), leaves at once (every agent says goodbye, as a
fleet being restarted does) and comes back: how long until the broker has let every agent
go (each one's grants requeued), its CPU meanwhile, and how long until everything has run
once the agents are back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zres  # noqa: E402


def noop(x: int = 0) -> int:
    return x


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process PID so far, all its threads."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(url: str) -> dict[str, float]:
    """The broker's counters from its /metrics."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=60) as reply:
        text = reply.read().decode()
    wanted = {"zres_scheduling_seconds_sum": "sched_s", "zres_scheduling_seconds_count":
              "passes", "zres_messages_received_total": "in", "zres_messages_sent_total": "out"}
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+) (\S+)", line)
        if match and match[1] in wanted:
            out[wanted[match[1]]] = float(match[2])
    return out


class Fleet:
    """The fleet's processes: started, waited for, stopped, their counts summed."""

    def __init__(self, cluster: zres.LocalCluster, n: int, procs: int, answer: str,
                 threads: int, side: str) -> None:
        self.procs = []
        per = -(-n // procs)
        for first in range(0, n, per):
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, "--serve", cluster.address, str(cluster.keys),
                 str(first), str(min(per, n - first)), answer, str(threads), side,
                 str(cluster._env["ZRES_AGENT__HEARTBEAT_INTERVAL"])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        self.ask(None, "ready")

    def ask(self, command: str | None, answer: str | None) -> list[str]:
        """Send COMMAND to every fleet process; return the line each answers (ANSWER, if
        given, or fail)."""
        lines = []
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            if command is not None:
                proc.stdin.write(command + "\n")
                proc.stdin.flush()
            lines.append(proc.stdout.readline().strip())
            if answer is not None and lines[-1] != answer:
                raise RuntimeError(f"a fleet process said {lines[-1]!r}, not {answer!r}")
        return lines

    def mute(self) -> None:
        """The first fleet process's first agent goes silent."""
        proc = self.procs[0]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("mute\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "muted"

    def counts(self, command: str = "counts") -> dict[str, Any]:
        total: dict[str, Any] = {}
        for line in self.ask(command, None):
            for name, count in json.loads(line).items():
                if isinstance(count, str):
                    total[name] = total.get(name) or count
                elif name in ("found_s", "slowest_echo_s"):
                    total[name] = max(total.get(name, count), count)
                else:
                    total[name] = total.get(name, 0) + count
        return total

    def stop(self) -> dict[str, Any]:
        total = self.counts("stop")
        for proc in self.procs:
            proc.wait(30)
        return total


def run(n_agents: int, n_tasks: int, procs: int, answer: str, threads: int,
        side: str) -> dict[str, Any]:
    with zres.LocalCluster(agents=[], http="127.0.0.1:0") as cluster:
        assert cluster.broker is not None and cluster.dashboard is not None
        pid, url = cluster.broker.pid, cluster.dashboard
        started = time.perf_counter()
        fleet = Fleet(cluster, n_agents, procs, answer, threads, side)
        cluster.wait_for_agents(n_agents, timeout=300)
        joined = time.perf_counter() - started
        fewest = [n_agents]
        done = threading.Event()

        def watch() -> None:  # the agents the broker lists, every few seconds
            while not done.wait(3.0):
                try:
                    fewest[0] = min(fewest[0], len(cluster.status(timeout=60)["agents"]))
                except Exception:  # (a slow answer is not a lost agent)
                    pass

        with zres.Client(cluster.address) as client:
            zres.wait(client.map(noop, range(1000)))  # (the function shipped, sockets warm)
            cpu0, idle0 = cpu_seconds(pid), time.perf_counter()
            time.sleep(5.0)  # (what the agents' heartbeats alone cost it)
            idle = (cpu_seconds(pid) - cpu0) / (time.perf_counter() - idle0)
            cpu0, m0 = cpu_seconds(pid), metrics(url)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            start = time.perf_counter()
            futures = client.map(noop, range(n_tasks))
            time.sleep(2.0)
            fleet.mute()
            zres.wait(futures)
            elapsed = time.perf_counter() - start
            cpu1, m1 = cpu_seconds(pid), metrics(url)
            done.set()
            watcher.join()
            failed = failures(futures)
            del futures
            status = cluster.status(timeout=60)
        counts = fleet.stop()
    cpu, messages = cpu1 - cpu0, (m1["in"] - m0["in"]) + (m1["out"] - m0["out"])
    passes = m1["passes"] - m0["passes"]
    sched = m1["sched_s"] - m0["sched_s"]
    return {"agents": n_agents, "tasks": n_tasks, "answer": answer, "failed": failed,
            "joined_s": round(joined, 1), "idle_cpu_pct": round(idle * 100, 1),
            "seconds": round(elapsed, 2),
            "lost": counts.get("lost", 0), "fewest_listed": min(fewest[0],
                                                                len(status["agents"])),
            "silent_found_s": counts.get("found_s", -1),
            "slowest_echo_s": counts.get("slowest_echo_s", 0),
            "broker_cpu_s": round(cpu, 2), "cpu_us_per_task": round(cpu / n_tasks * 1e6, 1),
            "net_us_per_task": round((cpu - idle * elapsed) / n_tasks * 1e6, 1),
            "messages": int(messages), "messages_per_task": round(messages / n_tasks, 2),
            "cpu_us_per_message": round(cpu / messages * 1e6, 1),
            "sched_us_per_decision": round(sched / n_tasks * 1e6, 1),
            "passes": int(passes), "sched_us_per_pass": round(sched / max(passes, 1) * 1e6, 1),
            "longest_turn_ms": round(status["loop"]["longest_turn"] * 1e3, 1),
            "fleet": counts}


def failures(futures: list[Any]) -> dict[str, int]:
    """How many of FUTURES failed, by exception type (none, as a rule)."""
    out: dict[str, int] = {}
    for future in futures:
        exc = future.exception()
        if exc is not None:
            out[type(exc).__name__] = out.get(type(exc).__name__, 0) + 1
    return out


def agents_listed(cluster: zres.LocalCluster) -> int:
    """How many agents the broker's status lists (asked again while it does not answer:
    a broker busy for minutes is what this measures)."""
    while True:
        try:
            return len(cluster.status(timeout=60)["agents"])
        except zres.ZresError:
            pass


def churn(n_agents: int, n_tasks: int, procs: int, threads: int, side: str) -> dict[str, Any]:
    """The agents' slots full and the rest of N_TASKS queued, every agent leaves at once
    (as a fleet restarting) and comes back: how long the broker takes to let them go (each
    one's grants requeued), and to run everything once they are back."""
    with zres.LocalCluster(agents=[], http="127.0.0.1:0") as cluster:
        assert cluster.broker is not None
        fleet = Fleet(cluster, n_agents, procs, "hold", threads, side)
        cluster.wait_for_agents(n_agents, timeout=300)
        with zres.Client(cluster.address) as client:
            futures = client.map(noop, range(n_tasks))
            granted, still = -1, 0.0
            while still < 1.0:  # (until the slots are full: no grant for a second)
                time.sleep(0.25)
                now = fleet.counts()["granted"]
                still = still + 0.25 if now == granted else 0.0
                granted = now
            cpu0, start = cpu_seconds(cluster.broker.pid), time.perf_counter()
            fleet.ask("leave", "left")
            while agents_listed(cluster):
                time.sleep(0.05)
            left, cpu = time.perf_counter() - start, cpu_seconds(cluster.broker.pid) - cpu0
            start = time.perf_counter()
            fleet.ask("join acked", "ready")
            zres.wait(futures)
            back = time.perf_counter() - start
            failed = failures(futures)
            del futures
            status = cluster.status(timeout=60)
        counts = fleet.stop()
    return {"failed": failed, "agents": n_agents, "tasks": n_tasks, "granted_before": granted,
            "leave_s": round(left, 2), "leave_cpu_s": round(cpu, 2),
            "back_s": round(back, 1), "lost": counts.get("lost", 0),
            "longest_turn_ms": round(status["loop"]["longest_turn"] * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="1,100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--answer", choices=["acked", "once"], default="acked")
    parser.add_argument("--procs", type=int, default=1, help="fleet processes")
    parser.add_argument("--threads", type=int, default=2, help="CPUs each agent offers")
    parser.add_argument("--churn", action="store_true",
                        help="also: every agent leaves and comes back with the tasks queued")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--side", choices=["late", "always"], default="late",
                        help="side heartbeats: while the loop's beats go unechoed, as agents "
                             "send them, or every interval, as agents before 2026-11-26 did")
    parser.add_argument("--serve", nargs=8, help=argparse.SUPPRESS)  # (a fleet process)
    args = parser.parse_args()
    if args.serve:
        from fleet_agents import serve  # (bench/, beside this file)
        serve(*args.serve)
        return
    rows = []
    print(f"{'agents':>6} {'lost':>4} {'listed':>6} {'found s':>7} {'echo s':>6} "
          f"{'idle cpu%':>9} "
          f"{'seconds':>8} "
          f"{'cpu us/task':>11} {'net':>6} "
          f"{'msgs/task':>9} {'cpu us/msg':>10} {'sched us/dec':>12} {'us/pass':>8} "
          f"{'longest turn ms':>15}", flush=True)
    for n in [int(s) for s in args.agents.split(",") if s]:
        row = run(n, args.tasks, args.procs, args.answer, args.threads, args.side)
        rows.append(row)
        print(f"{n:>6} {row['lost']:>4} {row['fewest_listed']:>6} "
              f"{row['silent_found_s']:>7} {row['slowest_echo_s']:>6} "
              f"{row['idle_cpu_pct']:>9} "
              f"{row['seconds']:>8} "
              f"{row['cpu_us_per_task']:>11} {row['net_us_per_task']:>6} "
              f"{row['messages_per_task']:>9} "
              f"{row['cpu_us_per_message']:>10} {row['sched_us_per_decision']:>12} "
              f"{row['sched_us_per_pass']:>8} {row['longest_turn_ms']:>15}"
              f"{'  failed: ' + str(row['failed']) if row['failed'] else ''}", flush=True)
    print(f"({args.tasks:,} no-op tasks per size, answered '{args.answer}', side beats "
          f"'{args.side}', fleet in "
          f"{args.procs} process(es), {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()})", flush=True)
    churns = []
    if args.churn:
        print(f"\nchurn: {'agents':>6} {'granted':>8} {'all gone s':>10} {'broker cpu s':>12} "
              f"{'all run s':>9} {'lost':>4} {'longest turn ms':>15}", flush=True)
        for n in [int(s) for s in args.agents.split(",") if s]:
            row = churn(n, args.tasks, args.procs, args.threads, args.side)
            churns.append(row)
            print(f"       {n:>6} {row['granted_before']:>8} {row['leave_s']:>10} "
                  f"{row['leave_cpu_s']:>12} {row['back_s']:>9} {row['lost']:>4} "
                  f"{row['longest_turn_ms']:>15}"
                  f"{'  failed: ' + str(row['failed']) if row['failed'] else ''}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                       "rows": rows, "churn": churns}, fh, indent=1)


if __name__ == "__main__":
    main()
