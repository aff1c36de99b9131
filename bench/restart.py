"""How long a broker takes to serve again after a SIGKILL, with many tasks queued.

Starts ``zres broker --state DIR`` on a free port, submits N Python tasks that no agent
can run yet (they stay queued: nothing is connected), waits until the broker has written
them all (a client keeps what is not acknowledged), SIGKILLs it and starts it again on
the same directory. Reports the time from the new process's start until it answers a
status request counting all N tasks, and what the state directory weighs.

    python bench/restart.py [--tasks 100000]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zres  # noqa: E402
from zres.core import protocol as P  # noqa: E402


def noop(i: int) -> int:
    return i


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(address: str, state: str) -> tuple[subprocess.Popen[bytes], float]:
    """Start a broker; return it and the seconds until it said it serves."""
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "zres", "broker", "--listen", address,
                             "--state", state], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("zres broker serving"), line
    return proc, began


def waiting(address: str) -> int:
    """The number of tasks the broker holds, by its status reply."""
    import zmq
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    P.send(sock, P.encode(P.STATUS, {"req": 1}))
    assert sock.poll(30_000), "no status reply"
    reply = P.decode(sock.recv_multipart())
    sock.close(0)
    return int(sum(reply.body.get("counts", {}).values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="zres-restart-bench-")
    address = f"tcp://127.0.0.1:{free_port()}"
    broker, _ = start(address, state)
    client = zres.Client(address)
    futures = client.map(noop, range(args.tasks), resources={"nothing-has-this": 1})
    deadline = time.monotonic() + 300
    while client._io.unacked or client._io.outbox:
        assert time.monotonic() < deadline, "the broker did not acknowledge the tasks"
        time.sleep(0.05)
    size = sum(f.stat().st_size for f in Path(state).iterdir())
    broker.kill()
    broker.wait()
    broker, began = start(address, state)
    serving = time.perf_counter() - began
    held = waiting(address)
    answered = time.perf_counter() - began
    print(f"{args.tasks:,} queued tasks, state {size / 1e6:.1f} MB: the restarted broker "
          f"serves after {serving:.2f} s and answers status (holding {held:,} tasks) "
          f"after {answered:.2f} s")
    del futures
    client.close()
    broker.kill()
    broker.wait()
    for name in os.listdir(state):
        os.remove(os.path.join(state, name))
    os.rmdir(state)


if __name__ == "__main__":
    main()
