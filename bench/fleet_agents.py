"""Fake agents for bench/fleet.py: many sessions in one process, speaking the real protocol.

Run by fleet.py (``--serve``); prints ``ready`` once every agent is welcomed. Commands on its
standard input: ``counts`` (prints its counts as one JSON line); ``mute`` (its first agent
goes silent: it finishes what it was told it may start, then neither beats nor takes
anything; once the broker declares it lost it registers anew, and ``found_s`` says how long
that took); ``leave`` (every agent says goodbye, as agents stopping do; prints ``left``);
``join MODE`` (every agent registers a new session and answers grants as MODE says; prints
``ready`` once all are welcomed); ``stop`` (prints its counts and ends). Answer modes:
``acked``, ``once`` (see fleet.py) and ``hold``: grants are kept and never answered (the
agents' slots stay full).

One epoll over every socket's ZMQ_FD, each socket drained when it is signalled (and after
each send, which may take the signal), keeps the fleet's own CPU per message small: the
broker is what is measured.
"""

from __future__ import annotations

import collections
import json
import os
import random
import selectors
import sys
import time
from typing import Any

import zmq

from zres.core import keys, versions
from zres.core import protocol as P
from zres.core.resources import UNIT
from zres.core.serialize import dumps


class FakeAgent:
    """One agent: its connection, its heartbeat thread's socket, its session and reports."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.name = name
        self.sock = fleet.socket()
        self.side = fleet.socket()
        self.new_session()

    def new_session(self) -> None:
        self.session = random.getrandbits(62)
        self.registered = False
        self.muted: float | None = None  # when it went silent (``mute``)
        self.echoed = 0.0   # the latest heartbeat of ours the broker echoed (sent then)
        self.lease = 0.0
        self.seq = 0
        self.unacked: collections.deque[tuple[int, list[int]]] = collections.deque()
        self.held: list[int] = []     # the next report's
        self.gated: list[int] = []    # ... of those, the queued grants (start once acked)
        self.ended: list[int] = []    # started and ended: the next report's

    def register(self) -> None:
        self.echoed = time.monotonic()
        self.send(P.encode(P.REGISTER, {
            "name": self.name, "session": self.session, "host": "fleet", "pid": os.getpid(),
            "t": time.monotonic(), "versions": versions.mine(),
            "slots": [{"units": {"CPU": self.fleet.threads * UNIT}, "gpus": [],
                       "gpu_memory": []}]}))

    def send(self, frames: list[Any]) -> None:
        P.send(self.sock, frames)
        self.fleet.sent += 1

    def beat(self, now: float) -> None:
        if not self.registered or self.muted is not None:
            return
        self.send(P.encode(P.HEARTBEAT, {"t": now, "session": self.session}))
        # A real agent's heartbeat thread beats only while the loop's beats go unechoed
        # (zres.agent.heartbeat).
        if self.fleet.side == "always" or \
                now - self.echoed > min(2 * self.fleet.interval, self.lease / 2):
            P.send_now(self.side, P.encode(P.HEARTBEAT, {"t": now, "session": self.session,
                                                          "side": True}))
            self.fleet.sent += 1
            self.fleet.side_beats += 1
            self.fleet.drain(self.side, self)

    def report(self) -> None:
        """Send what happened since the last report, if anything did."""
        if not (self.held or self.ended):
            return
        self.seq += 1
        body: dict[str, Any] = {"seq": self.seq, "session": self.session}
        if self.held:
            body["held"] = self.held
        frames: list[Any] = []
        if self.ended:
            body["started"] = self.ended
            body["results"] = [[i, P.OK, len(self.fleet.result), {}] for i in self.ended]
            frames = self.fleet.result * len(self.ended)
            self.fleet.done += len(self.ended)
        self.unacked.append((self.seq, self.gated))
        self.held, self.ended, self.gated = [], [], []
        self.send(P.encode(P.REPORT, body, frames))

    def acked(self, ack: Any) -> None:
        """The broker has our reports up to ACK: what they said was held may start (and,
        for no-ops, end at once)."""
        if type(ack) is not int:
            return
        while self.unacked and self.unacked[0][0] <= ack:
            self.ended.extend(self.unacked.popleft()[1])
            self.fleet.touched.add(self)

    def take(self, frames: list[Any], side: bool) -> None:
        self.fleet.received += 1
        msg = P.decode(frames)
        if msg.body.get("session") not in (None, self.session):
            return
        if msg.kind == P.HEARTBEAT and isinstance(msg.body.get("echo"), float):
            self.echoed = max(self.echoed, msg.body["echo"])
            # (the beat's round trip: the broker's loop behind its messages shows here)
            self.fleet.slowest_echo = max(self.fleet.slowest_echo,
                                          time.monotonic() - msg.body["echo"])
        if side:
            return
        if msg.kind == P.WELCOME:
            if not self.registered:
                self.registered = True
                self.lease = float(msg.body.get("lease", 0.0))
                self.fleet.welcomed += 1
            self.acked(msg.body.get("ack"))
        elif msg.kind in (P.HEARTBEAT, P.ACK):
            self.acked(msg.body.get("ack"))
        elif msg.kind == P.ASSIGN:
            self.acked(msg.body.get("ack"))
            ids = [item[0] for item in msg.body["tasks"]]
            self.fleet.granted += len(ids)
            if self.fleet.answer == "hold" or self.muted is not None:
                return  # (never held here: the broker grants them again, uncharged)
            self.held.extend(ids)
            self.fleet.touched.add(self)
            if self.fleet.answer == "once":
                self.ended.extend(ids)
            else:  # (as a real agent: a direct grant starts at once, a queued one once acked)
                queued = {item[0] for item in msg.body["tasks"]
                          if isinstance(item[-1], dict) and item[-1].get("queued")}
                self.ended.extend(i for i in ids if i not in queued)
                self.gated.extend(i for i in ids if i in queued)
        elif msg.kind == P.UNKNOWN:
            # Declared lost (or forgotten): a real agent stops that session's work and
            # registers anew.
            if self.muted is not None:
                self.fleet.found_s = round(time.monotonic() - self.muted, 2)
                self.fleet.found_why = str(msg.body.get("ended"))
            else:
                self.fleet.lost += 1
            self.new_session()
            self.register()


class Fleet:
    def __init__(self, address: str, keys_dir: str, first: int, count: int, answer: str,
                 threads: int, side: str, interval: float) -> None:
        self.ctx = zmq.Context(io_threads=1)
        self.ctx.max_sockets = 2 * count + 64
        self.key = keys.peer_key(keys_dir, ("agent",))
        self.address = address
        self.answer = answer
        self.threads = threads
        self.interval = interval
        self.side = side
        self.result = dumps(None)
        self.selector = selectors.EpollSelector()
        self.sent = self.received = self.welcomed = self.lost = self.granted = self.done = 0
        self.side_beats = 0
        self.found_s = -1.0  # how long the broker took to find the muted agent silent
        self.found_why = ""
        self.slowest_echo = 0.0  # the slowest heartbeat round trip (seconds)
        self.touched: set[FakeAgent] = set()
        self.agents = [FakeAgent(self, f"fleet-{first + i:05d}") for i in range(count)]
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, None)

    def socket(self) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        keys.secure(sock, self.key)
        sock.connect(self.address)
        return sock

    def drain(self, sock: zmq.Socket[Any], agent: FakeAgent) -> None:
        side = sock is agent.side
        while True:
            try:
                frames = P.recv(sock)
            except zmq.Again:
                return
            agent.take(frames, side)

    def serve(self) -> None:
        for agent in self.agents:
            for sock in (agent.sock, agent.side):
                self.selector.register(sock.getsockopt(zmq.FD), selectors.EVENT_READ,
                                       (sock, agent))
            agent.register()
        # Beats spread over the interval, as agents started at different times beat.
        now = time.monotonic()
        due = collections.deque((now + self.interval * i / len(self.agents), agent)
                                for i, agent in enumerate(self.agents))
        self.joining = True
        last_sweep = now
        while True:
            wait = max(0.0, min(due[0][0] - time.monotonic(), 0.05)) if due else 0.05
            for key, _ in self.selector.select(wait):
                if key.data is None:
                    if not self.command(sys.stdin.readline().split()):
                        self.close()
                        return
                    continue
                sock, agent = key.data
                self.drain(sock, agent)
            now = time.monotonic()
            while due and due[0][0] <= now:
                at, agent = due.popleft()
                agent.beat(now)
                due.append((at + self.interval, agent))
            if now - last_sweep > 0.2:  # (a signal missed is a message late, not lost)
                last_sweep = now
                for agent in self.agents:
                    self.drain(agent.sock, agent)
                    self.drain(agent.side, agent)
            while self.touched:
                touched, self.touched = self.touched, set()
                for agent in touched:
                    agent.report()
                    self.drain(agent.sock, agent)  # (a send may take the socket's signal)
            if self.joining and self.welcomed >= len(self.agents):
                self.joining = False
                print("ready", flush=True)

    def command(self, words: list[str]) -> bool:
        """Do what fleet.py asks; False: stop."""
        if not words or words[0] == "stop":
            return False
        if words[0] == "counts":
            self.counts()
        elif words[0] == "mute":
            self.agents[0].muted = time.monotonic()
            print("muted", flush=True)
        elif words[0] == "leave":
            for agent in self.agents:
                if agent.registered:  # (after its last report: SEQ)
                    agent.send(P.encode(P.BYE, {"session": agent.session, "seq": agent.seq}))
                agent.new_session()  # (not registered: it neither beats nor answers)
            print("left", flush=True)
        elif words[0] == "join":
            self.answer, self.welcomed, self.joining = words[1], 0, True
            for agent in self.agents:
                agent.register()
        return True

    def counts(self) -> None:
        print(json.dumps({"sent": self.sent, "received": self.received, "lost": self.lost,
                          "granted": self.granted, "done": self.done,
                          "side_beats": self.side_beats, "found_s": self.found_s,
                          "found_why": self.found_why,
                          "slowest_echo_s": round(self.slowest_echo, 2)}),
              flush=True)

    def close(self) -> None:
        self.counts()
        for agent in self.agents:
            P.send_now(agent.sock, P.encode(P.BYE, {"session": agent.session,
                                                   "seq": agent.seq}))
        self.ctx.destroy(linger=0)


def serve(address: str, keys_dir: str, first: str, count: str, answer: str, threads: str,
          side: str, interval: str) -> None:
    Fleet(address, keys_dir, int(first), int(count), answer, int(threads),
          side, float(interval)).serve()
