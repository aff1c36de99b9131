"""Gangs in the pure scheduler at scale: what multi-node gangs cost the ordinary tasks
around them, with and without reservations (run by ``simulate.py``; see its docstring).

A stream of ordinary tasks (GPU=1 for 1-10 minutes, CPU=4 for 0.5-5 minutes) arrives at
random over the horizon, and, with gangs, a stream of STRICT_SPREAD gangs of 2, 4, 8 or
16 bundles of GPU=8 CPU=8 (a whole 8-GPU node each: multi-node training jobs) running 10
to 50 minutes; two loads (``LOADS``): busy (ordinary tasks would keep 70% of the GPUs
busy, gangs 25% more) and saturated (80% and 30%: more than the cluster has). Each event
(arrivals, ends) is followed by one pass. Reported: the GPUs' utilisation over the horizon
(after the first 10 minutes), the ordinary tasks' waits from arrival to grant (p50, p95,
max; those still waiting at the end count as waiting till then), the gangs' waits, and
how many gangs never started.
"""

from __future__ import annotations

import heapq
import random
import time
from typing import Any

from zres.core.resources import UNIT, task_request
from zres.scheduler.policy import Scheduler

WARMUP = 600.0  # seconds left out of the utilisation


LOADS = {"busy": (0.70, 0.25), "saturated": (0.80, 0.30)}  # GPUs' share: ordinary, gangs


def workload(agents: int, horizon: float, gangs: bool, load: str = "busy", seed: int = 31
             ) -> list[tuple[float, str, Any, float]]:
    """(arrival, kind, request, seconds) events: kind "gpu", "cpu" or "gang" (request:
    its bundle count). LOAD (``LOADS``): what share of the GPUs ordinary tasks and gangs
    would keep busy ("saturated": more than all of them, so queues grow)."""
    ordinary, ganged = LOADS[load]
    rng = random.Random(seed)
    gpus = agents * 8
    events: list[tuple[float, str, Any, float]] = []
    rate = ordinary * gpus / 330.0  # GPU=1 tasks a second, 330 s long on average
    now = 0.0
    while now < horizon:
        now += rng.expovariate(rate)
        events.append((now, "gpu", {"GPU": 1}, rng.uniform(60, 600)))
    now = 0.0
    while now < horizon:  # CPU work beside (CPU=32 a node: ~30% of it)
        now += rng.expovariate(0.3 * agents * 32 / 4 / 165.0)
        events.append((now, "cpu", {"CPU": 4}, rng.uniform(30, 300)))
    if gangs:
        sizes = [n for n in (2, 4, 8, 16) if n <= agents // 4] or [2]
        mean = sum(sizes) / len(sizes) * 8 * 1800.0  # GPU-seconds a gang
        now = 0.0
        while now < horizon:
            now += rng.expovariate(ganged * gpus / mean)
            events.append((now, "gang", rng.choice(sizes), rng.uniform(600, 3000)))
    events.sort(key=lambda e: e[0])
    return events


def simulate_gangs(agents: int, horizon: float, gangs: bool, reservations: bool,
                   load: str = "busy") -> dict[str, Any]:
    """Run the LOAD workload on AGENTS nodes of GPU=8 CPU=32 until HORIZON seconds."""
    sched = Scheduler(starvation_after=60.0 if reservations else float("inf"))
    for slot in range(agents):
        sched.add_slot(slot, f"node-{slot}", {"GPU": 8 * UNIT, "CPU": 32 * UNIT})
    events = workload(agents, horizon, gangs, load)
    durations: dict[int, float] = {}
    kinds: dict[int, str] = {}
    arrived: dict[int, float] = {}
    gang_of: dict[int, int] = {}        # bundle grant id -> its gang
    bundles: dict[int, list[int]] = {}  # gang -> its bundle ids
    waits: dict[str, list[float]] = {"gpu": [], "cpu": [], "gang": []}
    finishing: list[tuple[float, int]] = []
    next_id, index, now, spent, decisions = 1, 0, 0.0, 0.0, 0
    busy, busy_since, busy_seconds = 0, WARMUP, 0.0

    def account(at: float) -> None:
        nonlocal busy_since, busy_seconds
        if at > busy_since:
            busy_seconds += busy * (at - busy_since)
            busy_since = at

    while now < horizon:
        while index < len(events) and events[index][0] <= now:
            at, kind, request, seconds = events[index]
            index += 1
            task = next_id
            next_id += 1
            arrived[task], kinds[task], durations[task] = at, kind, seconds
            started = time.process_time()
            if kind == "gang":
                ids = list(range(next_id, next_id + request))
                next_id += request
                bundles[task] = ids
                for bundle in ids:
                    gang_of[bundle] = task
                sched.add_gang(task, [task_request({"GPU": 8, "CPU": 8})] * request,
                               "STRICT_SPREAD", ids)
            else:
                sched.enqueue(task, task_request(request), 0, at, kind=kind)
            spent += time.process_time() - started
        started = time.process_time()
        grants = sched.schedule(now)
        spent += time.process_time() - started
        decisions += len(grants)
        account(now)
        for grant in grants:
            busy += grant.units.get("GPU", 0) // UNIT
            if grant.bundle is not None:
                gang = grant.bundle[0]
                if grant.bundle[1] == 0:
                    waits["gang"].append(now - arrived[gang])
                    heapq.heappush(finishing, (now + durations[gang], gang))
            else:
                waits[kinds[grant.task]].append(now - arrived[grant.task])
                heapq.heappush(finishing, (now + durations[grant.task], grant.task))
        upcoming = [horizon]
        if finishing:
            upcoming.append(finishing[0][0])
        if index < len(events):
            upcoming.append(events[index][0])
        now = min(upcoming)
        account(now)
        started = time.process_time()
        while finishing and finishing[0][0] <= now:
            task = heapq.heappop(finishing)[1]
            if task in bundles:
                busy -= 8 * len(bundles[task])
                sched.remove_gang(task, now=now)
            else:
                busy -= sched.running[task].units.get("GPU", 0) // UNIT
                sched.release(task, now)
                sched.finished(kinds[task], durations[task])
        spent += time.process_time() - started
    for task in sched.waiting:  # (still waiting at the end: waited till then)
        waits[kinds[task]].append(horizon - arrived[task])
    never = sum(1 for task in sched.waiting if kinds[task] == "gang")
    out: dict[str, Any] = {
        "agents": agents, "horizon": horizon, "load": load, "gangs": gangs,
        "reservations": reservations,
        "gpu_utilisation": busy_seconds / (agents * 8 * (horizon - WARMUP)),
        "decisions": decisions, "us_per_decision": spent / max(decisions, 1) * 1e6,
        "gangs_never_started": never}
    for kind, values in waits.items():
        values.sort()
        if values:
            out[f"{kind}_wait_p50"] = values[len(values) // 2]
            out[f"{kind}_wait_p95"] = values[len(values) * 95 // 100]
            out[f"{kind}_wait_max"] = values[-1]
            out[f"{kind}_count"] = len(values)
    return out


def report(runs: dict[str, dict[str, Any]]) -> None:
    """Print the gang runs as a table."""
    print(f"\n{'scenario':<44}{'GPU util':>9}{'GPU=1 wait p50':>15}{'p95':>9}{'max':>9}"
          f"{'CPU=4 p95':>10}{'gang wait p50':>14}{'max':>9}{'never':>6}{'us/dec':>8}")
    for name, r in runs.items():
        gang = (f"{r['gang_wait_p50']:>13.0f}s{r['gang_wait_max']:>8.0f}s"
                if "gang_wait_p50" in r else f"{'-':>14}{'-':>9}")
        print(f"{name:<44}{r['gpu_utilisation']:>9.1%}{r['gpu_wait_p50']:>14.1f}s"
              f"{r['gpu_wait_p95']:>8.0f}s{r['gpu_wait_max']:>8.0f}s"
              f"{r['cpu_wait_p95']:>9.0f}s{gang}{r['gangs_never_started']:>6}"
              f"{r['us_per_decision']:>8.1f}")
