"""The broker's metrics, for Prometheus: counters the loop bumps as plain integers, and
gauges read from the last snapshot of the cluster's state the loop published.

The loop never takes a lock or builds text for them: it adds to integers, times its
scheduling passes and commits, and publishes a snapshot only when someone has asked for one
(``Snapshots``). The HTTP thread turns them into Prometheus's text format through
``prometheus_client``, in a registry of the broker's own (several brokers in one process
never share one).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.report import STATES

# Seconds: a scheduling pass takes tens of microseconds to tens of milliseconds; a commit
# (an fsync) about a millisecond, more on a slow disk.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            0.5, 1.0, 2.5)


class Traffic:
    """Messages and bytes in and out of the broker's socket, and the loop's turns, counted
    by the loop."""

    __slots__ = ("messages_in", "bytes_in", "messages_out", "bytes_out", "turns",
                 "longest_turn", "longest_cpu", "_cpu", "spun")

    def __init__(self) -> None:
        self.messages_in = self.bytes_in = self.messages_out = self.bytes_out = 0
        self.turns = 0
        self.longest_turn = 0.0   # seconds: what one turn of the loop took at most
        # ... of the loop's own CPU time: on a machine busy with other work a turn may wait
        # for a CPU far longer than it works (both are what a message waits behind).
        self.longest_cpu = 0.0
        self._cpu = time.thread_time()
        self.spun = 0.0  # seconds the loop polled for messages before it slept (spinning)

    def awake(self) -> None:
        """The loop's wait for messages (and its spinning: not a turn's work) is over."""
        self._cpu = time.thread_time()  # (a system call each time: two a turn)

    def turned(self, seconds: float) -> None:
        """Count one turn of the loop that took SECONDS (from ``awake``)."""
        self.turns += 1
        if seconds > self.longest_turn:
            self.longest_turn = seconds
        cpu = time.thread_time() - self._cpu
        if cpu > self.longest_cpu:
            self.longest_cpu = cpu

    def describe(self) -> dict[str, Any]:
        """The loop's turns, its longest (seconds, and of CPU), and the seconds it spun."""
        return {"turns": self.turns, "longest_turn": round(self.longest_turn, 4),
                "longest_turn_cpu": round(self.longest_cpu, 4), "spun": round(self.spun, 3)}


class Snapshots:
    """The cluster's state as plain data, published by the loop for other threads.

    Built only on demand: a reader asks (``get``), the loop sees ``wanted`` at its next turn
    and publishes; an idle dashboard costs the loop nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value: dict[str, Any] | None = None
        self._at = float("-inf")
        self.wanted = False             # read by the loop each turn: a plain attribute
        self.last_turn = time.monotonic()  # when the loop last turned (for /health)
        # A byte written here wakes the loop from its poll: a reader waits milliseconds,
        # not the rest of the loop's poll timeout.
        self._waker, self.wake = socket.socketpair()
        self._waker.setblocking(False)
        self.wake.setblocking(False)

    def get(self, max_age: float = 1.0, timeout: float = 5.0) -> dict[str, Any] | None:
        """Return a snapshot at most MAX_AGE seconds old, waiting up to TIMEOUT for the loop
        to make one; None if it made none in time (the loop is stuck)."""
        with self._cond:
            if time.monotonic() - self._at > max_age:
                self.wanted = True
                try:
                    self._waker.send(b"\0")
                except OSError:  # full of wake-ups already (or closed): the loop will see
                    pass
                self._cond.wait_for(lambda: time.monotonic() - self._at <= max_age, timeout)
            return self._value if time.monotonic() - self._at <= max(max_age, timeout) \
                else None

    def publish(self, value: dict[str, Any]) -> None:
        """Make VALUE the current snapshot (called by the loop)."""
        with self._cond:
            self._value, self._at, self.wanted = value, time.monotonic(), False
            self._cond.notify_all()

    def drain(self) -> None:
        """Read the wake-ups sent (called by the loop when ``wake`` is readable, before it
        looks at ``wanted``, which is set before the byte is sent)."""
        try:
            while self.wake.recv(4096):
                pass
        except OSError:  # nothing more to read
            pass

    def close(self) -> None:
        """Close the wake-up sockets."""
        self._waker.close()
        self.wake.close()


class BrokerMetrics:
    """The broker's Prometheus registry: its traffic, its scheduling and commit times, and
    what its snapshot says (tasks, waiting demand, agents' resources)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any] | None],
                 journal: bool) -> None:
        self.traffic = Traffic()
        self.registry = CollectorRegistry()
        self.scheduling = Histogram(
            "zres_scheduling_seconds", "Seconds one scheduling pass took (ready tasks to "
            "grants)", buckets=_BUCKETS, registry=self.registry)
        # JOURNAL: the broker keeps a state store, whose commits are timed.
        self.commit = Histogram(
            "zres_journal_commit_seconds", "Seconds one commit of the broker's state store "
            "took", buckets=_BUCKETS, registry=self.registry) if journal else None
        self.registry.register(_SnapshotCollector(snapshot, self.traffic))

    def render(self) -> bytes:
        """Return every metric in Prometheus's text format."""
        return generate_latest(self.registry)


class _SnapshotCollector(Collector):
    """Metrics read at scrape time from the traffic counters and the latest snapshot."""

    def __init__(self, snapshot: Callable[[], dict[str, Any] | None],
                 traffic: Traffic) -> None:
        self._snapshot = snapshot
        self._traffic = traffic

    def collect(self) -> Iterator[Metric]:
        t = self._traffic
        for name, doc, value in (
                ("zres_messages_received", "Messages the broker received", t.messages_in),
                ("zres_received_bytes", "Bytes the broker received", t.bytes_in),
                ("zres_messages_sent", "Messages the broker sent", t.messages_out),
                ("zres_sent_bytes", "Bytes the broker sent", t.bytes_out),
                ("zres_loop_turns", "Turns of the broker's loop", t.turns),
                ("zres_loop_spin_seconds", "Seconds the broker's loop polled for messages "
                 "before it would sleep ([broker] spin)", t.spun)):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("zres_loop_longest_turn_seconds", "The longest turn of the "
                                "broker's loop since it started", value=t.longest_turn)
        snap = self._snapshot()
        if snap is None:
            return
        tasks = GaugeMetricFamily("zres_tasks", "Tasks the broker holds, by state "
                                  f"({', '.join(STATES)})", labels=["state"])
        for state in STATES:
            tasks.add_metric([state], snap["counts"].get(state, 0))
        yield tasks
        running = GaugeMetricFamily("zres_running_tasks", "Tasks running, by owner and "
                                    "whether their client is gone (client=gone: detached, "
                                    "or being stopped)", labels=["owner", "client"])
        for entry in snap.get("running_by_owner", []):
            running.add_metric([entry["owner"], "gone" if entry["client_gone"] else "present"],
                               entry["count"])
        yield running
        finished = CounterMetricFamily("zres_tasks_finished", "Tasks ended since the "
                                       "broker started, by how (finished, error, "
                                       "cancelled)", labels=["outcome"])
        for outcome in ("finished", "error", "cancelled"):
            finished.add_metric([outcome], snap["finished"].get(outcome, 0))
        yield finished
        demand = GaugeMetricFamily("zres_waiting_tasks", "Tasks waiting to run, by the "
                                   "resources they ask for", labels=["request"])
        shapes: dict[str, int] = {}
        for group in snap["groups"]:
            shapes[group["request"]] = shapes.get(group["request"], 0) + group["count"]
        for request, count in sorted(shapes.items()):
            demand.add_metric([request], count)
        yield demand
        yield GaugeMetricFamily("zres_infeasible_tasks", "Waiting tasks no agent could ever "
                                "run", value=sum(g["count"] for g in snap["groups"]
                                                 if g["infeasible"]))
        total = GaugeMetricFamily("zres_agent_resource_total", "What each agent offers, in "
                                  "user units", labels=["agent", "resource"])
        free = GaugeMetricFamily("zres_agent_resource_free", "What each agent has free now, "
                                 "in user units", labels=["agent", "resource"])
        for agent in snap["agents"]:
            for family, key in ((total, "total"), (free, "free")):
                sums: dict[str, float] = {}
                for slot in agent["slots"]:
                    for name, amount in slot[key].items():
                        sums[name] = sums.get(name, 0.0) + amount
                for name, amount in sorted(sums.items()):
                    family.add_metric([agent["name"], name], amount)
        yield total
        yield free
        yield GaugeMetricFamily("zres_agents", "Agents registered", value=len(snap["agents"]))
        held = GaugeMetricFamily("zres_agent_store_bytes", "Bytes of results each agent "
                                 "holds, in memory and spilled to its disk",
                                 labels=["agent", "tier"])
        for agent in snap["agents"]:
            store = agent.get("store") or {}
            for tier in ("memory", "spilled"):
                held.add_metric([agent["name"], tier], store.get(tier, 0))
        yield held
        relay = snap.get("relay") or {}
        yield CounterMetricFamily("zres_relayed_bytes", "Bytes the broker's relay moved for "
                                  "peers that could not reach an agent's data port",
                                  value=relay.get("bytes", 0))
        yield CounterMetricFamily("zres_relayed_transfers", "Transfers the broker's relay "
                                  "moved", value=relay.get("transfers", 0))
        memory = GaugeMetricFamily("zres_task_memory_bytes", "Memory of each running task, "
                                   "job and actor with a process of its own (by the broker's "
                                   "id; an actor's: its placement), now and at most",
                                   labels=["agent", "task", "kind"])
        for agent in snap["agents"]:
            for task_id, current, peak in (agent.get("memory") or {}).get("tasks", ()):
                memory.add_metric([agent["name"], str(task_id), "current"], current)
                memory.add_metric([agent["name"], str(task_id), "peak"], peak)
        yield memory
        yield GaugeMetricFamily("zres_clients", "Clients connected", value=snap["clients"])
        actors = GaugeMetricFamily("zres_actors", "Actors, by state", labels=["state"])
        by_state: dict[str, int] = {}
        for actor in snap["actors"]:
            by_state[actor["state"]] = by_state.get(actor["state"], 0) + 1
        for state, count in sorted(by_state.items()):
            actors.add_metric([state], count)
        yield actors
        yield from _gangs(snap)


def _gangs(snap: dict[str, Any]) -> Iterator[Any]:
    """Placement groups by state, and their bundles by the agent holding them."""
    groups = GaugeMetricFamily("zres_placement_groups", "Placement groups, by state",
                               labels=["state"])
    bundles = GaugeMetricFamily("zres_placement_group_bundles", "Placement group bundles "
                                "reserved, by the agent holding them", labels=["agent"])
    states: dict[str, int] = {}
    agents: dict[str, int] = {}
    for group in snap.get("placement_groups", []):
        states[group["state"]] = states.get(group["state"], 0) + 1
        for bundle in group["bundles"]:
            if bundle["agent"]:
                agents[bundle["agent"]] = agents.get(bundle["agent"], 0) + 1
    for state, count in sorted(states.items()):
        groups.add_metric([state], count)
    for agent, count in sorted(agents.items()):
        bundles.add_metric([agent], count)
    yield groups
    yield bundles
