"""Latency (or throughput) of two zres source trees, measured side by side: both clusters up
at once, timed in alternating batches of sequential submit-then-result calls (``--map N``:
of one map of N no-op tasks each, gathered).

On a shared two-core virtual machine the same code's median latency drifts by 30% and more
over minutes, so two runs one after the other compare the machine's moments as much as the
code. Here each batch of one tree is followed by a batch of the other (the order swapped
every round), so both see the same moments; the figure to read is how many rounds the
second tree won and the ratio of the medians.

    python bench/paired.py OLD_TREE NEW_TREE [--rounds 20] [--batch 50] [--pre N] [--map N]
                                             [--sleep MS]

Each tree is a checkout of zres (``git worktree add /tmp/old REV``); its cluster and its
client run that tree's code (it is put first on PYTHONPATH, and LocalCluster starts its
processes from it). The cluster is the one ``compare.py`` times: a broker and two agents of
``slot=2``, two threads, keys on, a state directory. ``--pre N`` first runs a map of N
no-op tasks on each (as compare.py's latency follows its throughput runs). ``--sleep MS``:
each task sleeps MS milliseconds rather than returning at once (what a change costs work
that is not a no-op).

A tree given as ``ray`` is Ray instead, its cluster as compare.py starts it (run from the
peers' environment, see compare.py): zres against Ray at the same moments, which
compare.py, timing one system after the other minutes apart, cannot give. Each side then
runs beside the other's idle cluster (Ray's idle processes take more of the two cores than
zres's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Each side's process: its cluster, ONE(i) (a task's round trip) and MANY(n) (a map of N,
# gathered), then _TIMED: batches timed as the parent asks, until it says 0.
_TIMED = """
def timed():
    print("ready", flush=True)
    for line in sys.stdin:
        count = int(line)
        if not count:
            break
        times = []
        for i in range(count):
            start = time.perf_counter()
            if mapped:  # (the time of one task, in a map of MAPPED)
                many(mapped)
                times.append((time.perf_counter() - start) / mapped)
            else:
                one(i)
                times.append(time.perf_counter() - start)
        print(json.dumps(times), flush=True)
"""

_CHILD = _TIMED + """
import json, sys, time
import zres
pre, mapped, nap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def noop(x):
    if nap:
        time.sleep(nap)
    return x

with zres.LocalCluster(agents=[{"slot": 2}] * 2, nthreads=2) as cluster:
    with zres.Client(cluster.address) as client:
        def one(i):
            client.gather([client.submit(noop, i)])

        def many(n):
            client.gather(client.map(noop, range(n)))
        for i in range(50):
            one(i)
        if pre:
            many(pre)
        timed()
"""

# Ray's side (a TREE of "ray"): the cluster compare.py starts for Ray, timed the same way.
_RAY_CHILD = _TIMED + """
import json, sys, time
import ray
from ray.cluster_utils import Cluster
pre, mapped, nap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def noop(x):
    if nap:
        time.sleep(nap)
    return x

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
for _ in range(2):
    cluster.add_node(num_cpus=2, resources={"slot": 2})
ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
cluster.wait_for_nodes()
task = ray.remote(noop)

def one(i):
    ray.get([task.remote(i)])

def many(n):
    ray.get([task.remote(i) for i in range(n)])
for i in range(50):
    one(i)
if pre:
    many(pre)
timed()
ray.shutdown()
cluster.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, metavar="TREE")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--pre", type=int, default=0)
    parser.add_argument("--map", type=int, default=0, help="time maps of N tasks instead")
    parser.add_argument("--sleep", type=float, default=0.0, metavar="MS",
                        help="each task sleeps MS milliseconds (not a no-op)")
    args = parser.parse_args()
    trees = [tree if tree == "ray" else os.path.abspath(tree) for tree in args.trees]
    children = {}
    for tree in trees:
        ray = tree == "ray"
        children[tree] = subprocess.Popen(
            [sys.executable, "-c", _RAY_CHILD if ray else _CHILD, str(args.pre), str(args.map),
             str(args.sleep / 1000)],
            cwd=None if ray else tree, text=True,
            env=os.environ if ray else {**os.environ, "PYTHONPATH": tree},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=ray)
    try:
        for tree, child in children.items():
            assert child.stdout is not None
            line = child.stdout.readline()
            while line and line.strip() != "ready":  # (Ray may say more as it starts)
                line = child.stdout.readline()
            if not line:
                sys.exit(f"paired.py: the cluster of {tree} did not start")
        times: dict[str, list[float]] = {tree: [] for tree in trees}
        medians: dict[str, list[float]] = {tree: [] for tree in trees}
        began = time.monotonic()
        for round_ in range(args.rounds):
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                child = children[tree]
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write(f"{args.batch}\n")
                child.stdin.flush()
                batch = json.loads(child.stdout.readline())
                times[tree] += batch
                medians[tree].append(statistics.median(batch))
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.write("0\n")
                child.stdin.close()
            child.wait(60)
    first, second = trees
    for tree in trees:
        ordered = sorted(times[tree])
        print(f"{tree}: median {statistics.median(ordered) * 1e3:.3f} ms, "
              f"p10 {ordered[len(ordered) // 10] * 1e3:.3f}, "
              f"p90 {ordered[len(ordered) * 9 // 10] * 1e3:.3f}, "
              f"p99 {ordered[int(len(ordered) * 0.99)] * 1e3:.3f} ({len(ordered)} calls)")
    won = sum(b < a for a, b in zip(medians[first], medians[second]))
    ratio = statistics.median(times[second]) / statistics.median(times[first])
    print(f"the second tree's batch median was lower in {won} of {args.rounds} rounds; "
          f"second / first median: {ratio:.3f} ({time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
