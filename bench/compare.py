"""Run zres, Dask distributed and Ray on the same workloads, on this machine, in one run.

    python3 -m venv /work/venv-peers
    /work/venv-peers/bin/pip install -e . -r bench/requirements.txt
    /work/venv-peers/bin/python bench/compare.py [--quick] [--json out.json]
                                                 [--systems zres,dask,ray] [--repeats N]

The peers are not dependencies of zres: they are in bench/requirements.txt. A system whose
library is missing is shown as "not installed"; one that fails to start or run is shown as
"unavailable: <reason>" (or "error: ..." for a single figure), never a crash.

Cluster shape, the same for each system: a scheduler process plus two worker nodes that
each run two tasks at a time, all on this machine, started afresh by this script.
- zres: ``zres.LocalCluster(agents=[{"slot": 2}] * 2, nthreads=2)``: a broker and two
  agents, each with one worker process of two threads; as LocalCluster does by default,
  its clients and agents reach the broker through a unix socket (CURVE as over TCP). A
  reader on a holder's host (all of them, here) reads its results in place (the agent
  passes the file: no socket, no encryption); ``zres-network`` (not run by default) puts
  the broker on loopback TCP and sets ``ZRES_LOCAL_READS=never``, so every message
  crosses TCP and every byte the agents' data ports, encrypted, as between hosts;
  ``zres-insecure`` and ``zres-network-insecure`` are the same without keys.
- Dask: ``dask scheduler`` and two ``dask worker --nthreads 2 --resources slot=2`` (each a
  nanny and its worker process). The command line rather than ``distributed.LocalCluster``,
  whose scheduler would live inside the client's process: this way every system's scheduler
  is a process of its own, and its memory can be counted apart from the client's.
- Ray: ``ray.cluster_utils.Cluster``: a head node with ``num_cpus=0`` (GCS and a raylet,
  running no tasks) and two nodes with ``num_cpus=2, resources={"slot": 2}``. Ray runs a
  worker process per CPU rather than threads; the head also starts Ray's dashboard, log
  monitor and autoscaler monitor, and each node a dashboard agent and a runtime-env agent,
  all counted in its memory. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray on loopback
  (otherwise it advertises the machine's own address).

Workloads, per system (quick mode's sizes in brackets):
1. throughput: 10,000 [2,000] no-op tasks submitted at once (``map``), time to all results;
2. the same, each task asking ``slot=1`` on workers offering ``slot=2``;
3. latency: 1,000 [200] sequential submit-then-result calls, median and p99;
4. dependencies: a chain of 1,000 [300] tasks (each takes the previous one's future), and
   1,000 [500] no-op results fanned into one task (``total(*futures)``);
5. data: 100 [20] tasks returning 10 MB of bytes each, gathered to the client (timed from
   their submit, and again from when all are made: the moving alone, since on a machine of
   few cores making and storing the values shares the cores with moving them); the same as
   NumPy arrays (which pickle protocol 5 can move without copies, unlike bytes); and 100
   [20] bytes tasks each passed to a dependent task returning its length (submitted at
   once; MB/s of blobs consumed, whether or not the bytes had to move);
6. start-up: from no processes to the first result (the client library already imported),
   and the summed resident memory of the cluster's processes (scheduler, agents or nodes,
   and their worker processes: every descendant of the benchmark process but itself) after
   a 200-task warm-up and a second of idling;
7. the floor: a bare pyzmq ROUTER-DEALER echo between two processes over tcp loopback
   (median round trip) and the bandwidth of 10 MB messages, so each system's latency and
   bandwidth can be read as a multiple of what the transport costs; and the same through two
   bare forwarding processes, the three links a zres task and result cross (client, broker,
   agent, worker), so zres's figures can be read against the floor of its own topology; and
   the direct bandwidth once more with each message kept as ``bytes`` to the end, as a
   gather of ``bytes`` results must (a copy into new memory that stays held): the most any
   system could gather them at here, with no task, no scheduler and one link; and one link
   with CURVE (a fresh key pair), plain and kept as bytes: with keys (the default) a zres
   result crosses one such link, from the agent holding it to whoever reads it.

Each system runs in a subprocess of its own (new session, killed whole afterwards), one
after another, never two at once, on one cluster after the start-up figures and an untimed
warm-up of 1,000 [500] no-op tasks. Each workload runs up to ``--repeats`` times (full: 3,
quick: 2), fewer where the runs so far plus one more would pass 20 s [4 s], and the best
run is kept (highest rate, shortest time; for latency the run with the lowest median, with
its own p99); start-up and memory are the lowest over 2 [1] fresh clusters. Every sample
is in the JSON. A system still running when its time is up (240 s [60 s], and the whole
comparison 590 s [115 s]) is stopped and what it finished is shown. On two cores numbers
are noisy: compare runs of one machine, and read the samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

BLOB_SIZE = 10_000_000          # bytes per data task (10 MB)
MB = 1e6                        # bandwidth unit
MIB = 1024 * 1024               # memory unit
# zres-insecure: zres without keys (no CURVE): what encryption costs; zres-network: TCP to
# the broker, no reads in place, every byte over the data ports (as between hosts). Not run
# by default.
ZRES_VARIANTS = ("zres-insecure", "zres-network", "zres-network-insecure")
SYSTEMS = ("zres", "dask", "ray", *ZRES_VARIANTS)
DEFAULT_SYSTEMS = ("zres", "dask", "ray")
MODULES = {"zres": "zres", "dask": "distributed", "ray": "ray",
           **{name: "zres" for name in ZRES_VARIANTS}}
PACKAGES = dict(MODULES)


@dataclasses.dataclass(frozen=True)
class Sizes:
    tasks: int          # throughput tasks
    latency: int        # sequential round trips
    chain: int          # tasks in the dependency chain
    fan_in: int         # results fanned into one task
    blobs: int          # 10 MB results
    echo: int           # bare zmq round trips
    warmup: int         # no-op tasks run once, untimed, before the workloads
    repeats: int        # most runs of each workload; the best is kept
    repeat_budget: float  # no further run once the runs so far plus one more exceed this (s)
    startups: int       # fresh clusters timed
    timeout: int        # seconds allowed to one system's subprocess
    deadline: int       # seconds allowed to the whole comparison


QUICK = Sizes(tasks=2_000, latency=200, chain=300, fan_in=500, blobs=20, echo=2_000,
              warmup=500, repeats=2, repeat_budget=4, startups=1, timeout=60, deadline=115)
FULL = Sizes(tasks=10_000, latency=1_000, chain=1_000, fan_in=1_000, blobs=100, echo=10_000,
             warmup=1_000, repeats=3, repeat_budget=20, startups=2, timeout=240,
             deadline=590)


# -- the figures: key, label, unit, which way is better ----------------------------------
@dataclasses.dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    better: str         # "higher", "lower" or "" (no winner, e.g. a count)


def figures(sizes: Sizes) -> list[Figure]:
    return [
        Figure("throughput", f"throughput, {sizes.tasks:,} no-op tasks", "tasks/s", "higher"),
        Figure("throughput_slot", f"throughput, {sizes.tasks:,} asking slot=1", "tasks/s",
               "higher"),
        Figure("latency_median", f"latency median, {sizes.latency:,} in a row", "ms", "lower"),
        Figure("latency_p99", "latency p99", "ms", "lower"),
        Figure("chain", f"chain of {sizes.chain:,} dependent tasks", "s", "lower"),
        Figure("fan_in", f"fan-in of {sizes.fan_in:,} results into one", "s", "lower"),
        Figure("gather", f"gather {sizes.blobs} x 10 MB to the client", "MB/s", "higher"),
        Figure("gather_made", "the same, once all are made", "MB/s", "higher"),
        Figure("gather_arrays", "the same as NumPy arrays", "MB/s", "higher"),
        Figure("dependents", f"{sizes.blobs} x 10 MB into dependents", "MB/s", "higher"),
        Figure("startup", "start-up to first result", "s", "lower"),
        Figure("memory", "idle cluster memory (RSS)", "MiB", "lower"),
        Figure("processes", "idle cluster processes", "count", ""),
    ]


# -- task functions: module level, so all three systems can pickle them -------------------
_blob: bytes | None = None


def noop(x: Any) -> Any:
    return x


def inc(x: int) -> int:
    return x + 1


def total(*xs: int) -> int:
    return sum(xs)


def blob(i: int) -> bytes:
    """10 MB of incompressible bytes, a new object each call (one copy, about a millisecond)."""
    global _blob
    if _blob is None:
        _blob = random.Random(0).randbytes(BLOB_SIZE)
    return _blob[:-1] + bytes([i % 256])


def array(i: int) -> Any:
    """The same 10 MB as a NumPy array (a view of blob's bytes: the same one copy)."""
    import numpy
    return numpy.frombuffer(blob(i), dtype=numpy.uint8)


def length(data: bytes) -> int:
    return len(data)


# -- the three systems behind one small interface -----------------------------------------
class Backend:
    """Start a cluster, submit calls (handles as arguments are dependencies), gather them."""

    def start(self) -> None:
        raise NotImplementedError

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def map(self, fn: Callable[..., Any], items: Iterable[Any],
            resources: dict[str, float] | None = None) -> list[Any]:
        raise NotImplementedError

    def gather(self, handles: list[Any]) -> list[Any]:
        raise NotImplementedError

    def wait(self, handles: list[Any]) -> None:
        """Return once every call of HANDLES has finished (fetching none of its results)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ZresBackend(Backend):
    def __init__(self, insecure: bool = False, network: bool = False) -> None:
        import zres
        self.zres = zres
        self.insecure = insecure
        self.address = "tcp://127.0.0.1:0" if network else None  # (None: LocalCluster's)
        self.cluster: Any = None
        self.client: Any = None
        if network:  # (this process's, and those of the cluster it starts)
            os.environ["ZRES_LOCAL_READS"] = "never"

    def start(self) -> None:
        self.cluster = self.zres.LocalCluster(agents=[{"slot": 2}, {"slot": 2}], nthreads=2,
                                              insecure=self.insecure, address=self.address)
        self.client = self.zres.Client(self.cluster.address)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args)

    def map(self, fn: Callable[..., Any], items: Iterable[Any],
            resources: dict[str, float] | None = None) -> list[Any]:
        return self.client.map(fn, items, resources=resources)

    def gather(self, handles: list[Any]) -> list[Any]:
        return self.client.gather(handles)  # type: ignore[no-any-return]

    def wait(self, handles: list[Any]) -> None:
        self.zres.wait(handles)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.client = self.cluster = None


class DaskBackend(Backend):
    def __init__(self) -> None:
        import distributed
        self.distributed = distributed
        self.client: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="compare-dask-")
        scheduler_file = os.path.join(self.tmp.name, "scheduler.json")
        common = ["--scheduler-file", scheduler_file, "--host", "127.0.0.1", "--no-dashboard"]
        commands = [["scheduler", "--port", "0"]]
        commands += [["worker", "--nthreads", "2", "--nworkers", "1", "--resources", "slot=2",
                      "--name", f"worker-{i}"] for i in range(2)]
        for command in commands:  # workers wait for the scheduler file by themselves
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", *command, *common], cwd=self.tmp.name,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not os.path.exists(scheduler_file):
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError("the dask scheduler did not start")
            time.sleep(0.01)
        self.client = self.distributed.Client(scheduler_file=scheduler_file)
        self.client.wait_for_workers(2, timeout=60)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def map(self, fn: Callable[..., Any], items: Iterable[Any],
            resources: dict[str, float] | None = None) -> list[Any]:
        return self.client.map(fn, list(items), pure=False, resources=resources)  # type: ignore[no-any-return]

    def gather(self, handles: list[Any]) -> list[Any]:
        return self.client.gather(handles)  # type: ignore[no-any-return]

    def wait(self, handles: list[Any]) -> None:
        self.distributed.wait(handles)

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.shutdown()  # stops the scheduler and, through it, the workers
            except Exception:
                pass
            self.client = None
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


class RayBackend(Backend):
    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster
        self.ray = ray
        self.cluster_type = Cluster
        self.cluster: Any = None
        self.remotes: dict[tuple[Callable[..., Any], str], Any] = {}

    def start(self) -> None:
        self.remotes = {}
        self.cluster = self.cluster_type(
            initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        for _ in range(2):
            self.cluster.add_node(num_cpus=2, resources={"slot": 2})
        self.ray.init(address=self.cluster.address, log_to_driver=False,
                      logging_level="WARNING")
        self.cluster.wait_for_nodes()

    def remote(self, fn: Callable[..., Any],
               resources: dict[str, float] | None = None) -> Any:
        key = (fn, json.dumps(resources, sort_keys=True))
        if key not in self.remotes:
            options = {"resources": resources} if resources else {}
            self.remotes[key] = self.ray.remote(fn).options(**options)
        return self.remotes[key]

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.remote(fn).remote(*args)

    def map(self, fn: Callable[..., Any], items: Iterable[Any],
            resources: dict[str, float] | None = None) -> list[Any]:
        remote = self.remote(fn, resources)
        return [remote.remote(item) for item in items]

    def gather(self, handles: list[Any]) -> list[Any]:
        return self.ray.get(handles)  # type: ignore[no-any-return]

    def wait(self, handles: list[Any]) -> None:
        self.ray.wait(handles, num_returns=len(handles), fetch_local=False)

    def close(self) -> None:
        self.ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


BACKENDS: dict[str, Callable[[], Backend]] = {
    "zres": ZresBackend, "dask": DaskBackend, "ray": RayBackend,
    "zres-insecure": lambda: ZresBackend(insecure=True),
    "zres-network": lambda: ZresBackend(network=True),
    "zres-network-insecure": lambda: ZresBackend(insecure=True, network=True)}


# -- workloads ----------------------------------------------------------------------------
def settle() -> None:
    """Drop the last workload's handles everywhere before timing the next one."""
    gc.collect()
    time.sleep(0.3)


def throughput(backend: Backend, n: int, resources: dict[str, float] | None = None) -> float:
    start = time.perf_counter()
    results = backend.gather(backend.map(noop, range(n), resources))
    elapsed = time.perf_counter() - start
    assert results == list(range(n))
    return n / elapsed


def latency(backend: Backend, n: int) -> tuple[float, float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        assert backend.gather([backend.submit(noop, i)]) == [i]
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3


def chain(backend: Backend, n: int) -> float:
    start = time.perf_counter()
    handle = backend.submit(inc, 0)
    for _ in range(n - 1):
        handle = backend.submit(inc, handle)
    assert backend.gather([handle]) == [n]
    return time.perf_counter() - start


def fan_in(backend: Backend, n: int) -> float:
    start = time.perf_counter()
    assert backend.gather([backend.submit(total, *backend.map(noop, range(n)))]) == [
        n * (n - 1) // 2]
    return time.perf_counter() - start


def gather_blobs(backend: Backend, n: int) -> float:
    start = time.perf_counter()
    results = backend.gather(backend.map(blob, range(n)))
    elapsed = time.perf_counter() - start
    assert [len(r) for r in results] == [BLOB_SIZE] * n
    return n * BLOB_SIZE / MB / elapsed


def gather_made(backend: Backend, n: int) -> float:
    """As gather_blobs, timed from when every result has been made: the moving alone (on a
    machine of few cores, making the values and storing them shares the cores with moving
    them, and bounds gather_blobs: see the floor)."""
    handles = backend.map(blob, range(n))
    backend.wait(handles)
    start = time.perf_counter()
    results = backend.gather(handles)
    elapsed = time.perf_counter() - start
    assert [len(r) for r in results] == [BLOB_SIZE] * n
    return n * BLOB_SIZE / MB / elapsed


def gather_arrays(backend: Backend, n: int) -> float:
    """As gather_blobs, with arrays: a system may hand them over without a copy."""
    start = time.perf_counter()
    results = backend.gather(backend.map(array, range(n)))
    elapsed = time.perf_counter() - start
    assert [r.nbytes for r in results] == [BLOB_SIZE] * n
    return n * BLOB_SIZE / MB / elapsed


def blob_dependents(backend: Backend, n: int) -> float:
    start = time.perf_counter()
    blobs = backend.map(blob, range(n))
    results = backend.gather([backend.submit(length, b) for b in blobs])
    elapsed = time.perf_counter() - start
    assert results == [BLOB_SIZE] * n
    return n * BLOB_SIZE / MB / elapsed


# -- process memory, from /proc -----------------------------------------------------------
def descendants(root: int) -> list[int]:
    """Every live process below ROOT, found through the parent ids in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of PID (0 for a zombie or a process gone meanwhile)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- one system, in its own subprocess ----------------------------------------------------
class Recorder:
    """Keeps the figures and samples, rewriting the output file after each one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"values": {}, "samples": {}}

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.data, fh)
        os.replace(tmp, self.path)

    def put(self, key: str, value: Any, samples: list[Any] | None = None) -> None:
        self.data["values"][key] = value
        if samples is not None:
            self.data["samples"][key] = samples
        self.save()


def best_of(sizes: Sizes, run: Callable[[], Any],
            best: Callable[[list[Any]], Any]) -> tuple[Any, list[Any]]:
    """Run up to sizes.repeats times, stopping early when one more would overrun the budget."""
    samples: list[Any] = []
    spent = 0.0
    while len(samples) < sizes.repeats:
        start = time.perf_counter()
        samples.append(run())
        settle()
        took = time.perf_counter() - start
        spent += took
        if spent + took > sizes.repeat_budget:
            break
    return best(samples), samples


def run_system(name: str, sizes: Sizes, out: str) -> None:
    rec = Recorder(out)
    rec.data["version"] = importlib.metadata.version(PACKAGES[name])
    rec.save()
    backend = BACKENDS[name]()
    starts: list[float] = []
    memories: list[tuple[int, int]] = []
    try:
        for attempt in range(sizes.startups):
            if attempt:
                backend.close()
                settle()
            start = time.perf_counter()
            backend.start()
            assert backend.gather([backend.submit(noop, 1)]) == [1]
            starts.append(time.perf_counter() - start)
            assert backend.gather(backend.map(noop, range(200))) == list(range(200))
            time.sleep(1.0)
            pids = [pid for pid in descendants(os.getpid()) if rss_bytes(pid)]
            memories.append((sum(rss_bytes(pid) for pid in pids), len(pids)))
            rec.put("startup", min(starts), starts)
            memory, count = min(memories)
            rec.put("memory", memory / MIB, [m / MIB for m, _ in memories])
            rec.put("processes", count, [c for _, c in memories])
        assert backend.gather(backend.map(noop, range(sizes.warmup))) == list(
            range(sizes.warmup))
        for _ in range(20):  # warm the single-call path too
            backend.gather([backend.submit(noop, 0)])
        settle()
        highest, lowest = max, min
        workloads: list[tuple[str, Callable[[], Any], Callable[[list[Any]], Any]]] = [
            ("throughput", lambda: throughput(backend, sizes.tasks), highest),
            ("throughput_slot", lambda: throughput(backend, sizes.tasks, {"slot": 1}), highest),
            ("latency", lambda: latency(backend, sizes.latency), lowest),  # lowest median
            ("chain", lambda: chain(backend, sizes.chain), lowest),
            ("fan_in", lambda: fan_in(backend, sizes.fan_in), lowest),
            ("gather", lambda: gather_blobs(backend, sizes.blobs), highest),
            ("gather_made", lambda: gather_made(backend, sizes.blobs), highest),
            ("gather_arrays", lambda: gather_arrays(backend, sizes.blobs), highest),
            ("dependents", lambda: blob_dependents(backend, sizes.blobs), highest),
        ]
        for key, run, best in workloads:
            try:
                value, samples = best_of(sizes, run, best)
            except Exception as exc:  # one workload failing leaves the others standing
                rec.put(key, f"error: {type(exc).__name__}: {exc}"[:200])
                settle()
                continue
            if key == "latency":
                rec.put("latency_median", value[0], [s[0] for s in samples])
                rec.put("latency_p99", value[1], [s[1] for s in samples])
            else:
                rec.put(key, value, samples)
    finally:
        backend.close()


# -- the floor: bare pyzmq between two processes ------------------------------------------
def echo_server() -> None:
    """ROUTERs on random loopback ports, one plain and one with CURVE (its public key
    printed after the ports): echo messages; on b"stream" send N 10 MB ones."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    curve = ctx.socket(zmq.ROUTER)
    public, secret = zmq.curve_keypair()
    curve.curve_server = True
    curve.curve_publickey, curve.curve_secretkey = public, secret
    curve_port = curve.bind_to_random_port("tcp://127.0.0.1")
    print(port, curve_port, public.decode(), flush=True)
    payload = random.Random(0).randbytes(BLOB_SIZE)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(curve, zmq.POLLIN)
    while True:
        for ready, _ in poller.poll():
            ident, *frames = ready.recv_multipart()
            if frames[0] == b"stream":
                for _ in range(int(frames[1])):
                    ready.send_multipart([ident, payload], copy=False)
            elif frames[0] == b"stop":
                sock.close()
                curve.close()
                ctx.term()
                return
            else:
                ready.send_multipart([ident, *frames])


def forwarder(upstream: int) -> None:
    """ROUTER on a random loopback port, passing messages to UPSTREAM and answers back."""
    import zmq
    ctx = zmq.Context()
    down = ctx.socket(zmq.ROUTER)
    port = down.bind_to_random_port("tcp://127.0.0.1")
    up = ctx.socket(zmq.DEALER)
    up.connect(f"tcp://127.0.0.1:{upstream}")
    print(port, flush=True)
    poller = zmq.Poller()
    poller.register(down, zmq.POLLIN)
    poller.register(up, zmq.POLLIN)
    peer: Any = b""
    while True:
        events = dict(poller.poll())
        if down in events:
            peer, *frames = down.recv_multipart(copy=False)
            up.send_multipart(frames, copy=False)
        if up in events:
            down.send_multipart([peer, *up.recv_multipart(copy=False)], copy=False)


def _start(*args: str) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """Start this file with ARGS; return the process, the port it prints and what else it
    prints on that line."""
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    port, *rest = proc.stdout.readline().decode().split()
    return proc, int(port), rest


def run_floor(sizes: Sizes, out: str) -> None:
    import zmq
    rec = Recorder(out)
    rec.data["version"] = importlib.metadata.version("pyzmq")
    server, port, (curve_port, server_key) = _start("--_echo-server")
    # The chain: this process -> forwarder -> forwarder -> the echo server.
    inner, inner_port, _ = _start("--_forward", str(port))
    outer, outer_port, _ = _start("--_forward", str(inner_port))
    ctx = zmq.Context()
    direct = ctx.socket(zmq.DEALER)
    direct.connect(f"tcp://127.0.0.1:{port}")
    # One link with CURVE, as zres's data ports have with keys (the default).
    curve = ctx.socket(zmq.DEALER)
    curve.curve_serverkey = server_key.encode()
    curve.curve_publickey, curve.curve_secretkey = zmq.curve_keypair()
    curve.connect(f"tcp://127.0.0.1:{curve_port}")
    chained = ctx.socket(zmq.DEALER)
    chained.connect(f"tcp://127.0.0.1:{outer_port}")
    try:
        def round_trips(sock: Any) -> float:
            samples = []
            for _ in range(sizes.echo):
                start = time.perf_counter()
                sock.send(b"x")
                sock.recv()
                samples.append(time.perf_counter() - start)
            return statistics.median(samples) * 1e6

        def bandwidth(sock: Any, keep: bool = False) -> float:
            """MB/s of 10 MB messages; KEEP holds each as bytes, as a gather of bytes must."""
            kept = []
            start = time.perf_counter()
            sock.send_multipart([b"stream", str(sizes.blobs).encode()])
            for _ in range(sizes.blobs):
                if keep:
                    kept.append(sock.recv())  # a copy into new memory, held to the end
                else:
                    assert len(sock.recv(copy=False)) == BLOB_SIZE
            elapsed = time.perf_counter() - start
            assert all(len(k) == BLOB_SIZE for k in kept)
            return sizes.blobs * BLOB_SIZE / MB / elapsed

        cheap = dataclasses.replace(sizes, repeats=max(3, sizes.repeats))  # a floor: its best
        for sock, prefix in ((direct, ""), (chained, "chain_")):
            for _ in range(200):  # warm up: connection, buffers, first-touch of memory
                sock.send(b"x")
                sock.recv()
            bandwidth(sock)
            rec.put(prefix + "echo_median",
                    *best_of(cheap, functools.partial(round_trips, sock), min))
            rec.put(prefix + "bandwidth", *best_of(cheap, functools.partial(bandwidth, sock), max))
        rec.put("kept_bandwidth", *best_of(cheap, functools.partial(bandwidth, direct, True), max))
        for _ in range(20):
            curve.send(b"x")
            curve.recv()
        bandwidth(curve)
        rec.put("curve_bandwidth", *best_of(cheap, functools.partial(bandwidth, curve), max))
        rec.put("curve_kept_bandwidth",
                *best_of(cheap, functools.partial(bandwidth, curve, True), max))
        direct.send(b"stop")
        server.wait(timeout=10)
    finally:
        direct.close(linger=0)
        curve.close(linger=0)
        chained.close(linger=0)
        ctx.term()
        for proc in (server, inner, outer):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# -- the parent: run each system's subprocess, then print one table -----------------------
def run_child(name: str, args: argparse.Namespace, sizes: Sizes,
              timeout: float) -> dict[str, Any]:
    """Run NAME's workloads in a subprocess of its own session; return what it recorded.

    The result has "values" and "samples" (whatever the child finished before it stopped),
    "version", and "status": "" when it ran to its end, else why not.
    """
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        out, log = os.path.join(tmp, "out.json"), os.path.join(tmp, "stderr.log")
        command = [sys.executable, __file__, "--_child", name, "--_out", out,
                   "--repeats", str(sizes.repeats)] + (["--quick"] if args.quick else [])
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
        with open(log, "wb") as err:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err, env=env,
                                     start_new_session=True)
            try:
                child.wait(timeout=max(1.0, timeout))
                status = "" if child.returncode == 0 else f"unavailable: {last_line(log)}"
            except subprocess.TimeoutExpired:
                status = f"timed out after {max(1.0, timeout):.0f}s"
            finally:  # what the child started (Ray's daemons, ...), then its whole session
                for pid in [child.pid, *descendants(child.pid)]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
        result: dict[str, Any] = {"values": {}, "samples": {}}
        if os.path.exists(out):
            result = json.loads(Path(out).read_text())
        result["status"] = status
        return result


def last_line(path: str) -> str:
    lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:160] if lines else "exited with no message"


def numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and v for v in values)


def advantage(fig: Figure, mine: Any, theirs: Any) -> float | None:
    """How many times better zres is than the peer on FIG (>1: zres wins)."""
    if not fig.better or not numbers(mine, theirs):
        return None
    return mine / theirs if fig.better == "higher" else theirs / mine


def build_report(mode: str, sizes: Sizes, systems: list[str],
                 results: dict[str, dict[str, Any]], floor: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for fig in figures(sizes):
        values = {name: results[name]["values"].get(fig.key, results[name]["status"]
                                                     or "missing") for name in systems}
        ratios = {peer: advantage(fig, values.get("zres"), values[peer])
                  for peer in systems if peer != "zres"}
        rows.append({"key": fig.key, "label": fig.label, "unit": fig.unit,
                     "better": fig.better, "values": values,
                     "samples": {n: results[n]["samples"].get(fig.key) for n in systems},
                     "zres_advantage": ratios})
    over_floor: dict[str, dict[str, float | None]] = {}
    for name in systems:
        lat, gathered = (results[name]["values"].get(k) for k in ("latency_median", "gather"))
        over_floor[name] = {}
        for prefix, what in (("", ""), ("chain_", "_chain")):
            echo, bandwidth = (floor["values"].get(prefix + k) for k in ("echo_median",
                                                                          "bandwidth"))
            over_floor[name][f"latency_over_echo{what}"] = (
                lat * 1e3 / echo if numbers(lat, echo) else None)
            over_floor[name][f"gather_over_socket{what}"] = (
                gathered / bandwidth if numbers(gathered, bandwidth) else None)
        kept, socket = (floor["values"].get(k) for k in ("kept_bandwidth", "bandwidth"))
        arrays = results[name]["values"].get("gather_arrays")
        over_floor[name]["gather_over_kept"] = (
            gathered / kept if numbers(gathered, kept) else None)
        over_floor[name]["arrays_over_socket"] = (
            arrays / socket if numbers(arrays, socket) else None)
        made = results[name]["values"].get("gather_made")
        over_floor[name]["made_over_socket"] = (
            made / socket if numbers(made, socket) else None)
        # Issue 29's targets with keys: gather and dependents against one CURVE link.
        curve = floor["values"].get("curve_bandwidth")
        for key in ("gather", "dependents"):
            value = results[name]["values"].get(key)
            over_floor[name][f"{key}_over_curve"] = (
                value / curve if numbers(value, curve) else None)
    return {"mode": mode, "sizes": dataclasses.asdict(sizes),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()},
            "versions": {n: results[n].get("version") for n in systems},
            "status": {n: results[n]["status"] for n in systems},
            "rows": rows,
            "floor": {"pyzmq": floor.get("version"), "values": floor["values"],
                      "samples": floor["samples"], "status": floor["status"]},
            "over_floor": over_floor}


def cell(value: Any) -> str:
    """A number, or the first word(s) of why there is none ("timed out", "error", ...)."""
    if not isinstance(value, (int, float)):
        return str(value).split(":")[0].split(" after ")[0]
    if isinstance(value, int) or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def describe(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x better" if ratio >= 1 else f"{1 / ratio:.2f}x worse"


def times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def print_report(report: dict[str, Any], systems: list[str]) -> None:
    peers = [n for n in systems if n != "zres"] if "zres" in systems else []
    rows = report["rows"]
    width = max(len(row["label"]) for row in rows) + 2
    cols = [max(12, len(n) + 2, *(len(cell(row["values"][n])) + 2 for row in rows))
            for n in systems]
    against = [max(16, len(p) + 10) for p in peers]
    header = (f"{'figure':<{width}}{'unit':<9}"
              + "".join(f"{n:>{w}}" for n, w in zip(systems, cols))
              + "".join(f"{'zres vs ' + p:>{w}}" for p, w in zip(peers, against)))
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['label']:<{width}}{row['unit']:<9}"
              + "".join(f"{cell(row['values'][n]):>{w}}" for n, w in zip(systems, cols))
              + "".join(f"{describe(row['zres_advantage'][p]):>{w}}"
                        for p, w in zip(peers, against)))
    print("-" * len(header))
    floor = report["floor"]
    echo, bandwidth = floor["values"].get("echo_median"), floor["values"].get("bandwidth")
    print(f"floor, bare pyzmq {floor['pyzmq']} ROUTER-DEALER over tcp loopback: echo round "
          f"trip median {cell(echo)} us, 10 MB messages {cell(bandwidth)} MB/s")
    chain_echo, chain_bandwidth = (floor["values"].get(k)
                                   for k in ("chain_echo_median", "chain_bandwidth"))
    print(f"  through two bare forwarders (zres's three links): round trip {cell(chain_echo)} "
          f"us, 10 MB messages {cell(chain_bandwidth)} MB/s")
    print(f"  one link, each message kept as bytes (a gather of bytes results, at best): "
          f"{cell(floor['values'].get('kept_bandwidth'))} MB/s")
    print(f"  one link with CURVE: 10 MB messages {cell(floor['values'].get('curve_bandwidth'))}"
          f" MB/s, kept as bytes {cell(floor['values'].get('curve_kept_bandwidth'))} MB/s")
    for name in systems:
        over = report["over_floor"][name]
        print(f"  {name}: latency / echo {times(over['latency_over_echo'])} "
              f"({times(over['latency_over_echo_chain'])} of the chain's); gather / socket "
              f"bandwidth {times(over['gather_over_socket'])} "
              f"({times(over['gather_over_socket_chain'])} of the chain's, "
              f"{times(over['gather_over_kept'])} of one link kept as bytes; once made "
              f"{times(over.get('made_over_socket'))}), as arrays "
              f"{times(over['arrays_over_socket'])}; gather / CURVE link "
              f"{times(over.get('gather_over_curve'))}, dependents / CURVE link "
              f"{times(over.get('dependents_over_curve'))}")
    print("'zres vs X': how many times better or worse zres is than X on that figure "
          "(more tasks/s and MB/s win; fewer ms, s and MiB win).")
    print("Each workload: best of up to {repeats} runs (fewer where one run is long); "
          "start-up and memory: lowest of {startups} fresh cluster(s).".format(
              **report["sizes"]))
    print("Versions: " + ", ".join(f"{n} {v}" for n, v in report["versions"].items() if v)
          + f"; Python {report['machine']['python']}, {report['machine']['cpus']} CPUs.")
    notes = [f"{name}: {status}" for name, status in report["status"].items() if status]
    notes += [f"{name}, {row['label']}: {row['values'][name]}" for row in rows
              for name in systems if str(row["values"][name]).startswith("error")]
    if floor["status"]:
        notes.append(f"floor: {floor['status']}")
    for note in notes:
        print("Note: " + note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smaller workloads, to finish in under two minutes")
    parser.add_argument("--json", metavar="PATH", help="also write the table here as JSON")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, from {','.join(SYSTEMS)} (default: "
                        f"{','.join(DEFAULT_SYSTEMS)})")
    parser.add_argument("--repeats", type=int, help="most runs of each workload (best is kept)")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    parser.add_argument("--_echo-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_forward", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.repeats:
        sizes = dataclasses.replace(sizes, repeats=max(1, args.repeats))
    if args._echo_server:
        return echo_server()
    if args._forward:
        return forwarder(args._forward)
    if args._child == "floor":
        return run_floor(sizes, args._out)
    if args._child:
        return run_system(args._child, sizes, args._out)

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        parser.error(f"--systems takes names from {','.join(SYSTEMS)}, not {unknown}")
    began = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - began:5.1f}s] {what}", file=sys.stderr, flush=True)

    def time_left() -> float:
        return min(sizes.timeout, sizes.deadline - (time.perf_counter() - began))

    progress("floor: bare pyzmq echo and bandwidth")
    floor = run_child("floor", args, sizes, time_left())
    results: dict[str, dict[str, Any]] = {}
    for name in systems:
        if importlib.util.find_spec(MODULES[name]) is None:
            results[name] = {"values": {}, "samples": {}, "status": "not installed"}
            progress(f"{name}: not installed")
            continue
        progress(f"{name}: running")
        results[name] = run_child(name, args, sizes, time_left())
        if results[name]["status"]:
            progress(f"{name}: {results[name]['status']}")
    report = build_report("quick" if args.quick else "full", sizes, systems, results, floor)
    report["elapsed_s"] = time.perf_counter() - began
    progress("done")
    print_report(report, systems)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
