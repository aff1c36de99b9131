"""The process that runs tasks, started and supervised by an agent.

Each worker process serves one slot of one agent with one fixed GPU visibility: the agent
sets CUDA_VISIBLE_DEVICES when it starts the process and never sends it a task granted a
different device set, so a CUDA context made by one task is never reused for another
device. Tasks run on a pool of threads; results go back to the agent in batches.

    python -m zres.worker ADDRESS IDENTITY NTHREADS AGENT_PID
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from . import protocol as P
from .context import TaskContext, set_task_context
from .serialize import CallLoader, dumps, dumps_exception, loads

_MAX_THREADS = 1024


class WorkerProcess:
    """Receive RUN batches from the agent, run them on threads, send DONE batches back."""

    def __init__(self, address: str, identity: bytes, nthreads: int, agent_pid: int) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.agent = self.ctx.socket(zmq.DEALER)
        self.agent.setsockopt(zmq.ROUTING_ID, identity)
        self.agent.setsockopt(zmq.LINGER, 2000)
        self.agent.connect(address)
        # Task threads hand results to the main thread (the only one that may use the
        # socket) as Python objects, and wake it through a pipe: nothing is encoded twice.
        self.results: queue.SimpleQueue[tuple[int, str, list[Any]]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # Every task the agent sends starts at once: the broker has already checked its
        # resources (CPU included), so a task never waits here for a thread, and "assigned"
        # means "running" when a loss is charged to a retry budget. Threads are made on
        # demand and reused; NTHREADS is what the slot offers as CPU.
        self.pool = ThreadPoolExecutor(max(_MAX_THREADS, nthreads),
                                       thread_name_prefix="zres-task")
        self.agent_pid = agent_pid
        self.loader = CallLoader()

    def run(self) -> None:
        self.agent.send_multipart(P.encode(P.READY, {"pid": os.getpid()}))
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
                os._exit(0)

    def _receive(self) -> None:
        while True:
            try:
                frames = self.agent.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            msg = P.decode(frames)
            if msg.kind != P.RUN:
                continue
            items = msg.body["tasks"]
            groups = P.split_frames(msg.frames, [i[1] + sum(i[2]) for i in items])
            for (task_id, nframes, dep_counts, context), frames_ in zip(items, groups):
                self.pool.submit(self._run_task, task_id, frames_[:nframes],
                                 P.split_frames(frames_[nframes:], dep_counts), context)

    def _run_task(self, task_id: int, payload: list[Any], deps: list[list[Any]],
                  context: dict[str, Any]) -> None:
        set_task_context(TaskContext(task_id, context["agent"], context["resources"],
                                             list(context["gpus"]), context.get("attempt", 0)))
        try:
            fn, args, kwargs = self.loader.load(payload, [loads(d) for d in deps])
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            outcome, frames = P.OK, dumps(value)
        except BaseException as exc:  # report everything, SystemExit included
            outcome, frames = P.RAISED, dumps_exception(exc)
        finally:
            set_task_context(None)
        self.results.put((task_id, outcome, frames))
        os.write(self._wake_w, b"x")

    def _send_results(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        items: list[Any] = []
        frames: list[Any] = []
        while True:
            try:
                task_id, outcome, task_frames = self.results.get_nowait()
            except queue.Empty:
                break
            items.append([task_id, outcome, len(task_frames), {}])
            frames.extend(task_frames)
        if items:
            self.agent.send_multipart(P.encode(P.DONE, {"results": items}, frames), copy=False)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str] | None = None) -> None:
    address, identity, nthreads, agent_pid = (argv or sys.argv[1:])[:4]
    WorkerProcess(address, identity.encode(), int(nthreads), int(agent_pid)).run()


if __name__ == "__main__":
    main()
