"""Pipelining: tasks granted into a slot's queue ahead of time start there in order, as
room frees, and the broker and agent agree on what runs. The pure scheduler is driven
with plain data; the end-to-end tests run real broker and agent processes."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import pytest

import zres
from tests.conftest import LOSS, wait_until
from tests.tasks import hold, wait_for_file

# -- end to end -------------------------------------------------------------------------------

PIPELINED = {"ZRES_BROKER__PREFETCH": "4"}


def overlap(path: str) -> int:
    """Record this task's start and end in PATH's directory; used to count overlap."""
    marker = Path(path) / f"{os.getpid()}-{time.monotonic_ns()}"
    marker.write_text(f"{time.monotonic()} ")
    time.sleep(0.002)
    marker.write_text(marker.read_text() + f"{time.monotonic()}")
    return 0


def test_pipelined_cluster_never_runs_more_than_capacity(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2, env=PIPELINED)
    client = make_client(cluster.address)
    zres.wait(client.map(overlap, [str(tmp_path)] * 300, resources={"slot": 1}), timeout=60)
    spans = sorted(tuple(map(float, p.read_text().split())) for p in tmp_path.iterdir())
    assert len(spans) == 300
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    assert most <= 2, f"{most} tasks asking slot=1 overlapped on an agent offering slot=2"


def make_short(client: zres.Client, tmp_path: Path, fn=hold) -> None:
    """Run FN a few times at once-released, so the broker knows its kind as short."""
    released = tmp_path / "released-at-once"
    released.touch()
    zres.wait([client.submit(fn, str(released), str(tmp_path / f"warm-{i}"),
                             resources={"slot": 1}) for i in range(10)], timeout=30)


def running_and_queued(client: zres.Client, tmp_path: Path, agent: str) -> tuple:
    """Start one task holding AGENT's only slot and one queued there; return the release
    file and both futures."""
    make_short(client, tmp_path)
    release, marker = str(tmp_path / "release"), str(tmp_path / "first")
    first = client.submit(hold, release, marker, resources={"slot": 1})
    queued = client.submit(hold, release, str(tmp_path / "second"), resources={"slot": 1})
    assert wait_until(lambda: os.path.exists(marker), message="the first task")
    assert f"queued on {agent}" in client.why(queued)
    return release, first, queued


def test_queued_task_cancelled_before_it_starts_never_runs(make_cluster, make_client,
                                                           tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2, env=PIPELINED)
    client = make_client(cluster.address)
    release, first, queued = running_and_queued(client, tmp_path, "agent-0")
    # Its worker holds it, to start it on its own: the agent says it had not begun.
    assert queued.cancel() and queued.cancelled() and queued.done()
    third = client.submit(hold, release, str(tmp_path / "third"), resources={"slot": 1})
    # Cancelling is asynchronous: the grant leaves the slot's queue once the agent (or the
    # worker holding the queue) has dropped it and said so.
    assert wait_until(lambda: "queued on agent-0" in client.why(third)
                      and "before it" not in client.why(third), message="the cancel to land")
    Path(release).touch()
    assert first.result(30) == "released" and third.result(30) == "released"
    assert not (tmp_path / "second").exists(), "the cancelled queued task ran"


def test_grants_queued_on_a_lost_agent_spend_a_retry_only_if_they_may_have_started(
        make_cluster, make_client, tmp_path):
    # Queued grants the agent had handed to its worker (which starts them on its own the
    # moment room frees) may have started when the agent died: they spend a retry, or
    # with none fail saying so; they never run twice with retries=0.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2, names=["doomed"],
                           env=PIPELINED, **LOSS)
    client = make_client(cluster.address)
    make_short(client, tmp_path)
    release = str(tmp_path / "release")
    # (queued at once: once the first has run long, nothing more is queued behind it)
    first = client.submit(hold, release, str(tmp_path / "first"), resources={"slot": 1})
    spare = client.submit(hold, release, str(tmp_path / "spare"), resources={"slot": 1},
                          retries=1)
    strict = client.submit(hold, release, str(tmp_path / "strict"), resources={"slot": 1})
    assert wait_until(lambda: (tmp_path / "first").exists(), message="the first task")
    assert wait_until(lambda: all("queued on doomed" in client.why(f)
                                  for f in (spare, strict)), message="both queued")
    cluster.add_agent({"slot": 1}, name="survivor")
    cluster.agents["doomed"].kill()
    Path(release).touch()
    assert spare.result(30) == "released" and spare.agent == "survivor"
    with pytest.raises(zres.AgentLostError, match="may have started"):
        strict.result(30)
    with pytest.raises(zres.AgentLostError, match="while running"):
        first.result(30)


def test_tasks_of_a_long_kind_are_never_queued_and_go_to_a_new_agent(make_cluster,
                                                                     make_client, tmp_path):
    # Pipelining is on by default, but only for kinds known to be short: a second long task
    # waits at the broker, not in a busy slot's queue, so an agent that joins takes it.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    first = client.submit(hold, release, str(tmp_path / "first"), resources={"slot": 1})
    assert wait_until(lambda: (tmp_path / "first").exists(), message="the first task")
    second = client.submit(hold, release, str(tmp_path / "second"), resources={"slot": 1})
    assert wait_until(lambda: "queued on" not in client.why(second)
                      and "slot" in client.why(second), message="the second to wait")
    cluster.add_agent({"slot": 1}, name="newcomer")
    assert wait_until(lambda: (tmp_path / "second").exists(), message="the second to start")
    Path(release).touch()
    assert second.result(30) == "released" and second.agent == "newcomer"
    assert first.result(30) == "released"


def pid_after(release: str, marker: str) -> int:
    """Write this process's id into MARKER, then block until RELEASE exists."""
    Path(marker + ".tmp").write_text(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    wait_for_file(release)
    return os.getpid()


def test_grants_queued_in_a_worker_that_dies_run_in_a_new_one(make_cluster, make_client,
                                                                tmp_path):
    # By default the agent hands a slot's queued grants to the worker process running the
    # slot's work. If that process dies, what it had not started runs in a fresh process,
    # with no retry spent; only the running task is lost.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    make_short(client, tmp_path, pid_after)
    release = str(tmp_path / "release")
    first = client.submit(pid_after, release, str(tmp_path / "first"), resources={"slot": 1},
                          retries=0)
    queued = [client.submit(pid_after, release, str(tmp_path / f"q{i}"),
                            resources={"slot": 1}, retries=0) for i in range(3)]
    assert wait_until(lambda: (tmp_path / "first").exists(), message="the first task")
    assert wait_until(lambda: all("queued on agent-0" in client.why(f) for f in queued),
                      message="the rest queued on the agent")
    old_pid = int((tmp_path / "first").read_text())
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(zres.WorkerLostError):
        first.result(30)
    Path(release).touch()
    pids = {f.result(30) for f in queued}
    assert old_pid not in pids and len(pids) == 1


def overlap_amount(path: str, amount: int) -> int:
    """As overlap, recording AMOUNT (what the task asked) with its span."""
    marker = Path(path) / f"{os.getpid()}-{time.monotonic_ns()}"
    marker.write_text(f"{amount} {time.monotonic()} ")
    time.sleep(0.001)
    marker.write_text(marker.read_text() + f"{time.monotonic()}")
    return amount


def test_mixed_short_tasks_in_a_worker_held_queue_never_exceed_capacity(make_cluster,
                                                                          make_client, tmp_path):
    # Short tasks asking slot=1 and slot=2 interleaved, queued in the worker process on an
    # agent offering slot=2: at no instant may what runs ask for more than 2.
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=4)
    client = make_client(cluster.address)
    warm = tmp_path / "warm"
    warm.mkdir()
    zres.wait([client.submit(overlap_amount, str(warm), 1, resources={"slot": 1})
               for _ in range(10)], timeout=30)
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    amounts = [1, 1, 2, 1, 2, 2, 1, 1, 1, 2] * 30
    futures = [client.submit(overlap_amount, str(spans_dir), a, resources={"slot": a})
               for a in amounts]
    assert [f.result(60) for f in futures] == amounts
    events = []
    for marker in spans_dir.iterdir():
        amount, start, end = marker.read_text().split()
        events += [(float(start), int(amount)), (float(end), -int(amount))]
    assert len(events) == 2 * len(amounts)
    running = most = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start
        running += step
        most = max(most, running)
    assert most <= 2, f"tasks asking {most} of slot ran at once on an agent offering 2"


def count_runs(release: str, runs: str) -> int:
    """Append this process's id to RUNS (one line a run), then block until RELEASE exists."""
    with open(runs, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    wait_for_file(release)
    return os.getpid()


def test_a_queued_grant_the_worker_started_is_not_run_again_when_the_worker_dies(
        make_cluster, make_client, tmp_path):
    # The worker starts a queued grant when room appears (here: the slot grows) and must
    # say so at once: if it dies later, that task was running (lost, retries=0), not
    # "never started" to be run again in a new process.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=4)
    client = make_client(cluster.address)
    make_short(client, tmp_path, count_runs)
    release = str(tmp_path / "release")
    first_runs, q_runs = tmp_path / "first-runs", tmp_path / "q-runs"
    first = client.submit(count_runs, release, str(first_runs), resources={"slot": 1},
                          retries=0)
    assert wait_until(lambda: first_runs.exists(), message="the first task")
    q = client.submit(count_runs, release, str(q_runs), resources={"slot": 1}, retries=0)
    assert wait_until(lambda: "queued on agent-0" in client.why(q), message="q queued")
    client.set_resources("agent-0", {"slot": 2})  # q fits now: the worker starts it
    assert wait_until(lambda: q_runs.exists(), message="q to start")
    assert wait_until(lambda: "running on agent-0" in client.why(q),
                      message="the broker to hear that q started")
    os.kill(int(first_runs.read_text()), signal.SIGKILL)
    with pytest.raises(zres.WorkerLostError):
        first.result(30)
    with pytest.raises(zres.WorkerLostError):
        q.result(30)
    assert len(q_runs.read_text().split()) == 1, "q (retries=0) ran twice"


def test_a_cancel_reaches_grants_queued_for_a_worker_still_starting(make_cluster,
                                                                  make_client, tmp_path):
    # When the worker holding a slot's queue dies, the grants go to its replacement while
    # that process starts: a cancel in that moment must still stop the grant.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=4)
    client = make_client(cluster.address)
    make_short(client, tmp_path, count_runs)
    release = str(tmp_path / "release")
    first_runs = tmp_path / "first-runs"
    first = client.submit(count_runs, release, str(first_runs), resources={"slot": 1})
    assert wait_until(lambda: first_runs.exists(), message="the first task")
    queued = [client.submit(count_runs, release, str(tmp_path / f"q{i}"),
                            resources={"slot": 1}) for i in range(3)]
    assert wait_until(lambda: all("queued on agent-0" in client.why(f) for f in queued),
                      message="the rest queued")
    os.kill(int(first_runs.read_text()), signal.SIGKILL)
    with pytest.raises(zres.WorkerLostError):
        first.result(30)
    queued[1].cancel()
    assert wait_until(lambda: (tmp_path / "q0").exists(), message="q0 in the new process")
    Path(release).touch()
    assert queued[0].result(30) and queued[2].result(30)
    with pytest.raises(concurrent.futures.CancelledError):
        queued[1].result(30)
    assert not (tmp_path / "q1").exists(), "the cancelled queued grant ran"


def test_a_queued_grant_that_fits_is_not_held_back_by_one_that_does_not(
        make_cluster, make_client, tmp_path):
    # slot=2, everything queued in the worker process: Y needs both, b one. When one
    # unit frees, b starts at once beside what runs (backfill), and Y once room for it
    # frees.
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=4)
    client = make_client(cluster.address)
    make_short(client, tmp_path)
    path = {n: str(tmp_path / n) for n in ["rP", "rQ", "rY", "rB", "P", "Q", "Y", "b"]}

    def submit(release: str, marker: str, amount: int) -> zres.Future:
        return client.submit(hold, path[release], path[marker], resources={"slot": amount})

    p, q = submit("rP", "P", 1), submit("rQ", "Q", 1)
    assert wait_until(lambda: os.path.exists(path["P"]) and os.path.exists(path["Q"]))
    y, b = submit("rY", "Y", 2), submit("rB", "b", 1)
    said: dict[str, str] = {}

    def queued() -> bool:
        said.update(Y=client.why(y), b=client.why(b))
        return all("queued on" in reason for reason in said.values())
    assert wait_until(queued, timeout=40, message="Y and b queued"), said
    Path(path["rP"]).touch()
    assert wait_until(lambda: os.path.exists(path["b"]), message="b to start beside Q")
    assert not os.path.exists(path["Y"])
    assert wait_until(lambda: "running on agent-0" in client.why(b),
                      message="the broker to hear that b started")
    Path(path["rQ"]).touch()
    Path(path["rB"]).touch()
    assert wait_until(lambda: os.path.exists(path["Y"]), message="Y to start")
    Path(path["rY"]).touch()
    assert [f.result(30) for f in (p, q, y, b)] == ["released"] * 4


class Pid:
    def pid(self) -> int:
        return os.getpid()


@pytest.mark.timeout(90)
def test_no_task_queues_behind_a_restarted_actor_and_a_newcomer_takes_it(
        make_cluster, make_client, tmp_path):
    # Chaos round 49: an actor restarted (its new placement has no kind, once counted as
    # short work) held its agent's only slot for good; a task of a short kind, blocked,
    # was queued there behind it and never started, while another agent sat idle. It now
    # waits at the broker, so an agent that has room takes it.
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2, names=["cpu-a"], env=PIPELINED)
    client = make_client(cluster.address)
    make_short(client, tmp_path)
    actor = client.actor(Pid, resources={"slot": 1}, restarts=-1)
    pid = actor.pid().result(30)
    os.kill(pid, signal.SIGKILL)
    assert actor.pid().result(30) != pid, "restarted on cpu-a"
    release, marker = tmp_path / "release", tmp_path / "task"
    release.touch()
    task = client.submit(hold, str(release), str(marker), resources={"slot": 1})
    assert wait_until(lambda: "cpu-a has slot=0 free" in client.why(task),
                      message="the task to be blocked")
    cluster.add_agent({"slot": 1}, name="cpu-b")
    assert task.result(20) == "released" and task.agent == "cpu-b"
    assert marker.exists()
    assert actor.pid().result(30) != pid, "the actor still holds cpu-a"


def gate(release: str, ledger: str, key: str) -> str:
    """Append KEY to LEDGER (one line a start), then block until RELEASE exists."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
    wait_for_file(release)
    return key


def test_grants_queued_behind_a_short_kind_task_that_runs_long_move_to_an_idle_agent(
        make_cluster, make_client, tmp_path):
    # A kind known as short is queued behind its own running tasks. One call of it blocks:
    # what was queued behind it is given back and runs on the other agent, each exactly
    # once, while the blocked one still runs.
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    opened, release = str(tmp_path / "open"), str(tmp_path / "release")
    Path(opened).touch()
    ledger = str(tmp_path / "ledger")
    zres.wait([client.submit(gate, opened, ledger, f"warm{i}", resources={"slot": 1})
               for i in range(10)], timeout=30)
    blocked = client.submit(gate, release, ledger, "blocked", resources={"slot": 1})
    quick = [client.submit(gate, opened, ledger, f"q{i}", resources={"slot": 1})
             for i in range(40)]
    done, waiting = concurrent.futures.wait(quick, timeout=20)
    assert not waiting, f"{len(waiting)} short tasks stuck behind the blocked one"
    assert not blocked.done()
    Path(release).touch()
    assert blocked.result(30) == "blocked"
    assert [f.result() for f in quick] == [f"q{i}" for i in range(40)]
    starts = Path(ledger).read_text().split()
    assert sorted(starts) == sorted([f"warm{i}" for i in range(10)] + ["blocked"]
                                    + [f"q{i}" for i in range(40)]), "a body ran twice"
