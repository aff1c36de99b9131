"""The process that runs tasks, started and supervised by an agent.

Each worker process serves one slot of one agent with one fixed GPU visibility: the agent
sets CUDA_VISIBLE_DEVICES when it starts the process and never sends it a task granted a
different device set, so a CUDA context made by one task is never reused for another
device. Tasks run on a pool of threads; results go back to the agent in batches.

Pipelining: while this process runs everything its slot runs, the agent hands it the
slot's queued grants too (``queued`` in a task's context). They start here strictly in
order, each when its ``taken`` amounts fit the slot's ``capacity`` beside what runs here:
the rule the agent and the broker apply to the same grants, so all three agree on what
has started, and the next short task starts the moment one ends, with no round trip.
Started and dropped (cancelled) queued grants are reported as soon as they are.

An actor gets a process of its own (``actor`` as the last argument): its first task
constructs the instance, and every later one calls a method on it, on NTHREADS threads
(the actor's ``max_concurrency``); coroutines run on the actor's own event loop.

    python -m zres.agent.worker ADDRESS IDENTITY NTHREADS AGENT_PID [actor]
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import signal
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from ..core import protocol as P
from ..core.context import TaskContext, set_task_context
from ..core.serialize import CallLoader, dumps, dumps_exception, loads
from . import commands

_MAX_THREADS = 1024


class WorkerProcess:
    """Receive RUN batches from the agent, run them on threads, send DONE batches back."""

    def __init__(self, address: str, identity: bytes, nthreads: int, agent_pid: int,
                 actor: bool = False) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.agent = self.ctx.socket(zmq.DEALER)
        self.agent.setsockopt(zmq.ROUTING_ID, identity)
        self.agent.setsockopt(zmq.LINGER, 2000)
        self.agent.connect(address)
        # Task threads hand results to the main thread (the only one that may use the
        # socket) as Python objects, and wake it through a pipe: nothing is encoded twice.
        self.results: queue.SimpleQueue[tuple[int, str, list[Any], dict[str, Any]]] = \
            queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._wake_pending = False   # a byte is in the pipe: no need for another
        # Every task the agent sends starts at once: the broker has already checked its
        # resources (CPU included), so a task never waits here for a thread, and "assigned"
        # means "running" when a loss is charged to a retry budget. Threads are made on
        # demand and reused; NTHREADS is what the slot offers as CPU.
        # An actor's calls are paced by the agent, never more than NTHREADS at once.
        self.pool = ThreadPoolExecutor(nthreads if actor else max(_MAX_THREADS, nthreads),
                                       thread_name_prefix="zres-task")
        self.actor = ActorHost(nthreads) if actor else None
        self.agent_pid = agent_pid
        self.loader = CallLoader()
        # The slot's accounting, for queued grants (see the module's docstring). Task
        # threads update it too: a thread that ends a task starts the queue's head itself
        # if it fits, and runs it, with no hand-off to another thread.
        self._lock = threading.Lock()
        self.capacity: dict[str, int] = {}
        self.used: dict[str, int] = {}
        self.taken: dict[int, dict[str, int]] = {}        # running task -> what it took
        self.queued: deque[tuple[dict[str, int], tuple[Any, ...]]] = deque()
        self.started: list[int] = []                      # queued grants started since
        self.dropped: list[int] = []                      # ... and cancelled unstarted

    def run(self) -> None:
        # Stopped by the agent: take running command jobs' process groups along.
        signal.signal(signal.SIGTERM, _stop)
        P.send(self.agent, P.encode(P.READY, {"pid": os.getpid()}))
        poller = zmq.Poller()
        poller.register(self.agent, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            events = dict(poller.poll(1000))
            if self.agent in events:
                self._receive()
            if self._wake_r in events:
                self._send_results()
            if os.getppid() != self.agent_pid:
                # The agent died (maybe before we started): nobody is left to report to,
                # and a task stuck in a thread must not keep this process alive.
                commands.terminate_all()
                os._exit(0)

    def _receive(self) -> None:
        while True:
            try:
                frames = P.recv(self.agent)
            except zmq.Again:
                return
            msg = P.decode(frames)
            if msg.kind == P.CANCEL:
                self._cancel(msg.body.get("ids", []))
                continue
            if msg.kind != P.RUN:
                continue
            capacity = msg.body.get("capacity")
            if capacity is not None:
                with self._lock:
                    self.capacity = capacity
            items = msg.body["tasks"]
            groups = P.split_frames(msg.frames, [i[1] + sum(i[2]) for i in items])
            for (task_id, nframes, dep_counts, context), frames_ in zip(items, groups):
                call = (task_id, frames_[:nframes], P.split_frames(frames_[nframes:], dep_counts),
                        context)
                if self.actor is not None:
                    self.actor.waiting.append(call)
                elif context.get("queued"):
                    with self._lock:
                        self.queued.append((context["taken"], call))
                else:
                    with self._lock:
                        self._take(call)
                    self.pool.submit(self._run_tasks, call)
            if self._start_queued():
                self._send_results()  # report the starts now (see _send_results)
            self._start_actor_calls()

    def _take(self, call: tuple[Any, ...]) -> None:
        """Count CALL's resources as in use (under the lock)."""
        taken = call[3].get("taken")
        if taken:
            self.taken[call[0]] = taken
            for name, amount in taken.items():
                self.used[name] = self.used.get(name, 0) + amount

    def _next_queued(self, ended: int | None = None) -> tuple[Any, ...] | None:
        """Return what ENDED gave back; start and return the queue's head if it now fits."""
        with self._lock:
            taken = self.taken.pop(ended, None) if ended is not None else None
            if taken:
                for name, amount in taken.items():
                    self.used[name] -= amount
            if not self.queued:
                return None
            head, call = self.queued[0]
            if any(self.capacity.get(n, 0) - self.used.get(n, 0) < a for n, a in head.items()):
                return None
            self.queued.popleft()
            self.started.append(call[0])
            self._take(call)
            return call

    def _start_queued(self) -> int:
        """Start queued grants in order while the head fits the slot's free amounts."""
        count = 0
        while (call := self._next_queued()) is not None:
            self.pool.submit(self._run_tasks, call)
            count += 1
        return count

    def _run_tasks(self, call: tuple[Any, ...] | None) -> None:
        """Run CALL, then each queued grant that its end lets start, on this thread."""
        while call is not None:
            result = self._call(*call)
            following = self._next_queued(call[0])
            # The result goes after the start it allowed, so one message reports both
            # (see _send_results), and before any other start, so no task that this end
            # let start can be reported ended ahead of it.
            self._put(result)
            if following is not None and self._start_queued():  # more fit beside it
                self._wake()
            call = following

    def _cancel(self, ids: list[int]) -> None:
        # Results before the cancel are reported first: the agent and the broker replay
        # these events in the order this process saw them.
        self._send_results()
        for task_id in ids:
            with self._lock:
                kept = deque(q for q in self.queued if q[1][0] != task_id)
                found = len(kept) != len(self.queued)
                if found:
                    self.queued = kept
                    self.dropped.append(task_id)
            if not found:
                commands.terminate(task_id)  # a running Python call cannot be stopped safely
        self._start_queued()
        self._send_results()

    def _start_actor_calls(self) -> None:
        """Start an actor's calls in the order received, while it has a free place."""
        actor = self.actor
        while actor is not None and actor.waiting and actor.free > 0:
            actor.free -= 1
            self.pool.submit(self._run_task, *actor.waiting.popleft())  # no accounting

    def _run_task(self, task_id: int, payload: list[Any], deps: list[list[Any]],
                  context: dict[str, Any]) -> None:
        self._put(self._call(task_id, payload, deps, context))

    def _call(self, task_id: int, payload: list[Any], deps: list[list[Any]],
              context: dict[str, Any]) -> tuple[int, str, list[Any], dict[str, Any]]:
        """Run one task; return its result as the agent is sent it."""
        task = TaskContext(task_id, context["agent"], context["resources"],
                           list(context["gpus"]), context.get("attempt", 0))
        set_task_context(task)
        try:
            fn, args, kwargs = self.loader.load(payload, [loads(d) for d in deps])
            if self.actor is not None:
                value = self.actor.run(fn, args, kwargs, bool(context.get("create")))
            else:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = asyncio.run(_await(value))
            outcome, frames = P.OK, dumps(value)
        except BaseException as exc:  # report everything, SystemExit included
            outcome, frames = P.RAISED, dumps_exception(exc)
        finally:
            set_task_context(None)
        return task_id, outcome, frames, task.report

    def _put(self, result: tuple[int, str, list[Any], dict[str, Any]]) -> None:
        self.results.put(result)
        self._wake()

    def _wake(self) -> None:
        """Have the main thread send what is waiting to go to the agent."""
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_w, b"x")

    def _send_results(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        # Only after the pipe is empty: a thread that then sees False writes a new byte.
        self._wake_pending = False
        items: list[Any] = []
        frames: list[Any] = []
        while True:
            try:
                task_id, outcome, task_frames, report = self.results.get_nowait()
            except queue.Empty:
                break
            items.append([task_id, outcome, len(task_frames), report])
            frames.extend(task_frames)
            if self.actor is not None:
                self.actor.finished(outcome)
        # Read after the results: a queued grant is marked started before its result is
        # put, so no result goes out ahead of its grant's start. Starts go out as soon as
        # they happen: should this process die, the agent runs the grants it has not heard
        # started again elsewhere, so only one started in the instant before the death can
        # run twice.
        with self._lock:
            started, dropped = self.started, self.dropped
            self.started, self.dropped = [], []
        if items or started or dropped:
            body: dict[str, Any] = {"results": items}
            if started or dropped:
                body["started"], body["dropped"] = started, dropped
            P.send(self.agent, P.encode(P.DONE, body, frames))
        # Only now: the agent must hear of a result before the call taking its place starts.
        self._start_actor_calls()


class ActorHost:
    """Hold one actor instance; run its construction and method calls.

    The construction runs alone; then up to CONCURRENCY calls at once, started in the
    order they arrived (``waiting``), each only after the previous result was sent.
    """

    READY = "__zres_ready__"  # a call that only waits for the instance to be up

    def __init__(self, concurrency: int) -> None:
        self.instance: Any = None
        self.concurrency = concurrency
        self.waiting: deque[tuple[Any, ...]] = deque()
        self.free = 1               # the construction's place
        self.constructed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def finished(self, outcome: str) -> None:
        if self.constructed:
            self.free += 1
        elif outcome == P.OK:
            self.constructed, self.free = True, self.concurrency
        # else __init__ raised: nothing more runs here; the agent ends this process

    def run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], create: bool) -> Any:
        if create:
            self.instance = fn(*args, **kwargs)
            return None
        if fn == self.READY:
            return None
        value = getattr(self.instance, fn)(*args, **kwargs)
        if inspect.isawaitable(value):
            # The actor's one event loop: its coroutines share state safely with each other.
            value = asyncio.run_coroutine_threadsafe(_await(value), self.loop()).result()
        return value

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="zres-actor-loop",
                                 daemon=True).start()
            return self._loop


def _stop(*_: Any) -> None:
    commands.terminate_all()
    os._exit(1)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str] | None = None) -> None:
    address, identity, nthreads, agent_pid, *mode = argv or sys.argv[1:]
    WorkerProcess(address, identity.encode(), int(nthreads), int(agent_pid),
                  actor=mode == ["actor"]).run()


if __name__ == "__main__":
    main()
