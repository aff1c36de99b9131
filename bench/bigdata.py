"""Big values on a local cluster with keys (issue 29's targets for them), in one run.

    python bench/bigdata.py [--size 2e9] [--kind numpy|bytes] [--json out.json]
                            [--phases argument,result,many,local] [--local-size 1e8]

A broker and two agents (keys on, the default), each agent with two worker processes of
one thread (CPU=2). Phases, one after another:

- idle: a prober (a client in a process of its own) runs a 1 ms task on agent-0 in a
  loop, submit to result: its latency on the idle cluster;
- argument: a SIZE-byte value (a NumPy array, or bytes) submitted to a task on agent-0
  that returns its length (the call is put on an agent, the worker reads it there);
- result: a task on agent-0 makes a SIZE-byte value, gathered by the client (on the
  agent's host a NumPy array is read in place: a mapping of the agent's store, whose
  pages are read as they are touched, so its "fetch" moves nothing);
- many: 20 tasks make SIZE/20 bytes each, gathered by the client (once, and once more
  with the first ones dropped), the broker's resident memory before and after;
- local: a dependent on the holder's agent reads a 100 MB value (``--local-size``), as a
  NumPy array and as bytes: its submit-to-result time, and that less the same task's
  with a tiny input (the read's own time; target: under 50 ms, no copy through a
  socket); beside it the floor for bytes, which must be copied into memory of their own:
  ``bytes()`` of a buffer that size, in this process.

The prober runs through the argument and result phases too: its median and p99 there
against idle's say whether a big value delays anybody's small task (target: within 3x).
Each phase gives its time, the peak resident memory of the client, of each agent and its
worker processes (VmHWM, reset at the phase's start), and whether any agent was lost (the
broker's log says "agent_lost", or an agent left the status's list). Targets: no agent
lost, broker RSS growth over "many" < 50 MB.

--size scales it down (the machine: 24 GiB, shared; each phase holds the value about
three times at once: the maker, the agent's store in /dev/shm, the reader).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zres  # noqa: E402

MIB = 1 << 20
PHASES = ("argument", "result", "many", "local")


# -- what the tasks run (by value: this file is __main__ for the workers) ------------------

def pause() -> int:
    time.sleep(0.001)
    return 1


def length(value: Any) -> int:
    return len(value)


def make(size: int, kind: str, mark: int = 7) -> Any:
    """SIZE bytes written (not a zero page left untouched) as KIND."""
    if kind == "bytes":
        return bytes([mark]) * size
    import numpy
    return numpy.full(size, mark, dtype=numpy.uint8)


# -- the prober: a client of its own, in a process of its own -----------------------------

def probe(address: str, keys: str, agent: str) -> None:
    """Run a 1 ms task on AGENT in a loop until stdin closes; print each latency (s) with
    the time it ended."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with zres.Client(address, keys=keys) as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.submit(pause, workers=[agent], pure=False).result(60)
            print(f"{time.time():.6f} {time.perf_counter() - start:.6f}", flush=True)


class Prober:
    def __init__(self, cluster: zres.LocalCluster, agent: str) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--_probe", cluster.address, str(cluster.keys), agent],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            when, took = line.split()
            self.samples.append((float(when), float(took)))

    def between(self, start: float, end: float) -> list[float]:
        return [took for when, took in self.samples if start <= when <= end]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self.thread.join(5)


def latency(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    return {"n": len(ordered), "median_ms": statistics.median(ordered) * 1e3,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3}


# -- memory, from /proc --------------------------------------------------------------------

def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def watched(cluster: zres.LocalCluster) -> dict[str, list[int]]:
    """Each process to watch, by role: the client (this one), each agent with its
    workers, the broker."""
    assert cluster.broker is not None
    out = {"client": [os.getpid()], "broker": [cluster.broker.pid]}
    for name, proc in cluster.agents.items():
        out[name] = [proc.pid, *children(proc.pid)]
    return out


def reset_peaks(pids: dict[str, list[int]]) -> None:
    for group in pids.values():
        for pid in group:
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # (VmHWM := VmRSS)
            except OSError:
                pass


def peaks(pids: dict[str, list[int]]) -> dict[str, list[float]]:
    """Peak RSS (MiB) of each process of each role since reset_peaks."""
    return {role: [status_kib(pid, "VmHWM") / 1024 for pid in group]
            for role, group in pids.items()}


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


# -- the phases ---------------------------------------------------------------------------

class Run:
    def __init__(self, size: int, kind: str, log: str, phases: list[str] | None = None,
                 local_size: int = 100_000_000) -> None:
        self.size, self.kind, self.log = size, kind, log
        self.phases = phases or list(PHASES)
        self.local_size = local_size
        self.rows: list[dict[str, Any]] = []

    def lost(self, client: zres.Client) -> list[str]:
        """Agents lost so far: said by the broker's log, or missing from its status."""
        said = [json.loads(line).get("agent", "?") for line in open(self.log, errors="replace")
                if '"agent_lost"' in line and line.startswith("{")]
        names = {a["name"] for a in client.status()["agents"] if not a.get("away")}
        return said + [f"{n} (not in status)" for n in ("agent-0", "agent-1")
                       if n not in names]

    def phase(self, name: str, cluster: zres.LocalCluster, client: zres.Client,
              prober: Prober, work: Any) -> None:
        pids = watched(cluster)
        reset_peaks(pids)
        began_at, start = time.time(), time.perf_counter()
        error = ""
        try:
            detail = work()
        except Exception as exc:  # (shown in the table, the next phases run on)
            detail, error = {}, f"{type(exc).__name__}: {exc}"[:200]
        took = time.perf_counter() - start
        ended_at = time.time()
        self.rows.append({"phase": name, "seconds": took, "error": error,
                          "latency": latency(prober.between(began_at, ended_at)),
                          "peak_mib": peaks(pids), "lost": self.lost(client), **detail})
        print(f"[{name}] {took:.2f}s {error}", flush=True)

    def main(self) -> None:
        size, kind = self.size, self.kind
        with zres.LocalCluster(agents=[{"CPU": 2}, {"CPU": 2}], nthreads=1,
                               nworkers=2) as cluster, zres.Client(cluster.address) as client:
            assert cluster.broker is not None
            prober = Prober(cluster, "agent-0")
            try:
                self.phase("idle", cluster, client, prober, lambda: time.sleep(5) or {})

                def argument() -> dict[str, Any]:
                    value = make(size, kind)
                    got = client.submit(length, value, workers=["agent-0"]).result(600)
                    assert got == size, got
                    return {}

                def result() -> dict[str, Any]:
                    future = client.submit(make, size, kind, workers=["agent-0"])
                    zres.wait([future], timeout=600)
                    made = time.perf_counter()
                    value = future.result(600)
                    fetched = time.perf_counter() - made
                    assert len(value) == size
                    return {"fetch_seconds": fetched, "fetch_mb_s": size / 1e6 / fetched}

                def many() -> dict[str, Any]:
                    broker = cluster.broker.pid  # type: ignore[union-attr]
                    before = rss_mib(broker)
                    futures = client.map(make, [size // 20] * 20, [kind] * 20, range(20),
                                         pure=False)
                    start = time.perf_counter()
                    values = zres.gather(futures)
                    gathered = time.perf_counter() - start
                    assert [len(v) for v in values] == [size // 20] * 20
                    del values, futures
                    futures = client.map(make, [size // 20] * 20, [kind] * 20, range(20),
                                         pure=False)
                    values = zres.gather(futures)
                    del values, futures
                    return {"gather_seconds": gathered, "broker_rss_before_mib": before,
                            "broker_rss_after_mib": rss_mib(broker)}

                def local() -> dict[str, Any]:
                    return {"local": read_in_place(client, self.local_size)}

                work = {"argument": argument, "result": result, "many": many, "local": local}
                for name in self.phases:
                    self.phase(name, cluster, client, prober, work[name])
            finally:
                prober.close()


def read_in_place(client: zres.Client, size: int, runs: int = 7) -> dict[str, Any]:
    """Per kind: the median submit-to-result time of a dependent on the holder's agent
    reading a SIZE-byte input, of the same with a tiny input, and the difference (the
    read); for bytes, the floor: a copy of SIZE bytes into new memory here."""
    def median_ms(value: Any) -> float:
        took = []
        for _ in range(runs):
            start = time.perf_counter()
            assert client.submit(length, value, workers=["agent-0"], pure=False).result(
                120) in (size, 16)
            took.append(time.perf_counter() - start)
        return statistics.median(took) * 1e3
    out: dict[str, Any] = {}
    for kind in ("numpy", "bytes"):
        big, tiny = (client.submit(make, n, kind, workers=["agent-0"], pure=False)
                     for n in (size, 16))
        zres.wait([big, tiny], timeout=600)
        read, small = median_ms(big), median_ms(tiny)
        out[kind] = {"dependent_ms": read, "tiny_input_ms": small, "read_ms": read - small}
        del big, tiny
    source = bytearray(os.urandom(1 << 20)) * (size >> 20)
    copies = []
    for _ in range(3):
        start = time.perf_counter()
        copy = bytes(source)
        copies.append(time.perf_counter() - start)
        del copy
    out["bytes"]["copy_floor_ms"] = min(copies) * 1e3
    out["size"] = size
    return out


def agent(peak: dict[str, list[float]], name: str) -> str:
    """An agent's peak and its largest worker's, MiB."""
    own, *workers = peak.get(name, [0.0])
    return f"{own:.0f}+{max(workers, default=0):.0f}"


def report(rows: list[dict[str, Any]], size: int, kind: str) -> None:
    idle = rows[0]["latency"].get("median_ms")
    print(f"bigdata: {size / 1e9:g} GB values ({kind}), keys on, 2 agents x 2 workers")
    header = (f"{'phase':<10}{'time s':>9}{'1ms task median':>17}{'p99':>9}{'x idle':>8}"
              f"{'client peak':>13}{'agent-0 peak':>14}{'agent-1 peak':>14}  lost  notes")
    print(header)
    print("-" * len(header))
    for row in rows:
        lat = row["latency"]
        ratio = f"{lat['median_ms'] / idle:.2f}" if lat.get("n") and idle else "-"
        peak = row["peak_mib"]
        notes = row["error"]
        if "fetch_mb_s" in row:
            notes += f"fetched in {row['fetch_seconds']:.2f}s ({row['fetch_mb_s']:.0f} MB/s)"
        if "local" in row:
            local = row["local"]
            notes += (f"{local['size'] / 1e6:.0f} MB read in place: numpy "
                      f"{local['numpy']['read_ms']:.1f} ms (a dependent "
                      f"{local['numpy']['dependent_ms']:.1f} ms, with a tiny input "
                      f"{local['numpy']['tiny_input_ms']:.1f}), bytes "
                      f"{local['bytes']['read_ms']:.1f} ms (a dependent "
                      f"{local['bytes']['dependent_ms']:.1f} ms; floor: a copy into new "
                      f"memory here {local['bytes']['copy_floor_ms']:.1f} ms)")
        if "broker_rss_before_mib" in row:
            growth = row["broker_rss_after_mib"] - row["broker_rss_before_mib"]
            notes += (f"gathered in {row['gather_seconds']:.2f}s "
                      f"({size / 1e6 / row['gather_seconds']:.0f} MB/s); broker RSS "
                      f"{row['broker_rss_before_mib']:.0f} -> "
                      f"{row['broker_rss_after_mib']:.0f} MiB ({growth:+.0f})")
        print(f"{row['phase']:<10}{row['seconds']:>9.2f}"
              f"{lat.get('median_ms', 0):>14.2f} ms{lat.get('p99_ms', 0):>6.1f} ms"
              f"{ratio:>8}{peak['client'][0]:>9.0f} MiB{agent(peak, 'agent-0'):>10} MiB"
              f"{agent(peak, 'agent-1'):>10} MiB  {len(row['lost']):>4}  {notes}")
    print("peaks: VmHWM over the phase (agent: its own process + its largest worker's); "
          "'x idle': the 1 ms task's median over idle's (target: within 3x); lost: agents "
          "the broker declared lost (target: none); broker RSS growth target: < 50 MB.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=float, default=2e9, help="bytes of each big value")
    parser.add_argument("--kind", choices=["numpy", "bytes"], default="numpy")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"which to run after idle, in order (default {','.join(PHASES)})")
    parser.add_argument("--local-size", type=float, default=1e8,
                        help="bytes of the value a dependent reads in place (local)")
    parser.add_argument("--_probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._probe:
        return probe(*args._probe)
    with tempfile.NamedTemporaryFile(prefix="zres-bigdata-", suffix=".log") as log:
        # The local processes log to stderr when asked: this file, for "agent_lost".
        saved = os.dup(2)
        os.environ["ZRES_LOCAL_LOGS"] = "1"
        os.dup2(log.fileno(), 2)
        phases = [p for p in args.phases.split(",") if p]
        unknown = sorted(set(phases) - set(PHASES))
        if unknown:
            parser.error(f"--phases: {', '.join(unknown)} (from {', '.join(PHASES)})")
        run = Run(int(args.size), args.kind, log.name, phases, int(args.local_size))
        try:
            run.main()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    report(run.rows, int(args.size), args.kind)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "kind": args.kind,
                                               "rows": run.rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
