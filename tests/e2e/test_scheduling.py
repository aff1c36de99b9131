"""Scheduling rules observed end to end, on real broker and agent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zres
from tests.conftest import LOSS, wait_until
from tests.tasks import announce_and_wait, wait_for_file

STREAM_SECONDS = float(os.environ.get("ZRES_TEST_STREAM_SECONDS", 40))
FAKE_GPUS = json.dumps([{"name": "Fake A100", "memory": 40e9},
                        {"name": "Fake A100", "memory": 40e9}])


def interval(seconds: float, begun: str = "", until: str = ""
             ) -> tuple[float, float, str, list[str]]:
    """Run for SECONDS (creating the file BEGUN first, if given; then, if UNTIL is given,
    on until that file exists, 30 s at most); return (start, end, CUDA_VISIBLE_DEVICES,
    granted gpu ids)."""
    start = time.time()
    if begun:
        Path(begun).touch()
    time.sleep(seconds)
    if until:
        wait_for_file(until, timeout=30)
    ctx = zres.get_task_context()
    return start, time.time(), os.environ["CUDA_VISIBLE_DEVICES"], ctx.gpu_ids


def hold_until(path: str, marker: str) -> tuple[str, list[str]]:
    """Announce the start by creating MARKER, then block until PATH exists."""
    announce_and_wait(path, marker, timeout=30)
    return os.environ["CUDA_VISIBLE_DEVICES"], zres.get_task_context().gpu_ids


def overlaps(a: tuple[float, float, str, list[str]],
             b: tuple[float, float, str, list[str]]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_guild_example_backfills_ddd_beside_aaa(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"gpu0": 1, "gpu1": 1}], nthreads=4)
    client = make_client(cluster.address)
    # aaa runs until ddd has begun (30 s at most): ddd, were it held behind ccc, which waits
    # for aaa's gpu0, would begin only after aaa ended.
    ddd_began = str(tmp_path / "ddd-began")
    aaa = client.submit(interval, 0.1, "", ddd_began, resources={"gpu0": 1})
    bbb = client.submit(interval, 0.2, resources={"gpu0": 1})
    ccc = client.submit(interval, 0.2, resources={"gpu0": 1, "gpu1": 1})
    ddd = client.submit(interval, 0.2, ddd_began, resources={"gpu1": 1})
    a, b, c, d = (f.result(30) for f in (aaa, bbb, ccc, ddd))
    assert overlaps(a, d), "ddd must run beside aaa, not wait behind ccc"
    for x, y in [(a, b), (a, c), (b, c), (c, d)]:
        assert not overlaps(x, y), "tasks sharing a resource of amount 1 must not overlap"
    assert c[0] >= b[1] - 0.05, "ccc (gpu0+gpu1) runs after bbb, in submission order"


def test_large_request_is_not_starved_by_a_stream_of_small_ones(make_cluster, make_client):
    cluster = make_cluster(agents=[{"GPU": 2}], nthreads=8,
                           env={"ZRES_BROKER__STARVATION_AFTER": "1.0"})
    client = make_client(cluster.address)
    # Durations out of phase, so the two GPUs never come free at the same moment.
    small = [client.submit(interval, d, resources={"GPU": 1}) for d in (0.3, 0.45, 0.3, 0.3)]
    big_submitted = time.time()
    big = client.submit(interval, 0.3, resources={"GPU": 2})
    deadline = time.monotonic() + STREAM_SECONDS
    while not big.done() and time.monotonic() < deadline:
        pending = [f for f in small if not f.done()]
        if len(pending) < 4:  # keep small tasks always waiting for a GPU
            small.append(client.submit(interval, 0.3, resources={"GPU": 1}))
        else:
            zres.wait(pending + [big], timeout=1, return_when=zres.FIRST_COMPLETED)
    assert big.done(), "the GPU=2 task starved behind the stream of GPU=1 tasks"
    big_start, big_end, visible, gpu_ids = big.result()
    assert sorted(gpu_ids) == ["0", "1"] and visible.count(",") == 1
    small += [client.submit(interval, 0.1, resources={"GPU": 1}) for _ in range(2)]
    results = [f.result(30) for f in small]
    assert not any(overlaps(r, big.result()) for r in results)
    assert any(big_submitted < r[0] < big_start for r in results), \
        "small tasks kept starting while the big one waited"
    assert any(r[0] >= big_end for r in results), "the stream flows on afterwards"


def test_fractional_gpus_pack_onto_one_device(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"GPU": 2}], nthreads=8)
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    quarters = [client.submit(hold_until, release, str(tmp_path / f"q{i}"),
                              resources={"GPU": 0.25}) for i in range(4)]
    wait_until(lambda: all((tmp_path / f"q{i}").exists() for i in range(4)),
               message="four GPU=0.25 tasks running at once")
    whole = client.submit(hold_until, release, str(tmp_path / "whole"), resources={"GPU": 1})
    wait_until(lambda: (tmp_path / "whole").exists(),
               message="a GPU=1 task beside four quarters")
    Path(release).touch()
    devices = {f.result(30)[0] for f in quarters}
    assert len(devices) == 1, f"quarters spread over devices {devices}"
    assert whole.result(30)[0] not in devices
    assert all(f.result()[1] == [f.result()[0]] for f in quarters)


def test_gpu_memory_requests_share_a_device_while_they_fit(make_cluster, make_client,
                                                           tmp_path):
    cluster = make_cluster(agents=[], env={"ZRES_TEST_FAKE_GPUS": FAKE_GPUS}, nthreads=8)
    cluster.add_agent(None, name="gpu-node")
    client = make_client(cluster.address)
    status = client.status()["agents"][0]["slots"][0]
    assert status["total"]["GPU"] == 2
    assert status["total"]["GPU_MEMORY"] == 80e9
    release = str(tmp_path / "release")
    tasks = [client.submit(hold_until, release, str(tmp_path / f"m{i}"),
                           resources={"GPU_MEMORY": "20GB"}) for i in range(5)]
    wait_until(lambda: sum((tmp_path / f"m{i}").exists() for i in range(5)) == 4,
               message="four 20GB tasks on two 40GB devices")
    assert "GPU_MEMORY" in client.why(tasks[4])
    Path(release).touch()
    placements = [f.result(30) for f in tasks[:4]]
    by_device: dict[str, int] = {}
    for visible, gpu_ids in placements:
        assert gpu_ids == [visible]
        by_device[visible] = by_device.get(visible, 0) + 1
    assert sorted(by_device.values()) == [2, 2]
    assert tasks[4].result(30)[0] in by_device


def test_gpu_memory_larger_than_any_device_is_infeasible(make_cluster, make_client):
    cluster = make_cluster(agents=[], env={"ZRES_TEST_FAKE_GPUS": FAKE_GPUS})
    cluster.add_agent(None, name="gpu-node")
    client = make_client(cluster.address)
    future = client.submit(interval, 0, resources={"GPU_MEMORY": "60GB"}, infeasible="error")
    with pytest.raises(zres.InfeasibleError, match="GPU_MEMORY"):
        future.result(10)


def test_agent_leaving_makes_waiting_tasks_infeasible(make_cluster, make_client):
    cluster = make_cluster(agents=[{"CPU": 1}], **LOSS)
    cluster.add_agent({"foo": 1, "CPU": 1}, name="foo-node")
    client = make_client(cluster.address)
    blocker = client.submit(hold_until, "/nonexistent/never", os.devnull,
                            resources={"foo": 1})
    wait_until(lambda: "running" in client.why(blocker), message="blocker running")
    waiting = client.submit(interval, 0, resources={"foo": 1})
    with pytest.warns(zres.InfeasibleWarning, match="no agent offers foo"):
        cluster.agents["foo-node"].kill()
        wait_until(lambda: waiting.infeasible is not None, message="infeasible report")
    assert "no agent offers foo" in client.why(waiting)
    with pytest.raises(zres.AgentLostError):
        blocker.result(10)
    cluster.add_agent({"foo": 1, "CPU": 1}, name="foo-node-2")
    assert waiting.result(20)[2] == ""


def test_runtime_capacity_change_starts_waiting_tasks(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1, "CPU": 4}], names=["node"])
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    first = client.submit(hold_until, release, str(tmp_path / "a"), resources={"foo": 1})
    second = client.submit(hold_until, release, str(tmp_path / "b"), resources={"foo": 1})
    wait_until(lambda: (tmp_path / "a").exists(), message="first task running")
    assert "foo=0" in client.why(second)  # queued on node (pipelined), or waiting
    # Raising capacity starts the waiting task at once.
    assert client.set_resources("node", {"foo": 2}) == [{"CPU": 4.0, "foo": 2.0}]
    wait_until(lambda: (tmp_path / "b").exists(), message="second task started")
    # Lowering below what is in use: running tasks finish, no new one starts until it fits.
    result = subprocess.run([sys.executable, "-m", "zres", "resources", "node", "foo=1",
                             "--broker", cluster.address, "--keys", cluster.keys],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "foo=1" in result.stdout
    third = client.submit(hold_until, release, str(tmp_path / "c"), resources={"foo": 1})
    slot = wait_until(lambda: client.status()["agents"][0]["slots"][0], message="status")
    assert slot["free"]["foo"] == -1
    assert "foo=-1" in client.why(third)
    Path(release).touch()
    assert first.result(30) and second.result(30) and third.result(30)
    with pytest.raises(zres.ZresError, match="no agent named"):
        client.set_resources("nobody", {"foo": 1})
    with pytest.raises(zres.ZresError, match="GPU device"):
        client.set_resources("node", {"GPU": 1})


def held_until(path: str, marker: str) -> float:
    """Announce the start by creating MARKER, block until PATH exists; return the end."""
    announce_and_wait(path, marker, timeout=30)
    return time.time()


def test_a_reservation_leaves_cpus_it_does_not_need_to_cpu_tasks(make_cluster, make_client,
                                                                 tmp_path):
    """Issue 27 item 5: a gpu task reserving gpu-node (gpu is a token standing for a GPU)
    does not idle the CPUs there; CPU tasks run beside it while it waits for the gpu, a
    task that would delay it is kept off and told why, by name, and it starts as soon as
    the gpu's task ends."""
    cluster = make_cluster(agents=[{"CPU": 3, "gpu": 1}], names=["gpu-node"], nthreads=4,
                           env={"ZRES_BROKER__STARVATION_AFTER": "0.2"})
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    first = client.submit(held_until, release, str(tmp_path / "first"),
                          resources={"gpu": 1, "CPU": 1})
    wait_until(lambda: (tmp_path / "first").exists(), message="the first gpu task running")
    big = client.submit(interval, 0, resources={"gpu": 1, "CPU": 2}, key="big-gpu")

    def reserved() -> bool:  # (a pass runs when something changes: a task asking nothing)
        client.submit(interval, 0, resources={"CPU": 0}).result(30)
        return "holds a reservation on gpu-node" in client.why(big)
    wait_until(reserved, message="the waiting gpu task reserving gpu-node")
    # 2 CPUs are free; big needs 2, and the first gpu task gives one back with the gpu:
    # one CPU may be lent, to one CPU=1 task at a time.
    cpu_tasks = [client.submit(interval, 0, key=f"cpu-{i}") for i in range(3)]
    assert all(f.result(30) for f in cpu_tasks), "the CPU tasks ran beside the reservation"
    assert not first.done() and not big.done()
    both = client.submit(interval, 0, resources={"CPU": 2}, key="two-cpus")
    wait_until(lambda: "reserved for task big-gpu" in client.why(both),
               message="a task taking both free CPUs kept off, naming the holder")
    assert "gpu-node is reserved for task big-gpu" in client.why(both)
    Path(release).touch()
    first_end = first.result(30)
    assert big.result(30)[0] >= first_end - 0.05, "big started once the gpu was free"
    assert both.result(30)


def agent_of(_: object = None) -> str:
    return zres.get_task_context().agent


def test_workers_place_tasks_only_on_the_named_agents(make_cluster, make_client, tmp_path):
    """Dask's workers= and allow_other_workers= (issue 27 item 11): agent names."""
    cluster = make_cluster(agents=[{"CPU": 2}, {"CPU": 2}], names=["agent-a", "agent-b"],
                           nthreads=2)
    client = make_client(cluster.address)
    assert {client.submit(agent_of, workers="agent-b").result(30) for _ in range(3)} == {
        "agent-b"}
    assert set(zres.gather(client.map(agent_of, range(6), workers=["agent-a"]))) == {
        "agent-a"}
    # agent-b busy: a task for it waits, saying why; one that only prefers it goes to a.
    release = str(tmp_path / "release")
    busy = [client.submit(hold_until, release, str(tmp_path / f"b{i}"), workers=["agent-b"])
            for i in range(2)]
    wait_until(lambda: all((tmp_path / f"b{i}").exists() for i in range(2)),
               message="agent-b's CPUs both held")
    waits = client.submit(agent_of, workers=["agent-b"])
    assert client.submit(agent_of, workers=["agent-b"], allow_other_workers=True
                         ).result(30) == "agent-a"
    wait_until(lambda: "agent-b has CPU=0 free" in client.why(waits),
               message="the task for agent-b waiting for it")
    assert "agent-a" not in client.why(waits)
    Path(release).touch()
    assert waits.result(30) == "agent-b" and all(f.result(30) for f in busy)
    # Names no agent has: infeasible, as any request no agent could meet.
    with pytest.raises(zres.InfeasibleError, match="no agent named gpu-9 has joined"):
        client.submit(agent_of, workers=["gpu-9"], infeasible="error").result(30)
    with pytest.warns(zres.InfeasibleWarning, match="no agent named gpu-9"):
        lost = client.submit(agent_of, workers="gpu-9")
        wait_until(lambda: lost.infeasible is not None, message="infeasible warning")
    client.cancel([lost])
    with pytest.raises(ValueError, match="needs workers="):
        client.submit(agent_of, allow_other_workers=True)
    with pytest.raises(TypeError, match="workers must name agents"):
        client.submit(agent_of, workers=[1])


CONFIG_ROUTES = [
    ("flag", ["--resources", "gpu0=1 Licence=2"], {}, None),
    ("file", ["--config", "{dir}/zres.toml"], {}, '[agent]\nresources = "gpu0=1 Licence=2"\n'),
    ("file-table", [], {"ZRES_CONFIG": "{dir}/zres.toml"},
     '[agent.resources]\ngpu0 = 1\nLicence = "2"\n'),
    ("cwd-file", [], {}, '[agent]\nresources = "gpu0=1,Licence=2"\n'),
    ("env-spec", [], {"ZRES_AGENT__RESOURCES": "gpu0=1 Licence=2"}, None),
    ("env-names", [], {"ZRES_AGENT__RESOURCES__gpu0": "1",
                       "ZRES_AGENT__RESOURCES__Licence": "2"}, None),
]


@pytest.mark.parametrize("route,args,env,toml", CONFIG_ROUTES, ids=[r[0] for r in CONFIG_ROUTES])
def test_every_config_route_gives_the_same_agent(make_cluster, make_client, tmp_path,
                                                 route, args, env, toml):
    cluster = make_cluster(agents=[])
    if toml:
        (tmp_path / "zres.toml").write_text(toml)
    environ = {**os.environ, **{k: v.format(dir=tmp_path) for k, v in env.items()}}
    if "ZRES_CONFIG" not in env:
        environ.pop("ZRES_CONFIG", None)
    agent = subprocess.Popen(
        [sys.executable, "-m", "zres", "agent", cluster.address, "--keys", cluster.keys,
         "--name", route,
         "--nthreads", "2", "--no-detect", *(a.format(dir=tmp_path) for a in args)],
        cwd=tmp_path, env=environ, stderr=subprocess.DEVNULL)
    try:
        client = make_client(cluster.address)
        agents = wait_until(lambda: client.status()["agents"], message="agent registered")
        assert agents[0]["slots"][0]["total"] == {"CPU": 2, "gpu0": 1, "Licence": 2}
        assert client.submit(interval, 0, resources={"gpu0": 1, "Licence": 2}).result(30)
    finally:
        agent.kill()
        agent.wait()


def test_precedence_flag_over_env_over_file(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[])
    (tmp_path / "zres.toml").write_text('[agent]\nresources = "foo=1 bar=1 baz=1"\n')
    environ = {**os.environ, "ZRES_AGENT__RESOURCES": "foo=2 bar=2"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "zres", "agent", cluster.address, "--keys", cluster.keys,
         "--name", "prec",
         "--nthreads", "1", "--no-detect", "--resources", "foo=3"],
        cwd=tmp_path, env=environ, stderr=subprocess.DEVNULL)
    try:
        client = make_client(cluster.address)
        agents = wait_until(lambda: client.status()["agents"], message="agent registered")
        total = agents[0]["slots"][0]["total"]
        assert total == {"CPU": 1, "foo": 3, "bar": 2, "baz": 1}
    finally:
        agent.kill()
        agent.wait()


def total(values: list[tuple[str, list[str]]]) -> int:
    return len(values)


def test_why_names_the_dependencies_a_task_waits_for(make_cluster, make_client, tmp_path):
    cluster = make_cluster(agents=[{"CPU": 2}])
    client = make_client(cluster.address)
    release = str(tmp_path / "release")
    first = client.submit(hold_until, release, str(tmp_path / "a"), key="first-input")
    done = client.submit(hold_until, str(tmp_path), str(tmp_path / "b"), key="ready-input")
    done.result(30)
    combined = client.submit(total, [first, done], key="combine")
    assert client.why(combined) == "waiting for 1 of 2 dependencies: first-input"
    Path(release).touch()
    assert combined.result(30) == 2
