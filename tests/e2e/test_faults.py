"""Ordinary faults lose nothing, run nothing twice and double-book nothing: a paused
broker, a killed, stopped or stopping agent, huge or malformed messages.

Every test runs real broker and agent processes on loopback. A fault's length (how long a
process stays stopped) is the one thing measured in time; events are ordered by waiting
on markers and on the broker's status.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

import zres
from tests.conftest import LOSS, process_gone, raw_dealer, stop_process, wait_until
from tests.tasks import hold, ledgered, starts, wait_for_file
from zres.core import keys
from zres.core import protocol as P

FAST = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}


def where(_: object = None) -> str:
    return zres.get_task_context().agent


def noop(x: int = 0) -> int:
    return x


def agent_names(cluster: zres.LocalCluster) -> set[str]:
    return {a["name"] for a in cluster.status()["agents"]}


def paused(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Stop PROC for SECONDS (the fault), then let it go on."""
    stop_process(proc.pid)
    try:
        time.sleep(seconds)
    finally:
        os.kill(proc.pid, signal.SIGCONT)


# -- 1. a paused or stalled broker kills nothing -----------------------------------------------

def test_a_broker_paused_past_the_heartbeat_timeout_loses_no_work(make_cluster, make_client,
                                                                  tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["a", "b"], **LOSS)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    running = [client.submit(hold, release, str(tmp_path / f"m{i}"), resources={"slot": 1})
               for i in range(2)]
    assert wait_until(lambda: all((tmp_path / f"m{i}").exists() for i in range(2)))
    agents = {name: proc.pid for name, proc in cluster.agents.items()}
    paused(cluster.broker, 3.0)  # twice the heartbeat timeout
    Path(release).touch()
    assert [f.result(30) for f in running] == ["released", "released"]
    assert sorted(f.agent for f in running) == ["a", "b"], "both kept their work"
    assert all(cluster.agents[n].poll() is None for n in agents), "an agent exited"
    assert agent_names(cluster) == {"a", "b"}
    assert client.submit(where, resources={"slot": 1}).result(30) in {"a", "b"}


def test_a_huge_map_is_taken_in_without_stalling_the_broker(make_cluster, make_client,
                                                            tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"], heartbeat_interval=0.2,
                           heartbeat_timeout=1.0)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    first = client.submit(hold, release, str(tmp_path / "m"), resources={"slot": 1})
    assert wait_until(lambda: (tmp_path / "m").exists())
    pid = cluster.agents["a"].pid
    waiting = client.map(noop, range(30_000), resources={"slot": 1})  # (seconds to take in)
    wait_until(lambda: cluster.status()["counts"].get("queued", 0) >= 29_000, timeout=60,
               message="the map to be taken in")
    assert agent_names(cluster) == {"a"} and cluster.agents["a"].pid == pid
    Path(release).touch()
    assert first.result(30) == "released", "the running task was lost"
    assert not any(f.done() for f in waiting[:100])


# -- 2. a dead, stopped or stopping agent fails no task that never started on it ---------------

def gated(ledger: str, key: str, gate: str = "") -> str:
    """Note KEY's start in LEDGER (as ``ledgered``), then wait for GATE, if given."""
    ledgered(ledger, key)
    if gate:
        wait_for_file(gate)
    return key


def test_a_killed_agents_direct_grants_count_as_begun_its_queued_ones_run_elsewhere(
        make_cluster, make_client, tmp_path):
    """As Ray counts a task leased to a node that died: a direct grant may have begun the
    moment it reached its agent (which asks the broker nothing first), so, lost with its
    agent, it spends a retry or fails with AgentLostError, saying so; a queued grant its
    agent never took in runs elsewhere, nothing spent. No body begins twice."""
    cluster = make_cluster(agents=[{"slot": 2}, {"slot": 1}], names=["doomed", "other"],
                           nthreads=2, **FAST)
    client = make_client(cluster.address)
    ledger, gate = str(tmp_path / "ledger"), str(tmp_path / "gate")
    release, busy_marker = str(tmp_path / "release"), tmp_path / "busy"
    # A short kind (grants queue only behind short work), then the other agent kept busy.
    zres.wait(client.map(gated, [ledger] * 20, [f"warm{i}" for i in range(20)],
                         resources={"slot": 1}), timeout=30)
    busy = client.submit(hold, release, str(busy_marker), resources={"slot": 1},
                         workers="other")
    wait_until(busy_marker.exists, message="the other agent to be busy")
    running = client.submit(gated, ledger, "running", gate, resources={"slot": 1}, retries=0)
    wait_until(lambda: starts(ledger).get("running"), message="a task to run on doomed")
    doomed = cluster.agents["doomed"]
    stop_process(doomed.pid)  # it takes in nothing more
    direct = client.submit(gated, ledger, "direct", resources={"slot": 1}, retries=0)
    queued = client.submit(gated, ledger, "queued", resources={"slot": 1}, retries=0)
    wait_until(lambda: client.why(direct) == "running on doomed"
               and client.why(queued).startswith("queued on doomed"),
               message="a direct and a queued grant to the stopped agent")
    workers = worker_processes(doomed.pid)
    doomed.kill()
    # (its workers die with it, told by the kernel: one still alive as the gate opens
    # would end the task and send its result straight to the broker, as it may)
    wait_until(lambda: all(process_gone(pid) for pid in workers),
               message="the doomed agent's workers to die with it")
    Path(release).touch()
    Path(gate).touch()
    assert isinstance(running.exception(30), zres.AgentLostError)
    error = direct.exception(30)
    assert isinstance(error, zres.AgentLostError) and "may have started" in str(error), \
        f"a direct grant to a lost agent was not counted as possibly begun: {error!r}"
    assert queued.result(30) == "queued" and queued.agent == "other"
    assert busy.result(30) == "released"
    counts = starts(ledger)
    assert (counts.get("running"), counts.get("queued"), counts.get("direct")) == (1, 1, None)


def announce(marker: str) -> str:
    Path(marker).touch()
    return "announced"


def test_a_direct_grant_starts_while_the_broker_that_sent_it_is_stopped(make_cluster,
                                                                        make_client,
                                                                        tmp_path):
    """The broker keeps that a direct grant may have begun before it sends it: its agent
    hands it to a worker at once, asking nothing (a round trip less per task)."""
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"], heartbeat_timeout=10.0)
    client = make_client(cluster.address)
    assert client.submit(noop, 1).result(30) == 1  # (its worker process is up)
    marker, agent = tmp_path / "started", cluster.agents["a"]
    stop_process(agent.pid)  # (for a moment: its lease holds)
    try:
        future = client.submit(announce, str(marker), resources={"slot": 1}, retries=0)
        wait_until(lambda: client.why(future) == "running on a", message="the grant to go")
        stop_process(cluster.broker.pid)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    try:
        wait_until(marker.exists, timeout=10, message="the task to start, its broker stopped")
    finally:
        os.kill(cluster.broker.pid, signal.SIGCONT)
    assert future.result(30) == "announced"


def named_hold(release: str, marker: str) -> str:
    """Write this task's agent into MARKER, then block until RELEASE exists."""
    Path(marker + ".tmp").write_text(zres.get_task_context().agent)
    os.rename(marker + ".tmp", marker)
    hold(release, marker + ".seen")
    return "released"


def test_sigterm_drains_an_agent_and_no_task_fails(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], names=["one", "two"],
                           drain_grace=60, **FAST)
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), tmp_path / "m"
    running = client.submit(named_hold, release, str(marker), resources={"slot": 1},
                            retries=0)
    leaving = wait_until(lambda: marker.exists() and marker.read_text())
    staying = ({"one", "two"} - {leaving}).pop()
    cluster.agents[leaving].terminate()
    wait_until(lambda: any(a["name"] == leaving and a["draining"]
                           for a in cluster.status()["agents"]),
               message="the broker to hear that the agent is leaving")
    later = [client.submit(where, resources={"slot": 1}) for _ in range(10)]
    assert [f.result(30) for f in later] == [staying] * 10
    Path(release).touch()
    assert running.result(30) == "released", "the running task failed"
    assert cluster.agents[leaving].wait(30) == 0
    wait_until(lambda: agent_names(cluster) == {staying}, message="the agent to leave")


def test_an_agent_whose_drain_grace_runs_out_hands_its_tasks_back(make_cluster, make_client,
                                                                  tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], names=["leaving"], drain_grace=0.5, **FAST)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    retried = client.submit(hold, release, str(tmp_path / "r"), resources={"slot": 1},
                            retries=1, key="retried")
    assert wait_until(lambda: (tmp_path / "r").exists())
    strict = client.submit(hold, release, str(tmp_path / "s"), resources={"slot": 1},
                           key="strict")
    cluster.agents["leaving"].terminate()
    assert cluster.agents["leaving"].wait(30) == 0
    cluster.add_agent({"slot": 1}, name="next")
    Path(release).touch()
    assert retried.result(30) == "released" and retried.agent == "next"
    assert strict.result(30) == "released" and strict.agent == "next", \
        "a task that never started was given back, not failed"


# -- 4. attempts are fenced: retries=0 runs at most once ---------------------------------------

def test_a_stopped_agent_never_runs_a_task_twice(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 2}, {"slot": 2}], names=["stopped", "steady"],
                           nthreads=2, **LOSS)
    client = make_client(cluster.address)
    ledger = str(tmp_path / "ledger")
    zres.wait(client.map(ledgered, [ledger] * 40, [f"warm{i}" for i in range(40)],
                         [0.002] * 40, resources={"slot": 1}), timeout=30)  # a short kind
    keys = [f"t{i}" for i in range(2000)]
    futures = client.map(ledgered, [ledger] * len(keys), keys, [0.005] * len(keys),
                         resources={"slot": 1}, retries=0)
    wait_until(lambda: sum(1 for k in starts(ledger) if k.startswith("t")) >= 50,
               message="work under way")
    paused(cluster.agents["stopped"], 3.0)  # twice the heartbeat timeout
    outcomes = [f.exception(60) for f in futures]
    for key, error in zip(keys, outcomes):
        if error is not None:
            assert isinstance(error, zres.AgentLostError), f"{key}: {error!r}"
            assert "stopped" in str(error)
    wait_until(lambda: agent_names(cluster) == {"stopped", "steady"}, timeout=30,
               message="the stopped agent to join again, with a new session")
    # The ledger read once, after all that (reading it again for each of the 2,000 keys
    # took seconds): a start made late, by the agent come back, is in it too.
    counts = starts(ledger)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"retries=0 bodies ran more than once: {twice}"
    unsure = [k for k, error in zip(keys, outcomes) if error is None and counts.get(k) != 1]
    assert not unsure, f"tasks that succeeded but did not begin exactly once: {unsure[:10]}"
    assert {f.result(30) for f in client.map(where, range(40), resources={"slot": 1})} \
        <= {"stopped", "steady"}


# -- 3. a command job's resources come back only when its processes are gone -------------------

def test_what_a_job_leaves_behind_keeps_its_gpu_until_it_is_gone(make_cluster, make_client,
                                                                tmp_path):
    cluster = make_cluster(agents=[{"gpu0": 1}], names=["node"], **FAST,
                           env={"ZRES_AGENT__JOB_GRACE": "1"})  # (then SIGKILL: not 5 s)
    client = make_client(cluster.address)
    pid_file = tmp_path / "child.pid"
    # The job's leader exits at once, leaving a child in its process group that ignores
    # SIGTERM for a moment: the GPU is the job's until that child is gone.
    first = client.submit_command(
        ["sh", "-c", f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; exec sleep 60' & "
         f"while [ ! -s {pid_file} ]; do sleep 0.01; done"],
        resources={"gpu0": 1})
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(),
               message="the child to start")
    child = int(pid_file.read_text())
    second = client.submit_command(["sh", "-c", "echo second"], resources={"gpu0": 1})
    assert first.result(60).exit_code == 0
    second.result(60)
    assert process_gone(child), "the next job started while the first one's child ran"


def worker_processes(agent: int) -> list[int]:
    """The worker processes an agent has started (children running zres's worker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == agent and b"worker" in cmdline:
            found.append(int(entry))
    return found


def test_a_job_outlives_every_worker_process_and_keeps_its_gpu(make_cluster, make_client,
                                                              tmp_path):
    # A worker process dying (an OOM kill, say) must not orphan a command job nor give its
    # GPU to the next job while it runs: the agent owns the job's process group.
    cluster = make_cluster(agents=[{"gpu0": 1, "CPU": 2}], names=["node"], **FAST)
    client = make_client(cluster.address)
    go, started = tmp_path / "go", tmp_path / "started"
    job = client.submit_command(
        ["sh", "-c", f"touch {started}; while [ ! -e {go} ]; do sleep 0.01; done"],
        resources={"gpu0": 1})
    wait_until(started.exists, message="the job to start")
    assert client.submit(noop, resources={"CPU": 1}).result(30) == 0
    for pid in worker_processes(cluster.agents["node"].pid):
        os.kill(pid, signal.SIGKILL)
    queued = client.submit_command(["true"], resources={"gpu0": 1})
    assert wait_until(lambda: "gpu0" in client.why(queued), message="the second to wait")
    assert client.submit(noop, resources={"CPU": 1}).result(30) == 0  # the agent goes on
    assert not queued.done() and "gpu0" in client.why(queued), \
        "the GPU was handed on while the job ran"
    go.touch()
    assert job.result(30).exit_code == 0 and queued.result(30).exit_code == 0


def test_an_agent_restarted_after_a_kill_stops_the_jobs_it_left(make_cluster, make_client,
                                                                tmp_path):
    # ... and the files it left: its lease, start logs and socket, in its state directory
    # (never the temporary directory).
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cluster = make_cluster(agents=[{"gpu0": 1}], names=["node"], env={"TMPDIR": str(tmp)},
                           **FAST)
    run = Path(cluster.state_dir) / "agent-node" / "run"
    client = make_client(cluster.address)
    pid_file = tmp_path / "pid"
    client.submit_command(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 120"],
                          resources={"gpu0": 1}, detached=True)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(),
               message="the job to start")
    job = int(pid_file.read_text())
    # Killed once it has noted the job (its record of running jobs is written before the
    # broker hears the job started; the job itself may write its pid before that).
    wait_until(lambda: any(j["state"] == "running" for j in client.jobs()),
               message="the agent to report the job started")
    cluster.agents["node"].kill()
    cluster.agents["node"].wait(10)
    assert not process_gone(job), "the job should outlive its agent's kill"
    left = {p.name for p in run.iterdir()}
    assert {"lease", "workers"} < left and any(n.startswith("starts-") for n in left)
    cluster.add_agent({"gpu0": 1}, name="node")
    wait_until(lambda: process_gone(job), message="the restarted agent to stop it")
    assert client.submit_command(["true"], resources={"gpu0": 1}).result(30).exit_code == 0
    assert not (left - {"lease", "workers"}) & {p.name for p in run.iterdir()}, \
        "the killed agent's files are still there"
    assert list(tmp.iterdir()) == []


def test_an_agent_whose_socket_path_is_too_long_keeps_it_in_a_short_private_directory(
        make_cluster, make_client, tmp_path):
    """An ipc socket's path has room for 107 bytes: an agent whose state directory lies
    deeper keeps its workers' socket in a private directory of the temporary directory,
    removed by its next start after a kill, and when it stops."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    deep = tmp_path / ("d" * 50) / ("e" * 50)
    assert len(str(deep / "run" / "workers")) > 107
    cluster = make_cluster(agents=[], env={"TMPDIR": str(tmp)}, **FAST)
    client = make_client(cluster.address)
    sockets = []
    for _ in range(2):  # started, killed; started again
        agent = cluster.add_agent({"foo": 1}, name="deep", extra_args=["--state", str(deep)])
        assert client.submit(noop, 7, resources={"foo": 1}).result(30) == 7
        (socket_dir,) = tmp.iterdir()  # (the killed one's, gone)
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        assert (deep / "run" / "elsewhere").read_text() == str(socket_dir)
        assert (socket_dir / "workers").is_socket()
        sockets.append(socket_dir)
        if len(sockets) == 1:
            agent.kill()
            agent.wait(10)
    assert sockets[0] != sockets[1]
    agent.terminate()
    agent.wait(30)
    assert list(tmp.iterdir()) == [] and not (deep / "run").exists()
    assert stat.S_IMODE(deep.stat().st_mode) == 0o700


# -- 5. pipelining never blocks ready work, and priority holds ---------------------------------

def clocked(log: str, key: str, release: str = "") -> str:
    """Append KEY to LOG when it starts; block until RELEASE exists (if given)."""
    with open(log, "a") as fh:
        fh.write(f"{key}\n")
    if release:
        deadline = time.time() + 60
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.005)
    return key


def order(log: str) -> list[str]:
    return open(log).read().split() if os.path.exists(log) else []


@pytest.fixture
def warm_one_slot(make_cluster, make_client, tmp_path):  # type: ignore[no-untyped-def]
    """An agent with one CPU and R=1, the function warm (known short): pipelining is on."""
    cluster = make_cluster(agents=[{"CPU": 1, "R": 1}], nthreads=1, **FAST)
    client = make_client(cluster.address)
    warm = str(tmp_path / "warm")
    zres.wait([client.submit(clocked, warm, f"w{i}") for i in range(30)], timeout=30)
    return client, str(tmp_path / "log"), str(tmp_path / "clog")


@pytest.mark.parametrize("p1,p2,first", [(1, 0, "x"), (0, 1, "y")])
def test_ready_and_constrained_tasks_start_by_priority(warm_one_slot, p1, p2, first):
    # Dask's test_constrained_vs_ready_priority_1, end to end: one CPU held by a clog;
    # x (any CPU) and y (CPU and R) wait; the higher priority starts first.
    client, log, clog = warm_one_slot
    blocker = client.submit(clocked, log, "clog", clog)
    assert wait_until(lambda: order(log) == ["clog"])
    x = client.submit(clocked, log, "x", priority=p1)
    y = client.submit(clocked, log, "y", priority=p2, resources={"R": 1})
    assert wait_until(lambda: all("its worker holds it" in client.why(f) for f in (x, y)),
                      message="both waiting where they will run")
    Path(clog).touch()
    assert [blocker.result(30), x.result(30), y.result(30)] == ["clog", "x", "y"]
    assert order(log)[1] == first


def test_a_ready_task_is_not_held_back_by_a_constrained_one(make_cluster, make_client,
                                                             tmp_path):
    # Dask's test_constrained_vs_ready_priority_2: two CPUs, R=1. clog2 holds R and a CPU;
    # clog1 the other CPU. y (R) waits behind clog2 whatever its priority; when clog1
    # ends, x (a CPU) starts at once.
    cluster = make_cluster(agents=[{"CPU": 2, "R": 1}], nthreads=2, **FAST)
    client = make_client(cluster.address)
    log, clog1, clog2 = (str(tmp_path / n) for n in ("log", "clog1", "clog2"))
    zres.wait([client.submit(clocked, str(tmp_path / "warm"), f"w{i}") for i in range(30)],
              timeout=30)
    c1 = client.submit(clocked, log, "clog1", clog1)
    c2 = client.submit(clocked, log, "clog2", clog2, resources={"R": 1})
    assert wait_until(lambda: sorted(order(log)) == ["clog1", "clog2"])
    y = client.submit(clocked, log, "y", priority=5, resources={"R": 1})
    x = client.submit(clocked, log, "x", priority=0)
    Path(clog1).touch()
    assert x.result(30) == "x"
    assert "y" not in order(log)
    assert "R" in client.why(y), client.why(y)
    Path(clog2).touch()
    assert [c1.result(30), c2.result(30), y.result(30)] == ["clog1", "clog2", "y"]


def test_constrained_tasks_start_in_priority_order(warm_one_slot):
    # Dask's test_constrained_tasks_respect_priority: R=1 held by a clog; x1, x2, x3 ask
    # for R with priorities 1, 2, 0: they start highest first.
    client, log, clog = warm_one_slot
    blocker = client.submit(clocked, log, "clog", clog, resources={"R": 1})
    assert wait_until(lambda: order(log) == ["clog"])
    xs = [client.submit(clocked, log, key, priority=p, resources={"R": 1})
          for key, p in (("x1", 1), ("x2", 2), ("x3", 0))]
    assert wait_until(lambda: all("its worker holds it" in client.why(f) for f in xs),
                      message="all three waiting where they will run")
    Path(clog).touch()
    assert [f.result(30) for f in [blocker, *xs]] == ["clog", "x1", "x2", "x3"]
    assert order(log) == ["clog", "x2", "x1", "x3"]


# -- 6. one message cannot cost everyone ------------------------------------------------------

def reply(sock: zmq.Socket, timeout: float = 10.0) -> P.Message:
    """The broker's next message to SOCK, heartbeats aside (they come at any time)."""
    deadline = time.monotonic() + timeout
    while True:
        assert sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), \
            "the broker did not answer"
        msg = P.decode(P.recv(sock))
        if msg.kind != P.HEARTBEAT:
            return msg


def test_messages_over_a_limit_are_refused_naming_it(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], names=["a"], **FAST)
    client = make_client(cluster.address)
    sock = raw_dealer(cluster.address, keys.peer_key(cluster.keys, ("agent",)))  # may register
    try:
        P.send(sock, P.encode(P.HELLO, {"client": "x" * 20_000_000}))
        answer = reply(sock)
        assert answer.kind == P.REFUSED and "max_header_bytes" in answer.body["error"]
        slots = [{"units": {"CPU": 10_000}, "gpus": []}] * 5000
        P.send(sock, P.encode(P.REGISTER, {"name": "huge", "session": 1, "slots": slots}))
        answer = reply(sock)
        assert answer.kind == P.REFUSED and "max_slots" in answer.body["error"]
    finally:
        sock.close()
    with pytest.raises(zres.ZresError, match="max_name_bytes"):
        zres.Client(cluster.address, name="n" * 5000)
    # A hello too big for the broker to read is refused as such: the client says why at
    # once (it used to wait out its connect timeout, then say no broker answered).
    with pytest.raises(zres.ZresError, match="refused its hello: .*max_header_bytes"):
        zres.Client(cluster.address, name="n" * 20_000_000, connect_timeout=30)
    assert client.submit(where, resources={"slot": 1}).result(30) == "a"


def test_a_malformed_submit_is_answered_and_its_tasks_fail(make_cluster):
    cluster = make_cluster(agents=[{"slot": 1}], **FAST)
    sock = raw_dealer(cluster.address)
    try:
        P.send(sock, P.encode(P.HELLO, {"client": "raw"}))
        assert reply(sock).kind == P.WELCOME
        bad_job = [1, {}, 0, 0, [], 0, "job", False, {"job": {"argv": "not a list"}}]
        P.send(sock, P.encode(P.SUBMIT, {"tasks": [bad_job]}))
        answer = reply(sock)
        assert answer.kind == P.REFUSED and answer.body["ids"] == [1]
        assert "argv" in answer.body["error"]
    finally:
        sock.close()
    assert cluster.status()["counts"] == {}, "the refused task was kept"


def test_a_log_line_quotes_little_of_bad_input(tmp_path):
    address = "tcp://127.0.0.1:0"
    proc = subprocess.Popen([sys.executable, "-m", "zres", "broker", "--listen", address,
                             "--log-format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        address = proc.stdout.readline().decode().split()[-1]
        sock = raw_dealer(address)
        P.send(sock, [b"\xff" * 2_000_000])
        P.send(sock, P.encode("k" * 1_000_000, {}))
        P.send(sock, P.encode(P.STATUS, {}))
        while reply(sock).kind != P.STATUS_REPLY:
            pass
        sock.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = err.decode().splitlines()
    assert any("bad_message" in line for line in lines)
    assert max(len(line) for line in lines) < 1000, "a log line quoted the bad input whole"


def test_a_client_keeps_its_submits_within_the_brokers_limits(make_cluster, make_client):
    """A batch of tasks over the header limit would be refused with no way to say which
    tasks it held (their futures would wait for ever): the client splits its batches to
    fit, and fails at once a task that alone cannot fit."""
    cluster = make_cluster(agents=[{"slot": 2}], env={"ZRES_BROKER__MAX_HEADER_BYTES": "8192"},
                           **FAST)
    client = make_client(cluster.address)
    futures = [client.submit(noop, n, key=f"{n}-" + "k" * 600) for n in range(40)]
    assert [f.result(30) for f in futures] == list(range(40))
    deps = [client.submit(noop, n) for n in range(1000)]
    wait_until(lambda: all(f.done() for f in deps), 30, message="the inputs")
    with pytest.raises(zres.ZresError, match="max_header_bytes"):
        client.submit(sum, deps).result(30)
    assert client.submit(noop, 7).result(30) == 7


def test_a_job_spec_exec_would_refuse_is_refused_up_front(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], **FAST)
    client = make_client(cluster.address)
    with pytest.raises(ValueError, match="environment variable name"):
        client.submit_command(["true"], env={"A=B": "1"})
    with pytest.raises(ValueError, match="NUL"):
        client.submit_command(["echo", "a\0b"])
    sock = raw_dealer(cluster.address)
    try:
        P.send(sock, P.encode(P.HELLO, {"client": "raw"}))
        assert reply(sock).kind == P.WELCOME
        job = {"argv": ["true"], "env": {"A=B": "1"}, "cwd": None}
        P.send(sock, P.encode(P.SUBMIT, {"tasks": [[1, {}, 0, 0, [], 0, "j", False,
                                                    {"job": job}]]}))
        answer = reply(sock)
        assert answer.kind == P.REFUSED and "environment variable" in answer.body["error"]
    finally:
        sock.close()
    assert client.submit_command(["true"]).result(30).exit_code == 0


def size_of(data: bytes) -> int:
    return len(data)


def test_a_stopped_worker_holds_up_only_the_work_sent_to_it(make_cluster, make_client):
    """A worker process stopped (SIGSTOP) while its agent sends it far more than the
    kernel's buffers hold: the agent carries on (a command job starts and ends beside it,
    it stays registered), and the work sent meanwhile runs, whole, once the worker goes on."""
    cluster = make_cluster(agents=[{"A": 40, "CPU": 40}], names=["node"], **FAST)
    client = make_client(cluster.address)
    assert client.submit(noop, 1, resources={"A": 1}).result(30) == 1  # (its worker is up)
    [worker] = worker_processes(cluster.agents["node"].pid)
    stop_process(worker)
    try:
        blobs = [bytes([n]) * 900_000 for n in range(30)]  # (each travels with its call)
        sized = [client.submit(size_of, blob, resources={"A": 1}) for blob in blobs]
        assert wait_until(lambda: all("running on" in w or "holds it" in w
                                      for w in map(client.why, sized)),
                          message="all thirty granted to the stopped worker's agent")
        job = client.submit_command(["true"], resources={"A": 1})
        assert job.result(30).exit_code == 0
        assert agent_names(cluster) == {"node"}
        assert not any(f.done() for f in sized)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert client.gather(sized, timeout=60) == [900_000] * 30
