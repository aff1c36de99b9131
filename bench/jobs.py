"""Command jobs in bulk: how fast ``zres submit --file`` queues N jobs with no agent up, and
how fast one agent that then joins runs them all.

    python bench/jobs.py [--jobs 1000] [--repeats 3] [--json out.json]

Each job is ``true I``: a process started, followed and ended by the agent, its log written.
The cluster is a ``LocalCluster`` (keys on, a state directory) with no agent; one agent of
``CPU=2``, memory limits off (a cgroup made and /proc read per job would be measured
instead), joins once every job is queued. Printed: seconds to queue and jobs a second,
seconds to run them all and jobs a second, best of the repeats (a fresh cluster each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zres  # noqa: E402


def zres_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "zres", *args], env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"zres {args[0]} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def one_run(n: int) -> tuple[float, float]:
    """Seconds to queue N jobs, and to run them once an agent joins."""
    with tempfile.TemporaryDirectory() as tmp, zres.LocalCluster(agents=[]) as cluster:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
        env.update(ZRES_BROKER=cluster.address, ZRES_KEYS=str(cluster.keys))
        lines = Path(tmp) / "jobs.txt"
        lines.write_text("".join(f"true {i}\n" for i in range(n)))
        began = time.perf_counter()
        ids = zres_cli(env, "submit", "--file", str(lines)).split()
        queued = time.perf_counter() - began
        assert len(set(ids)) == n, f"{len(set(ids))} ids for {n} jobs"
        began = time.perf_counter()
        cluster.add_agent({"CPU": 2}, name="late", extra_args=["--memory-limits", "off"])
        zres_cli(env, "wait", *ids)
        return queued, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    runs = [one_run(args.jobs) for _ in range(args.repeats)]
    queued = min(r[0] for r in runs)
    ran = min(r[1] for r in runs)
    print(f"{args.jobs:,} jobs queued (zres submit --file, no agent up): {queued:.2f} s, "
          f"{args.jobs / queued:,.0f} jobs/s")
    print(f"run by one agent of CPU=2 that joins then: {ran:.2f} s, {args.jobs / ran:,.0f} "
          f"jobs/s (best of {args.repeats}; every run: "
          + ", ".join(f"{q:.2f} + {r:.2f} s" for q, r in runs) + ")")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"jobs": args.jobs, "queue_seconds": queued, "run_seconds": ran,
             "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
