"""The process that runs tasks, started and supervised by an agent.

Each worker process serves one slot of one agent with one fixed GPU visibility: the agent
sets CUDA_VISIBLE_DEVICES when it starts the process and never sends it a task granted a
different device set, so a CUDA context made by one task is never reused for another
device. Tasks run on a pool of threads; results go back to the agent in batches (the last
task running sends its own: no hand-off to the main thread; see ``link``).

Every start is written to this process's start log (shared with the agent, see
``shared``) before the task's body runs, and reported to the agent with the next batch:
should this process die, the agent knows exactly which of its tasks had started.

Pipelining: while this process runs everything its slot runs, the agent hands it a few of
the slot's queued grants (``queued`` in a task's context). This process starts them itself
the moment room frees, with no round trip: highest priority first, each when its
``taken`` amounts fit the slot's ``capacity`` beside what runs here; one that does not fit
is passed over by those behind it (backfill) until it has waited ``starve`` seconds. It
starts them only while the agent's lease holds, so a stopped or cut-off agent's worker
soon starts nothing on its own.

An actor gets a process of its own (``actor`` as the last argument): its first task
constructs the instance, and every later one calls a method on it, on NTHREADS threads
(the actor's ``max_concurrency``); coroutines run on the actor's own event loop.

    python -m zres.agent.worker SOCKET IDENTITY NTHREADS AGENT_PID LEASE STARTS [actor]
"""

from __future__ import annotations

import bisect
import inspect
import os
import queue
import sys
import threading
import time
from typing import Any

import zmq

from ..core import protocol as P
from ..core import wakeup
from ..core.context import TOKEN_ENV, TaskContext, set_task_context
from ..core.serialize import CallLoader, dumps_exception, dumps_result, loads, missing_module_note
from .actor_host import ActorHost
from .data.worker_side import InputLost, WorkerObjects
from .direct import DirectResults
from .link import AgentLink, LinkClosed
from .output import OutputBuffer, capture
from .shared import Lease, StartLog
from .stopping import CallStopper, Stopped
from .threads import TaskThreads

_MAX_THREADS = 1024
_PR_SET_PDEATHSIG = 1
_STOPPED = {"type": "CancelledError", "message": "stopped by a forced cancel"}

# A queued grant as this process keeps it: (order key, queued since, taken, call).
Queued = tuple[tuple[int, int], float, dict[str, int], tuple[Any, ...]]


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process the moment PARENT (the agent) dies.

    A worker with no agent has nobody to report to, and must not run on with grants the
    broker will give to someone else. Linux only; elsewhere the main loop's check of the
    parent process is the backstop.
    """
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(0)


class WorkerProcess:
    """Receive RUN batches from the agent, run them on threads, send DONE batches back."""

    def __init__(self, socket_path: str, identity: bytes, nthreads: int, agent_pid: int,
                 lease: str, starts: str, actor: bool = False) -> None:
        # Read by the main thread; written under a lock by any thread: the last task
        # running sends its result itself, with no hand-off to the main thread.
        self.link = AgentLink(socket_path, identity)
        self._send_lock = threading.Lock()
        # Task threads hand results to the sender as Python objects (an actor's to the
        # main thread, woken through a pipe): nothing is encoded twice.
        self.results: queue.SimpleQueue[tuple[int, str, list[Any], dict[str, Any]]] = \
            queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._wake_pending = False   # a byte is in the pipe: no need for another
        # What tasks print goes to their clients (see output): sent every INTERVAL while
        # there is some, and before any result.
        self.output = OutputBuffer(self._wake)  # (capture() in main: sys is the process's)
        # Every task the agent sends starts at once: its resources are free, the broker
        # and the agent have checked. Threads are made on demand and reused; NTHREADS is
        # what the slot offers as CPU. An actor's calls are paced by the agent, never more
        # than NTHREADS at once.
        self.pool = TaskThreads(nthreads if actor else max(_MAX_THREADS, nthreads),
                                "zres-task")
        self.actor = ActorHost(nthreads) if actor else None
        self.agent_pid = agent_pid
        self.loader = CallLoader()
        self.objects = WorkerObjects()  # (the agent's store: big results, inputs by reference)
        self.stopper = CallStopper()
        self.direct = DirectResults()  # (small results' way to the broker: see direct)
        self._turns_by = 0.0           # when the main thread's poll returns at the latest
        self._stop_errors: dict[int, dict[str, Any]] = {}  # stopped, failing so, not cancelled
        self._cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.lease = Lease(lease)
        self.starts = StartLog(starts)
        # The slot's accounting, for queued grants (see the module's docstring). Task
        # threads update it too: a thread that ends a task starts the next queued grant
        # itself if it fits, and runs it, with no hand-off to another thread.
        self._lock = threading.Lock()
        self.capacity: dict[str, int] = {}
        self.starve = 5.0
        self.used: dict[str, int] = {}
        self.taken: dict[int, dict[str, int]] = {}        # running task -> what it took
        self.running = 0                                  # tasks begun, not ended
        self.queued: list[Queued] = []                    # in order (priority, then seq)
        self.started: list[int] = []                      # starts not reported yet
        self.dropped: list[int] = []                      # ... and queued grants cancelled

    def run(self) -> None:
        self._send(P.encode(P.READY, {"pid": os.getpid()}))
        poller = zmq.Poller()
        poller.register(self.link.fileno(), zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            # Starts are reported with the next results; a start with none soon after is
            # reported on its own a few milliseconds later.
            with self._send_lock:  # (a task's thread keeps back the agent's copy of a
                # result sent straight only if this thread then turns within LATER: direct)
                timeout = 5 if self.started or self.direct.later else 1000
                due = self.output.due
                if due is not None:
                    timeout = min(timeout, max(0, int((due - time.monotonic()) * 1000) + 1))
                self._turns_by = time.monotonic() + timeout / 1000
            events = dict(poller.poll(timeout))
            self._turns_by = time.monotonic()  # (awake: it sends them before it waits again)
            if self.link.fileno() in events:
                self._receive()
            elif not events and self.queued and self._start_queued():
                self._send_results()  # the lease came back (the agent touches us too)
            if self._wake_r in events or (not events and self.started):
                self._send_results()
            elif self.output.due is not None and time.monotonic() >= self.output.due:
                with self._send_lock:
                    self._send_output()
            if self.direct.later and (not events or self.direct.due()):  # (see direct)
                with self._send_lock:
                    self._send_later()
            if os.getppid() != self.agent_pid:
                os._exit(0)  # the agent died and no kernel told us (not Linux)

    def _receive(self) -> None:
        try:
            messages = self.link.read()
        except LinkClosed:
            os._exit(0)  # the agent has gone: nobody to report to
        for frames in messages:
            msg = P.decode(frames)
            if msg.kind == P.CANCEL:
                self._cancel(msg.body.get("ids", []))
                if msg.body.get("force"):
                    for task_id in msg.body.get("ids", []):
                        if isinstance(msg.body.get("error"), dict):  # (node out of memory)
                            self._stop_errors[task_id] = msg.body["error"]
                        if not self.stopper.stop(task_id):
                            self._stop_errors.pop(task_id, None)
                continue
            if msg.kind != P.RUN:
                continue
            self.direct.connect(msg.body.get("direct"))
            via = msg.body.get("via")  # (the session its grants run under: see direct)
            if "capacity" in msg.body:
                with self._lock:
                    self.capacity = msg.body["capacity"]
                    self.starve = float(msg.body.get("starve", self.starve))
            items = msg.body["tasks"]
            groups = P.split_frames(msg.frames, [i[1] + sum(i[2]) for i in items])
            for (task_id, nframes, dep_counts, context), frames_ in zip(items, groups):
                context["via"] = via
                call = (task_id, frames_[:nframes], P.split_frames(frames_[nframes:], dep_counts),
                        context)
                if self.actor is not None:
                    self.actor.waiting.append(call)
                elif context.get("queued"):
                    key = (-int(context.get("priority", 0)), int(context.get("seq", 0)))
                    with self._lock:
                        bisect.insort(self.queued, (key, float(context.get("since", 0.0)),
                                                    context["taken"], call),
                                      key=lambda q: q[0])
                else:
                    with self._lock:
                        self._begin(call)
                    self.pool.submit(self._run_tasks, call)
            if self._start_queued():
                self._send_results()  # report the starts now (see _send_results)
            self._start_actor_calls()

    def _begin(self, call: tuple[Any, ...]) -> None:
        """CALL starts now (under the lock): log it, report it, count what it takes."""
        self.starts.record(call[3]["run"])
        self.started.append(call[0])
        self.running += 1
        self.direct.note(call[0], call[3])
        taken = call[3].get("taken")
        if taken:
            self.taken[call[0]] = taken
            for name, amount in taken.items():
                self.used[name] = self.used.get(name, 0) + amount

    def _next_queued(self, ended: int | None = None) -> tuple[Any, ...] | None:
        """Give back what ENDED took; start and return the first queued grant that fits."""
        with self._lock:
            if ended is not None:
                self.running -= 1
            taken = self.taken.pop(ended, None) if ended is not None else None
            if taken:
                for name, amount in taken.items():
                    self.used[name] -= amount
            if not self.queued:
                return None
            now = time.monotonic()
            if not self.lease.valid(now):
                return None  # the broker may no longer count on this agent: start nothing
            for index, (_, since, need, call) in enumerate(self.queued):
                if all(self.capacity.get(n, 0) - self.used.get(n, 0) >= a
                       for n, a in need.items()):
                    del self.queued[index]
                    self._begin(call)
                    return call
                if now - since >= self.starve:
                    return None  # it has waited long enough: nothing behind it overtakes
            return None

    def _start_queued(self) -> int:
        """Start queued grants while one fits the slot's free amounts."""
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
            # let start can be reported ended ahead of it. The last task running sends it
            # itself (one at a time: no batch to wait for); else the main thread batches.
            self._put(result, alone=following is None and not self.running)
            if following is not None and self._start_queued():  # more fit beside it
                self._wake()
            call = following

    def _cancel(self, ids: list[int]) -> None:
        # Results before the cancel are reported first: the agent and the broker replay
        # these events in the order this process saw them.
        self._send_results()
        with self._lock:
            kept = [q for q in self.queued if q[3][0] not in ids]
            self.dropped += [q[3][0] for q in self.queued if q[3][0] in ids]
            self.queued = kept
        self._start_queued()
        self._send_results()

    def _start_actor_calls(self) -> None:
        """Start an actor's calls in the order received, while it has a free place."""
        actor = self.actor
        while actor is not None and actor.waiting and actor.free > 0:
            actor.free -= 1
            call = actor.waiting.popleft()
            self.starts.record(call[3]["run"])
            with self._lock:
                self.started.append(call[0])
            self.pool.submit(self._run_task, *call)  # no accounting

    def _run_task(self, task_id: int, payload: list[Any], deps: list[list[Any]],
                  context: dict[str, Any]) -> None:
        self._put(self._call(task_id, payload, deps, context))

    def _call(self, task_id: int, payload: list[Any], deps: list[list[Any]],
              context: dict[str, Any]) -> tuple[int, str, list[Any], dict[str, Any]]:
        """Run one task; return its result as the agent is sent it."""
        try:
            return self._run_call(task_id, payload, deps, context)
        except Stopped:  # a forced cancel that landed on the way out of the call
            self.stopper.leave(task_id)
            return task_id, P.FAILED, [], self._stop_errors.pop(task_id, _STOPPED)

    def _run_call(self, task_id: int, payload: list[Any], deps: list[list[Any]],
                  context: dict[str, Any]) -> tuple[int, str, list[Any], dict[str, Any]]:
        token = str(context.get("token", ""))
        task = TaskContext(task_id, context["agent"], context["resources"],
                           list(context["gpus"]), context.get("attempt", 0), token=token,
                           cpus=list(context.get("cpus", ())))
        set_task_context(task)
        if self.actor is not None and token:
            # This process serves one actor: a client made anywhere in it (a thread of its
            # own, its event loop) acts for the actor's owner.
            os.environ[TOKEN_ENV] = token
        try:
            deps = self.objects.inputs(deps, context.get("refs"))
            if context.get("payload", -1) >= 0:  # its call was put on an agent: it is that
                payload = deps.pop(context["payload"])  # input (not one the call reads)
        except InputLost as lost:  # (before its body: it ran nothing, and runs again)
            set_task_context(None)
            self.output.end(task_id)
            return task_id, P.FAILED, [], {"type": "InputLostError", "message": str(lost),
                                           "input": lost.object_id}
        if task.cpus:  # (this thread, and what it starts: given back as it ends)
            os.sched_setaffinity(0, task.cpus)
        try:
            fn, args, kwargs = self.loader.load(payload, [loads(d) for d in deps])
            self.stopper.enter(task_id)
            if self.actor is not None:
                value = self.actor.run(fn, args, kwargs, bool(context.get("create")))
            else:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    import asyncio  # (here: most processes run no coroutine, and start sooner)
                    value = asyncio.run(_await(value))
            self.stopper.leave(task_id)
            outcome, frames = P.OK, dumps_result(value, fn, task_id, task.agent)
            frames, kept = self.objects.keep(task_id, frames, fn, task.agent)  # (big: stored)
            task.report.update(kept)
        except Stopped:
            raise
        except BaseException as exc:  # report everything, SystemExit included
            self.stopper.leave(task_id)
            if isinstance(exc, ModuleNotFoundError) and exc.name:
                exc.add_note(missing_module_note(exc.name, task.agent))
            outcome, frames = P.RAISED, dumps_exception(exc)
        finally:
            set_task_context(None)
            if task.cpus:
                os.sched_setaffinity(0, self._cores)
            if self.output.end(task_id):  # (before its result is put: see _send_results)
                self.direct.printed(task_id)
        return task_id, outcome, frames, task.report

    def _put(self, result: tuple[int, str, list[Any], dict[str, Any]],
             alone: bool = False) -> None:
        self.results.put(result)
        if alone and self.actor is None:
            self._send_batch()  # (sent by this thread: see __init__)
        else:
            self._wake()  # (an actor's next call is fed by the main thread once it is sent)

    def _wake(self) -> None:
        """Have the main thread send what is waiting to go to the agent."""
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_w, b"x")

    def _send_results(self) -> None:
        wakeup.drain(self._wake_r)
        # Only after the pipe is empty: a thread that then sees False writes a new byte.
        self._wake_pending = False
        self._send_batch()
        # Only now: the agent must hear of a result before the call taking its place starts.
        self._start_actor_calls()

    def _send_batch(self) -> None:
        """Send the agent the results put, the output before them, starts and drops (any
        thread: one at a time, a batch taking everything put so far)."""
        with self._send_lock:
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
            # Output after the results, and sent before them: a task's output is kept
            # before its result is put, so none of it can be left behind a result sent now.
            # With no result, only once due (a wake for output alone starts the clock).
            due = self.output.due
            if items or due is not None and time.monotonic() >= due:
                self._send_output()
            # Read after the results: a queued grant is marked started before its result
            # is put, so no result goes out ahead of its start.
            with self._lock:
                started, dropped = self.started, self.dropped
                self.started, self.dropped = [], []
            replicas = self.objects.take_replicas()  # (inputs fetched: the agent counts them)
            if items or started or dropped or replicas:
                body: dict[str, Any] = {"results": items}
                if started or dropped:
                    body["started"], body["dropped"] = started, dropped
                if replicas:
                    body["replicas"] = replicas
                def copy() -> list[Any]:
                    return P.encode(P.DONE, body, frames)
                if not self.direct.sent(items, frames, started, dropped or replicas, copy,
                                        self._turns_by):
                    self._send_later()
                    self._send(copy())

    def _send_later(self) -> None:
        """Send the agent its copies of results sent straight to the broker (under
        _send_lock): before anything later."""
        for message in self.direct.take_later():
            self._send(message)

    def _send_output(self) -> None:
        """Send what tasks printed (under _send_lock)."""
        items = self.output.take()
        if items:
            self._send(P.encode(P.OUTPUT, {"items": items}))

    def _send(self, message: list[Any]) -> None:
        """Send the agent MESSAGE (under _send_lock, READY aside)."""
        try:
            self.link.send(message)
        except LinkClosed:
            os._exit(0)  # the agent has gone (the kernel kills us too: see die_with_parent)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str] | None = None) -> None:
    socket_path, identity, nthreads, agent_pid, lease, starts, *mode = argv or sys.argv[1:]
    die_with_parent(int(agent_pid))
    worker = WorkerProcess(socket_path, identity.encode(), int(nthreads), int(agent_pid), lease,
                           starts, actor=mode == ["actor"])
    capture(worker.output)
    worker.run()


if __name__ == "__main__":
    main()
