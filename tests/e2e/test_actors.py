"""Actors end to end: state kept between calls, ordering, concurrency, resources held until
the end, names, and what happens when an actor's process, agent or owner goes away. Every
test runs real broker, agent and actor processes; events are ordered by files and by the
broker's status, never by sleeping."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import zres
from tests.conftest import LOSS, wait_until
from tests.tasks import hold, wait_for_file
from zres.cli.status_text import render_status

# -- actor classes and tasks (they travel by value to the worker processes) -----------------


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def add(self, k: int = 1) -> int:
        self.n += k
        return self.n

    def get(self) -> int:
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict:
        ctx = zres.get_task_context()
        return {"agent": ctx.agent, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": ctx.gpu_ids, "thread": threading.get_ident()}

    def hold(self, release: str, marker: str) -> str:
        return hold(release, marker)

    def fail(self) -> None:
        raise ValueError(f"refused at {self.n}")

    def exit(self, code: int) -> None:
        os._exit(code)


class Journal:
    def __init__(self) -> None:
        self.entries: list = []

    def append(self, caller: str, index: int) -> int:
        self.entries.append((caller, index))
        return len(self.entries)

    def read(self) -> list:
        return self.entries


class Broken:
    def __init__(self) -> None:
        raise RuntimeError("cannot construct")

    def ping(self) -> str:
        return "pong"


class Meeting:
    """Two calls meet at a barrier: only possible when they run at the same time."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)

    def meet(self) -> int:
        self.barrier.wait()
        return threading.get_ident()


class Signals:
    """Coroutine methods share one event loop: one call waits for an event another sets."""

    def __init__(self) -> None:
        self.event: asyncio.Event | None = None

    async def wait(self) -> int:
        self.event = self.event or asyncio.Event()
        await asyncio.wait_for(self.event.wait(), 30)
        return id(asyncio.get_running_loop())

    async def fire(self) -> int:
        self.event = self.event or asyncio.Event()
        self.event.set()
        return id(asyncio.get_running_loop())


class Relay:
    """An actor that holds a handle to another actor and calls it."""

    def __init__(self, other: zres.ActorHandle) -> None:
        self.other = other

    def forward(self, k: int) -> int:
        return self.other.add(k).result(30)

    def use(self, handle: zres.ActorHandle, k: int) -> int:
        return handle.add(k).result(30)


def call_add(handle: zres.ActorHandle, k: int) -> int:
    return handle.add(k).result(30)


def add_to_named(name: str, k: int) -> int:
    return zres.get_actor(name).add(k).result(30)


def double(x: int) -> int:
    return 2 * x


def gpu_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def actor_state(client: zres.Client, handle: zres.ActorHandle) -> dict:
    return next(a for a in client.status()["actors"] if a["id"] == handle._zres_id)


# -- basics --------------------------------------------------------------------------------


def test_actor_keeps_state_between_calls(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    client = make_client(cluster.address)
    counter = client.actor(Counter, 10)
    assert counter.ready().result(30) is None
    assert counter.add(5).result(30) == 15
    assert counter.add(1).result(30) == 16, "the same instance serves every call"
    futures = [counter.add(1) for _ in range(200)]
    assert [f.result(30) for f in futures] == list(range(17, 217))
    with pytest.raises(ValueError, match="refused at 216"):
        counter.fail().result(30)
    assert counter.get().result(30) == 216, "a method's exception fails that call only"
    state = actor_state(client, counter)
    assert state["state"] == "alive" and state["agent"] == "agent-0"
    assert state["units"] == {}, "an actor that asks for nothing holds nothing (as Ray's)"


def test_module_level_api_uses_the_default_client(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    make_client(cluster.address)  # the newest open client is the default
    counter = zres.actor(Counter, 1, name="default-counter")
    assert zres.get_actor("default-counter").add(2).result(30) == 3
    zres.kill(counter)
    with pytest.raises(zres.ActorDiedError, match="killed"):
        counter.get().result(30)


def test_exception_in_init_fails_ready_and_every_call_and_frees_resources(make_cluster,
                                                                           make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    broken = client.actor(Broken, resources={"slot": 1}, restarts=2)
    early = [broken.ping() for _ in range(3)]  # made while __init__ may still be running
    with pytest.raises(RuntimeError, match="cannot construct"):
        broken.ready().result(30)
    for future in [*early, broken.ping()]:
        with pytest.raises(RuntimeError, match="cannot construct"):
            future.result(30)
    assert not client.status()["actors"], "an __init__ that raised is not restarted"
    assert client.submit(double, 4, resources={"slot": 1}).result(30) == 8


def test_bad_arguments_are_refused_where_they_are_made(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    with pytest.raises(TypeError, match="needs a class"):
        client.actor(double)
    with pytest.raises(ValueError, match="max_concurrency"):
        client.actor(Counter, max_concurrency=0)
    with pytest.raises(ValueError, match="restarts"):
        client.actor(Counter, restarts=-2)
    with pytest.raises(ValueError, match="get_if_exists needs the actor's name"):
        client.actor(Counter, get_if_exists=True)
    with pytest.raises(zres.ResourceSpecError):
        client.actor(Counter, resources={"GPU": -1})
    counter = client.actor(Counter)
    with pytest.raises(AttributeError, match="no method 'nope'"):
        counter.nope()
    with pytest.raises(ValueError, match="no live actor named 'ghost'"):
        client.get_actor("ghost")
    with pytest.raises(TypeError, match="ActorHandle"):
        client.kill("counter")
    assert counter.add(2).result(30) == 2


def test_infeasible_actor_fails_construction_and_calls(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    actor = client.actor(Counter, resources={"foo": 1}, infeasible="error")
    with pytest.raises(zres.InfeasibleError, match="foo"):
        actor.ready().result(30)
    with pytest.raises(zres.InfeasibleError, match="foo"):
        actor.get().result(30)


# -- resources -------------------------------------------------------------------------------


def test_actor_holds_its_gpu_until_killed(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"GPU": 1}], nthreads=2)
    client = make_client(cluster.address)
    model = client.actor(Counter, resources={"GPU": 1})
    seen = model.where().result(30)
    assert seen["cuda"] == "0" and seen["gpu_ids"] == ["0"]
    task = client.submit(gpu_devices, resources={"GPU": 1})
    assert model.add(1).result(30) == 1  # the actor keeps serving; the task keeps waiting
    assert not task.done()
    assert "GPU" in client.why(task)
    state = actor_state(client, model)
    assert (state["state"], state["agent"]) == ("alive", "agent-0")
    assert state["units"] == {"GPU": 1.0}, "it holds what it asked for, no CPU"
    line = next(s for s in render_status(client.status()).splitlines() if "Counter(" in s)
    assert "alive on agent-0" in line and "GPU=1" in line, line
    client.kill(model)
    assert task.result(30) == "0"
    with pytest.raises(zres.ActorDiedError, match="killed by zres.kill"):
        model.add(1).result(30)
    assert not client.status()["actors"]


def test_construction_waits_for_resources_and_status_says_why(make_cluster, make_client,
                                                              tmp_path):
    cluster = make_cluster(agents=[{"GPU": 1}], nthreads=2)
    client = make_client(cluster.address)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    busy = client.submit(hold, release, marker, resources={"GPU": 1})
    assert wait_for_file(marker, 30)
    model = client.actor(Counter, 7, resources={"GPU": 1}, name="model")
    state = wait_until(lambda: actor_state(client, model).get("reason"), message="a reason")
    assert "GPU" in state, state
    assert "waiting" in client.why(model.ready()) or "GPU" in client.why(model.ready())
    shown = render_status(client.status())
    assert "actors:" in shown and "Counter(model)" in shown and "pending" in shown
    call = model.get()
    Path(release).touch()
    assert busy.result(30) == "released"
    assert call.result(30) == 7
    assert actor_state(client, model)["state"] == "alive"


# -- ordering and concurrency ------------------------------------------------------------------


def test_calls_from_concurrent_callers_run_in_the_order_each_made_them(make_cluster,
                                                                     make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    owner = make_client(cluster.address)
    journal = owner.actor(Journal, name="journal")
    callers = {f"c{i}": make_client(cluster.address) for i in range(3)}
    futures: dict[str, list] = {}

    def call_many(caller: str, client: zres.Client) -> None:
        handle = client.get_actor("journal")
        futures[caller] = [handle.append(caller, i) for i in range(300)]

    threads = [threading.Thread(target=call_many, args=item) for item in callers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for caller_futures in futures.values():
        zres.wait(caller_futures, timeout=60)
    entries = journal.read().result(30)
    assert len(entries) == 900
    for caller in callers:
        assert [i for c, i in entries if c == caller] == list(range(300)), caller


def test_a_call_waiting_for_its_argument_holds_back_later_calls_from_that_caller(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    client = make_client(cluster.address)
    journal = client.actor(Journal)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    slow = client.submit(hold, release, marker)
    first = journal.append("me", 0)
    second = journal.append("me", slow)  # waits for the task's result
    third = journal.append("me", 2)
    assert first.result(30) == 1
    assert wait_for_file(marker, 30)
    assert not third.done(), "a later call overtook one waiting for its argument"
    Path(release).touch()
    assert (second.result(30), third.result(30)) == (2, 3)
    assert journal.read().result(30) == [("me", 0), ("me", "released"), ("me", 2)]


def test_max_concurrency_runs_that_many_calls_at_once(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    client = make_client(cluster.address)
    meeting = client.actor(Meeting, max_concurrency=2)
    a, b = meeting.meet(), meeting.meet()
    assert a.result(30) != b.result(30), "the two calls ran in two threads at once"
    serial = client.actor(Counter)
    threads = {serial.where().result(30)["thread"] for _ in range(5)}
    assert len(threads) == 1, "max_concurrency=1 runs every call on one thread"


def test_async_methods_run_on_the_actors_event_loop(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    client = make_client(cluster.address)
    signals = client.actor(Signals, max_concurrency=2)
    waiting = signals.wait()
    fired = signals.fire()
    assert waiting.result(30) == fired.result(30), "both coroutines ran on one event loop"


# -- handles and futures travel ------------------------------------------------------------------


def test_handles_and_call_futures_are_arguments_of_tasks_and_other_calls(make_cluster,
                                                                         make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=3)  # two actors hold a CPU each
    client = make_client(cluster.address)
    counter = client.actor(Counter)
    assert client.submit(call_add, counter, 5).result(30) == 5, "a task used the handle"
    relay = client.actor(Relay, counter)
    assert relay.forward(3).result(30) == 8, "an actor used the handle"
    assert relay.use(counter, 4).result(30) == 12, "a handle as a call's argument"
    assert client.submit(double, counter.add(1)).result(30) == 26, "a call's future as an arg"
    assert counter.add(counter.get()).result(30) == 26, "a call's future in another call"
    assert relay.forward(counter.get()).result(30) == 52, "... and in another actor's call"


# -- names and owners ----------------------------------------------------------------------------


def test_named_actor_is_found_from_another_client_and_outlives_its_creator(make_cluster,
                                                                           make_client):
    cluster = make_cluster(agents=[{"slot": 2}], nthreads=2)
    creator, other = make_client(cluster.address), make_client(cluster.address)
    creator.actor(Counter, 100, name="store").ready().result(30)
    with pytest.raises(ValueError, match="an actor named 'store' already exists"):
        other.actor(Counter, name="store")
    store = other.get_actor("store")
    assert store.ready().result(30) is None
    assert store.add(1).result(30) == 101
    # Ray's get_if_exists: the live one, whatever the arguments.
    assert other.actor(Counter, 0, name="store", get_if_exists=True) == store
    assert creator.submit(add_to_named, "store", 1).result(30) == 102, "found from a task"
    creator.close()
    assert store.add(1).result(30) == 103, "a named actor lives on after its creator left"
    other.kill(store)
    with pytest.raises(ValueError, match="no live actor"):
        other.get_actor("store")
    # None live: made. Clients racing to get or make one get the same one (the broker
    # decides), whichever made it.
    third = make_client(cluster.address)
    with cf.ThreadPoolExecutor(2) as pool:
        racing = list(pool.map(lambda c: c.actor(Counter, 10, name="store", get_if_exists=True),
                               [other, third]))
    assert racing[0] == racing[1] != store
    assert [racing[0].add(1).result(30), racing[1].add(1).result(30)] == [11, 12]
    assert [a["name"] for a in other.status()["actors"]] == ["store"]


def test_unnamed_actor_ends_when_its_creator_disconnects(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    creator, other = make_client(cluster.address), make_client(cluster.address)
    made = creator.actor(Counter, resources={"slot": 1})
    made.ready().result(30)
    shared = zres.ActorHandle(made._zres_id, "Counter", ["get"], client=other)
    assert shared.get().result(30) == 0
    waiting = other.submit(double, 21, resources={"slot": 1})
    wait_until(lambda: "slot" in other.why(waiting), message="the task waiting for slot")
    creator.close()
    assert waiting.result(30) == 42
    with pytest.raises(zres.ActorDiedError, match="disconnected"):
        shared.get().result(30)
    assert not other.status()["actors"]


# -- failures ----------------------------------------------------------------------------------


def test_actor_process_killed_without_restarts_fails_calls_naming_the_signal(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    actor = client.actor(Counter, resources={"slot": 1})
    pid = actor.pid().result(30)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    running = actor.hold(release, marker)
    queued = actor.get()
    assert wait_for_file(marker, 30)
    os.kill(pid, signal.SIGKILL)
    assert_calls_fail_naming(running, queued, actor, "SIGKILL")
    assert client.submit(double, 1, resources={"slot": 1}).result(30) == 2, "slot freed"


def assert_calls_fail_naming(running: zres.Future, queued: zres.Future, actor,
                             cause: str) -> None:
    """The running call, a queued one and a later one fail with ActorDiedError naming CAUSE."""
    with pytest.raises(zres.ActorDiedError, match=cause):
        running.result(30)
    with pytest.raises(zres.ActorDiedError, match=f"{cause}.*no restarts left"):
        queued.result(30)
    with pytest.raises(zres.ActorDiedError, match=cause):
        actor.get().result(30)


def test_actor_process_killed_with_restarts_runs_queued_calls_on_a_new_instance(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    actor = client.actor(Counter, 10, resources={"slot": 1}, restarts=1)
    assert actor.add(5).result(30) == 15
    pid = actor.pid().result(30)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    running = actor.hold(release, marker)
    queued = [actor.add(1), actor.add(1)]
    assert wait_for_file(marker, 30)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(zres.ActorDiedError, match="SIGKILL"):
        running.result(30)
    assert [f.result(30) for f in queued] == [11, 12], "queued calls ran on a fresh instance"
    new_pid = actor.pid().result(30)
    assert new_pid != pid
    state = actor_state(client, actor)
    assert state["starts"] == 2 and state["restarts_left"] == 0
    os.kill(new_pid, signal.SIGKILL)
    wait_until(lambda: all(a["id"] != actor._zres_id for a in client.status()["actors"]),
               message="the actor to end")
    with pytest.raises(zres.ActorDiedError, match="no restarts left"):
        actor.get().result(30)


def test_call_with_retries_runs_again_on_the_restarted_actor(make_cluster, make_client,
                                                             tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    actor = client.actor(Counter, resources={"slot": 1}, restarts=1)
    pid = actor.pid().result(30)
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    call = actor.hold.options(retries=1)(release, marker)
    assert wait_for_file(marker, 30)
    os.unlink(marker)
    os.kill(pid, signal.SIGKILL)
    assert wait_for_file(marker, 30), "the call started again on the new instance"
    Path(release).touch()
    assert call.result(30) == "released"


def test_actor_restarts_on_another_agent_when_its_agent_dies(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}, {"slot": 1}], nthreads=2, **LOSS)
    client = make_client(cluster.address)
    actor = client.actor(Counter, 1, resources={"slot": 1}, restarts=1)
    first = actor.where().result(30)["agent"]
    cluster.agents[first].kill()
    # Sent while the agent is dying: only a call that asked for retries may run again.
    second = actor.where.options(retries=1)().result(30)["agent"]
    assert second != first
    assert actor.get().result(30) == 1, "constructed again with the same arguments"


def test_actor_process_exiting_fails_calls_naming_the_exit_code(make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2)
    client = make_client(cluster.address)
    actor = client.actor(Counter, resources={"slot": 1})
    actor.ready().result(30)
    exiting, queued = actor.exit(3), actor.get()
    assert_calls_fail_naming(exiting, queued, actor, "exited with code 3")
    assert client.submit(double, 2, resources={"slot": 1}).result(30) == 4, "slot freed"


def test_actor_whose_agent_is_lost_without_restarts_fails_calls_naming_the_agent(
        make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2, **LOSS)
    client = make_client(cluster.address)
    actor = client.actor(Counter, resources={"slot": 1})
    release, marker = str(tmp_path / "release"), str(tmp_path / "marker")
    running = actor.hold(release, marker)
    assert wait_for_file(marker, 30)
    cluster.agents["agent-0"].kill()
    with pytest.raises(zres.ActorDiedError, match="agent agent-0 was lost"):
        running.result(30)
    with pytest.raises(zres.ActorDiedError, match="agent agent-0 was lost"):
        actor.get().result(30)
    assert not client.status()["actors"]


def test_restarting_actor_waits_for_a_fitting_agent_and_then_runs_queued_calls(
        make_cluster, make_client):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2, **LOSS)
    client = make_client(cluster.address)
    start = client.submit(double, 3, resources={"slot": 0.5})
    actor = client.actor(Counter, start, resources={"slot": 1}, restarts=1)
    del start  # the restart keeps its construction's arguments itself
    assert actor.add(0).result(30) == 6
    cluster.agents["agent-0"].kill()
    state = wait_until(lambda: (s := actor_state(client, actor))["state"] == "restarting"
                       and s, message="the actor to wait for a new agent")
    assert state.get("reason"), "status says why it waits"
    queued = [actor.add(1), actor.add(2)]
    cluster.add_agent({"slot": 1}, name="agent-1")
    assert [f.result(30) for f in queued] == [7, 9], "constructed again, then the calls ran"
    assert actor.where().result(30)["agent"] == "agent-1"


CREATOR_SCRIPT = """
import sys
from pathlib import Path
import zres

class Counter:
    def __init__(self):
        self.n = 0
    def add(self, k):
        self.n += k
        return self.n

address, marker = sys.argv[1:3]
client = zres.Client(address)
client.actor(Counter, resources={"slot": 1}).ready().result(30)
client.actor(Counter, name="kept").add(7).result(30)
Path(marker).touch()
sys.stdin.read()  # until killed
"""


def test_killed_creator_ends_its_unnamed_actor_and_not_its_named_one(make_cluster,
                                                                     make_client, tmp_path):
    cluster = make_cluster(agents=[{"slot": 1}], nthreads=2,
                           env={"ZRES_BROKER__CLIENT_TIMEOUT": "1.0"})
    other = make_client(cluster.address)
    script, marker = tmp_path / "creator.py", str(tmp_path / "marker")
    script.write_text(CREATOR_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env["ZRES_KEYS"] = cluster.keys
    creator = subprocess.Popen([sys.executable, str(script), cluster.address, marker],
                               stdin=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        wait_until(lambda: os.path.exists(marker), timeout=30, message="the creator's actors")
        waiting = other.submit(double, 21, resources={"slot": 1})
        wait_until(lambda: "slot" in other.why(waiting), message="the task waiting for slot")
        creator.kill()
        creator.wait(10)
        assert waiting.result(30) == 42, "the unnamed actor's slot was freed"
        assert other.get_actor("kept").add(1).result(30) == 8, "the named one lives on"
        assert [a["name"] for a in other.status()["actors"]] == ["kept"]
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.wait(10)
