"""Simulate the pure scheduler at scale, in one process, with no sockets.

    python bench/simulate.py [--quick] [--json out.json]

Runs a discrete-event simulation (tasks have durations; finishing frees resources) and
reports, per scenario: scheduling decisions per second (wall time spent inside the
scheduler only), microseconds per decision, memory per waiting task, and the makespan
against a lower bound (the busiest resource's total work divided by its capacity, or the
longest task, whichever is larger).

Scenarios
- seed: the seed cluster, 10 machines (4 with GPU=2), 1,000 tasks (100 GPU=1, 10 GPU=2).
- scale-N-M: N agents with mixed capacities, M tasks with mixed requests, all queued at
  once; run at two sizes so the per-decision cost can be compared as both grow tenfold.
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
        started = time.perf_counter()
        grants = sched.schedule(now)
        spent += time.perf_counter() - started
        decisions += len(grants)
        for grant in grants:
            heapq.heappush(finishing, (now + durations[grant.task], grant.task))
        if not finishing:
            raise RuntimeError(f"{len(sched.waiting)} tasks can never run")
        now, task_id = heapq.heappop(finishing)
        started = time.perf_counter()
        sched.release(task_id)
        while finishing and finishing[0][0] == now:
            sched.release(heapq.heappop(finishing)[1])
        spent += time.perf_counter() - started
    bound = lower_bound(agents, tasks)
    return {"agents": len(agents), "tasks": len(tasks), "decisions": decisions,
            "decisions_per_s": decisions / spent, "us_per_decision": spent / decisions * 1e6,
            "bytes_per_waiting_task": per_waiting, "makespan": now, "lower_bound": bound,
            "makespan_ratio": now / bound}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller scale runs")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    scale = [(100, 10_000), (1_000, 100_000)] if not args.quick else [(30, 3_000),
                                                                      (300, 30_000)]
    runs = {"seed": simulate(*seed_cluster())}
    for n_agents, n_tasks in scale:
        runs[f"scale-{n_agents}-{n_tasks}"] = simulate(*mixed(n_agents, n_tasks))
    print(f"{'scenario':<20}{'decisions/s':>13}{'us/decision':>13}{'B/waiting':>11}"
          f"{'makespan':>10}{'bound':>9}{'ratio':>7}")
    for name, r in runs.items():
        print(f"{name:<20}{r['decisions_per_s']:>13,.0f}{r['us_per_decision']:>13.1f}"
              f"{r['bytes_per_waiting_task']:>11,.0f}{r['makespan']:>10.1f}"
              f"{r['lower_bound']:>9.1f}{r['makespan_ratio']:>7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
