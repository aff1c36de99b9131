"""How long zres's processes take to start, for one source tree or several side by side.

Every test, every ``zres`` command a user types, every agent's worker process and every
client program pays its start: Python's own, then zres's imports. The test suite starts
thousands of them (most of its CPU time on two cores), so what a module imports at its top
is a cost, not a detail. Timed here as Python does it (``python -c "import M"``, and one
command run to its end), the best of ``--runs`` each, the trees alternating so that they
see the same moments of a machine whose speed drifts.

    python bench/startup.py TREE [TREE ...] [--runs 9]

Each tree is a checkout of zres (``git worktree add /tmp/old REV``); its modules are
compiled first, as an installed package's are.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import time

# What each kind of process imports before it does anything (a broker and an agent import
# structlog too once they emit their first log record, at the level they were given).
STARTS = [
    ("python alone", ["-c", "pass"]),
    ("worker process", ["-c", "import zres.agent.worker"]),
    ("agent", ["-c", "import zres.agent.daemon"]),
    ("broker", ["-c", "import zres.broker.server"]),
    ("client program", ["-c", "import zres; zres.Client"]),
    ("zres jobs --help", ["-m", "zres", "jobs", "--help"]),
    ("zres --version", ["-m", "zres", "--version"]),
    # What a test or a notebook pays for a cluster of its own: all three processes started
    # (broker, agent, worker), one task, all stopped.
    ("a LocalCluster", ["-c", "import zres\nwith zres.LocalCluster() as c:\n"
                        "    with zres.Client(c.address) as client:\n"
                        "        client.submit(int, 1).result()"]),
]


def start(tree: str, args: list[str]) -> float:
    """Seconds one start of ``python ARGS`` takes, with TREE's zres."""
    began = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="zres source trees")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    trees = [os.path.abspath(t) for t in args.trees]
    for tree in trees:
        compileall.compile_dir(os.path.join(tree, "zres"), quiet=2)
    print(f"best of {args.runs} starts, ms: " + " | ".join(trees))
    for name, command in STARTS:
        times = {t: float("inf") for t in trees}
        for _ in range(args.runs):  # (alternating: one start of each tree in turn)
            for tree in trees:
                times[tree] = min(times[tree], start(tree, command))
        print(f"{name:18} " + "  ".join(f"{times[t] * 1000:7.1f}" for t in trees))


if __name__ == "__main__":
    main()
