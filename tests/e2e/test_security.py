"""Only holders of the cluster's keys get in, each in its own role (issue 17): real
brokers and agents, and peers played by hand on raw sockets with or without keys."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import zmq
import zmq.auth

import zres
from tests.conftest import raw_dealer, wait_until
from zres.core import keys as K
from zres.core import protocol as P
from zres.core.errors import ZresError
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(90)


def answer(sock: zmq.Socket, timeout: float = 10.0) -> P.Message | None:
    """The first message that is not a heartbeat, or None if none comes in TIMEOUT."""
    deadline = time.monotonic() + timeout
    while sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
        msg = P.decode(sock.recv_multipart())
        if msg.kind != P.HEARTBEAT:
            return msg
    return None


def touch_task(path: str) -> list[Any]:
    """A SUBMIT item and frames whose task would create PATH."""
    frames = [cloudpickle.dumps(Path(path).touch), cloudpickle.dumps(((), {}))]
    return [[1, {"CPU": UNIT}, 0, 0, [], len(frames), "touch", False]], frames


def cli(*args: str, keys: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ZRES_KEYS"}
    if keys is not None:
        env["ZRES_KEYS"] = keys
    return subprocess.run([sys.executable, "-m", "zres", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_process_without_a_key_cannot_submit_or_reach_a_handler(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}])
    sock = raw_dealer(cluster.address, None)
    try:
        items, frames = touch_task(str(tmp_path / "ran"))
        P.send(sock, P.encode(P.SUBMIT, {"tasks": items}, frames))
        sock.send_multipart([b"\xff garbage", b"\x00" * 64])
        assert answer(sock, timeout=2.0) is None, "the broker answered a peer with no key"
        status = cluster.status()
        assert status["counts"] == {} and not (tmp_path / "ran").exists()
    finally:
        sock.close()


def test_roles_client_cannot_register_and_agent_cannot_submit(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}])
    client_key = K.peer_key(cluster.keys, ("client",))
    agent_key = K.peer_key(cluster.keys, ("agent",))
    as_client, as_agent = raw_dealer(cluster.address, client_key), raw_dealer(cluster.address,
                                                                       agent_key)
    try:
        P.send(as_client, P.encode(P.REGISTER, {
            "name": "impostor", "session": 1, "host": "h", "pid": 1, "t": 0.0,
            "slots": [{"units": {"CPU": UNIT}, "gpus": []}]}))
        refused = answer(as_client)
        assert refused is not None and refused.kind == P.REFUSED
        assert "client key may not register as an agent (zres agent takes an agent key" \
            in refused.body["error"]
        items, frames = touch_task(str(tmp_path / "ran"))
        P.send(as_agent, P.encode(P.SUBMIT, {"tasks": items}, frames))
        refused = answer(as_agent)
        assert refused is not None and refused.kind == P.REFUSED
        assert "agent key may not send submit" in refused.body["error"]
        assert refused.body["ids"] == [1], "the refusal does not name the task it fails"
        status = cluster.status()
        assert [a["name"] for a in status["agents"]] == ["agent-0"]
        assert status["counts"] == {} and not (tmp_path / "ran").exists()
    finally:
        as_client.close()
        as_agent.close()


def test_another_key_cannot_take_over_an_agents_name(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}])
    K.keygen(cluster.keys, "agent", "other")
    mine = tmp_path / "other-keys"
    mine.mkdir()
    for name in ("broker.key", "agent-other.key_secret"):
        (mine / name).write_bytes(Path(cluster.keys, name).read_bytes())
    result = cli("agent", cluster.address, "--name", "agent-0", "--no-detect",
                 "--resources", "foo=1", "--log-format", "json", keys=str(mine))
    assert result.returncode == 1
    assert "belongs to another key" in result.stderr
    status = cluster.status()
    assert [(a["name"], a.get("lost")) for a in status["agents"]] == [("agent-0", None)]
    client = zres.Client(cluster.address)
    try:
        assert client.submit(int, 7, resources={"foo": 1}).result(30) == 7, \
            "the real agent-0 no longer serves"
    finally:
        client.close()


class Box:
    def __init__(self) -> None:
        self.value = 0

    def get(self) -> int:
        return self.value

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value

    def job(self) -> int:
        """Queue a command job from inside this actor; return its id."""
        job = zres.submit_command(["true"], detached=True)
        return zres.default_client().job_ids([job])[0]


def key_dir(cluster: zres.LocalCluster, tmp_path: Path, stem: str) -> str:
    """A directory holding the broker's public key and one secret key, STEM's."""
    mine = tmp_path / f"keys-{stem}"
    mine.mkdir()
    for file in ("broker.key", f"{stem}.key_secret"):
        (mine / file).write_bytes(Path(cluster.keys, file).read_bytes())
    return str(mine)


@pytest.mark.timeout(120)
def test_a_client_cannot_touch_another_owners_work_and_an_admin_can(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 2}])
    for name in ("alice", "bob"):
        K.keygen(cluster.keys, "client", name)
    alice_keys, bob_keys, admin_keys = (key_dir(cluster, tmp_path, stem) for stem in
                                        ("client-alice", "client-bob", "admin"))
    alice = zres.Client(cluster.address, keys=alice_keys)
    bob = zres.Client(cluster.address, keys=bob_keys)
    admin = zres.Client(cluster.address, keys=admin_keys)
    where = ("--broker", cluster.address)
    try:
        job = alice.submit_command(["sh", "-c", "echo secret; sleep 60"], resources={"foo": 1})
        counter = alice.actor(Box, name="alices", resources={"foo": 1})
        counter.ready().result(30)
        [job_id] = alice.job_ids([job])
        wait_until(lambda: cli("logs", str(job_id), *where, keys=alice_keys
                               ).stdout.startswith("secret"), message="alice reads her log")
        listed = cli("jobs", *where, keys=bob_keys).stdout
        assert "alice" in listed, f"zres jobs does not show the owner: {listed}"
        for command, words in (("logs", "read the log of"), ("cancel", "cancel")):
            result = cli(command, str(job_id), *where, keys=bob_keys)
            assert result.returncode != 0 and (
                f"refused it: job {job_id} belongs to alice: only alice or an admin key may "
                f"{words} it") in result.stderr, result.stderr  # (not the wire's kind)
            assert "secret" not in result.stdout
        result = cli("resources", "agent-0", "foo=3", *where, keys=bob_keys)
        assert result.returncode != 0 and ("a client key may not change an agent's capacity "
                                           "(zres resources takes an admin key)"
                                           ) in result.stderr, result.stderr
        # Her actor is hers to call, unless she shares it; a restart keeps which is which.
        lab = alice.actor(Box, name="lab", shared=True)
        assert bob.get_actor("lab").add(5).result(30) == 5, "a shared actor is for everyone"
        private = r"actor Box\(alices\) belongs to alice: only alice or an admin key may"
        for restarted in (False, True):
            with pytest.raises(zres.NotOwnerError, match=r"actor Box\(alices\) exists but "
                               "belongs to alice and is not shared"):
                bob.get_actor("alices")
            stolen = zres.ActorHandle(counter._zres_id, "Box", ["get", "add"], client=bob)
            with pytest.raises(zres.NotOwnerError, match=f"{private} call it"):
                stolen.add(1).result(30)
            with pytest.raises(ZresError, match=f"{private} kill it"):
                bob.kill(stolen)
            assert bob.get_actor("lab").add(1).result(30) == 6 + restarted
            if not restarted:
                cluster.restart_broker()
        assert lab.get().result(30) == 7
        # What an actor submits is its owner's (its agent holds the admin key here).
        queued = counter.job().result(30)
        assert owners(admin)[queued] == "alice"
        assert not job.done() and counter.get().result(10) == 0, "bob's attempts did harm"
        assert admin.get_actor("alices").add(2).result(30) == 2, "an admin may call it"
        assert cli("logs", str(job_id), *where, keys=admin_keys).stdout.startswith("secret")
        result = cli("cancel", str(job_id), *where, keys=admin_keys)
        assert result.returncode == 0, result.stderr
        with pytest.raises(CancelledError):  # (stopped by the admin)
            job.result(30)
        admin.kill(admin.get_actor("alices"))
        with pytest.raises(zres.ActorDiedError):
            counter.get().result(30)
    finally:
        for client in (alice, bob, admin):
            client.close()


def test_a_wrong_broker_key_is_refused_on_both_sides(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}])
    other = tmp_path / "another-cluster"
    K.keygen(other)
    with pytest.raises(ZresError) as refused:  # (not "no broker answered within 10s")
        zres.Client(cluster.address, keys=str(other), connect_timeout=10)
    assert "refused this client" in str(refused.value) and str(other) in str(refused.value)
    result = cli("agent", cluster.address, "--name", "stranger", "--no-detect",
                 "--log-format", "json", keys=str(other))
    assert result.returncode == 1 and "agent_refused" in result.stderr
    result = cli("status", cluster.address, keys=str(other))
    assert result.returncode == 1 and "refused this command" in result.stderr
    assert [a["name"] for a in cluster.status()["agents"]] == ["agent-0"]


def test_each_local_cluster_has_keys_of_its_own(make_cluster):
    first, second = make_cluster(agents=[{"foo": 1}]), make_cluster(agents=[{"foo": 1}])
    assert K.allowed(first.keys).keys().isdisjoint(K.allowed(second.keys).keys())
    with pytest.raises(ZresError, match="refused"):
        zres.Client(second.address, keys=first.keys, connect_timeout=10)
    for mode, path in ((0o700, first.keys), (0o600, f"{first.keys}/client.key_secret")):
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, path


def test_keygen_makes_private_keys_and_does_not_overwrite_them(tmp_path):
    where = tmp_path / "keys"
    made = cli("keygen", str(where))
    assert made.returncode == 0 and "agent.key_secret" in made.stdout
    assert sorted(p.name for p in where.iterdir()) == sorted(
        f"{stem}.{ext}" for stem in ("broker", "client", "agent", "admin")
        for ext in ("key", "key_secret"))
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in where.glob("*.key_secret"))
    before = (where / "broker.key_secret").read_bytes()
    again = cli("keygen", str(where))
    assert again.returncode != 0 and "--force" in again.stderr
    assert (where / "broker.key_secret").read_bytes() == before
    assert cli("keygen", str(where), "--role", "client", "--name", "carol").returncode == 0
    carol, _ = zmq.auth.load_certificate(str(where / "client-carol.key"))
    assert K.allowed(where)[carol] == ("client", "carol")
    assert cli("keygen", str(where), "--force").returncode == 0
    assert (where / "broker.key_secret").read_bytes() != before
    # One agent key per node (host names hold '-'): with the cluster's keys in a new
    # directory, and no shared agent key; added to an existing one.
    nodes = tmp_path / "nodes"
    made = cli("keygen", str(nodes), "--agents", "gpu-node-1,node2")
    assert made.returncode == 0, made.stderr
    assert sorted(p.stem for p in nodes.glob("*.key_secret")) == [
        "admin", "agent-gpu-node-1", "agent-node2", "broker", "client"]
    assert cli("keygen", str(where), "--agents", "node3").returncode == 0
    assert sorted(K.allowed(nodes).values()) == [("admin", "admin"), ("agent", "gpu-node-1"),
                                                 ("agent", "node2"), ("client", "client")]
    assert ("agent", "node3") in K.allowed(where).values()
    again = cli("keygen", str(nodes), "--agents", "node2")
    assert again.returncode != 0 and "agent-node2" in again.stderr


def test_a_broker_given_no_keys_makes_its_own_and_its_user_finds_them(spawn, tmp_path):
    home = tmp_path / "config"
    env = {**os.environ, "XDG_CONFIG_HOME": str(home)}
    env.pop("ZRES_KEYS", None)
    broker = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0",
                    "--log-format", "json"], env=env, stdout=subprocess.PIPE, text=True)
    address = broker.stdout.readline().split()[-1]
    own = home / "zres" / "keys"
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o700
    status = subprocess.run([sys.executable, "-m", "zres", "status", address], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    stranger = subprocess.run([sys.executable, "-m", "zres", "status", address],
                              env={**env, "XDG_CONFIG_HOME": str(tmp_path / "elsewhere")},
                              capture_output=True, text=True, timeout=60)
    assert stranger.returncode == 1 and "it has no key" in stranger.stderr


@pytest.mark.parametrize("who", ["client", "command"])
def test_a_peer_that_looked_for_keys_before_its_starting_broker_made_them_gets_in(
        who, spawn, tmp_path, monkeypatch):
    """The race of a client started just after a broker's first start: it looks for this
    user's keys before the broker has made them, and the broker listens (keys made) before
    the client connects. Stepped: the broker starts just after the client's look."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for name in ("ZRES_KEYS", "ZRES_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    from tests.cli.test_cli import free_port
    address = f"tcp://127.0.0.1:{free_port()}"
    looked = zres.config.find_key

    def look_then_start_the_broker(*args: Any, **kwargs: Any) -> Any:
        key = looked(*args, **kwargs)
        if key is None and not (home / "zres" / "keys").exists():
            broker = spawn([sys.executable, "-m", "zres", "broker", "--listen", address,
                            "--http", "off"], env=dict(os.environ), stdout=subprocess.PIPE,
                           text=True)
            assert address in broker.stdout.readline(), "the broker listens"
        return key

    monkeypatch.setattr(zres.config, "find_key", look_then_start_the_broker)
    if who == "client":
        with zres.Client(address, connect_timeout=30) as client:
            assert client.status()["agents"] == []
    else:
        from zres.local import request
        assert request(address, P.STATUS, {}, 30)["agents"] == []


def test_an_agent_that_looked_for_keys_before_its_broker_made_them_gets_in(
        spawn, tmp_path, monkeypatch):
    """`zres broker & zres agent`: the agent looks for this user's keys before the broker
    has made them (stepped: the broker starts once the agent has looked), connects without,
    is refused, and looks again (it used to exit, refused)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("ZRES_KEYS", "ZRES_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    from tests.cli.test_cli import free_port
    address = f"tcp://127.0.0.1:{free_port()}"
    agent = spawn([sys.executable, "-m", "zres", "agent", address, "--resources", "foo=1",
                   "--no-detect", "--name", "early", "--log-format", "json"],
                  env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    for line in agent.stderr:  # (it logs agent_started once it has looked)
        if '"agent_started"' in line:
            break
    broker = spawn([sys.executable, "-m", "zres", "broker", "--listen", address,
                    "--http", "off"], env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert address in broker.stdout.readline(), "the broker listens"
    from zres.local import request
    wait_until(lambda: [a["name"] for a in request(address, P.STATUS, {}, 30)["agents"]]
               == ["early"], timeout=30, message="the agent to register")
    assert agent.poll() is None


def test_insecure_only_on_loopback_unless_asked_on_the_command_line(spawn, tmp_path):
    env = {**os.environ, "ZRES_SECURITY__INSECURE": "true"}
    refused = subprocess.run([sys.executable, "-m", "zres", "broker", "--listen",
                              "tcp://0.0.0.0:0"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "only --insecure on the command line" in refused.stderr
    broker = spawn([sys.executable, "-m", "zres", "broker", "--listen", "tcp://127.0.0.1:0",
                    "--insecure", "--log-format", "json"], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True)
    address = broker.stdout.readline().split()[-1]
    sock = raw_dealer(address, None)
    try:
        P.send(sock, P.encode(P.STATUS, {"req": 1}))
        reply = answer(sock)
        assert reply is not None and reply.kind == P.STATUS_REPLY, "insecure lets anyone in"
    finally:
        sock.close()
    broker.terminate()
    assert "broker_insecure" in broker.stderr.read()


def test_an_unreadable_key_file_locks_out_nobody_else(make_cluster):
    cluster = make_cluster(agents=[{"foo": 1}])
    Path(cluster.keys, "client-broken.key").write_text("not a key")
    client = zres.Client(cluster.address, keys=cluster.keys)
    try:
        assert client.submit(int, 5).result(30) == 5
    finally:
        client.close()


# -- owners on every route (issue 26) -----------------------------------------------------


def node_keys(cluster: zres.LocalCluster, tmp_path: Path, node: str) -> str:
    """A node's own keys directory: the broker's public key and agent-NODE's secret key
    (made here), as `zres keygen --agents` and deploy/ give each node."""
    K.keygen(cluster.keys, agents=[node])
    return key_dir(cluster, tmp_path, f"agent-{node}")


def job_from_a_task(release: str) -> tuple[int, int]:
    """Once RELEASE exists, queue a command job from inside this task (through the worker's
    default client); return its job id, and how many clients this worker process had open
    once this task had its own."""
    from zres.client import registry
    client = zres.default_client()
    opened = len(registry._open)
    while not os.path.exists(release):
        time.sleep(0.02)
    job = zres.submit_command(["true"], resources={"CPU": 0.1}, detached=True)
    return client.job_ids([job])[0], opened


def owners(client: zres.Client) -> dict[int, str]:
    return {job["id"]: job["owner"] for job in client.jobs(all=True)}


@pytest.mark.timeout(150)
def test_every_job_has_its_owner_on_every_route_and_after_a_restart(make_cluster, tmp_path):
    cluster = make_cluster(agents=[], nthreads=4)
    # The agent has a key of its own only (as on a node of its own): what runs on it
    # submits as its task's owner, never as the agent.
    cluster.add_agent({"foo": 4}, name="node1",
                      extra_args=["--keys", node_keys(cluster, tmp_path, "node1")])
    for name in ("alice", "bob"):
        K.keygen(cluster.keys, "client", name)
    alice_keys, bob_keys, admin_keys = (key_dir(cluster, tmp_path, stem) for stem in
                                        ("client-alice", "client-bob", "admin"))
    alice = zres.Client(cluster.address, keys=alice_keys)
    bob = zres.Client(cluster.address, keys=bob_keys)
    admin = zres.Client(cluster.address, keys=admin_keys)
    where = ("--broker", cluster.address)

    def submit(*argv: str) -> int:
        result = cli("submit", *where, "-r", "foo=1", "--", *argv, keys=alice_keys)
        assert result.returncode == 0, result.stderr
        return int(result.stdout)

    try:
        # `zres submit` (a detached job): alice's, and only she (and admins) may touch it.
        long = submit("sh", "-c", "echo started; sleep 300", "token=s3cret")
        failing = submit("false")
        wait_until(lambda: cli("logs", str(long), *where, keys=alice_keys
                               ).stdout.startswith("started"), message="alice reads her log")
        for command, verb in (("logs", "read the log of"), ("cancel", "cancel")):
            result = cli(command, str(long), *where, keys=bob_keys)
            assert result.returncode != 0 and (
                f"job {long} belongs to alice: only alice or an admin key may {verb} it"
                in result.stderr), result.stderr
        # Her command line is hers: others see its name, owner, state, resources, agent.
        shown = {job["id"]: job for job in bob.jobs(all=True)}
        assert shown[long]["owner"] == "alice" and shown[long]["agent"] == "node1"
        assert shown[long]["state"] == "running" and shown[long]["units"]["foo"] == 1.0
        assert not {"argv", "cwd", "env", "error"} & set(shown[long]), shown[long]
        for reader in (alice, admin):
            [mine] = [j for j in reader.jobs() if j["id"] == long]
            assert mine["argv"][-1] == "token=s3cret" and mine["cwd"] == os.getcwd()
        # What a wait reported is its owner's: bob's waits neither wait for her jobs nor
        # mark them reported.
        result = cli("wait", *where, "--timeout", "5", keys=bob_keys)
        assert (result.returncode, result.stderr) == (0, ""), "bob waits for alice's jobs"
        assert cli("wait", str(failing), *where, keys=bob_keys).returncode == 1
        # From inside her work, with only the agent's key on its host: a Python task's
        # nested submit, and a command job's own `zres submit`.
        release = tmp_path / "release"
        release.touch()
        nested, opened = alice.submit(job_from_a_task, str(release)).result(60)
        # (one worker process: bob's task there gets a client of its own, not alice's)
        by_bob, opened_then = bob.submit(job_from_a_task, str(release)).result(60)
        assert (opened, opened_then, owners(admin)[by_bob]) == (1, 2, "bob")
        assert bob.submit(job_from_a_task, str(release)).result(60)[1] == 2, \
            "a later task of the same owner makes a client of its own"
        inner = alice.submit_command(
            [sys.executable, "-m", "zres", "submit", *where, "--", "true"],
            resources={"foo": 1}).result(60)
        inner_id = int(Path(inner.log).read_text().split()[0])
        assert {nested: "alice", inner_id: "alice", inner.job_id: "alice"}.items() \
            <= owners(admin).items()

        # A restart keeps every owner: of the jobs, and of a task still running (what it
        # submits after the restart is hers too).
        again = tmp_path / "again"
        waiting = alice.submit(job_from_a_task, str(again))
        wait_until(lambda: waiting.running(), message="the task to start")
        running = submit("sleep", "300")
        wait_until(lambda: {j["id"]: j["state"] for j in alice.jobs()}.get(running)
                   == "running", message="the job to run")
        cluster.restart_broker()
        again.touch()
        after, _ = waiting.result(60)
        assert owners(admin)[after] == "alice", "the task's owner was lost"
        assert owners(bob)[long] == "alice" and owners(bob)[running] == "alice"
        result = cli("cancel", str(running), *where, keys=bob_keys)
        assert f"job {running} belongs to alice" in result.stderr, result.stderr
        for job in (running, long):
            result = cli("cancel", str(job), *where, keys=alice_keys)
            assert result.returncode == 0, result.stderr
        assert cli("wait", str(long), str(running), *where, keys=alice_keys).returncode == 1
        result = cli("wait", *where, keys=alice_keys)  # (bob's waits marked none of hers)
        assert result.returncode == 1 and f"job {failing} (false): exit code 1" \
            in result.stderr, result.stderr
    finally:
        for client in (alice, bob, admin):
            client.close()


def test_agent_names_stay_bound_to_their_keys_and_a_revoked_node_is_lost(make_cluster, spawn,
                                                                          tmp_path):
    cluster = make_cluster(agents=[])
    node1, shared = node_keys(cluster, tmp_path, "node1"), key_dir(cluster, tmp_path, "agent")

    def impostor(name: str) -> subprocess.CompletedProcess:
        return cli("agent", cluster.address, "--name", name, "--no-detect", "--resources",
                   "foo=1", "--log-format", "json", keys=shared, timeout=20)

    # A node's own key owns its name; a name it registers is bound to it, through a restart.
    worker = cluster.add_agent({"foo": 1}, name="worker-a", extra_args=["--keys", node1])
    for name in ("node1", "worker-a"):
        result = impostor(name)
        assert result.returncode == 1 and \
            f"agent name '{name}' belongs to another key (agent:node1)" in result.stderr, name
    worker.kill()
    worker.wait(10)
    cluster.restart_broker()
    result = impostor("worker-a")
    assert result.returncode == 1 and "belongs to another key (agent:node1)" in result.stderr
    # An agent with a node's own key is named by it; removing the key's file revokes it: the
    # broker drops it at its next heartbeat, and it exits saying why.
    own = spawn([sys.executable, "-m", "zres", "agent", cluster.address, "--no-detect",
                 "--resources", "foo=1", "--keys", node1, "--log-format", "json"],
                stderr=subprocess.PIPE, text=True)
    cluster.wait_for_agents(["node1"])
    os.remove(Path(cluster.keys, "agent-node1.key"))
    assert own.wait(30) == 1
    assert "its key agent:node1 was revoked" in own.stderr.read()
    wait_until(lambda: not any(a["name"] == "node1" and not a.get("lost")
                               for a in cluster.status()["agents"]), message="node1 dropped")


def wait_for(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.02)
    return "released"


def test_a_session_is_bound_to_its_key_and_a_revoked_key_loses_it(make_cluster, tmp_path):
    cluster = make_cluster(agents=[{"foo": 1}])
    for name in ("alice", "bob", "carol"):
        K.keygen(cluster.keys, "client", name)
    alice_key, bob_key = (K.peer_key(key_dir(cluster, tmp_path, f"client-{name}"), ("client",))
                          for name in ("alice", "bob"))
    release = tmp_path / "release"

    def dealer(key: K.PeerKey) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, b"alice's-routing-id")
        K.secure(sock, key)
        sock.connect(cluster.address)
        return sock

    alice = dealer(alice_key)
    P.send(alice, P.encode(P.HELLO, {"client": "alice"}))
    assert answer(alice).kind == P.WELCOME
    frames = [cloudpickle.dumps(wait_for), cloudpickle.dumps(((str(release),), {}))]
    P.send(alice, P.encode(P.SUBMIT, {"tasks": [[1, {"CPU": UNIT}, 0, 0, [], 2, "w", False]]},
                           frames))
    wait_until(lambda: cluster.status()["counts"].get("running"), message="alice's task")
    alice.close()  # (her process died)
    # Bob, on her routing id, is refused and told nothing of hers.
    bob = dealer(bob_key)
    try:
        P.send(bob, P.encode(P.HELLO, {"client": "bob"}))
        refused = answer(bob)
        assert refused.kind == P.REFUSED and "another key's client session" in \
            refused.body["error"], refused
        release.touch()
        wait_until(lambda: cluster.status()["counts"].get("finished"), message="the task to end")
        P.send(bob, P.encode(P.STATUS, {"req": 7}))  # (its answer comes after her news)
        heard = [answer(bob)]
        while heard[-1] is not None and heard[-1].body.get("kind") != P.STATUS:
            heard.append(answer(bob))
        assert [m and m.kind for m in heard] == [P.REFUSED], "bob heard alice's news"
    finally:
        bob.close()
    # Alice, back on her routing id with her key, gets what waited for her.
    alice = dealer(alice_key)
    try:
        P.send(alice, P.encode(P.HELLO, {"client": "alice"}))
        kinds = {}
        while P.RESULTS not in kinds or P.WELCOME not in kinds:
            msg = answer(alice)
            kinds[msg.kind] = msg
        assert kinds[P.RESULTS].body["results"][0][:2] == [1, P.OK]
    finally:
        alice.close()
    # A task token bob made up (claiming to act for alice's task) gets him nothing.
    forged = raw_dealer(cluster.address, bob_key)
    try:
        P.send(forged, P.encode(P.HELLO, {"client": "bob", "token": "t1:alice." + "0" * 32}))
        refused = answer(forged)
        assert refused.kind == P.REFUSED and "not one this broker gave" in \
            refused.body["error"], refused
    finally:
        forged.close()

    # A key removed from the broker's directory: its client's session ends within a
    # heartbeat (what it waits for fails, saying why) and its I/O thread ends; a new
    # client with it is refused at once and leaves no thread behind.
    carol_keys = key_dir(cluster, tmp_path, "client-carol")
    carol = zres.Client(cluster.address, keys=carol_keys)
    waiting = carol.submit(wait_for, str(tmp_path / "never"))
    wait_until(waiting.running, message="carol's task to start")
    os.remove(Path(cluster.keys, "client-carol.key"))
    with pytest.raises(ZresError, match="its key client:carol was revoked"):
        waiting.result(30)
    wait_until(lambda: not carol._io._thread.is_alive(), message="carol's I/O thread to end")
    threads = threading.active_count()
    with pytest.raises(ZresError, match="refused this client"):
        zres.Client(cluster.address, keys=carol_keys, connect_timeout=10)
    assert threading.active_count() == threads, [t.name for t in threading.enumerate()]
    carol.close()
