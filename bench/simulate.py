"""Simulate the pure scheduler at scale, in one process, with no sockets.

    python bench/simulate.py [--quick] [--json out.json]

Runs a discrete-event simulation (tasks have durations; finishing frees resources) and
reports, per scenario: scheduling decisions per second (CPU time spent inside the
scheduler only, so that other work on the machine moves it less), microseconds per
decision, memory per waiting task, and the makespan against a lower bound (the busiest
resource's total work divided by its capacity, or the longest task, whichever is larger).

Scenarios
- seed: the seed cluster, 10 machines (4 with GPU=2), 1,000 tasks (100 GPU=1, 10 GPU=2).
- scale-N-M: N agents with mixed capacities, M tasks with mixed requests, all queued at
  once; run at two sizes so the per-decision cost can be compared as both grow tenfold.
- pipelined-N-M: N CPU agents, M short tasks (1-9 ms, two kinds) queued at once, with
  pipelining on (``prefetch=2``) and the broker's default ``starvation_after``: each
  agent starts its queued grants itself as room frees (in priority order, backfilling)
  and reports each start, as ``zres.agent.running`` does. A pass after every end; and
  (``-turns``) one pass per 0.5 ms of simulated time, taking every end in it first, as the
  broker takes a loop turn's reports before its pass (many slots gain room per pass).
  Also reports the passes, the grants per pass and the reservations made.
- owners-trickle: fair share (issue 28). 20 [4] agents of CPU=8; alice floods 100,000 [20,000]
  tasks of 1-3 s at priority 1000 at t=0; bob submits one task of 1-3 s at priority 1
  every 2 s from t=1, 300 in all. Reports bob's waits (queued to granted), alice's
  makespan and the cost per decision, with fair share (alice and bob own their tasks) and
  without (every task of one owner, as before fair share: bob waits for the flood).
- owners-two-floods: the same, and bob also floods 20,000 [4,000] tasks (priority 0) at
  t=300: the share of the grants made from t=300 to t=600 that each owner got (bob's
  trickle goes ahead of his own flood: priority orders one owner's tasks).
- gangs-N LOAD: gangs (issue 31) on N = 1,000 [100] nodes of GPU=8 CPU=32 for two hours
  [one]: ordinary GPU=1 and CPU=4 tasks arriving at random (busy: ~70% of the GPUs;
  saturated: ~80%), without gangs, and with STRICT_SPREAD gangs of 2-16 whole nodes (~25%
  [30%] more) with reservations (``starvation_after`` 60 s) and without: the GPUs'
  utilisation, the ordinary tasks' and the gangs' waits (``simulate_gangs``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulate_gangs import report, simulate_gangs  # noqa: E402

from zres.core.resources import UNIT, task_request  # noqa: E402
from zres.scheduler.policy import Scheduler  # noqa: E402


def seed_cluster() -> tuple[list[dict[str, float]], list[tuple[dict[str, float], float]]]:
    agents = [{"CPU": 8, "GPU": 2, "MEMORY": 64e9} for _ in range(4)]
    agents += [{"CPU": 8, "MEMORY": 64e9} for _ in range(6)]
    rng = random.Random(1)
    tasks: list[tuple[dict[str, float], float]] = []
    tasks += [({"GPU": 1}, rng.uniform(5, 15)) for _ in range(100)]
    tasks += [({"GPU": 2}, rng.uniform(10, 20)) for _ in range(10)]
    tasks += [({}, rng.uniform(1, 5)) for _ in range(890)]
    rng.shuffle(tasks)
    return agents, tasks


def mixed(n_agents: int, n_tasks: int, seed: int = 7) -> tuple[list[dict[str, float]],
                                                                list[tuple[dict[str, float],
                                                                           float]]]:
    rng = random.Random(seed)
    agents: list[dict[str, float]] = []
    for i in range(n_agents):
        kind = i % 10
        if kind < 3:
            agents.append({"CPU": 16, "GPU": rng.choice([1, 2, 4, 8]), "MEMORY": 256e9})
        elif kind < 4:
            agents.append({"CPU": 64, "MEMORY": 1e12, "licence": 2})
        else:
            agents.append({"CPU": rng.choice([4, 8, 16, 32]), "MEMORY": 64e9})
    shapes = [({}, 0.55), ({"CPU": 2}, 0.1), ({"CPU": 4, "MEMORY": 32e9}, 0.1),
              ({"GPU": 1}, 0.1), ({"GPU": 0.25}, 0.05), ({"GPU": 2}, 0.04),
              ({"MEMORY": 500e9}, 0.03), ({"licence": 1}, 0.03)]
    weights = [w for _, w in shapes]
    tasks = [(dict(rng.choices(shapes, weights)[0][0]), rng.uniform(1, 30))
             for _ in range(n_tasks)]
    return agents, tasks


def lower_bound(agents: list[dict[str, float]], tasks: list[tuple[dict[str, float], float]]
                ) -> float:
    capacity: dict[str, float] = {}
    for agent in agents:
        for name, amount in agent.items():
            capacity[name] = capacity.get(name, 0) + amount
    work: dict[str, float] = {}
    for request, duration in tasks:
        for name, amount in {"CPU": 1, **request}.items():
            work[name] = work.get(name, 0) + amount * duration
    bound = max(work[name] / capacity[name] for name in work)
    return max(bound, max(d for _, d in tasks))


def short_tasks(n_agents: int, n_tasks: int, seed: int = 11
                ) -> tuple[list[dict[str, float]], list[tuple[dict[str, float], float]]]:
    rng = random.Random(seed)
    agents: list[dict[str, float]] = [{"CPU": rng.choice([4, 8, 16]), "MEMORY": 64e9}
                                      for _ in range(n_agents)]
    tasks = [(({} if rng.random() < 0.8 else {"CPU": 2}), rng.uniform(0.001, 0.009))
             for _ in range(n_tasks)]
    return agents, tasks


def simulate(agents: list[dict[str, float]], tasks: list[tuple[dict[str, float], float]]
             ) -> dict[str, Any]:
    sched = Scheduler(starvation_after=60.0)
    for slot, agent in enumerate(agents):
        sched.add_slot(slot, f"agent-{slot}", {n: round(a * UNIT) for n, a in agent.items()})
    durations = {}
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for task_id, (request, duration) in enumerate(tasks):
        sched.enqueue(task_id, task_request(request), 0, 0.0)
        durations[task_id] = duration
    per_waiting = (tracemalloc.get_traced_memory()[0] - before) / len(tasks)
    tracemalloc.stop()
    now, decisions, spent = 0.0, 0, 0.0
    finishing: list[tuple[float, int]] = []
    while sched.waiting or finishing:
        started = time.process_time()
        grants = sched.schedule(now)
        spent += time.process_time() - started
        decisions += len(grants)
        for grant in grants:
            heapq.heappush(finishing, (now + durations[grant.task], grant.task))
        if not finishing:
            raise RuntimeError(f"{len(sched.waiting)} tasks can never run")
        now, task_id = heapq.heappop(finishing)
        started = time.process_time()
        sched.release(task_id)
        while finishing and finishing[0][0] == now:
            sched.release(heapq.heappop(finishing)[1])
        spent += time.process_time() - started
    bound = lower_bound(agents, tasks)
    return {"agents": len(agents), "tasks": len(tasks), "decisions": decisions,
            "decisions_per_s": decisions / spent, "us_per_decision": spent / decisions * 1e6,
            "bytes_per_waiting_task": per_waiting, "makespan": now, "lower_bound": bound,
            "makespan_ratio": now / bound}


def simulate_pipelined(agents: list[dict[str, float]],
                       tasks: list[tuple[dict[str, float], float]],
                       prefetch: int = 2, starvation_after: float = 5.0,
                       turn: float = 0.0) -> dict[str, Any]:
    """Run TASKS with pipelining: grants queue on slots, and each agent starts what fits.

    TURN: what ends within this many (simulated) seconds is reported together, before one
    pass, as the broker takes every report of a loop turn before its pass (0: a pass after
    each end)."""
    sched = Scheduler(starvation_after=starvation_after, prefetch=prefetch)
    for slot, agent in enumerate(agents):
        sched.add_slot(slot, f"agent-{slot}", {n: round(a * UNIT) for n, a in agent.items()})
    durations: dict[int, float] = {}
    kinds: dict[int, str] = {}
    for task_id, (request, duration) in enumerate(tasks):
        kinds[task_id] = kind = "big" if request else "small"
        sched.enqueue(task_id, task_request(request), 0, 0.0, kind=kind)
        durations[task_id] = duration
    now, decisions, spent, passes, reserved = 0.0, 0, 0.0, 0, set()
    finishing: list[tuple[float, int]] = []
    waiting_on: dict[int, list[int]] = {}  # slot -> queued grants, as its agent holds them

    def agent_starts(slot_id: int) -> float:
        """Start SLOT_ID's queued grants that fit now, in order; return the time spent in
        the scheduler."""
        slot = sched.slots[slot_id]
        order = waiting_on.get(slot_id, [])
        order.sort(key=lambda t: (-sched.running[t].priority, sched.running[t].seq))
        took = 0.0
        for task in list(order):
            grant = sched.running[task]
            if all(slot.free.get(n, 0) >= a for n, a in grant.taken.items()):
                order.remove(task)
                started = time.process_time()
                sched.started(task)
                took += time.process_time() - started
                heapq.heappush(finishing, (now + durations[task], task))
        return took

    while sched.waiting or finishing:
        # (short tasks that turned long stop counting as short, as the broker's turns
        # have them; the grants it would ask back stay queued here: recalls are not played)
        sched.overdue(now)
        if sched.needs_pass():
            started = time.process_time()
            grants = sched.schedule(now)
            spent += time.process_time() - started
            passes += 1
            decisions += len(grants)
            reserved.update(sched._reserved)  # (a few slots at most)
            touched = set()
            for grant in grants:
                if grant.started:
                    heapq.heappush(finishing, (now + durations[grant.task], grant.task))
                else:
                    waiting_on.setdefault(grant.slot, []).append(grant.task)
                    touched.add(grant.slot)
            for slot_id in sorted(touched):
                spent += agent_starts(slot_id)
        if not finishing:
            raise RuntimeError(f"{len(sched.waiting)} tasks can never run")
        now = finishing[0][0]
        until = now + turn
        ended = set()
        while finishing and finishing[0][0] <= until:
            now = finishing[0][0]
            _, task_id = heapq.heappop(finishing)
            slot_id = sched.running[task_id].slot
            started = time.process_time()
            sched.release(task_id)
            sched.finished(kinds[task_id], durations[task_id])
            spent += time.process_time() - started
            ended.add(slot_id)
        for slot_id in sorted(ended):
            spent += agent_starts(slot_id)
    return {"agents": len(agents), "tasks": len(tasks), "decisions": decisions,
            "decisions_per_s": decisions / spent, "us_per_decision": spent / decisions * 1e6,
            "passes": passes, "grants_per_pass": decisions / passes,
            "reservations": len(reserved), "makespan": now,
            "lower_bound": lower_bound(agents, tasks),
            "makespan_ratio": now / lower_bound(agents, tasks)}


def simulate_owners(flood: int, bob_flood: int = 0, fair: bool = True, agents: int = 20,
                    cpus: int = 8) -> dict[str, Any]:
    """Alice's FLOOD at t=0, bob's trickle (a task every 2 s) and, with BOB_FLOOD, bob's
    own flood at t=300 (see the module's docstring). FAIR=False: no owners given."""
    sched = Scheduler(starvation_after=60.0)
    for slot in range(agents):
        sched.add_slot(slot, f"agent-{slot}", {"CPU": cpus * UNIT})
    rng = random.Random(5)
    durations: dict[int, float] = {}
    owner_of: dict[int, str] = {}
    queued_at: dict[int, float] = {}
    spent = 0.0

    def enqueue(task: int, owner: str, priority: int, now: float) -> None:
        nonlocal spent
        owner_of[task], queued_at[task] = owner, now
        durations[task] = rng.uniform(1, 3)
        started = time.process_time()
        sched.enqueue(task, task_request({}), priority, now, owner=owner if fair else "")
        spent += time.process_time() - started

    for task in range(flood):
        enqueue(task, "alice", 1000, 0.0)
    trickle = set(range(flood, flood + 300))
    arrivals = [(1.0 + 2.0 * i, task) for i, task in enumerate(sorted(trickle))]
    arrivals += [(300.0, flood + 300 + i) for i in range(bob_flood)]
    arrivals.sort()
    finishing: list[tuple[float, int]] = []
    now, decisions, arrived, waits = 0.0, 0, 0, []
    granted = {"alice": 0, "bob": 0}  # from t=300 to t=600
    while sched.waiting or finishing or arrived < len(arrivals):
        while arrived < len(arrivals) and arrivals[arrived][0] <= now:
            task = arrivals[arrived][1]
            enqueue(task, "bob", 1 if task in trickle else 0, now)
            arrived += 1
        started = time.process_time()
        grants = sched.schedule(now)
        spent += time.process_time() - started
        decisions += len(grants)
        for grant in grants:
            heapq.heappush(finishing, (now + durations[grant.task], grant.task))
            if grant.task in trickle:
                waits.append(now - queued_at[grant.task])
            if 300.0 <= now < 600.0:
                granted[owner_of[grant.task]] += 1
        upcoming = [finishing[0][0]] if finishing else []
        if arrived < len(arrivals):
            upcoming.append(arrivals[arrived][0])
        now = min(upcoming)
        started = time.process_time()
        while finishing and finishing[0][0] <= now:
            sched.release(heapq.heappop(finishing)[1], now)
        spent += time.process_time() - started
    waits.sort()
    total = sum(granted.values()) or 1
    return {"fair": fair, "agents": agents, "tasks": len(durations), "decisions": decisions,
            "us_per_decision": spent / decisions * 1e6, "makespan": now,
            "bob_wait_p50": waits[len(waits) // 2], "bob_wait_p95": waits[len(waits) * 95 // 100],
            "bob_wait_max": waits[-1],
            "share_300_600": {o: round(n / total, 3) for o, n in granted.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller scale runs")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--only", choices=["plain", "pipelined", "owners", "gangs"],
                        help="run only these scenarios (default: all)")
    args = parser.parse_args()
    scale = [(100, 10_000), (1_000, 100_000)] if not args.quick else [(30, 3_000),
                                                                      (300, 30_000)]
    runs: dict[str, dict[str, Any]] = {}
    if args.only in (None, "plain"):
        runs["seed"] = simulate(*seed_cluster())
        for n_agents, n_tasks in scale:
            runs[f"scale-{n_agents}-{n_tasks}"] = simulate(*mixed(n_agents, n_tasks))
    if args.only in (None, "pipelined"):
        for n_agents, n_tasks in scale:
            runs[f"pipelined-{n_agents}-{n_tasks}"] = simulate_pipelined(
                *short_tasks(n_agents, n_tasks))
            runs[f"pipelined-{n_agents}-{n_tasks}-turns"] = simulate_pipelined(
                *short_tasks(n_agents, n_tasks), turn=0.0005)
    owners: dict[str, dict[str, Any]] = {}
    if args.only in (None, "owners"):
        flood, second, agents = (100_000, 20_000, 20) if not args.quick else (20_000, 4_000, 4)
        for fair in (False, True):
            label = "fair" if fair else "no owners"
            owners[f"owners-trickle ({label})"] = simulate_owners(flood, 0, fair, agents)
            owners[f"owners-two-floods ({label})"] = simulate_owners(flood, second, fair,
                                                                     agents)
    gangs: dict[str, dict[str, Any]] = {}
    if args.only in (None, "gangs"):
        nodes, horizon = (1_000, 7_200.0) if not args.quick else (100, 3_600.0)
        for load in ("busy", "saturated"):
            for label, with_gangs, reserve in (("no gangs", False, True),
                                               ("gangs, reservations", True, True),
                                               ("gangs, no reservations", True, False)):
                gangs[f"gangs-{nodes} {load} ({label})"] = simulate_gangs(
                    nodes, horizon, with_gangs, reserve, load)
    if runs:
        print(f"{'scenario':<30}{'decisions/s':>13}{'us/decision':>13}{'B/waiting':>11}"
              f"{'makespan':>10}{'bound':>9}{'ratio':>7}")
    for name, r in runs.items():
        waiting = r.get("bytes_per_waiting_task")
        print(f"{name:<30}{r['decisions_per_s']:>13,.0f}{r['us_per_decision']:>13.1f}"
              f"{'-' if waiting is None else f'{waiting:,.0f}':>11}{r['makespan']:>10.2f}"
              f"{r['lower_bound']:>9.2f}{r['makespan_ratio']:>7.2f}")
    for name, r in runs.items():
        if "passes" in r:
            print(f"{name}: {r['passes']:,} passes, {r['grants_per_pass']:.1f} grants per "
                  f"pass, {r['reservations']} reservations")
    if owners:
        print(f"\n{'scenario':<32}{'us/decision':>12}{'makespan':>10}"
              f"{'bob trickle waits: p50':>24}{'p95':>11}{'max':>11}   share t=300-600")
    for name, r in owners.items():
        share = ", ".join(f"{o} {v:.0%}" for o, v in r["share_300_600"].items())
        print(f"{name:<32}{r['us_per_decision']:>12.1f}{r['makespan']:>10.0f}"
              f"{r['bob_wait_p50']:>23.3f}s{r['bob_wait_p95']:>10.3f}s"
              f"{r['bob_wait_max']:>10.3f}s   {share}")
    if gangs:
        report(gangs)
    if args.json:
        Path(args.json).write_text(json.dumps({**runs, **owners, **gangs}, indent=2))


if __name__ == "__main__":
    main()
